"""softmax.whole_row / softmax.online against the float64 oracle (softmax._reference_softmax).

Tolerances: fp32 output within ``2e-5*ref + 1e-12`` (the fp32 rounding of ``x*scale + mask`` times
|v| after exp, exp's 1 ulp, and the 16-lane fp32 row sum's rounding growing with L/16); bf16/fp16
output within 1 ulp of the storage dtype of the correctly rounded reference (fp32 math, one
rounding at the end).
"""

import ml_dtypes
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import softmax
from pypto_numba.errors import TileError
from pypto_numba.precision import ulp

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

A2 = pn.load_profile("ascend910b")
COL = A2.tile("softmax_col_tile")
LONG = A2.ub_bytes // 4 + 17  # one fp32 row longer than all of UB
STRATEGIES = {"whole_row": softmax.whole_row, "online": softmax.online}
REF = softmax._reference_softmax
LENGTHS = [1, 3, 1000, 4099]


def assert_matches(y, ref, dtype):
    assert np.isfinite(y.astype(np.float32)).all()
    if dtype == "fp32":
        err = np.abs(y.astype(np.float64) - ref)
        bound = 2e-5 * ref + 1e-12
        assert np.all(err <= bound), float((err / bound).max())
    else:
        r = ref.astype(NP_DTYPE[dtype]).astype(np.float64)
        got = y.astype(np.float64)
        ulps = np.abs(got - r) / ulp(np.minimum(np.abs(r), np.abs(got)), dtype)
        assert ulps.max() <= 1.0, float(ulps.max())


def check(fn, x, dtype, copied=0, **kw):
    y, rec = run_traced(fn, x, **kw)
    assert y.shape == x.shape and y.dtype == x.dtype
    assert_matches(y, REF(x, kw.get("mask"), kw.get("scale")), dtype)
    if copied:  # a mask that had to be expanded or made contiguous: counted as workspace
        assert rec.cost.differences(rec.planned) == {"workspace_bytes": (copied, 0)}
    else:
        assert_cost_matches_plan(rec)
    return y, rec


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("length", LENGTHS)
def test_rows_match_reference_and_plan(strategy, length, dtype, rng):
    x = make((7, length), dtype, rng, scale=3.0)
    check(STRATEGIES[strategy], x, dtype)


@pytest.mark.parametrize("length", LENGTHS)
def test_online_small_col_tile_matches(length, dtype, rng):
    """Several column tiles per row, the last a tail; the max grows across tiles (ramp + noise)."""
    x = (make((5, length), "fp32", rng, scale=2.0) + np.linspace(-6, 6, length, dtype=np.float32)).astype(NP_DTYPE[dtype])
    check(softmax.online, x, dtype, col_tile=64)
    check(softmax.online, x[:, ::-1].copy(), dtype, col_tile=64)  # max found in the first tile


