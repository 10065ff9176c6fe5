"""swiglu.separate / swiglu.fused against the float64 oracle, a hand-computed case, their exact
relations to fp32 math, the clamp, out=, plans and counted cost.

Tolerances: ``fused`` rounds once, so it lies within half a storage ulp of the float64 value plus
the fp32 math's error (``F32_REL``: the sigmoid's 1.5e-7 relative error, machine/vmath.py, and
three fp32 roundings); ``separate`` also rounds h = silu(gate) to the storage dtype first, which
adds up to ``ulp(h)/2 * |up|``: below one ulp of the result while h is a normal number, more where
h is subnormal (fp16 below 6.1e-5, silu(gate) for gate < -12). In fp32 the two give the same bits.
"""

import ml_dtypes
import numba
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import swiglu
from pypto_numba.errors import ConstraintError, DTypeError, ShapeError, TileError
from pypto_numba.machine import dtypes, tile
from pypto_numba.precision import ulp

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

A2 = pn.load_profile("ascend910b")
STRATEGIES = {"separate": swiglu.separate, "fused": swiglu.fused}
PLANS = {"separate": swiglu.plan_separate, "fused": swiglu.plan_fused}
SHAPES = [(1,), (7,), (3, 37), (5, 3, 1000), (2, 4099)]  # odd rows, I not a multiple of any tile or lane count
F32_REL = 4e-7
F32 = np.float32


def bits(a):
    return dtypes.kernel_view(np.ascontiguousarray(a))


