"""linear.matmul_add vs linear.fused_bias: results, rounding semantics, counted Cost, errors."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import DTYPES, NP_DTYPE, assert_cost_matches_plan, make, run_traced
from pypto_numba import linear, reference
from pypto_numba.errors import DTypeError, ShapeError, TileError
from pypto_numba.machine import dtypes

U_OUT = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
SMALL = ((16, 32), (16, 64), (16, 32))  # tails on every level for the odd shapes below


def _bound(x, w, bias, rounds):
    """Error bound vs float64: fp32 accumulation + ``rounds`` roundings to the storage dtype."""
    dt = dtypes.storage_name(x.dtype)
    x64 = x.astype(np.float64).reshape(-1, x.shape[-1])
    mag = np.abs(x64) @ np.abs(w.astype(np.float64)).T
    if bias is not None:
        mag = mag + np.abs(bias.astype(np.float64))
    return (x.shape[-1] * 2.0**-24 + 2 * rounds * U_OUT[dt]) * mag.reshape(x.shape[:-1] + (w.shape[0],))


@pytest.mark.parametrize("strategy,rounds", [(linear.fused_bias, 1), (linear.matmul_add, 2)])
@pytest.mark.parametrize("x_shape", [(2, 3, 70), (1, 70), (70,)])
def test_matches_reference(strategy, rounds, x_shape, dtype, rng):
    x, w, b = make(x_shape, dtype, rng), make((45, 70), dtype, rng), make((45,), dtype, rng)
    out, rec = run_traced(strategy, x, w, b, cube_tiles=SMALL)
    assert out.dtype == NP_DTYPE[dtype] and out.shape == x_shape[:-1] + (45,)
    err = np.abs(out.astype(np.float64) - reference.linear(x, w, b))
    assert np.all(err <= _bound(x, w, b, rounds))
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("m", [1, 3, 5, 37])
def test_cost_matches_plan_default_tiles(m, dtype, rng):
    """Default tiles (decode tiles below 16 rows: the skinny loops, for fp32 too), odd N and K;
    both strategies."""
    x, w, b = make((m, 133), dtype, rng), make((77, 133), dtype, rng), make((77,), dtype, rng)
    for fn in (linear.fused_bias, linear.matmul_add):
        out, rec = run_traced(fn, x, w, b)
        assert_cost_matches_plan(rec)
        err = np.abs(out.astype(np.float64) - reference.linear(x, w, b))
        assert np.all(err <= _bound(x, w, b, 2))


def test_fused_saves_one_kernel_and_one_output_round_trip(dtype, rng):
    m, k, n = 37, 70, 45
    x, w, b = make((m, k), dtype, rng), make((n, k), dtype, rng), make((n,), dtype, rng)
    _, fused = run_traced(linear.fused_bias, x, w, b, cube_tiles=SMALL)
    _, split = run_traced(linear.matmul_add, x, w, b, cube_tiles=SMALL)
    out_bytes = m * n * x.itemsize
    assert (fused.cost.kernels, split.cost.kernels) == (1, 2)
    assert split.cost.gm_write_bytes - fused.cost.gm_write_bytes == out_bytes
    assert split.cost.gm_read_bytes - fused.cost.gm_read_bytes == out_bytes
    assert split.cost.workspace_bytes - fused.cost.workspace_bytes == out_bytes
    assert fused.cost.cube_flops == split.cost.cube_flops == 2 * m * n * k
    # and the plans say the same without data
    pf = linear.plan_fused_bias((m, k), (n, k), dtype, cube_tiles=SMALL).cost
    ps = linear.plan_matmul_add((m, k), (n, k), dtype, cube_tiles=SMALL).cost
    assert ps.gm_bytes - pf.gm_bytes == 2 * out_bytes


def test_matmul_add_rounds_twice(dtype, rng):
    """matmul_add == round(widen(round(x @ w^T)) + bias) exactly; the product is fused_bias(bias=None)."""
    x, w, b = make((37, 70), dtype, rng, scale=3.0), make((45, 70), dtype, rng), make((45,), dtype, rng)
    prod = linear.fused_bias(x, w, None, cube_tiles=SMALL)
    expect = dtypes.from_float32(dtypes.to_float32(prod) + dtypes.to_float32(b), dtype)
    got = linear.matmul_add(x, w, b, cube_tiles=SMALL)
    assert np.array_equal(got.view(np.uint8), expect.view(np.uint8))


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
def test_fused_never_less_precise(dt, rng):
    for seed in range(3):
        r = np.random.default_rng(seed)
        x, w = make((64, 256), dt, r), make((96, 256), dt, r)
        b = make((96,), dt, r, scale=4.0)
        ref = reference.linear(x, w, b)
        e_fused = np.abs(linear.fused_bias(x, w, b).astype(np.float64) - ref)
        e_split = np.abs(linear.matmul_add(x, w, b).astype(np.float64) - ref)
        assert e_fused.max() <= e_split.max()
        assert e_fused.mean() < e_split.mean()


def test_no_bias_single_kernel(rng):
    x, w = make((20, 33), "bf16", rng), make((17, 33), "bf16", rng)
    a, ra = run_traced(linear.fused_bias, x, w, None)
    s, rs = run_traced(linear.matmul_add, x, w, None)
    assert ra.cost.kernels == rs.cost.kernels == 1
    assert np.array_equal(a.view(np.uint16), s.view(np.uint16))
    assert_cost_matches_plan(ra)


def test_non_contiguous_inputs_counted_as_workspace(rng):
    x = make((20, 66), "fp32", rng)[:, ::2]
    w, b = make((17, 33), "fp32", rng), make((17,), "fp32", rng)
    out, rec = run_traced(linear.fused_bias, x, w, b)
    assert rec.cost.workspace_bytes == x.size * 4
    assert np.allclose(out, reference.linear(x, w, b), rtol=1e-5, atol=1e-4)


def test_bad_inputs(rng):
    x, w, b = make((4, 8), "fp32", rng), make((6, 8), "fp32", rng), make((6,), "fp32", rng)
    with pytest.raises(ShapeError, match=r"K = 8 .* K = 9"):
        linear.fused_bias(x, make((6, 9), "fp32", rng), b)
    with pytest.raises(ShapeError, match=r"bias has shape \(5,\).*N = 6"):
        linear.matmul_add(x, w, make((5,), "fp32", rng))
    with pytest.raises(ShapeError, match=r"bias must have 1 dims"):
        linear.fused_bias(x, w, b.reshape(1, 6))
    with pytest.raises(DTypeError, match=r"float64"):
        linear.fused_bias(x.astype(np.float64), w, b)
    with pytest.raises(DTypeError, match=r"weight has dtype int32"):
        linear.fused_bias(x, w.astype(np.int32), b)
    with pytest.raises(DTypeError, match=r"share one storage dtype"):
        linear.fused_bias(x, w.astype(np.float16), b)
    with pytest.raises(ShapeError, match=r"zero-size"):
        linear.fused_bias(x[:0], w, b)
    with pytest.raises(ShapeError, match=r"weight must have 2 dims"):
        linear.fused_bias(x, w[0], b)
    with pytest.raises(DTypeError, match=r"numpy array"):
        linear.fused_bias(x.tolist(), w, b)


def test_tile_errors_name_buffer_bytes_budget(rng):
    x, w, b = make((4, 8), "fp32", rng), make((6, 8), "fp32", rng), make((6,), "fp32", rng)
    with pytest.raises(TileError, match=r"L0A = .* = 131072 B but ascend910b has 65536 B"):
        linear.fused_bias(x, w, b, cube_tiles=((256, 256), (128, 128), (16, 16)))
    with pytest.raises(TileError, match=r"BT = nL0=512\*4 = 2048 B"):
        linear.plan_fused_bias((4, 8), (6, 8), "bf16", cube_tiles=((16, 16), (16, 16), (512, 512)))
    # without a bias the BT rule does not apply
    linear.plan_fused_bias((4, 8), (6, 8), "bf16", bias=False, cube_tiles=((16, 16), (16, 16), (256, 256)))
    # matmul_add's vector kernel streams each [mL1, nL1] block through UB in row sub-tiles
    p = linear.plan_matmul_add((512, 8), (512, 8), "fp32")
    rows, n1 = p.params["bias_rows"], p.params["n1"]
    assert rows == (188416 - 256 * 4) // (256 * 8) // 8 * 8 == 88
    assert p.cost.ub_peak_bytes == (2 * rows * n1 + n1) * 4 <= p.profile.ub_bytes


@pytest.mark.parametrize("dt", DTYPES)
def test_plans_for_production_shapes(dt):
    """The benchmark shapes plan without data (default tiles fit every dtype)."""
    p = linear.plan_fused_bias((2048, 4096), (4096, 4096), dt)
    assert p.cost.kernels == 1 and p.cost.cube_flops == 2 * 2048 * 4096 * 4096
    d = linear.plan_fused_bias((8, 4096), (4096, 4096), dt)
    assert d.params["m1"] == 16  # decode tiles


def test_plan_accepts_numpy_dtypes_and_rejects_others():
    assert linear.plan_fused_bias((4, 8), (6, 8), np.float16).dtype == "fp16"
    with pytest.raises(DTypeError, match="'float64' is not a storage dtype; use fp32, bf16 or fp16"):
        linear.plan_fused_bias((4, 8), (6, 8), "float64")


# ---------------------------------------------------------------------------------------------
# row_scale: a per-row fp32 scale on the accumulator (rmsnorm.deferred's 1/rms, rmsnorm.fold's weight)


def _scaled_bound(x, w, r, bias):
    """|r| * (the fp32 accumulation bound) + the one rounding of the output, vs float64."""
    dt = dtypes.storage_name(x.dtype)
    x64 = x.astype(np.float64).reshape(-1, x.shape[-1])
    mag = np.abs(r.reshape(-1, 1)) * (np.abs(x64) @ np.abs(w.astype(np.float64)).T)
    acc = (x.shape[-1] + 2) * 2.0**-24 * mag
    if bias is not None:
        mag = mag + np.abs(bias.astype(np.float64))
    return (acc + 2 * U_OUT[dt] * mag).reshape(x.shape[:-1] + (w.shape[0],))


@pytest.mark.parametrize("m", [1, 5, 17, 33])
def test_row_scale_against_float64(m, dtype, rng):
    """``round(r[i] * (x @ W^T)[i, j] + b[j])``: decode (M < 16) and prefill paths, odd K and N,
    with and without a bias; the plan counts what the kernel does."""
    x, w, b = make((m, 133), dtype, rng), make((77, 133), dtype, rng, 0.1), make((77,), dtype, rng)
    r = make((m,), "fp32", rng, 0.5, 1.0)
    for bias in (b, None):
        out, rec = run_traced(linear.fused_bias, x, w, bias, row_scale=r)
        want = r.astype(np.float64)[:, None] * reference.linear(x, w)
        if bias is not None:
            want = want + bias.astype(np.float64)
        assert out.dtype == NP_DTYPE[dtype] and out.shape == (m, 77)
        assert np.all(np.abs(out.astype(np.float64) - want) <= _scaled_bound(x, w, r, bias))
        assert_cost_matches_plan(rec)
        p = linear.plan_fused_bias(x.shape, w.shape, dtype, bias=bias is not None, row_scale=True)
        base = linear.plan_fused_bias(x.shape, w.shape, dtype, bias=bias is not None)
        assert rec.cost == p.cost
        tn = -(-77 // p.params["n1"])
        assert p.cost.gm_read_bytes - base.cost.gm_read_bytes == m * 4 * tn
        assert p.cost.vector_ops - base.cost.vector_ops == m * 77
        assert p.cost.kernels == 1 and p.cost.gm_write_bytes == base.cost.gm_write_bytes


def test_row_scale_ones_gives_the_same_bits_and_leading_dims(rng):
    x, w, b = make((2, 9, 70), "bf16", rng), make((45, 70), "bf16", rng), make((45,), "bf16", rng)
    base = linear.fused_bias(x, w, b, SMALL)
    assert np.array_equal(dtypes.kernel_view(linear.fused_bias(x, w, b, SMALL, row_scale=np.ones((2, 9), np.float32))),
                          dtypes.kernel_view(base))
    r = np.full(18, 2.0, np.float32)  # x2 is exact: twice the accumulator, rounded once
    two = linear.fused_bias(x, w, None, SMALL, row_scale=r)
    assert np.array_equal(two.astype(np.float32), (2 * linear.fused_bias(x, w, None, SMALL).astype(np.float32)))
    # the kept signature (same shapes, other scales) reads the new scales
    half = linear.fused_bias(x, w, None, SMALL, row_scale=np.full(18, 0.5, np.float32))
    assert np.array_equal(half.astype(np.float32), 0.5 * linear.fused_bias(x, w, None, SMALL).astype(np.float32))


@pytest.mark.parametrize("m", [1, 5, 17, 33])
def test_deferred_rmsnorm_then_folded_linear(m, dtype, rng):
    """``fused_bias(x, fold(g, W), row_scale=deferred(x))`` is RMSNorm then the Linear: against the
    float64 ``rmsnorm(x, g) @ W^T + b`` within one fp32 accumulation, the rounding of the folded
    weight and the output's one rounding."""
    from pypto_numba import rmsnorm

    K, N = 133, 45
    x, w, b = make((m, K), dtype, rng, 2.0), make((N, K), dtype, rng, 0.1), make((N,), dtype, rng)
    g = make((K,), "fp32", rng, 0.1, 1.0)
    r = rmsnorm.deferred(x)
    out = linear.fused_bias(x, rmsnorm.fold(g, w), b, row_scale=r)
    x64 = x.astype(np.float64)
    normed = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + 1e-6) * g.astype(np.float64)
    want = normed @ w.astype(np.float64).T + b.astype(np.float64)
    dt = dtypes.storage_name(x.dtype)
    mag = np.abs(normed) @ np.abs(w.astype(np.float64)).T
    # r within 16 fp32 ulps (see test_rmsnorm), the folded weight one storage rounding, fp32 sums
    bound = ((K + 18) * 2.0**-24 + 2 * U_OUT[dt]) * mag + 2 * U_OUT[dt] * (mag + np.abs(b.astype(np.float64)))
    assert np.all(np.abs(out.astype(np.float64) - want) <= bound)
    # and it is as close as plain + Linear (which rounds the normed rows instead of the weight)
    ref = linear.fused_bias(rmsnorm.plain(x, g), w, b)
    err_d = np.max(np.abs(out.astype(np.float64) - want) / (mag + 1e-30))
    err_p = np.max(np.abs(ref.astype(np.float64) - want) / (mag + 1e-30))
    assert err_d <= 2 * err_p + 4 * U_OUT[dt]


def test_row_scale_bad_input(rng):
    x, w = make((5, 24), "fp32", rng), make((12, 24), "fp32", rng)
    with pytest.raises(ShapeError, match=r"row_scale must have shape \(5,\) or x's leading dims \(5,\)"):
        linear.fused_bias(x, w, row_scale=np.ones(4, np.float32))
    with pytest.raises(DTypeError, match=r"row_scale must be fp32 .*shape \(5,\)"):
        linear.fused_bias(x, w, row_scale=np.ones(5, np.float16))
    with pytest.raises(TypeError):
        linear.matmul_add(x, w, row_scale=np.ones(5, np.float32))