def test_online_row_longer_than_ub(dtype, rng):
    x = make((3, LONG), dtype, rng, scale=4.0)
    check(softmax.online, x, dtype)
    assert softmax.plan_online(x.shape, dtype).params["n_tiles"] == -(-LONG // COL)
    with pytest.raises(TileError, match=r"w_ub \[1, \d+\] = \d+ B exceeds the 65536 B .*use softmax.online"):
        softmax.whole_row(x)


def test_vocab_row_bf16(rng):
    x = make((2, 151936), "bf16", rng, scale=3.0)
    check(softmax.online, x, "bf16")


def test_higher_rank_and_mask_broadcast(rng):
    x = make((2, 3, 5, 37), "bf16", rng, scale=2.0)
    causal = np.triu(np.full((5, 37), -np.inf, np.float32), k=33)  # [S, L] broadcast over B, H
    for fn in STRATEGIES.values():
        check(fn, x, "bf16", mask=causal)
        check(fn, x, "bf16", mask=rng.standard_normal((3, 1, 37)).astype(np.float32))
        # a last dim of 1 is expanded to [Rm, L] fp32 rows before the kernel (workspace)
        check(fn, x, "bf16", copied=2 * 5 * 37 * 4, mask=rng.standard_normal((2, 1, 5, 1)).astype(np.float32))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_mask_scale_and_fully_masked_rows(strategy, dtype, rng):
    x = make((6, 1000), dtype, rng, scale=3.0)
    mask = (rng.standard_normal((6, 1000)) * 0.5).astype(np.float32)
    mask[1] = -np.inf  # fully masked row
    mask[2, :999] = -np.inf  # one survivor: exactly 1
    mask[3, 500:] = -np.inf
    kw = dict(col_tile=128) if strategy == "online" else {}
    y, _ = check(STRATEGIES[strategy], x, dtype, mask=mask, scale=0.125, **kw)
    assert (y[1].astype(np.float32) == 0).all()
    assert y[2, 999] == 1 and (y[2, :999].astype(np.float32) == 0).all()
    assert (y[3, 500:].astype(np.float32) == 0).all()


def test_scale_only(dtype, rng):
    x = make((4, 333), dtype, rng, scale=1.0)
    for fn in STRATEGIES.values():
        check(fn, x, dtype, scale=1 / np.sqrt(128))
        check(fn, x, dtype, scale=-3)


def test_strategies_same_bits_when_row_fits_one_tile(dtype, rng):
    x = make((9, 4099), dtype, rng, scale=3.0)
    mask = rng.standard_normal((1, 4099)).astype(np.float32)
    a = softmax.whole_row(x, mask=mask, scale=0.5)
    b = softmax.online(x, mask=mask, scale=0.5)
    assert np.array_equal(a.view(np.uint8), b.view(np.uint8))


def test_deterministic_across_calls_and_row_tiles(rng):
    x = make((33, 3000), "fp32", rng, scale=3.0)
    ref = softmax.online(x, col_tile=256)
    for _ in range(3):
        assert np.array_equal(softmax.online(x, col_tile=256), ref)
    assert np.array_equal(softmax.online(x, col_tile=256, row_tile=1), ref)
    w = softmax.whole_row(x)
    assert np.array_equal(softmax.whole_row(x, row_tile=1), w)
    assert np.array_equal(softmax.whole_row(x), w)


def test_rows_sum_to_one(rng):
    x = make((64, 4096), "fp32", rng, scale=5.0)
    for fn in STRATEGIES.values():
        s = fn(x).astype(np.float64).sum(axis=-1)
        assert np.abs(s - 1).max() < 1e-5


def test_plans_gm_bytes_and_tiles():
    n = 8192 * 4096
    w = softmax.plan_whole_row((8192, 4096), "bf16")
    assert (w.cost.gm_read_bytes, w.cost.gm_write_bytes, w.cost.kernels) == (2 * n, 2 * n, 1)
    assert w.params["rows_per_task"] == 4  # 8 rows clamped: 4 x 4096 x 4 B = 64 KiB
    o = softmax.plan_online((8192, 4096), "bf16", has_mask=True)
    assert (o.cost.gm_read_bytes, o.cost.gm_write_bytes) == (2 * (2 * n + 4 * n), 2 * n)
    v = softmax.plan_online((16, 151936), "fp32")
    assert v.params["n_tiles"] == -(-151936 // COL)
    with pytest.raises(TileError, match="use softmax.online"):
        softmax.plan_whole_row((16, 151936), "fp32")
    # bf16 with a mask at 16384: 16384 x (2 + 4 + 4 + 2) B = all of the physical UB, above the
    # compiler-safe Vec limit (npu-facts 8.1), so refused; without the mask it fits
    with pytest.raises(TileError, match=r"needs 196608 B of UB .* allows 188416 B .*use softmax.online"):
        softmax.plan_whole_row((1, 16384), "bf16", has_mask=True)
    assert softmax.plan_whole_row((1, 16384), "bf16").cost.ub_peak_bytes == 16384 * (2 + 4 + 2)


def test_advise_picks_whole_row_then_online():
    a = pn.advise("softmax", shape=(32, 4096), dtype="bf16")
    assert a.chosen == "whole_row"
    b = pn.advise("softmax", shape=(16, 151936), dtype="bf16")
    assert b.chosen == "online"


def test_compare_passes(rng):
    x = make((8, 1000), "bf16", rng, scale=2.0)
    c = pn.compare("softmax", x, repeats=1)
    assert [r.verdict for r in c.rows] == ["PASS", "PASS"], c.to_table()


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_out_separate_and_in_place_give_the_same_bits(strategy, dtype, rng):
    """out= (a separate array, or x itself) gets the bits of the call that allocates, with a mask
    and a scale and column tiles; a large out= streams its lines (the same bits); bad out= and an
    out overlapping the mask are refused."""
    fn = STRATEGIES[strategy]
    kw = dict(col_tile=256) if strategy == "online" else {}
    for shape in ((5, 1000), (300, 4099)):  # the second one is large enough to stream
        x = make(shape, dtype, rng, scale=3.0)
        mask = (rng.standard_normal(shape[-1:]) * 0.5).astype(np.float32)
        want = fn(x, mask=mask, scale=0.5, **kw)
        out = np.full_like(x, 7)
        assert fn(x, mask=mask, scale=0.5, out=out, **kw) is out
        assert np.array_equal(out.view(np.uint8), want.view(np.uint8))
        y = x.copy()
        assert fn(y, mask=mask, scale=0.5, out=y, **kw) is y
        assert np.array_equal(y.view(np.uint8), want.view(np.uint8))
    x = make((4, 64), dtype, rng)
    with pytest.raises(pn.PyptoNumbaError, match="dtype"):
        fn(x, out=np.empty((4, 64), np.float64))
    with pytest.raises(pn.PyptoNumbaError, match="shape"):
        fn(x, out=np.empty_like(x)[:, :32])
    with pytest.raises(pn.PyptoNumbaError, match="overlaps x partially"):
        big = np.zeros((5, 64), x.dtype)
        big[:4] = x
        fn(big[:4], out=big[1:])
    if dtype == "fp32":
        m = np.zeros((4, 64), np.float32)
        with pytest.raises(pn.PyptoNumbaError, match="overlaps the mask"):
            fn(x, mask=m, out=m)
