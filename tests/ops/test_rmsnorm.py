"""rmsnorm.plain and rmsnorm.fused_add against a float64 oracle, their exact relations, cost."""

import numpy as np
import pytest
from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

import pypto_numba as pn
from pypto_numba import rmsnorm, rope
from pypto_numba.machine import dtypes

A2 = pn.load_profile("ascend910b")
DS = (1, 3, 96, 4099)
ULP = {"fp32": 2.0**-23, "bf16": 2.0**-8, "fp16": 2.0**-11}


def _oracle(x, w, eps, offset, residual=None):
    h = x.astype(np.float64) if residual is None else residual.astype(np.float64) + x.astype(np.float64)
    ms = np.mean(h * h, axis=-1, keepdims=True)
    return h / np.sqrt(ms + eps) * (w.astype(np.float64) + offset)


def _check_close(y, ref, dtype):
    # fp32 math then one rounding: within a few storage ulps of the float64 value (relative to the row scale)
    scale = np.max(np.abs(ref), axis=-1, keepdims=True) + 1e-30
    err = np.abs(y.astype(np.float64) - ref) / scale
    assert np.max(err) <= 2 * ULP[dtype] + 1e-5, np.max(err)


def _ulps_apart(a, b, dtype):
    """Distance in storage ulps of two same-dtype arrays (their bit patterns as ordered integers)."""
    ia = dtypes.kernel_view(a).astype(np.int64)
    ib = dtypes.kernel_view(b).astype(np.int64)
    return np.max(np.abs(ia - ib))


