"""mean.sum_div: fp32 sum over any dim / length, cast back -- against the float64 oracle.

Compiled signatures are kept few: the rows kernel and the strided kernel each run on fp32, bf16 and
fp16 storage, and the two-kernel split (fp32 partials) on fp32 plus one 16-bit dtype each.
"""

import ml_dtypes
import numba
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import mean, reference
from pypto_numba.precision import ulp

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

A2 = pn.load_profile("ascend910b")
ROW_TILE = A2.tile("mean_row_tile")


def assert_mean_close(y, x, dim, dtype, keepdim=False):
    """fp32: within a few fp32 ulps of the sum's scale; bf16/fp16: <= 1 ulp of the storage dtype."""
    ref = reference.mean(x, dim, keepdim)
    got = np.asarray(y).astype(np.float64)
    assert got.shape == ref.shape
    err = np.abs(got - ref)
    if dtype == "fp32":
        # fp32 summation error of L terms of size ~max|x|, divided by L: a few eps * max|x|
        scale = float(np.max(np.abs(x.astype(np.float64))))
        assert np.all(err <= 2e-6 * np.abs(ref) + 1e-6 * scale), float(err.max())
    else:
        assert np.all(err <= ulp(ref, dtype)), float((err / ulp(ref, dtype)).max())


# (shape, dim, split) covering: short rows batched per tile, rows longer than the 64 KiB tile
# (two-level, one kernel), few long rows split through GM partials (two kernels), the strided
# layout with inner tails, its GM split, 1-D and 4-D inputs.
CASES = [
    ((37, 1001), -1, "auto"),          # rows: 8 rows x 1008 per tile, tail rows and cols
    ((3, 2 * ROW_TILE + 5), 1, "ub"),  # rows: 3 row tiles each, accumulator in UB
    ((5, 7, 9), 1, "auto"),            # strided: inner 9 (tail of an aligned inner tile)
    ((2, 50, 2049), -2, "ub"),         # strided: 2049 = one full inner tile + 1, 7 L-tiles
    ((4, 3, 5, 6), 0, "auto"),         # strided over the first dim of a 4-D tensor
    ((7,), 0, "auto"),                 # 1-D -> 0-d result
]
SPLIT_CASES = [  # (shape, dim, dtype): the 2-kernel GM split
    ((3, 3 * ROW_TILE + 5), -1, "fp32"),
    ((2, ROW_TILE + 1), 1, "bf16"),
    ((5, 3000, 9), 1, "fp32"),
    ((3, 4001, 17), -2, "fp16"),
]


@pytest.mark.parametrize("shape,dim,split", CASES)
def test_matches_reference_and_plan(shape, dim, split, dtype, rng):
    x = make(shape, dtype, rng, loc=0.5)
    y, rec = run_traced(mean.sum_div, x, dim, split=split)
    assert y.dtype == NP_DTYPE[dtype]
    assert_mean_close(y, x, dim, dtype)
    assert_cost_matches_plan(rec)
    assert rec.cost.kernels == 1 and rec.cost.workspace_bytes == 0
    n_out = int(np.prod(y.shape))
    b = x.itemsize
    assert rec.cost.gm_read_bytes == x.size * b and rec.cost.gm_write_bytes == n_out * b


@pytest.mark.parametrize("shape,dim,dtype", SPLIT_CASES)
def test_gm_split_two_kernels(shape, dim, dtype, rng):
    x = make(shape, dtype, rng, loc=0.5)
    y, rec = run_traced(mean.sum_div, x, dim)  # auto: too few tasks for 48 vector cores
    assert_mean_close(y, x, dim, dtype)
    assert_cost_matches_plan(rec)
    steps = rec.params["steps"]
    groups = steps[0]["groups"]
    assert rec.cost.kernels == 2 and rec.params["split"] == "gm" and groups > 1
    n_out = int(np.prod(y.shape))
    partial_bytes = n_out * groups * 4  # fp32 partials round-trip through GM
    b = x.itemsize
    assert rec.cost.workspace_bytes == partial_bytes
    assert rec.cost.gm_read_bytes == x.size * b + partial_bytes
    assert rec.cost.gm_write_bytes == partial_bytes + n_out * b
    # the split result is the same mean as the one-kernel path, up to summation order
    y1 = mean.sum_div(x, dim, split="ub")
    if dtype == "fp32":
        np.testing.assert_allclose(y, y1, rtol=2e-6, atol=1e-7)


def test_auto_split_gives_every_vector_core_a_task():
    p = mean.plan_sum_div((64 * 1024 * 1024,), "fp32")
    assert len(p.kernels) == 2 and p.kernels[0].tasks == A2.vector_cores
    # many rows: no split, one task per 8 short rows
    p = mean.plan_sum_div((4096, 1000), "bf16")
    assert len(p.kernels) == 1 and p.kernels[0].tasks == 4096 // 8
    assert p.cost.gm_read_bytes == 4096 * 1000 * 2 and p.cost.gm_write_bytes == 4096 * 2


def test_hand_computed_means():
    x = np.tile(np.arange(5, dtype=np.float32), (3, 1))  # rows 0..4: mean exactly 2
    np.testing.assert_array_equal(mean.sum_div(x), np.full(3, 2.0, np.float32))
    np.testing.assert_array_equal(mean.sum_div(x, 0), np.arange(5, dtype=np.float32))
    ones = np.ones((2, 3 * ROW_TILE + 5), ml_dtypes.bfloat16)  # several tiles, exact sums
    assert mean.sum_div(ones, -1, split="gm").astype(np.float32).tolist() == [1.0, 1.0]
    # fp32 sum before the division: 4096 bf16 values of 1.0 + 1/128 (whose bf16 running sum
    # would stall) average to exactly 1.0078125
    v = np.full(4096, 1.0078125, ml_dtypes.bfloat16)
    assert float(mean.sum_div(v, 0)) == 1.0078125


