"""rope: standard, interleaved, rmsnorm, fused_rmsnorm and cos_sin against the float64 oracles.

The oracles (pypto_numba.reference) compute from the storage inputs in float64 with no
intermediate rounding; the kernels compute in fp32 and round once, so the error bound is half an
ulp of the output dtype plus fp32 arithmetic error. PyPTO's own cases use their own tolerances
(npu-facts 3 and 1.5).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import reference as ref
from pypto_numba import rope
from pypto_numba.machine.tile import aligned_empty
from pypto_numba.errors import ConstraintError, DTypeError, ShapeError, TileError

from conftest import DTYPES, NP_DTYPE, assert_cost_matches_plan, make, run_traced

# one relative ulp of the output dtype (twice the rounding error) and an fp32-arithmetic slack
RTOL = {"fp32": 2.0**-21, "bf16": 2.0**-8, "fp16": 2.0**-10}
ATOL = 1e-5


def tables(S, R, dtype, rng, lead=()):
    """Random per-position cos/sin (not assuming the HF cat(f, f) layout)."""
    return make(lead + (S, R), dtype, rng), make(lead + (S, R), dtype, rng)


def close(actual, expected, dtype, rtol=None, atol=ATOL):
    np.testing.assert_allclose(
        np.asarray(actual).astype(np.float64), expected,
        rtol=RTOL[dtype] if rtol is None else rtol, atol=atol,
    )


# ---------------------------------------------------------------------------------------------
# correctness against the float64 oracles, every dtype, odd shapes (tails), both store paths


@pytest.mark.parametrize("shape", [(2, 7, 3, 24), (11, 2, 128)], ids=["odd", "d128"])
def test_standard_matches_reference(shape, dtype, rng):
    x = make(shape, dtype, rng)
    cos, sin = tables(shape[-3], shape[-1], dtype, rng)
    out, rec = run_traced(rope.standard, x, cos, sin, token_tile=3)
    assert out.dtype == x.dtype and out.shape == x.shape
    close(out, ref.rope_standard(x, cos, sin), dtype)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("shape", [(2, 7, 3, 24), (11, 2, 128)], ids=["odd", "d128"])
def test_interleaved_matches_reference(shape, dtype, rng):
    x = make(shape, dtype, rng)
    cos, sin = tables(shape[-3], shape[-1], dtype, rng)
    out, rec = run_traced(rope.interleaved, x, cos, sin, token_tile=3)
    close(out, ref.rope_interleaved(x, cos, sin), dtype)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("shape", [(40,), (5, 24), (2, 7, 3, 24), (3, 4, 128)])
def test_rmsnorm_matches_reference(shape, dtype, rng):
    x = make(shape, dtype, rng, scale=3.0)
    w = make(shape[-1:], dtype, rng)
    out, rec = run_traced(rope.rmsnorm, x, w, eps=1e-5, token_tile=2)
    close(out, ref.rmsnorm(x, w, eps=1e-5), dtype)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("shape", [(2, 7, 3, 24), (11, 2, 128)], ids=["odd", "d128"])
def test_fused_rmsnorm_matches_reference(shape, dtype, rng):
    x = make(shape, dtype, rng, scale=2.0)
    w = make(shape[-1:], dtype, rng)
    cos, sin = tables(shape[-3], shape[-1], dtype, rng)
    out, rec = run_traced(rope.fused_rmsnorm, x, w, cos, sin, token_tile=3)
    close(out, ref.rope_fused_rmsnorm(x, w, cos, sin), dtype)
    assert_cost_matches_plan(rec)


def test_rotation_by_hand():
    """One head, D=4, angle pi/2 on the first pair and 0 on the second: exact values."""
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], np.float32)  # [S=1, H=1, D=4]
    # split-half pairs (0, 2) and (1, 3): cos/sin per dim
    cos = np.array([[0.0, 1.0, 0.0, 1.0]], np.float32)
    sin = np.array([[1.0, 0.0, 1.0, 0.0]], np.float32)
    # out[0] = x0*c0 - x2*s0 = -3, out[1] = x1 = 2, out[2] = x2*c2 + x0*s2 = 1, out[3] = 4
    np.testing.assert_array_equal(rope.standard(x, cos, sin), [[[-3.0, 2.0, 1.0, 4.0]]])
    # GPT-J pairs (0, 1) and (2, 3): rotate the first pair by pi/2 (cos/sin per element)
    cos = np.array([[0.0, 0.0, 1.0, 1.0]], np.float32)
    sin = np.array([[1.0, 1.0, 0.0, 0.0]], np.float32)
    # out[0] = x0*0 - x1*1 = -2, out[1] = x1*0 + x0*1 = 1
    np.testing.assert_array_equal(rope.interleaved(x, cos, sin), [[[-2.0, 1.0, 3.0, 4.0]]])
    # RMSNorm of [3, 4]: rms = sqrt(12.5); weight 2
    y = rope.rmsnorm(np.array([3.0, 4.0], np.float32), np.array([2.0, 2.0], np.float32), eps=0.0)
    np.testing.assert_allclose(y, np.array([6.0, 8.0]) / np.sqrt(12.5), rtol=1e-6)


# ---------------------------------------------------------------------------------------------
# PyPTO's own cases


@pytest.mark.parametrize("heads", [16, 8], ids=["q16", "k8"])
@pytest.mark.parametrize("S", [1, 4, 7, 32, 128])
def test_qwen3_fused_rmsnorm_rope(heads, S, rng):
    """npu-facts 3 (test_rope.json): theta=1e6, D=128, bf16, rtol=atol=1e-2."""
    x = make((S, heads, 128), "bf16", rng)
    w = make((128,), "bf16", rng, scale=0.1, loc=1.0)
    cos, sin = rope.cos_sin(np.arange(S), 128, theta=1e6, dtype=NP_DTYPE["bf16"])
    out, rec = run_traced(rope.fused_rmsnorm, x, w, cos, sin)
    assert rec.params["token_tile"] == 8  # the Qwen3 kernel's BS_TILE fits the 910B UB
    np.testing.assert_allclose(out.astype(np.float64), ref.rope_fused_rmsnorm(x, w, cos, sin), rtol=1e-2, atol=1e-2)
    assert_cost_matches_plan(rec)
    normed = rope.rmsnorm(x, w)
    np.testing.assert_allclose(
        rope.standard(normed, cos, sin).astype(np.float64), ref.rope_standard(normed, cos, sin), rtol=1e-2, atol=1e-2
    )


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("heads", [1, 128])
def test_pypto_interleave_rope_case(dtype, heads, rng):
    """npu-facts 1.5 (InterleaveRope): D=64, per-position cos/sin, rtol=7.8125e-3, atol=1e-4."""
    B, S = 2, 9
    x = make((B, S, heads, 64), dtype, rng)
    cos, sin = tables(S, 64, dtype, rng, lead=(B,))
    out = rope.interleaved(x, cos, sin)
    np.testing.assert_allclose(out.astype(np.float64), ref.rope_interleaved(x, cos, sin), rtol=7.8125e-3, atol=1e-4)


# ---------------------------------------------------------------------------------------------
# partial rotary, broadcasting, tiles, threads, out=


@pytest.mark.parametrize("fn", [rope.standard, rope.interleaved], ids=["standard", "interleaved"])
def test_partial_rotary_passes_dims_through(fn, dtype, rng):
    x = make((5, 3, 64), dtype, rng)
    cos, sin = tables(5, 32, dtype, rng)
    out = fn(x, cos, sin, token_tile=2)
    oracle = ref.rope_standard if fn is rope.standard else ref.rope_interleaved
    close(out, oracle(x, cos, sin), dtype)
    np.testing.assert_array_equal(out[..., 32:].view(np.uint8), x[..., 32:].view(np.uint8))  # bit copy
    assert not np.allclose(out[..., :32].astype(np.float32), x[..., :32].astype(np.float32))


def test_partial_rotary_fused(dtype, rng):
    x = make((2, 5, 3, 48), dtype, rng)
    w = make((48,), dtype, rng)
    cos, sin = tables(5, 16, dtype, rng)
    out, rec = run_traced(rope.fused_rmsnorm, x, w, cos, sin, token_tile=2)
    close(out, ref.rope_fused_rmsnorm(x, w, cos, sin), dtype)
    close(out[..., 16:], ref.rmsnorm(x, w)[..., 16:], dtype)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize(
    "table_lead", [(), (3,), (2, 1), (2, 3), (1, 1, 3)], ids=["shared", "per-l1", "per-l0", "per-both", "extra-ones"]
)
def test_tables_broadcast_over_leading_dims(table_lead, rng):
    x = make((2, 3, 5, 4, 32), "fp32", rng)
    cos, sin = tables(5, 32, "fp32", rng, lead=table_lead)
    for fn, oracle in ((rope.standard, ref.rope_standard), (rope.interleaved, ref.rope_interleaved)):
        out, rec = run_traced(fn, x, cos, sin, token_tile=2)
        close(out, oracle(x, cos, sin).reshape(x.shape), "fp32")
        assert_cost_matches_plan(rec)
    w = make((32,), "fp32", rng)
    close(rope.fused_rmsnorm(x, w, cos, sin), ref.rope_fused_rmsnorm(x, w, cos, sin).reshape(x.shape), "fp32")


@pytest.mark.parametrize("fn", ["standard", "interleaved", "fused_rmsnorm", "rmsnorm"])
def test_result_independent_of_token_tile_and_threads(fn, rng):
    x = make((3, 13, 2, 128), "bf16", rng)
    w = make((128,), "bf16", rng)
    cos, sin = tables(13, 128, "bf16", rng, lead=(3,))
    args = {"standard": (x, cos, sin), "interleaved": (x, cos, sin), "fused_rmsnorm": (x, w, cos, sin), "rmsnorm": (x, w)}[fn]
    f = getattr(rope, fn)
    base = f(*args, token_tile=1)
    for tile in (2, 5, 8):
        np.testing.assert_array_equal(f(*args, token_tile=tile).view(np.uint16), base.view(np.uint16))
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        single = f(*args)
    finally:
        numba.set_num_threads(threads)
    np.testing.assert_array_equal(single.view(np.uint16), base.view(np.uint16))


@pytest.mark.parametrize("stream", [False, True], ids=["cached", "streaming"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_out_argument_in_place_and_misaligned(stream, dtype, rng, monkeypatch):
    """out= (x itself, or rows starting off any 32-byte boundary) gives the new array's bits, with
    plain stores and with streaming stores (forced by lowering the size threshold)."""
    monkeypatch.setattr(rope.public, "STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    x = make((9, 3, 40), dtype, rng)
    cos, sin = tables(9, 40, dtype, rng)
    w = make((40,), dtype, rng)
    close(rope.standard(x, cos, sin), ref.rope_standard(x, cos, sin), dtype)
    for fn, args in ((rope.standard, (x, cos, sin)), (rope.interleaved, (x, cos, sin)), (rope.fused_rmsnorm, (x, w, cos, sin))):
        expected = fn(*args)
        size = x.itemsize
        buf = np.empty(x.size + 64, x.dtype)
        for off_bytes in (2, 16, 30):  # row starts at every alignment
            start = (-buf.ctypes.data % 32 + off_bytes) // size
            misaligned = buf[start : start + x.size].reshape(x.shape)
            assert fn(*args, out=misaligned) is misaligned
            np.testing.assert_array_equal(misaligned.view(np.uint8), expected.view(np.uint8))
        y = x.copy()
        fn(y, *args[1:], out=y)
        np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))
    with pytest.raises(ConstraintError, match="overlaps"):
        flat = np.zeros(x.size + 40, x.dtype)
        rope.standard(flat[: x.size].reshape(x.shape), cos, sin, out=flat[40:].reshape(x.shape))
    with pytest.raises(ShapeError, match="out must have x's shape"):
        rope.standard(x, cos, sin, out=np.empty((9, 3, 20), x.dtype))
    with pytest.raises(DTypeError, match="out must be"):
        rope.standard(x, cos, sin, out=np.empty(x.shape, np.float16))


@pytest.mark.parametrize("D,R", [(64, 64), (128, 32), (96, 64)])
def test_fp32_direct_streaming_matches_staged_bits(D, R, rng, monkeypatch):
    """fp32 rope with line-aligned head rows streams from registers (no staging row); its bits
    equal the staged path's (a misaligned out=) and the cached path's, also in place, with a
    partial rotary dim and with a token tile tail; counted Cost == planned."""
    monkeypatch.setattr(rope.public, "STREAM_MIN_BYTES", 0)
    x = make((2, 11, 3, D), "fp32", rng)
    cos, sin = tables(11, R, "fp32", rng)
    direct, rec = run_traced(rope.standard, x, cos, sin)  # fresh outputs are 64-byte aligned
    assert direct.ctypes.data % 64 == 0
    assert_cost_matches_plan(rec)
    close(direct, ref.rope_standard(x, cos, sin), "fp32")
    buf = np.empty(x.size + 32, np.float32)
    start = (-buf.ctypes.data % 64) // 4 + 4  # 16 bytes past a line: the staged path
    staged = rope.standard(x, cos, sin, out=buf[start : start + x.size].reshape(x.shape))
    np.testing.assert_array_equal(staged.view(np.uint32), direct.view(np.uint32))
    y, _ = aligned_empty(x.shape, "fp32")  # in place on line-aligned rows: direct too
    y[...] = x
    assert rope.standard(y, cos, sin, out=y) is y
    np.testing.assert_array_equal(y.view(np.uint32), direct.view(np.uint32))
    monkeypatch.setattr(rope.public, "STREAM_MIN_BYTES", 1 << 62)
    np.testing.assert_array_equal(rope.standard(x, cos, sin).view(np.uint32), direct.view(np.uint32))


def test_non_contiguous_input_is_copied_and_counted(rng):
    base = make((6, 3, 2, 64), "fp16", rng)
    x = np.swapaxes(base, 1, 2)[:, :1]  # [6, 1, 3, 64] view with strides
    assert not x.flags.c_contiguous
    cos, sin = tables(1, 64, "fp16", rng)
    out, rec = run_traced(rope.standard, x, cos, sin)
    close(out, ref.rope_standard(x, cos, sin), "fp16")
    assert rec.cost.workspace_bytes == x.size * 2


# ---------------------------------------------------------------------------------------------
# the comparison users need: fused vs rmsnorm then standard, exactly in the counted Cost


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_saves_one_kernel_and_one_gm_round_trip(dtype, rng):
    x = make((2, 7, 3, 64), dtype, rng)
    w = make((64,), dtype, rng)
    cos, sin = tables(7, 64, dtype, rng)
    with pn.trace() as t:
        two = rope.standard(rope.rmsnorm(x, w, token_tile=3), cos, sin, token_tile=3)
    with pn.trace() as f:
        fused = rope.fused_rmsnorm(x, w, cos, sin, token_tile=3)
    for r in t.records + f.records:
        assert_cost_matches_plan(r)
    split, one = t.total, f.total
    assert (split.kernels, one.kernels) == (2, 1)
    assert split.gm_read_bytes - one.gm_read_bytes == x.nbytes  # the normed tensor read back
    assert split.gm_write_bytes - one.gm_write_bytes == x.nbytes  # ... after being written
    assert split.tasks == 2 * one.tasks
    assert split.estimate("ascend910b").seconds > one.estimate("ascend910b").seconds
    expected = ref.rope_fused_rmsnorm(x, w, cos, sin)
    err_fused = np.abs(fused.astype(np.float64) - expected).mean()
    err_split = np.abs(two.astype(np.float64) - expected).mean()
    if dtype == "fp32":
        np.testing.assert_allclose(fused, two, rtol=1e-5, atol=1e-5)
    else:  # one rounding instead of two
        assert err_fused < err_split


def test_plan_cost_formulas():
    """The documented GM formulas, on an odd shape with leading dims and a tail tile."""
    b = 2
    n_lead, S, H, D, R, T = 6, 7, 3, 48, 16, 3
    tasks = n_lead * 3
    X = n_lead * S * H * D * b
    tokens = n_lead * S
    p = rope.plan_standard((2, 3, S, H, D), (S, R), "bf16", token_tile=T)
    c = p.cost
    assert (c.kernels, c.tasks, c.gm_read_bytes, c.gm_write_bytes) == (1, tasks, X + 2 * tokens * R * b, X)
    assert c.vector_ops == tokens * H * R * 3 + tokens * R * 2 + tokens * H * R * 2
    p = rope.plan_fused_rmsnorm((2, 3, S, H, D), (S, R), "bf16", token_tile=T)
    assert p.cost.gm_read_bytes == X + tasks * D * b + 2 * tokens * R * b
    p = rope.plan_rmsnorm((2, 3, S, H, D), "fp32", token_tile=T)
    assert p.cost.gm_read_bytes == 2 * X + tasks * D * 4 and p.cost.gm_write_bytes == 2 * X


# ---------------------------------------------------------------------------------------------
# tiles: the Qwen3 tile fits exactly; explicit tiles that do not fit are TileErrors


def test_qwen3_tile_fits_ub_and_reduction_limit():
    p = rope.plan_fused_rmsnorm((128, 16, 128), (128, 128), "bf16")
    assert p.params["token_tile"] == 8
    # x 32 KiB + xf 64 KiB + sq 64 KiB + rstd 4 KiB + w 256 B + wf 512 B + cos/sin 2x2 KiB + 2x4 KiB
    assert p.cost.ub_peak_bytes == 180992 <= p.profile.ub_bytes
    with pytest.raises(TileError, match=r"65536 B limit.*token_tile <= 8"):
        rope.plan_fused_rmsnorm((128, 16, 128), (128, 128), "bf16", token_tile=9)


def test_default_token_tile_is_lowered_to_fit():
    p = rope.plan_fused_rmsnorm((4096, 32, 128), None, "fp32")  # sq_ub: T*32*128*4 <= 64 KiB
    assert p.params["token_tile"] == 4
    assert rope.plan_standard((4096, 32, 128), None, "fp32").params["token_tile"] == 8


def test_tile_errors():
    with pytest.raises(TileError, match=r"needs \d+ B of UB.*use token_tile <= \d+"):
        rope.plan_standard((64, 32, 128), None, "fp32", token_tile=64)
    with pytest.raises(TileError, match="process fewer heads"):
        rope.plan_standard((4, 512, 128), None, "fp32")
    x = np.zeros((4, 512, 128), np.float32)
    with pytest.raises(TileError, match="process fewer heads"):
        rope.standard(x, x[:, 0], x[:, 0])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(TileError, match="token_tile must be a positive integer"):
            rope.plan_interleaved((4, 2, 64), None, "fp16", token_tile=bad)


# ---------------------------------------------------------------------------------------------
# cos_sin


@pytest.mark.parametrize("dtype", DTYPES)
def test_cos_sin_matches_reference(dtype):
    positions = np.array([[0, 1, 5, 4095], [7, 100, 2048, 30000]])
    (cos, sin), rec = run_traced(rope.cos_sin, positions, 64, theta=1e6, dtype=NP_DTYPE[dtype])
    assert cos.shape == sin.shape == (2, 4, 64) and cos.dtype == NP_DTYPE[dtype]
    rc, rs = ref.cos_sin(positions, 64, theta=1e6)
    half_ulp = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}[dtype]  # at |v| <= 1
    np.testing.assert_allclose(cos.astype(np.float64), rc, rtol=0, atol=half_ulp * 1.01)
    np.testing.assert_allclose(sin.astype(np.float64), rs, rtol=0, atol=half_ulp * 1.01)
    np.testing.assert_array_equal(cos[..., :32].view(np.uint8), cos[..., 32:].view(np.uint8))
    assert_cost_matches_plan(rec)


def test_cos_sin_tables_drive_rope(rng):
    """HF tables from cos_sin: rotating by position p then taking a dot product depends on p - q only."""
    x = make((1, 1, 64), "fp32", rng)
    xs = np.repeat(x, 12, axis=0)  # the same vector at 12 positions
    cos, sin = rope.cos_sin(np.arange(12), 64)
    r = rope.standard(xs, cos, sin)[:, 0, :].astype(np.float64)
    dots = r @ r.T
    np.testing.assert_allclose(np.diag(dots, 1), np.full(11, dots[0, 1]), rtol=1e-5)


def test_cos_sin_bad_inputs():
    with pytest.raises(ShapeError, match="rot_dim must be even"):
        rope.cos_sin(np.arange(4), 7)
    for bad in (0, -2, 2.0, None):
        with pytest.raises(ShapeError, match="rot_dim must be a positive even integer"):
            rope.cos_sin(np.arange(4), bad)
    for theta in (0.0, -1.0, float("inf"), "x"):
        with pytest.raises(ConstraintError, match="theta"):
            rope.cos_sin(np.arange(4), 8, theta=theta)
    with pytest.raises(DTypeError, match="positions must be an integer or float array"):
        rope.cos_sin(np.array(["a"]), 8)
    with pytest.raises(ConstraintError, match="finite"):
        rope.cos_sin(np.array([0.0, np.nan]), 8)
    with pytest.raises(ShapeError, match="zero-size"):
        rope.cos_sin(np.arange(0), 8)
    with pytest.raises(DTypeError, match="not a storage dtype"):
        rope.cos_sin(np.arange(4), 8, dtype=np.float64)


# ---------------------------------------------------------------------------------------------
# bad inputs: clear errors before any kernel runs


def test_bad_inputs(rng):
    x = make((4, 2, 16), "fp32", rng)
    cos, sin = tables(4, 16, "fp32", rng)
    w = make((16,), "fp32", rng)
    with pytest.raises(ShapeError, match="R = cos.shape.-1. = 7 must be even"):
        rope.standard(x, cos[:, :7], sin[:, :7])
    with pytest.raises(ShapeError, match="R = cos.shape.-1. = 32 exceeds head dim D = 16"):
        big = make((4, 32), "fp32", rng)
        rope.interleaved(x, big, big)
    with pytest.raises(ShapeError, match="cos and sin must have the same shape"):
        rope.standard(x, cos, sin[:, :8])
    with pytest.raises(ShapeError, match="cos/sin have 3 positions .* x has S = 4"):
        rope.fused_rmsnorm(x, w, cos[:3], sin[:3])
    with pytest.raises(ShapeError, match="do not broadcast"):
        c3 = make((3, 4, 16), "fp32", rng)
        rope.standard(make((2, 4, 2, 16), "fp32", rng), c3, c3)
    with pytest.raises(ShapeError, match="cos must have at least 2 dims"):
        rope.standard(x, cos[0], sin[0])
    with pytest.raises(ShapeError, match=r"weight must have shape \(16,\)"):
        rope.fused_rmsnorm(x, w[:8], cos, sin)
    with pytest.raises(ShapeError, match=r"weight must have shape \(16,\)"):
        rope.rmsnorm(x, w.reshape(1, 16))
    with pytest.raises(DTypeError, match="weight must have x's dtype"):
        rope.rmsnorm(x, w.astype(np.float16))
    with pytest.raises(DTypeError, match="cos/sin must have x's dtype"):
        rope.standard(x, cos.astype(np.float16), sin.astype(np.float16))
    with pytest.raises(DTypeError, match="float64; accepted"):
        rope.standard(x.astype(np.float64), cos, sin)
    with pytest.raises(DTypeError, match="int32; accepted"):
        rope.rmsnorm(x.astype(np.int32), w)
    with pytest.raises(DTypeError, match="numpy array"):
        rope.standard(x.tolist(), cos, sin)
    with pytest.raises(ShapeError, match="zero-size"):
        rope.standard(x[:0], cos[:0], sin[:0])
    with pytest.raises(ShapeError, match="zero-size"):
        rope.rmsnorm(x[..., :0], w[:0])
    with pytest.raises(ShapeError, match=r"x\[\.\.\., S, H, D\]"):
        rope.standard(x[:, 0], cos, sin)
    with pytest.raises(ConstraintError, match="eps must be a finite number >= 0"):
        rope.rmsnorm(x, w, eps=-1.0)
    with pytest.raises(ConstraintError, match="eps"):
        rope.fused_rmsnorm(x, w, cos, sin, eps=float("nan"))


def test_registry_and_trace_names(rng):
    names = {s.name for s in pn.strategies("rope")}
    assert {"standard", "interleaved", "rmsnorm", "fused_rmsnorm"} <= names
    x = make((3, 2, 16), "fp16", rng)
    cos, sin = tables(3, 16, "fp16", rng)
    _, rec = run_traced(rope.interleaved, x, cos, sin)
    assert (rec.op, rec.strategy, rec.dtype) == ("rope", "interleaved", "fp16")