@pytest.mark.parametrize("D", DS)
@pytest.mark.parametrize("wdt", ["fp32", "same"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_plain_oracle(rng, dtype, D, wdt, offset):
    x = make((5, 3, D), dtype, rng)
    w = make((D,), dtype if wdt == "same" else "fp32", rng, 0.1, 0.0 if offset else 1.0)
    eps = 1e-5
    y, rec = run_traced(rmsnorm.plain, x, w, eps, offset)
    assert y.shape == x.shape and y.dtype == x.dtype
    _check_close(y, _oracle(x, w, eps, offset), dtype)
    assert_cost_matches_plan(rec)
    assert rec.cost == rmsnorm.plan_plain(x.shape, dtype, weight_dtype=w.dtype, offset=offset).cost


@pytest.mark.parametrize("D", DS)
@pytest.mark.parametrize("rdt", ["fp32", "same"])
@pytest.mark.parametrize("wdt", ["fp32", "same"])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_fused_add_oracle_and_relation(rng, dtype, D, rdt, wdt, offset):
    rname = dtype if rdt == "same" else "fp32"
    x = make((7, D), dtype, rng)
    r = make((7, D), rname, rng, 4.0)
    w = make((D,), dtype if wdt == "same" else "fp32", rng, 0.1, 1.0)
    (y, new), rec = run_traced(rmsnorm.fused_add, x, r, w, 1e-6, offset)
    assert y.dtype == x.dtype and new.dtype == r.dtype and new.shape == y.shape == x.shape
    assert_cost_matches_plan(rec)
    # new residual: exactly the fp32 sum rounded once to the residual's dtype
    want_new = (r.astype(np.float32) + x.astype(np.float32)).astype(r.dtype)
    np.testing.assert_array_equal(dtypes.kernel_view(new), dtypes.kernel_view(want_new))
    # normed: the norm of the *rounded* new residual -- plain(new) rounded once to x's dtype; the two
    # kernels' fp32 sums of squares may be vectorised differently (reassoc, machine/jit.py): <= 1 ulp
    want = rmsnorm.plain(want_new, w.astype(np.float32), 1e-6, offset).astype(x.dtype)  # widening w is exact
    assert _ulps_apart(y, want, dtype) <= 1
    _check_close(y, _oracle(want_new, w, 1e-6, offset), dtype)


def test_inv_modes_same_bits_different_ops(rng, dtype):
    x = make((9, 4099), dtype, rng)
    w = make((4099,), "fp32", rng)
    a, ra = run_traced(rmsnorm.plain, x, w, inv="rsqrt")
    b, rb = run_traced(rmsnorm.plain, x, w, inv="recip_sqrt")
    np.testing.assert_array_equal(dtypes.kernel_view(a), dtypes.kernel_view(b))
    assert_cost_matches_plan(rb)
    assert rb.cost.vector_ops - ra.cost.vector_ops == 9  # one more op per row (sqrt + reciprocal)
    r = make((9, 4099), "fp32", rng)
    (c, _), _ = run_traced(rmsnorm.fused_add, x, r, w, inv="rsqrt")
    (d, _), rd = run_traced(rmsnorm.fused_add, x, r, w, inv="recip_sqrt")
    np.testing.assert_array_equal(dtypes.kernel_view(c), dtypes.kernel_view(d))
    assert_cost_matches_plan(rd)


def test_eps_matters(rng):
    x = make((4, 16), "fp32", rng, 1e-3)
    w = np.ones(16, np.float32)
    for eps in (0.0, 1e-6, 1e-2):
        _check_close(rmsnorm.plain(x, w, eps), _oracle(x, w, eps, 0.0), "fp32")
    assert not np.allclose(rmsnorm.plain(x, w, 0.0), rmsnorm.plain(x, w, 1e-2))


def test_hand_computed():
    # x = [3, 4]: mean(x^2) = 12.5, 1/sqrt(12.5) = 0.28284271...; w = [1, 2], offset 1 -> (2, 3)
    x = np.array([[3.0, 4.0]], np.float32)
    w = np.array([1.0, 2.0], np.float32)
    s = 1.0 / np.sqrt(12.5)
    np.testing.assert_allclose(rmsnorm.plain(x, w, 0.0), [[3 * s, 8 * s]], rtol=1e-6)
    np.testing.assert_allclose(rmsnorm.plain(x, w, 0.0, 1.0), [[6 * s, 12 * s]], rtol=1e-6)
    y, new = rmsnorm.fused_add(x, np.array([[1.0, -2.0]], np.float32), w, 0.0)
    np.testing.assert_array_equal(new, [[4.0, 2.0]])  # mean(16, 4) = 10
    np.testing.assert_allclose(y, [[4 / np.sqrt(10), 4 / np.sqrt(10)]], rtol=1e-6)


def test_matches_rope_rmsnorm(rng, dtype):
    # the same math as rope.rmsnorm (x-dtype weight, offset 0): equal up to the vectorised sum's order
    x = make((6, 4, 128), dtype, rng)
    w = make((128,), dtype, rng, 0.1, 1.0)
    assert _ulps_apart(rmsnorm.plain(x, w), rope.rmsnorm(x, w), dtype) <= 1


@pytest.mark.parametrize("kind", ["plain", "fused_add"])
def test_out_and_in_place(rng, dtype, kind):
    x = make((5, 96), dtype, rng)
    r = make((5, 96), "fp32", rng)
    w = make((96,), "fp32", rng)
    fn = (lambda a, **kw: rmsnorm.plain(a, w, **kw)) if kind == "plain" else (
        lambda a, **kw: rmsnorm.fused_add(a, r, w, **kw)[0])
    want = fn(x)
    out = np.empty_like(x)
    got = fn(x, out=out)
    assert got is out
    np.testing.assert_array_equal(dtypes.kernel_view(out), dtypes.kernel_view(want))
    xc = x.copy()
    fn(xc, out=xc)  # in place: a row is read before it is written
    np.testing.assert_array_equal(dtypes.kernel_view(xc), dtypes.kernel_view(want))


@pytest.mark.parametrize("rdt", ["fp32", "same"])
def test_fused_add_residual_out_and_in_place(rng, dtype, rdt):
    """residual_out= receives the new residual (a separate array, or the residual in place, as
    vLLM's fused_add_rms_norm), with the bits of the allocating call; a bad one is refused."""
    rname = dtype if rdt == "same" else "fp32"
    x = make((6, 80), dtype, rng)
    r = make((6, 80), rname, rng, 4.0)
    w = make((80,), "fp32", rng, 0.1, 1.0)
    want_y, want_new = rmsnorm.fused_add(x, r, w)
    assert np.array_equal(dtypes.kernel_view(want_new),
                          dtypes.kernel_view((r.astype(np.float32) + x.astype(np.float32)).astype(r.dtype)))
    sep = np.empty_like(r)
    y, new = rmsnorm.fused_add(x, r, w, residual_out=sep)
    assert new is sep
    np.testing.assert_array_equal(dtypes.kernel_view(new), dtypes.kernel_view(want_new))
    np.testing.assert_array_equal(dtypes.kernel_view(y), dtypes.kernel_view(want_y))
    rc = r.copy()
    y, new = rmsnorm.fused_add(x, rc, w, residual_out=rc)
    assert new is rc
    np.testing.assert_array_equal(dtypes.kernel_view(rc), dtypes.kernel_view(want_new))
    np.testing.assert_array_equal(dtypes.kernel_view(y), dtypes.kernel_view(want_y))
    other = "fp16" if rname != "fp16" else "fp32"
    with pytest.raises(pn.DTypeError, match="residual_out must be a numpy array of the residual's dtype"):
        rmsnorm.fused_add(x, r, w, residual_out=np.empty((6, 80), NP_DTYPE[other]))
    with pytest.raises(pn.ShapeError, match="residual_out must have the residual's shape"):
        rmsnorm.fused_add(x, r, w, residual_out=np.empty((6, 81), r.dtype))
    big = np.empty((7, 80), r.dtype)
    with pytest.raises(pn.ConstraintError, match="residual_out overlaps residual"):
        rmsnorm.fused_add(x, big[:6], w, residual_out=big[1:])
    out = np.empty_like(x)
    if rname == dtype:
        with pytest.raises(pn.ConstraintError, match="residual_out overlaps out"):
            rmsnorm.fused_add(x, r, w, out=out, residual_out=out)


@pytest.mark.parametrize("tt", [1, 3, 8])
def test_token_tile_tails_same_bits(rng, tt):
    x = make((19, 130), "bf16", rng)
    w = make((130,), "fp32", rng)
    base = rmsnorm.plain(x, w)
    y, rec = run_traced(rmsnorm.plain, x, w, token_tile=tt)
    np.testing.assert_array_equal(dtypes.kernel_view(y), dtypes.kernel_view(base))
    assert rec.cost.tasks == -(-19 // tt)
    assert_cost_matches_plan(rec)


def test_default_tile_from_profile():
    p = rmsnorm.plan_plain((4096, 2048), "bf16", profile=A2)
    assert p.params["token_tile"] == A2.tile("rmsnorm_row_tile") == 8
    wide = rmsnorm.plan_plain((2048, 5120), "bf16", profile=A2)  # [T, 5120] fp32 <= 64 KiB -> T = 3
    assert wide.params["token_tile"] == 3


def test_fused_add_saves_traffic():
    shape = (4096, 2048)
    f = rmsnorm.plan_fused_add(shape, "bf16", residual_dtype="fp32", weight_dtype="fp32", token_tile=4).cost
    p = rmsnorm.plan_plain(shape, "fp32", weight_dtype="fp32", token_tile=4).cost
    n = 4096 * 2048
    # add kernel: read x (bf16) + residual (fp32), write the new residual (fp32)
    add_bytes = n * (2 + 4) + n * 4
    separate = add_bytes + p.gm_read_bytes + p.gm_write_bytes
    assert separate - (f.gm_read_bytes + f.gm_write_bytes) == n * 4 + n * 2  # the re-read + fp32-vs-bf16 normed


# ---------------------------------------------------------------------------------------------
# deferred: the fp32 1/rms of each row; fold: the gamma folded into the next Linear's weight


@pytest.mark.parametrize("D", (3, 96, 4099))
def test_deferred_oracle_relation_and_cost(rng, dtype, D):
    x = make((5, 3, D), dtype, rng, 2.0)
    eps = 1e-5
    r, rec = run_traced(rmsnorm.deferred, x, eps)
    assert r.shape == (5, 3) and r.dtype == np.float32
    x64 = x.astype(np.float64)
    want = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1) + eps)
    assert np.max(np.abs(r / want - 1.0)) <= 16 * 2.0**-24, np.max(np.abs(r / want - 1.0))
    assert_cost_matches_plan(rec)
    N = 15
    bx = x.itemsize
    assert rec.cost.gm_read_bytes == N * D * bx and rec.cost.gm_write_bytes == N * 4 and rec.cost.kernels == 1
    assert rec.cost == rmsnorm.plan_deferred(x.shape, dtype).cost
    # plain's scale is deferred's: plain(x, w) is (x * r) * w in fp32, rounded once to x's dtype
    w = make((D,), "fp32", rng, 0.5, 1.0)
    y = rmsnorm.plain(x, w, eps)
    z = ((x.astype(np.float32) * r[..., None]) * w).astype(x.dtype)
    assert _ulps_apart(y, z, dtype) == 0


def test_deferred_plan_saves_the_normed_rows():
    """deferred writes N*4 bytes instead of plain's N*D*bx and reads no weight."""
    p, d = rmsnorm.plan_plain((16, 5120), "bf16", weight_dtype="fp32"), rmsnorm.plan_deferred((16, 5120), "bf16")
    assert d.cost.gm_write_bytes == 16 * 4 and p.cost.gm_write_bytes == 16 * 5120 * 2
    assert p.cost.gm_read_bytes - d.cost.gm_read_bytes == p.kernels[0].tasks * 5120 * 4
    assert d.cost.vector_ops == 16 * 5120 * (2 + 1) + 16 * 3


def test_deferred_out_and_1d(rng):
    x = make((7, 40), "fp32", rng)
    out = np.full(7, np.nan, np.float32)
    assert rmsnorm.deferred(x, out=out) is out
    assert np.array_equal(out, rmsnorm.deferred(x))
    r1 = rmsnorm.deferred(x[0])
    assert r1.shape == () and r1 == out[0]


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_fold_is_one_rounding_of_w_times_gamma(rng, dtype, offset):
    W = make((9, 37), dtype, rng, 0.2)
    g = make((37,), "fp32", rng, 0.1, 0.0 if offset else 1.0)
    f = rmsnorm.fold(g, W, offset)
    assert f.shape == W.shape and f.dtype == W.dtype
    exact = W.astype(np.float64) * (g.astype(np.float64) + offset)  # float64: exact for these inputs
    want = exact.astype(np.float32).astype(W.dtype)
    assert _ulps_apart(f, want, dtype) <= 1  # fp32 product then rint: at most the fp32 rounding apart
    err = np.abs(f.astype(np.float64) - exact) / np.maximum(np.abs(exact), 2.0**-14)  # fp16 subnormals: absolute
    assert np.max(err) <= ULP[dtype] * (1 + 2.0**-16)  # within half a storage ulp, plus fp32's


def test_fold_takes_torch_tensors(rng):
    torch = pytest.importorskip("torch")
    W, g = make((9, 37), "fp16", rng, 0.2), make((37,), "fp32", rng, 0.1, 1.0)
    got = rmsnorm.fold(torch.from_numpy(g), torch.from_numpy(W))
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float16
    assert np.array_equal(got.numpy().view(np.uint16), rmsnorm.fold(g, W).view(np.uint16))