def test_keepdim_and_negative_dims(rng):
    x = make((4, 5, 6), "fp32", rng)
    for dim in range(-3, 3):
        y = mean.sum_div(x, dim, keepdim=True)
        assert y.shape == reference.mean(x, dim, keepdims := True).shape
        assert_mean_close(y, x, dim, "fp32", keepdim=keepdims)
    assert mean.sum_div(x, -3).shape == (5, 6)
    assert mean.sum_div(x[0, 0], 0).shape == ()


def test_two_level_tiles_on_long_rows(rng):
    """A row of 1000 with row_tile=64 is summed as 16 fp32 partials folded into the accumulator."""
    x = make((3, 1000), "fp16", rng, loc=1.0)
    y, rec = run_traced(mean.sum_div, x, -1, row_tile=64, split="ub")
    step = rec.params["steps"][0]
    assert step["col_tile"] == 64 and step["rows_per_tile"] == 1 and step["tiles_per_task"] == 16
    assert_mean_close(y, x, -1, "fp16")
    assert_cost_matches_plan(rec)
    # ops: per element add + cast in, one partial add per (row, tile), per output div + cast out
    assert rec.cost.vector_ops == 3 * 1000 * 2 + 3 * 16 + 3 * 2
    assert rec.cost.ub_peak_bytes == 64 * 2 + 64 * 4 + 8 * 4 + 16 * 2


def test_same_bits_for_one_and_two_threads(rng):
    x = make((2, 50, 2049), "fp32", rng)
    xr = make((3, 3 * ROW_TILE + 5), "fp32", rng)
    n = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = [mean.sum_div(x, 1), mean.sum_div(xr, -1), mean.sum_div(x, 1, split="gm")]
        numba.set_num_threads(n)
        two = [mean.sum_div(x, 1), mean.sum_div(xr, -1), mean.sum_div(x, 1, split="gm")]
    finally:
        numba.set_num_threads(n)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def test_non_contiguous_input_is_copied_and_counted(rng):
    base = make((6, 40), "bf16", rng)
    x = base[:, ::2]  # strided view
    y, rec = run_traced(mean.sum_div, x, -1)
    np.testing.assert_array_equal(y.view(np.uint16), mean.sum_div(np.ascontiguousarray(x), -1).view(np.uint16))
    assert rec.cost.workspace_bytes == rec.planned.workspace_bytes + x.size * 2


def test_tile_errors():
    with pytest.raises(pn.TileError, match=r"exceeds the 65536 B limit.*row_tile <= 16384"):
        mean.plan_sum_div((4, 40000), "fp32", row_tile=32768)
    with pytest.raises(pn.TileError, match=r"not a multiple of 32 B"):
        mean.plan_sum_div((4, 1000), "fp32", row_tile=100)
    with pytest.raises(pn.TileError, match=r"last dim 24 x 2 B = 48 B is not a multiple of 32 B"):
        mean.plan_sum_div((4, 10, 100), "bf16", dim=1, inner_tile=24)
    with pytest.raises(pn.TileError, match="positive integer"):
        mean.plan_sum_div((4, 10), "fp32", rows_per_task=0)
    # the 950 profile has the same 64 KiB reduction limit
    with pytest.raises(pn.TileError, match="ascend950"):
        mean.plan_sum_div((4, 40000), "fp32", row_tile=32768, profile="ascend950")


def test_bad_inputs(rng):
    x = make((4, 5), "fp32", rng)
    with pytest.raises(pn.DTypeError, match="float64"):
        mean.sum_div(x.astype(np.float64))
    with pytest.raises(pn.DTypeError, match="int32"):
        mean.sum_div(np.ones((4, 5), np.int32))
    with pytest.raises(pn.DTypeError, match="numpy array"):
        mean.sum_div([[1.0, 2.0]])
    with pytest.raises(pn.ShapeError, match="zero-size"):
        mean.sum_div(np.ones((4, 0), np.float32))
    with pytest.raises(pn.ShapeError, match="dims"):
        mean.sum_div(np.float32(3.0) * np.ones((), np.float32))
    with pytest.raises(pn.ShapeError, match=r"dim=2 is out of range .*-2\.\.1"):
        mean.sum_div(x, 2)
    with pytest.raises(pn.ShapeError, match="out of range"):
        mean.sum_div(x, -3)
    for bad in (1.0, "1", None, True):
        with pytest.raises(pn.ShapeError, match="dim must be an int"):
            mean.sum_div(x, bad)
    with pytest.raises(pn.ConstraintError, match="keepdim must be a bool"):
        mean.sum_div(x, -1, keepdim=1)
    with pytest.raises(pn.ConstraintError, match="split must be one of"):
        mean.sum_div(x, -1, split="l2")
    # all are ValueErrors, DTypeError also a TypeError
    assert issubclass(pn.DTypeError, TypeError) and issubclass(pn.ShapeError, ValueError)


def test_nan_and_inf_propagate():
    x = np.ones((3, 40), np.float32)
    x[0, 5] = np.nan
    x[1, 7] = np.inf
    y = mean.sum_div(x)
    assert np.isnan(y[0]) and y[1] == np.inf and y[2] == 1.0


def test_registered_and_plan_needs_no_data():
    names = [s.name for s in pn.strategies("mean")]
    assert "sum_div" in names
    p = mean.plan_sum_div((8, 11008), "bf16")
    assert p.cost.gm_read_bytes == 8 * 11008 * 2 and p.cost.kernels == 1
