"""gelu.tanh / gelu.erf against the float64 oracles (reference.gelu_tanh / gelu_erf).

The kernel has one compiled signature per storage dtype (the variant and ``math`` are runtime
flags), so these tests compile three.

Tolerances: fp32 output within ``2e-6*|ref| + 2e-7*|x|`` (the second term is the vector unit's
~1.2e-7 absolute tanh/erf error scaled by ``0.5*|x|``; it matters only where ``1 + tanh`` cancels,
x < 0). bf16/fp16 output within 1 ulp of the storage dtype of the correctly rounded reference --
checked on every finite 16-bit value with x > -3; below that, ``0.5*x*(1 + tanh(..))`` in fp32
cancels (``1 + tanh(u)`` for u << 0 keeps only an absolute ~1e-7), so there only the absolute
bound holds: that cancellation is the formula's, on the NPU as here (fp32 vector math).
"""

import math

import ml_dtypes
import numpy as np
import pytest
from scipy import special

import pypto_numba as pn
from pypto_numba import gelu, reference
from pypto_numba.precision import ulp

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

A2 = pn.load_profile("ascend910b")
TILE = A2.tile("gelu_tile")
VARIANTS = {"tanh": (gelu.tanh, reference.gelu_tanh), "erf": (gelu.erf, reference.gelu_erf)}
SIZES = [(1,), (7,), (TILE - 1,), (TILE + 1,), (3 * TILE + 5,), (3, 5, 7), (2, 3, TILE // 2 + 3)]


def all_finite_16bit(dtype):
    """Every finite value of a 16-bit storage dtype (as that dtype)."""
    x = np.arange(65536, dtype=np.uint16).view(NP_DTYPE[dtype])
    return x[np.isfinite(x.astype(np.float32))]


def assert_fp32_close(y, x, ref):
    xf = np.abs(x.astype(np.float64))
    err = np.abs(y.astype(np.float64) - ref)
    bound = 2e-6 * np.abs(ref) + 2e-7 * xf
    assert np.all(err <= bound), float((err / np.maximum(bound, 1e-300)).max())


def ulps_from_rounded_ref(y, ref, dtype):
    """|y - round(ref)| in ulps of the storage dtype (at the smaller magnitude of the two)."""
    r = ref.astype(NP_DTYPE[dtype]).astype(np.float64)  # correctly rounded float64 -> storage
    got = y.astype(np.float64)
    return np.abs(got - r) / ulp(np.minimum(np.abs(r), np.abs(got)), dtype)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("shape", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes_match_reference_and_plan(variant, shape, dtype, rng):
    fn, ref_fn = VARIANTS[variant]
    x = make(shape, dtype, rng, scale=3.0)
    y, rec = run_traced(fn, x)
    assert y.shape == x.shape and y.dtype == x.dtype
    ref = ref_fn(x)
    if dtype == "fp32":
        assert_fp32_close(y, x, ref)
    else:
        keep = x.astype(np.float32) > -3
        assert ulps_from_rounded_ref(y[keep], ref[keep], dtype).max() <= 1
    assert_cost_matches_plan(rec)
    n, b = x.size, x.itemsize
    ops = {"tanh": 9, "erf": 5}[variant] + (2 if dtype != "fp32" else 0)
    c = rec.cost
    assert (c.kernels, c.tasks, c.gm_read_bytes, c.gm_write_bytes, c.vector_ops) == (
        1, math.ceil(n / TILE), n * b, n * b, n * ops)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fp32_dense_grid(variant):
    fn, ref_fn = VARIANTS[variant]
    x = np.linspace(-12, 12, 400_001, dtype=np.float32)
    y = fn(x)
    ref = ref_fn(x)
    assert_fp32_close(y, x, ref)
    pos = x > 0  # no cancellation for x > 0: relative error at the level of a few fp32 ulps
    assert np.max(np.abs(y[pos] - ref[pos]) / ref[pos]) < 1e-6


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_every_16bit_value_within_one_ulp_above_minus3(variant, dt):
    fn, ref_fn = VARIANTS[variant]
    x = all_finite_16bit(dt)
    y = fn(x)
    ref = ref_fn(x)
    xf = x.astype(np.float64)
    keep = xf > -3
    assert ulps_from_rounded_ref(y[keep], ref[keep], dt).max() <= 1
    # the negative tail: absolute error of the fp32 evaluation (0.5*|x| * ~1.2e-7) + rounding
    tail = ~keep
    err = np.abs(y[tail].astype(np.float64) - ref[tail])
    assert np.all(err <= 2e-7 * np.abs(xf[tail]) + ulp(ref[tail], dt))


def stable_gelu_tanh(x):
    """float64 tanh-GELU without cancellation: 0.5*x*(1 + tanh(u)) == x * sigmoid(2u).

    (reference.gelu_tanh cancels in float64 itself for x < ~-6: 1 + tanh(u) with u << 0.)
    """
    x = x.astype(np.float64)
    return x * special.expit(2.0 * np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3))


def stable_gelu_erf(x):
    """float64 exact GELU without cancellation: 0.5*x*(1 + erf(x/sqrt2)) == 0.5*x*erfc(-x/sqrt2)."""
    x = x.astype(np.float64)
    return 0.5 * x * special.erfc(-x / np.sqrt(2.0))


@pytest.mark.parametrize("variant", VARIANTS)
def test_storage_math(variant, rng):
    fn, ref_fn = VARIANTS[variant]
    # bf16: every intermediate rounded to bf16 -> different results, larger error
    x = make((20_001,), "bf16", rng, scale=3.0)
    y32, ys = fn(x), fn(x, math="storage")
    ref = ref_fn(x)
    assert np.count_nonzero(y32 != ys) > x.size // 20
    err32 = np.abs(y32.astype(np.float64) - ref)
    errs = np.abs(ys.astype(np.float64) - ref)
    # fp32 math leaves only the final rounding (<= 0.5 ulp); storage math adds one per step
    assert errs.mean() > 1.2 * err32.mean() and errs.max() > err32.max()
    # fp32: storage precision is fp32, so the result is bit-identical
    x = make((20_001,), "fp32", rng, scale=3.0)
    np.testing.assert_array_equal(fn(x).view(np.uint32), fn(x, math="storage").view(np.uint32))
    _, rec = run_traced(fn, x, math="storage")
    assert_cost_matches_plan(rec)
    with pytest.raises(pn.ConstraintError, match="math must be one of"):
        fn(x, math="fp16")


@pytest.mark.parametrize("variant", VARIANTS)
def test_nan_inf(variant, dtype):
    fn, _ = VARIANTS[variant]
    x = np.array([np.nan, np.inf, 0.0, 1.0], np.float32).astype(NP_DTYPE[dtype])
    y = fn(x).astype(np.float32)
    assert np.isnan(y[0]) and y[1] == np.inf and y[2] == 0.0 and y[3] > 0.8


@pytest.mark.parametrize("variant", VARIANTS)
def test_minus_inf_gives_zero(variant):
    fn, _ = VARIANTS[variant]
    y = fn(np.array([-np.inf, -1e30], np.float32))
    assert y[0] == 0.0 and y[1] == 0.0
    y = fn(np.array([-np.inf, 2.0], ml_dtypes.bfloat16), math="storage")
    assert y[0] == 0.0
    assert reference.gelu_tanh(np.array([-np.inf]))[0] == 0.0 and reference.gelu_erf(np.array([-np.inf]))[0] == 0.0


def test_tile_errors():
    # erf keeps 5 fp32 temps, tanh 2 (fp32): at tile 8192 erf needs 229376 B > 192 KiB UB
    assert gelu.plan_tanh((100_000,), "fp32", tile=8192).cost.ub_peak_bytes == 8192 * 16
    with pytest.raises(pn.TileError, match=r"needs 229376 B of UB .*ascend910b allows 188416 B .*physical UB 196608 B.*; use tile <= 6728"):
        gelu.plan_erf((100_000,), "fp32", tile=8192)
    with pytest.raises(pn.TileError, match=r"needs 229376 B of UB"):
        gelu.erf(np.ones(10, np.float32), tile=8192)
    # 32-byte rule on the last tile dim
    with pytest.raises(pn.TileError, match=r"100 x 4 B = 400 B is not a multiple of 32 B"):
        gelu.plan_tanh((1000,), "fp32", tile=100)
    with pytest.raises(pn.TileError, match=r"8 x 2 B = 16 B is not a multiple of 32 B"):
        gelu.tanh(np.ones(10, ml_dtypes.bfloat16), tile=8)
    with pytest.raises(pn.TileError, match="positive integer"):
        gelu.plan_tanh((1000,), "fp32", tile=0)
    # a larger UB (ascend950, 248 KiB) fits erf at 8192
    assert gelu.plan_erf((100_000,), "fp32", tile=8192, profile="ascend950").kernels[0].tasks == 13


def test_explicit_tile_and_plan_without_data(rng):
    x = make((1000,), "fp16", rng)
    y, rec = run_traced(gelu.erf, x, tile=64)
    assert rec.cost.tasks == 16
    assert_cost_matches_plan(rec)
    np.testing.assert_array_equal(y.view(np.int16), gelu.erf(x).view(np.int16))  # tile-invariant
    p = gelu.plan_tanh((8, 11008), "bf16")
    assert p.cost.gm_read_bytes == 8 * 11008 * 2 == p.cost.gm_write_bytes


@pytest.mark.parametrize("variant", VARIANTS)
def test_bad_inputs(variant):
    fn, _ = VARIANTS[variant]
    with pytest.raises(pn.DTypeError, match="float64"):
        fn(np.ones(4))
    with pytest.raises(pn.DTypeError, match="int32"):
        fn(np.ones(4, np.int32))
    with pytest.raises(pn.DTypeError, match="numpy array"):
        fn([1.0, 2.0])
    with pytest.raises(pn.ShapeError, match="zero-size"):
        fn(np.ones((3, 0), np.float32))
    with pytest.raises(pn.ShapeError, match="dims"):
        fn(np.array(1.0, np.float32))


@pytest.mark.parametrize("variant", VARIANTS)
def test_non_contiguous_input(variant, rng):
    fn, _ = VARIANTS[variant]
    base = make((6, 2 * TILE + 2), "bf16", rng)
    x = base[:, ::2]
    y, rec = run_traced(fn, x)
    np.testing.assert_array_equal(y.view(np.uint16), fn(np.ascontiguousarray(x)).view(np.uint16))
    assert y.flags.c_contiguous and y.shape == x.shape
    assert rec.cost.workspace_bytes == rec.planned.workspace_bytes + x.size * 2
    assert rec.cost.gm_read_bytes == rec.planned.gm_read_bytes


@pytest.mark.parametrize("variant", VARIANTS)
def test_out_argument_in_place_and_errors(variant):
    fn, _ = VARIANTS[variant]
    x = np.linspace(-4, 4, 1001, dtype=np.float32).astype(ml_dtypes.bfloat16)
    want = fn(x)
    out = np.empty_like(x)
    assert fn(x, out=out) is out
    np.testing.assert_array_equal(out.view(np.uint16), want.view(np.uint16))
    y = x.copy()
    assert fn(y, out=y) is y  # in place
    np.testing.assert_array_equal(y.view(np.uint16), want.view(np.uint16))
    with pytest.raises(pn.DTypeError, match="out must be a numpy array of x's dtype"):
        fn(x, out=np.empty(x.shape, np.float32))
    with pytest.raises(pn.ShapeError, match="out must have x's shape"):
        fn(x, out=np.empty((7,), x.dtype))
    with pytest.raises(pn.ConstraintError, match="overlaps x partially"):
        z = np.zeros(2000, x.dtype)
        fn(z[:1001], out=z[1:1002])


@pytest.mark.parametrize("variant", VARIANTS)
def test_streamed_lines_same_bits_at_any_placement(variant, dtype, rng, monkeypatch):
    """Large outputs are written by streaming stores, unless out starts 1 to ALIAS_WINDOW - 1
    bytes past x within a page (tile.streams_apart); every placement, in place, and a fresh
    output give the bits of the plain path, with tails at both ends of the tiles."""
    from pypto_numba.machine import tile

    fn, ref_fn = VARIANTS[variant]
    n = 3 * TILE + 37
    x = make((n,), dtype, rng, scale=3.0)
    want = fn(x)  # small: plain stores
    bits = np.uint32 if dtype == "fp32" else np.uint16
    monkeypatch.setattr(gelu, "STREAM_MIN_BYTES", 64)
    streamed = []
    kernel = gelu._gelu_kernel
    monkeypatch.setattr(gelu, "_gelu_kernel", lambda *a: (streamed.append(a[-1]), kernel(*a))[1])
    buf = np.empty(n + 2 * tile.PAGE, x.dtype)
    for d in (0, 2, 4, 16, 48, 64, 128, 256, tile.ALIAS_WINDOW - 4, tile.ALIAS_WINDOW, 1024, 2050, 4032, 4094):
        if d % x.itemsize:
            continue
        first = (tile.address(x) + d - tile.address(buf)) % tile.PAGE // x.itemsize
        out = buf[first : first + n]
        assert fn(x, out=out) is out
        assert streamed[-1] == (not 0 < d < tile.ALIAS_WINDOW), d
        np.testing.assert_array_equal(out.view(bits), want.view(bits))
    y = fn(x)  # fresh: placed for streaming
    assert streamed[-1] and tile.streams_apart(y, x)
    np.testing.assert_array_equal(y.view(bits), want.view(bits))
    z = x.copy()
    assert fn(z, out=z) is z and streamed[-1]  # in place streams
    np.testing.assert_array_equal(z.view(bits), want.view(bits))
    fn(x, math="storage")
    assert not streamed[-1]  # the numba loop of storage math: never streamed