def assert_close(y, g, u, dtype, strategy, limit=None):
    """``y`` against the oracle of gate ``g`` and up ``u``: ``|y - ref| <= ulp/2 + F32_REL * |ref|``
    (ulp of the storage dtype at the larger of |y| and |ref|), plus for ``separate`` in bf16/fp16
    the rounding of h = silu(gate): ``ulp(h)/2 * |up|``."""
    ref = swiglu.reference(g, u, limit)
    got = y.astype(np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    err = np.abs(got[ok] - ref[ok])
    bound = 0.5 * ulp(np.maximum(np.abs(got[ok]), np.abs(ref[ok])), dtype) + F32_REL * np.abs(ref[ok])
    if strategy == "separate" and dtype != "fp32":
        g64, u64 = g.astype(np.float64), u.astype(np.float64)
        if limit is not None:
            g64, u64 = np.minimum(g64, limit), np.clip(u64, -limit, limit)
        h = swiglu.reference(g64, np.ones_like(g64))
        bound = bound + (0.5 * ulp(h, dtype) * np.abs(u64))[ok]
    assert np.all(err <= bound), float(np.max(err / bound))


def operands(shape, dtype, rng, form):
    """(args, gate, up): ``(gate, up)`` or the packed ``(x,)`` with x = [gate | up]."""
    g, u = make(shape, dtype, rng, 3.0), make(shape, dtype, rng)
    args = (g, u) if form == "two" else (np.concatenate([g, u], axis=-1),)
    return args, g, u


def run(strategy, *args, **kw):
    y, rec = run_traced(STRATEGIES[strategy], *args, **kw)
    assert_cost_matches_plan(rec)
    return y, rec


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("form", ["two", "packed"])
@pytest.mark.parametrize("shape", SHAPES)
def test_oracle_both_forms(strategy, form, shape, dtype, rng):
    args, g, u = operands(shape, dtype, rng, form)
    y, rec = run(strategy, *args)
    assert y.shape == shape and y.dtype == NP_DTYPE[dtype]
    assert_close(y, g, u, dtype, strategy)
    np.testing.assert_array_equal(swiglu.reference(*args), swiglu.reference(g, u))  # the packed split
    plan = PLANS[strategy](shape, dtype)
    assert rec.cost == plan.cost
    n, b = int(np.prod(shape)), dtypes.itemsize(dtype)
    assert (rec.cost.kernels, rec.cost.gm_read_bytes, rec.cost.gm_write_bytes, rec.cost.workspace_bytes) == (
        (1, 2 * n * b, n * b, 0) if strategy == "fused" else (2, 3 * n * b, 2 * n * b, n * b))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_hand_computed(strategy):
    # silu(g) = g / (1 + e^-g): silu(1) = 0.7310585786300049, silu(-1) = -0.2689414213699951,
    # silu(2) = 1.7615941559557646, silu(-5) = -0.033464254621424277
    g = np.array([0.0, 1.0, -1.0, 2.0, -5.0], F32)
    u = np.array([3.0, 2.0, -4.0, 0.5, -4.0], F32)
    want = [0.0, 1.4621171572600098, 1.0757656854799804, 0.8807970779778823, 0.13385701848569711]
    fn = STRATEGIES[strategy]
    np.testing.assert_allclose(fn(g, u), want, rtol=1e-6, atol=0)
    np.testing.assert_allclose(fn(np.concatenate([g, u])), want, rtol=1e-6, atol=0)
    # limit 1: gate clamped from above only (2 -> 1, -5 stays), up both ways (3 -> 1, -4 -> -1)
    clamped = [0.0, 0.7310585786300049, 0.2689414213699951, 0.36552928931500245, 0.033464254621424277]
    np.testing.assert_allclose(fn(g, u, limit=1.0), clamped, rtol=1e-6, atol=0)
    assert fn(np.zeros(3, F32), np.full(3, 5.0, F32)).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("limit", [None, 2.5])
def test_bits_are_fp32_math_rounded_where_the_npu_rounds(dtype, rng, limit):
    """fused = the fp32 result rounded once; separate = silu(gate) rounded, times up, rounded."""
    g, u = make((6, 515), dtype, rng, 3.0), make((6, 515), dtype, rng, 2.0)
    g32, u32 = g.astype(F32), u.astype(F32)
    y32 = swiglu.fused(g32, u32, limit=limit)
    np.testing.assert_array_equal(bits(swiglu.fused(g, u, limit=limit)), bits(y32.astype(g.dtype)))
    silu32 = swiglu.fused(g32, np.ones_like(g32), limit=limit)  # silu(clamp(gate)) * 1 (limit >= 1)
    uc = u32 if limit is None else np.clip(u32, F32(-limit), F32(limit))
    want = (silu32.astype(g.dtype).astype(F32) * uc).astype(g.dtype)
    np.testing.assert_array_equal(bits(swiglu.separate(g, u, limit=limit)), bits(want))


@pytest.mark.parametrize("limit", [None, 3.0])
def test_fp32_separate_equals_fused(rng, limit):
    g, u = make((17, 1001), "fp32", rng, 4.0), make((17, 1001), "fp32", rng, 4.0)
    np.testing.assert_array_equal(swiglu.separate(g, u, limit=limit), swiglu.fused(g, u, limit=limit))


def test_separate_rounds_the_intermediate(rng):
    """In bf16/fp16 separate differs from fused where rounding silu(gate) moves the result (within
    the bound of test_oracle_both_forms), by at most 2 steps of the storage dtype here."""
    for dt in ("bf16", "fp16"):
        g, u = make((64, 512), dt, rng, 3.0), make((64, 512), dt, rng)
        a, b = swiglu.separate(g, u), swiglu.fused(g, u)
        steps = np.abs(bits(a).astype(np.int64) - bits(b).astype(np.int64))
        assert 0 < np.count_nonzero(steps) and steps.max() <= 2


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_limit_clamps_values_beyond_it(strategy, dtype, rng):
    g = make((9, 300), dtype, rng, 15.0)  # far beyond the limit both ways
    u = make((9, 300), dtype, rng, 15.0)
    y, rec = run(strategy, g, u, limit=10.0)
    assert_close(y, g, u, dtype, strategy, limit=10.0)
    assert np.all(np.abs(y.astype(F32)) <= 10.0 * 10.0 * 1.01)  # |silu(g <= 10)| * |up| <= 10 * 10
    # gate below -limit is not clamped: the result is the unclamped silu there
    low = g.astype(np.float64) < -10.0
    assert low.any()
    uc = np.clip(u.astype(np.float64), -10.0, 10.0)
    assert_close(y[low], g[low], uc[low], dtype, strategy)
    _, free = run(strategy, g, u)
    n = g.size
    assert rec.cost.vector_ops - free.cost.vector_ops == 3 * n  # gate 1, up 2
    # a limit beyond every value changes nothing
    np.testing.assert_array_equal(bits(STRATEGIES[strategy](g, u, limit=1e30)), bits(STRATEGIES[strategy](g, u)))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_special_values(strategy, dtype):
    g = np.array([np.nan, np.inf, -np.inf, -np.inf, 0.0, -0.0, 100.0, -100.0, 1.0, 30.0], F32).astype(NP_DTYPE[dtype])
    u = np.array([1.0, 2.0, 3.0, np.inf, np.inf, 1.0, 1.0, 1.0, np.nan, -np.inf], F32).astype(NP_DTYPE[dtype])
    y = STRATEGIES[strategy](g, u).astype(np.float64)
    ref = swiglu.reference(g, u)
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    # nan, inf * 2, silu(-inf) = 0 (the limit) * 3, 0 * inf = nan, 0 * inf = nan, ...
    assert y[1] == np.inf and y[2] == 0.0 and np.isnan(y[3]) and np.isnan(y[4]) and y[9] == -np.inf
    assert abs(y[7]) < 1e-30 and np.isnan(y[0]) and np.isnan(y[8])
    assert y[6] == 100.0  # sigmoid(100) = 1 in fp32
    limited = STRATEGIES[strategy](g, u, limit=5.0).astype(np.float64)
    np.testing.assert_array_equal(np.isnan(limited), np.isnan(swiglu.reference(g, u, limit=5.0)))
    assert limited[1] == pytest.approx(5.0 / (1.0 + np.exp(-5.0)) * 2.0, rel=2**-7)  # inf -> 5


@numba.njit(cache=True)
def _spans_both(a, b, out_ir, out_plain, n, lim, ahead, stream, cm):
    """Each kernel mode's 512-bit span and its plain loop over three spans of ``n`` elements."""
    for kind in range(3):
        for t in range(3):
            at = np.uint64(t * n)
            o = np.uint64((kind * 3 + t) * n)
            if kind == swiglu.FUSED:
                swiglu._span_fused(a, at, b, at, out_ir, o, np.uint64(n), lim, ahead, stream, cm)
            elif kind == swiglu.SILU:
                swiglu._span_silu(a, at, b, at, out_ir, o, np.uint64(n), lim, ahead, stream, cm)
            else:
                swiglu._span_mul(a, at, b, at, out_ir, o, np.uint64(n), lim, ahead, stream, cm)
            swiglu._span_plain(a, at, b, at, out_plain, o, np.uint64(n), lim, kind, cm)
    if stream:
        tile.store_fence()


@pytest.mark.parametrize("mode", ["rint", "floor"])
@pytest.mark.parametrize("stream", [False, True])
def test_spans_equal_the_plain_loop(dtype, mode, stream, rng):
    """The kernels' IR spans (every mode: fused, silu, mul) give the bits of the readable numba
    loop: heads and tails off a line, clamped and unclamped, special values, prefetching or not."""
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 88.0, -88.0, 12.0, -12.0], F32)
    cm = dtypes.CastMode(mode)
    for n in (1, 7, 33, 517):
        vals = [make((3 * n,), dtype, rng, 6.0) for _ in range(2)]
        for v in vals:
            v[: min(3 * n, specials.size)] = specials[: 3 * n].astype(v.dtype)
        a, b = (dtypes.kernel_view(v) for v in (vals[0], vals[1][::-1].copy()))
        for lim, ahead, skip in ((np.inf, 0, 0), (5.0, 16, 3), (0.5, 0, 1)):
            buf, _ = tile.aligned_empty((9 * n + 64,), dtype)
            out_ir = dtypes.kernel_view(buf)[skip: skip + 9 * n]
            out_plain = np.empty(9 * n, out_ir.dtype)
            _spans_both(a, b, out_ir, out_plain, n, F32(lim), np.uint64(ahead), stream, cm)
            # a NaN's sign follows the operand order LLVM picks (x86 keeps the first NaN operand)
            nan = np.isnan(dtypes.storage_view(out_plain, dtype).astype(F32))
            np.testing.assert_array_equal(np.isnan(dtypes.storage_view(out_ir, dtype).astype(F32)), nan)
            np.testing.assert_array_equal(out_ir[~nan], out_plain[~nan])


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("tile", [16, 48, 512, 4096])
def test_tiles_and_tails_same_bits(strategy, tile, rng):
    g, u = make((9, 1000), "bf16", rng, 3.0), make((9, 1000), "bf16", rng)
    base = STRATEGIES[strategy](g, u)
    y, rec = run(strategy, g, u, tile=tile)
    np.testing.assert_array_equal(bits(y), bits(base))
    cols = min(tile, 1008)  # 1000 aligned to 16 bf16 elements
    rows = max(1, min(9, tile // cols))
    kernels = 1 if strategy == "fused" else 2
    assert rec.cost.tasks == kernels * -(-9 // rows) * -(-1000 // cols)
    assert rec.params["col_tile"] == cols and rec.params["rows_per_task"] == rows


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_packed_and_two_tensors_agree(strategy, dtype, rng):
    args, g, u = operands((4, 3, 77), dtype, rng, "packed")
    a, ra = run(strategy, *args)
    b, rb = run(strategy, g, u)
    np.testing.assert_array_equal(bits(a), bits(b))
    assert ra.cost == rb.cost


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_out_and_in_place(strategy, dtype, rng):
    fn = STRATEGIES[strategy]
    g, u = make((5, 96), dtype, rng, 3.0), make((5, 96), dtype, rng)
    want = fn(g, u)
    out = np.empty_like(g)
    assert fn(g, u, out=out) is out
    np.testing.assert_array_equal(bits(out), bits(want))
    out2 = np.empty_like(g)
    assert fn(np.concatenate([g, u], axis=-1), out=out2) is out2
    np.testing.assert_array_equal(bits(out2), bits(want))
    for which in ("gate", "up"):  # in place: each element is read before it is written
        gc, uc = g.copy(), u.copy()
        target = gc if which == "gate" else uc
        fn(gc, uc, out=target)
        np.testing.assert_array_equal(bits(target), bits(want))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_non_contiguous_inputs_are_copied_and_counted(strategy, rng):
    fn = STRATEGIES[strategy]
    g, u = make((6, 40), "bf16", rng, 3.0), make((6, 40), "bf16", rng)
    gs = np.repeat(g, 2, axis=-1)[:, ::2]
    y, rec = run_traced(fn, gs, u)
    np.testing.assert_array_equal(bits(y), bits(fn(g, u)))
    assert rec.cost.workspace_bytes - rec.planned.workspace_bytes == g.nbytes
    packed = np.concatenate([g, u], axis=-1)
    y2, rec2 = run_traced(fn, np.asfortranarray(packed))
    np.testing.assert_array_equal(bits(y2), bits(y))
    assert rec2.cost.workspace_bytes - rec2.planned.workspace_bytes == packed.nbytes


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_bad_inputs(strategy):
    fn = STRATEGIES[strategy]
    g = np.ones((4, 37), F32)
    where = f"swiglu.{strategy}"
    with pytest.raises(ShapeError, match=rf"{where}: x's last dim 37 is odd; .*pass gate and up as two tensors"):
        fn(g)
    with pytest.raises(ShapeError, match=r"up must have gate's shape \(4, 37\), got \(4, 36\)"):
        fn(g, g[:, :36].copy())
    with pytest.raises(DTypeError, match=r"inputs must share one storage dtype, got gate=fp32, up=bf16"):
        fn(g, g.astype(ml_dtypes.bfloat16))
    with pytest.raises(DTypeError, match=r"gate has dtype float64; accepted"):
        fn(g.astype(np.float64), g)
    with pytest.raises(DTypeError, match=r"x has dtype int32"):
        fn(np.ones((4, 38), np.int32))
    for bad in (0, 0.0, -1.0, float("nan"), float("inf"), 1e39, 1e-50, "10", True):
        with pytest.raises(ConstraintError, match=r"limit must be a finite number > 0 in fp32"):
            fn(g, g, limit=bad)
    with pytest.raises(ShapeError, match=r"out must have the result's shape \(4, 19\)"):
        fn(np.ones((4, 38), F32), out=np.empty((4, 38), F32))
    x = np.ones((4, 38), F32)
    with pytest.raises(ConstraintError, match=r"out overlaps x"):
        fn(x, out=x[:2].reshape(4, 19))
    with pytest.raises(ConstraintError, match=r"out overlaps gate partially"):
        buf = np.ones(4 * 37 + 1, F32)
        fn(buf[:-1].reshape(4, 37), g, out=buf[1:].reshape(4, 37))
    with pytest.raises(DTypeError, match=r"out must be a numpy array of the inputs' dtype \(fp32\)"):
        fn(g, g, out=np.empty((4, 37), np.float16))


def test_plans_and_tiles():
    shape = (2048, 6144)  # Qwen3-1.7B MLP, 2K-token prefill
    f = swiglu.plan_fused(shape, "bf16", profile=A2)
    s = swiglu.plan_separate(shape, "bf16", profile=A2)
    n = 2048 * 6144
    assert f.params["tile"] == A2.tile("gelu_tile")  # no swiglu_tile in the profile: the elementwise tile
    assert s.cost.gm_bytes - f.cost.gm_bytes == 2 * n * 2 and s.cost.kernels == 2 and f.cost.kernels == 1
    assert s.cost.workspace_bytes == n * 2 and f.cost.workspace_bytes == 0
    assert s.cost.vector_ops - f.cost.vector_ops == 2 * n  # the bf16 intermediate's narrow and widen
    assert f.cost.ub_peak_bytes == 4096 * (3 * 2 + 3 * 4)
    assert swiglu.plan_fused(shape, "fp32").cost.vector_ops == swiglu.plan_separate(shape, "fp32").cost.vector_ops
    with pytest.raises(TileError, match=r"needs \d+ B of UB .*use tile <= 11776 \(a multiple of 8\)"):
        swiglu.plan_fused((2, 20000), "fp32", tile=20000)
    with pytest.raises(TileError, match=r"last dim 33 x 2 B = 66 B is not a multiple of 32 B"):
        swiglu.plan_fused((2, 100), "bf16", tile=33)
    with pytest.raises(TileError, match=r"tile must be a positive integer"):
        swiglu.plan_separate((2, 100), tile=0)
    with pytest.raises(ConstraintError, match=r"limit must be"):
        swiglu.plan_fused((2, 100), limit=-1)


def test_advise_and_compare(rng):
    a = pn.advise("swiglu", tokens=2048, intermediate=6144, dtype="bf16")
    assert a.chosen == "fused" and a.agrees_with_seed
    c = pn.compare("swiglu", *swiglu.OP.inputs.make((16, 515), "bf16", rng), repeats=1, limit=10.0)
    assert [r.verdict for r in c.rows] == ["PASS", "PASS"]
    assert pn.reference.swiglu is swiglu.reference


# --- swiglu.epilogue = linear.gate_up_swiglu: the gate/up projections with SwiGLU in the epilogue


def _mlp(M, K, I, dtype, rng):
    return make((M, K), dtype, rng), make((I, K), dtype, rng, K**-0.5 * 2), make((I, K), dtype, rng, K**-0.5)


@pytest.mark.parametrize("M", [1, 5, 37])
@pytest.mark.parametrize("limit", [None, 1.5])
def test_epilogue_oracle_and_cost(M, limit, dtype, rng):
    x, wg, wu = _mlp(M, 300, 130, dtype, rng)
    y, rec = run_traced(swiglu.epilogue, x, wg, wu, limit=limit)
    assert_cost_matches_plan(rec)
    assert y.shape == (M, 130) and y.dtype == x.dtype and rec.cost.kernels == 1
    x64 = x.astype(np.float64)
    gate, up = x64 @ wg.astype(np.float64).T, x64 @ wu.astype(np.float64).T
    ref = swiglu.reference(gate, up, limit)
    # fp32 products accumulated over K = 300 (BLAS's order), then one rounding
    scale = np.abs(gate).max() * np.abs(up).max()
    err = np.abs(y.astype(np.float64) - ref)
    assert np.all(err <= 0.5 * ulp(ref, dtype) + 1e-5 * scale), float(err.max())
    # the same math as fused on the fp32 products, to fp32 sum-order differences
    near = swiglu.fused(gate.astype(F32), up.astype(F32), limit=limit).astype(x.dtype)
    assert np.max(np.abs(bits(y).astype(np.int64) - bits(near).astype(np.int64))) <= 1


def test_epilogue_plan_counts_and_tiles():
    p = swiglu.plan_epilogue((2048, 2048), (6144, 2048), "bf16", profile=A2)
    f = pn.linear.plan_fused_bias((2048, 2048), (6144, 2048), "bf16", bias=False, profile=A2)
    (_, m1), (_, k1), (_, n1) = A2.tile("linear_cube_tiles")
    assert (p.params["m1"], p.params["k1"], p.params["n1"]) == (m1, k1, n1)  # bf16: x + 2 weight tiles fit L1
    k = p.kernels[0]
    assert k.unit == "mixed" and k.cube_flops == 2 * f.cost.cube_flops
    # x is read once per column block for both products: one x read fewer than two projections
    x_reads = 2048 * 2048 * 2 * (6144 // n1)
    assert 2 * f.cost.gm_read_bytes - k.gm_read_bytes == x_reads
    assert k.gm_write_bytes == 2048 * 6144 * 2 and p.cost.workspace_bytes == 0
    assert p.cost.l0c_peak_bytes == 2 * 128 * 128 * 4
    p32 = swiglu.plan_epilogue((2048, 2048), (6144, 2048), "fp32", profile=A2)
    assert p32.params["k1"] == k1 // 2  # fp32: kL1 halved until x and both weight tiles fit L1
    with pytest.raises(TileError, match=r"L0C|L1"):
        swiglu.plan_epilogue((64, 256), (512, 256), "fp32", cube_tiles=((128, 256), (64, 256), (128, 256)))


def test_epilogue_bad_inputs(rng):
    x, wg, wu = _mlp(4, 64, 32, "fp32", rng)
    with pytest.raises(ShapeError, match=r"w_up must have w_gate's shape \(32, 64\), got \(31, 64\)"):
        swiglu.epilogue(x, wg, wu[:31])
    with pytest.raises(ShapeError, match=r"x has K = 63"):
        swiglu.epilogue(x[:, :63].copy(), wg, wu)
    with pytest.raises(DTypeError, match=r"inputs must share one storage dtype, got x=fp32, w_gate=fp32, w_up=bf16"):
        swiglu.epilogue(x, wg, wu.astype(ml_dtypes.bfloat16))
    with pytest.raises(ConstraintError, match=r"limit must be a finite number > 0"):
        swiglu.epilogue(x, wg, wu, limit=0.0)
