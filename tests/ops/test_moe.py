"""moe.sigmoid_gating / moe.softmax_gating / moe.combine against the float64 oracles.

How ids are compared with a float64 reference
---------------------------------------------
The kernels rank the fp32 scores they computed (as the NPU's fp32 topk does), the oracle ranks
float64 scores. Two experts whose float64 selection scores differ by less than the fp32 rounding
bound ``TOL`` may legitimately come out in either order. So for every row we look at the float64
scores that decide the result: the sorted group scores down to the (topk_group+1)-th, and the
sorted eligible selection scores down to the (top_k+1)-th. A row is *separated* when every gap
between neighbours there is either exactly 0 (a true tie: equal inputs give equal fp32 scores, and
both sides break it toward the lower index) or larger than ``TOL``. On separated rows the ids must
equal the oracle's exactly. On every row, the picked experts' float64 selection scores must match
the oracle's sorted top-k scores within ``TOL`` (the set is optimal up to rounding), and the
weights must equal the float64 formula evaluated on the kernel's own ids. Each test also asserts
that most rows are separated, so the exact check is never vacuous.

``TOL = 1e-6``: the fp32 selection score carries the sigmoid/exp error of the vector unit
(<= 6e-8 abs, machine/vmath.py), one fp32 rounding of s (<= 6e-8) and of s + bias (<= 1.2e-7 for
|sel| < 2), doubled for a top-2 group sum: < 5e-7; softmax probabilities are < 1 with a few-ulp
relative error. 1e-6 is that bound with a margin of 2.
"""

from __future__ import annotations

import re

import ml_dtypes
import numba
import numpy as np
import pytest

import pypto_numba as pn
import pypto_numba.moe as moe
from pypto_numba import reference

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

TOL = 1e-6
W_RTOL, W_ATOL = 2e-5, 1e-6  # fp32 weights: a few fp32 roundings of values <= routed scale


def _f64_scores(logits, bias, softmax):
    x = reference.f64(logits)
    if softmax:
        p = np.exp(x - x.max(axis=-1, keepdims=True))
        return p / p.sum(axis=-1, keepdims=True), None
    s = 1.0 / (1.0 + np.exp(-x))
    return s, s + (reference.f64(bias)[None, :] if bias is not None else 0.0)


def _separated(sorted_desc, count):
    """Rows whose first ``count + 1`` sorted scores have gaps that are 0 or > TOL."""
    head = sorted_desc[:, : count + 1]
    gaps = head[:, :-1] - head[:, 1:]
    return np.all((gaps == 0) | (gaps > TOL), axis=1)


def check_gating(weights, ids, logits, top_k, *, softmax=False, bias=None, n_group=1, topk_group=1,
                 group_score="max", renormalize=None, scale=1.0, eps=1e-20, min_separated=0.9):
    """Full comparison with the oracle (see the module docstring). Returns the separated mask."""
    T, E = logits.shape
    if renormalize is None:
        renormalize = not softmax
    assert weights.dtype == np.float32 and weights.shape == (T, top_k)
    assert ids.dtype == np.int32 and ids.shape == (T, top_k)
    if softmax:
        ref_w, ref_ids = reference.moe_softmax_gating(logits, top_k, renormalize, scale, n_group,
                                                      topk_group, group_score)
    else:
        ref_w, ref_ids = reference.moe_sigmoid_gating(logits, top_k, bias, n_group, topk_group,
                                                      group_score, renormalize, scale, eps)
    s, sel = _f64_scores(logits, bias, softmax)
    if sel is None:
        sel = s
    ok = np.ones(T, bool)
    if n_group > 1:
        grouped = sel.reshape(T, n_group, E // n_group)
        gs = grouped.max(-1) if group_score == "max" else np.sort(grouped, -1)[..., -2:].sum(-1)
        ok &= _separated(-np.sort(-gs, axis=1), topk_group)
    masked = reference.moe_group_filter(sel, n_group, topk_group, group_score)
    top_sorted = -np.sort(-masked, axis=1)
    ok &= _separated(top_sorted, min(top_k, top_sorted.shape[1] - 1))
    assert ok.mean() >= min_separated, f"only {ok.mean():.2%} of rows are separated: test too weak"
    # exact ids where the ranking is decided by more than rounding
    np.testing.assert_array_equal(ids[ok], ref_ids[ok])
    # everywhere: distinct valid experts, an optimal set up to rounding, weights by the formula
    assert ids.min() >= 0 and ids.max() < E
    assert all(len(set(r)) == top_k for r in ids.tolist())
    picked = np.take_along_axis(masked, ids.astype(np.int64), axis=1)
    np.testing.assert_allclose(picked, top_sorted[:, :top_k], rtol=0, atol=TOL)
    w = np.take_along_axis(s, ids.astype(np.int64), axis=1)
    if renormalize:
        w = w / (w.sum(axis=1, keepdims=True) + (0.0 if softmax else eps))
    np.testing.assert_allclose(weights, w * scale, rtol=W_RTOL, atol=W_ATOL)
    np.testing.assert_allclose(weights[ok], ref_w[ok], rtol=W_RTOL, atol=W_ATOL)
    return ok


def uniform(shape, dtype, rng, low=0.0, high=2.0):
    return rng.uniform(low, high, shape).astype(np.float32).astype(NP_DTYPE[dtype])


# ---------------------------------------------------------------------------------------------
# PyPTO's moe_gating_topk cases (npu-facts 1.3): (k, k_group, groups, mode, norm, scale, bs, E),
# inputs uniform[0, 2), tolerance rtol = atol = 5e-3 on weights (we also hold the tighter checks
# of check_gating). norm_type sigmoid renormalises with eps; softmax does not renormalise.
# The softmax case has groups: softmax_gating takes the same n_group/topk_group/group_score
# options, so it maps onto the API directly. PyPTO's kernel masks non-selected groups with 0.0
# and its reference with -inf; with positive scores (sigmoid without bias, softmax) both agree.

PYPTO_CASES = [
    (2, 1, 1, 0, "sigmoid", 1.0, 32, 16),
    (4, 1, 4, 0, "sigmoid", 1.0, 64, 32),
    (4, 2, 4, 1, "softmax", 1.0, 128, 64),
    (8, 2, 8, 0, "sigmoid", 2.0, 256, 128),
]


@pytest.mark.parametrize("case", PYPTO_CASES, ids=lambda c: f"k{c[0]}_g{c[2]}_{c[4]}_E{c[7]}")
def test_pypto_moe_gating_topk_cases(case, rng):
    k, k_group, groups, mode, norm, scale, bs, E = case
    logits = uniform((bs, E), "fp32", rng)
    group_score = ("max", "top2_sum")[mode]
    if norm == "sigmoid":
        w, ids = moe.sigmoid_gating(logits, k, n_group=groups, topk_group=k_group, group_score=group_score,
                                    routed_scaling_factor=scale)
        ref_w, ref_ids = reference.moe_sigmoid_gating(logits, k, None, groups, k_group, group_score, True, scale)
    else:
        w, ids = moe.softmax_gating(logits, k, n_group=groups, topk_group=k_group, group_score=group_score,
                                    routed_scaling_factor=scale)
        ref_w, ref_ids = reference.moe_softmax_gating(logits, k, False, scale, groups, k_group, group_score)
    check_gating(w, ids, logits, k, softmax=norm == "softmax", n_group=groups, topk_group=k_group,
                 group_score=group_score, scale=scale)
    np.testing.assert_allclose(w, ref_w, rtol=5e-3, atol=5e-3)  # PyPTO's own tolerance
    assert (ids == ref_ids).mean() > 0.99


# ---------------------------------------------------------------------------------------------
# model routers, odd T (77 = 2 full token tiles + a tail of 13), every storage dtype


T_ODD = 77


def test_deepseek_v3(dtype, rng):
    E = 256
    logits = make((T_ODD, E), dtype, rng)
    bias = (rng.standard_normal(E) * 0.05).astype(np.float32)  # e_score_correction_bias, fp32
    opts = dict(bias=bias, n_group=8, topk_group=4, routed_scaling_factor=2.5)
    (w, ids), rec = run_traced(moe.sigmoid_gating, logits, 8, **opts)
    assert_cost_matches_plan(rec)
    check_gating(w, ids, logits, 8, bias=bias, n_group=8, topk_group=4, scale=2.5)
    # only experts of 4 groups, at most 4 distinct groups per row
    assert max(len(set((r // 32).tolist())) for r in ids) <= 4


def test_deepseek_top2_sum_groups(rng):
    E = 256
    logits = make((T_ODD, E), "fp32", rng)
    bias = (rng.standard_normal(E) * 0.05).astype(np.float32)
    w, ids = moe.sigmoid_gating(logits, 8, bias=bias, n_group=8, topk_group=4, group_score="top2_sum",
                                routed_scaling_factor=2.5)
    check_gating(w, ids, logits, 8, bias=bias, n_group=8, topk_group=4, group_score="top2_sum", scale=2.5)


def test_glm45(dtype, rng):
    E = 160
    logits = make((T_ODD, E), dtype, rng)
    bias = (rng.standard_normal(E) * 0.05).astype(ml_dtypes.bfloat16)  # GLM keeps the bias in bf16
    (w, ids), rec = run_traced(moe.sigmoid_gating, logits, 8, bias=bias, routed_scaling_factor=2.5)
    assert_cost_matches_plan(rec)
    check_gating(w, ids, logits, 8, bias=bias, scale=2.5)


def test_mixtral(dtype, rng):
    logits = make((T_ODD, 8), dtype, rng, scale=2.0)
    (w, ids), rec = run_traced(moe.softmax_gating, logits, 2, renormalize=True)
    assert_cost_matches_plan(rec)
    check_gating(w, ids, logits, 2, softmax=True, renormalize=True)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, rtol=1e-6)


def test_qwen3_moe(dtype, rng):
    logits = make((T_ODD, 128), dtype, rng, scale=2.0)
    (w, ids), rec = run_traced(moe.softmax_gating, logits, 8, renormalize=True)
    assert_cost_matches_plan(rec)
    check_gating(w, ids, logits, 8, softmax=True, renormalize=True)


def test_softmax_without_renormalize_and_scaled(rng):
    logits = make((40, 64), "fp32", rng, scale=3.0)
    w, ids = moe.softmax_gating(logits, 6, routed_scaling_factor=1.7)
    check_gating(w, ids, logits, 6, softmax=True, renormalize=False, scale=1.7)


def test_sigmoid_options_eps_and_no_renormalize(rng):
    logits = make((50, 32), "fp32", rng)
    w, ids = moe.sigmoid_gating(logits, 4, eps=0.5)  # a large eps is visible in the weights
    check_gating(w, ids, logits, 4, eps=0.5)
    assert np.all(w.sum(axis=1) < 0.9)
    w, ids = moe.sigmoid_gating(logits, 4, renormalize=False, routed_scaling_factor=3.0)
    check_gating(w, ids, logits, 4, renormalize=False, scale=3.0)


def test_bf16_logits_have_exact_ties(rng):
    """bf16 logits repeat values; equal scores must go to the lower index like the oracle."""
    logits = uniform((64, 256), "bf16", rng)
    assert np.mean([len(np.unique(r)) for r in logits.astype(np.float32)]) < 200  # many exact duplicates per row
    w, ids = moe.sigmoid_gating(logits, 8, n_group=8, topk_group=4)
    ok = check_gating(w, ids, logits, 8, n_group=8, topk_group=4)
    assert ok.mean() > 0.95


@pytest.mark.parametrize("E, k, n_group, topk_group, group_score", [
    (10, 3, 2, 1, "top2_sum"),  # odd group size 5
    (36, 5, 4, 3, "max"),       # odd group size 9, 2*topk_group >= k
    (36, 7, 4, 3, "top2_sum"),  # 2*topk_group < k: no floor
    (45, 9, 9, 4, "max"),       # E not a multiple of 4 or 8
    (7, 7, 1, 1, "max"),        # top_k = E
])
def test_odd_sizes_sigmoid(E, k, n_group, topk_group, group_score, rng):
    logits = make((37, E), "fp32", rng)
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    opts = dict(n_group=n_group, topk_group=topk_group, group_score=group_score)
    (w, ids), rec = run_traced(moe.sigmoid_gating, logits, k, bias=bias, **opts)
    assert_cost_matches_plan(rec)
    check_gating(w, ids, logits, k, bias=bias, **opts)


@pytest.mark.parametrize("E, k", [(3, 1), (13, 4), (70, 9)])
def test_odd_sizes_softmax(E, k, rng):
    logits = make((37, E), "fp16", rng, scale=3.0)
    w, ids = moe.softmax_gating(logits, k, renormalize=True)
    check_gating(w, ids, logits, k, softmax=True, renormalize=True)


def test_other_profile(rng):
    logits = make((40, 256), "fp32", rng)
    (w, ids), rec = run_traced(moe.sigmoid_gating, logits, 8, n_group=8, topk_group=4, profile="ascend950")
    assert rec.profile == "ascend950"
    assert_cost_matches_plan(rec)
    check_gating(w, ids, logits, 8, n_group=8, topk_group=4)


# ---------------------------------------------------------------------------------------------
# hand-built ties and ordering


def test_ties_go_to_lower_index():
    logits = np.array([[1.0, 3.0, 3.0, 2.0, 3.0, 0.0, 3.0, 1.0]], np.float32)
    w, ids = moe.sigmoid_gating(logits, 3)
    assert ids.tolist() == [[1, 2, 4]]
    np.testing.assert_allclose(w, 1 / 3, rtol=1e-6)
    w, ids = moe.softmax_gating(logits, 5)
    assert ids.tolist() == [[1, 2, 4, 6, 3]]
    flat = np.zeros((3, 16), np.float32)
    for fn in (moe.sigmoid_gating, moe.softmax_gating):
        w, ids = fn(flat, 4)
        assert ids.tolist() == [[0, 1, 2, 3]] * 3


def test_group_ties_go_to_lower_group():
    # 4 groups of 2 whose maxima are all equal: groups 0 and 1 win; inside, the higher score first
    logits = np.array([[0.0, 1.0, 1.0, 0.5, 1.0, 0.9, 0.2, 1.0]], np.float32)
    w, ids = moe.sigmoid_gating(logits, 3, n_group=4, topk_group=2)
    assert ids.tolist() == [[1, 2, 3]]
    # top-2 sums: groups (1.0), (1.5), (1.9), (1.2) -> groups 2 and 1
    w, ids = moe.sigmoid_gating(logits, 4, n_group=4, topk_group=2, group_score="top2_sum")
    assert sorted(ids[0].tolist()) == [2, 3, 4, 5] and ids[0, :2].tolist() == [2, 4]


def test_selection_by_biased_score_weights_from_unbiased():
    logits = np.array([[2.0, 0.0, -1.0, -3.0]], np.float32)
    bias = np.array([0.0, 1.0, 0.0, 0.0], np.float32)
    w, ids = moe.sigmoid_gating(logits, 2, bias=bias, routed_scaling_factor=2.0)
    assert ids.tolist() == [[1, 0]]  # sel = [0.88, 1.5, 0.27, 0.05]: expert 1 first
    s = 1 / (1 + np.exp(-np.array([0.0, 2.0])))
    np.testing.assert_allclose(w[0], s / s.sum() * 2.0, rtol=1e-6)
    assert w[0, 0] < w[0, 1]  # ordered by selection score, not by weight


def test_threads_do_not_change_results(rng):
    logits = make((200, 256), "bf16", rng)
    bias = (rng.standard_normal(256) * 0.05).astype(np.float32)
    opts = dict(bias=bias, n_group=8, topk_group=4, routed_scaling_factor=2.5)
    w2, i2 = moe.sigmoid_gating(logits, 8, **opts)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        w1, i1 = moe.sigmoid_gating(logits, 8, **opts)
    finally:
        numba.set_num_threads(before)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_array_equal(w1, w2)


# ---------------------------------------------------------------------------------------------
# combine


@pytest.mark.parametrize("shape", [(45, 8, 300), (3, 2, 16)])
def test_combine(dtype, rng, shape):
    T, K, H = shape
    x = make(shape, dtype, rng)
    w = rng.uniform(0, 1, (T, K)).astype(np.float32)
    out, rec = run_traced(moe.combine, x, w)
    assert_cost_matches_plan(rec)
    assert out.dtype == x.dtype and out.shape == (T, H)
    ref = reference.moe_combine(x, w)
    # fp32 accumulation (error ~1e-7 x sum|terms|), then one rounding to the storage dtype
    half_ulp = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}[dtype]
    np.testing.assert_allclose(out.astype(np.float64), ref, rtol=1.01 * half_ulp + 1e-6, atol=1e-5)


def test_combine_bf16_weights_and_gating_output(rng):
    logits = make((33, 64), "fp32", rng)
    w, ids = moe.sigmoid_gating(logits, 4)
    x = make((33, 4, 40), "fp32", rng)
    np.testing.assert_allclose(moe.combine(x, w), reference.moe_combine(x, w), rtol=1e-5, atol=1e-6)
    wb = w.astype(ml_dtypes.bfloat16)
    np.testing.assert_allclose(moe.combine(x, wb), reference.moe_combine(x, wb), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------
# costs and tiles


def test_cost_formulas_odd_T(rng):
    T, E = 77, 256
    logits = make((T, E), "bf16", rng)
    bias = np.zeros(E, ml_dtypes.bfloat16)
    _, rec = run_traced(moe.sigmoid_gating, logits, 8, bias=bias, n_group=8, topk_group=4)
    assert_cost_matches_plan(rec)
    tasks = 3  # ceil(77 / 32)
    c = rec.cost
    assert (c.kernels, c.tasks) == (1, tasks)
    assert c.gm_read_bytes == T * E * 2 + tasks * E * 2
    assert c.gm_write_bytes == T * 8 * 8
    # per row: cast E, sigmoid 4E, bias E, group max E, group top-k 8, mask E, top-k E,
    # gather 8, scale 8, renormalise 2*8+1
    assert c.vector_ops == T * (E + 4 * E + E + E + 8 + E + E + 8 + 8 + 17)
    _, rec = run_traced(moe.sigmoid_gating, logits, 8, bias=bias, n_group=8, topk_group=4, token_tile=5)
    assert_cost_matches_plan(rec)
    assert rec.cost.tasks == 16
    x = make((45, 8, 300), "fp16", rng)
    _, rec = run_traced(moe.combine, x, np.ones((45, 8), np.float32), h_tile=64)
    assert_cost_matches_plan(rec)
    assert rec.cost.tasks == 2 * 5  # ceil(45/32) x ceil(300/64)
    assert rec.cost.gm_read_bytes == 45 * 8 * 300 * 2 + 5 * 45 * 8 * 4
    assert rec.cost.gm_write_bytes == 45 * 300 * 2


def test_tile_error_merge_sort_limit():
    # 5632 x 4 B = 22528 B is not < 22528 B (strict) -- no token tile helps
    with pytest.raises(pn.TileError, match=r"MERGE_SORT.*22528 B.*E must be <= 5624"):
        moe.plan_sigmoid_gating((4, 5632), "fp32", top_k=8, token_tile=1)
    with pytest.raises(pn.TileError, match="MERGE_SORT"):
        moe.plan_softmax_gating((4, 6000), "bf16", top_k=2, token_tile=1)
    moe.plan_sigmoid_gating((4, 5624), "fp32", top_k=8, token_tile=1)  # 22496 B < 22528 B


@pytest.mark.parametrize("fn, shape, opts", [
    (moe.plan_sigmoid_gating, (64, 4096), {}),  # UB: 32 rows x 4096 x (4 + 4) B > 192 KiB
    (moe.plan_softmax_gating, (64, 1024), {}),  # the [32, 1024] fp32 reduction tile > 64 KiB
    (moe.plan_sigmoid_gating, (64, 1024), {"n_group": 8, "topk_group": 4}),  # group reduce
])
def test_tile_error_suggests_a_token_tile_that_fits(fn, shape, opts):
    with pytest.raises(pn.TileError, match=r"use token_tile <= \d+") as info:
        fn(shape, "fp32", top_k=8, **opts)
    good = int(re.search(r"token_tile <= (\d+)", str(info.value)).group(1))
    plan = fn(shape, "fp32", top_k=8, token_tile=good, **opts)
    assert plan.cost.ub_peak_bytes <= plan.profile.ub_bytes
    with pytest.raises(pn.TileError):
        fn(shape, "fp32", top_k=8, token_tile=good + 1, **opts)


def test_tile_errors_combine_and_bad_tiles():
    with pytest.raises(pn.TileError, match=r"use h_tile <= \d+"):
        moe.plan_combine((64, 8, 4096), "fp32", h_tile=1024)
    with pytest.raises(pn.TileError, match="multiple of 32 B"):
        moe.plan_combine((64, 8, 4096), "fp32", h_tile=100)
    with pytest.raises(pn.TileError, match="token_tile must be a positive integer"):
        moe.plan_sigmoid_gating((8, 16), top_k=2, token_tile=0)


# ---------------------------------------------------------------------------------------------
# bad input


def _logits(T=4, E=16):
    return np.zeros((T, E), np.float32)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(top_k=0), pn.ConstraintError, r"top_k=0 must be in \[1, 16\]"),
    (dict(top_k=17), pn.ConstraintError, r"top_k=17 must be in \[1, 16\]"),
    (dict(top_k=5, n_group=4, topk_group=1), pn.ConstraintError, r"top_k=5.*4 eligible experts"),
    (dict(top_k=2.0), pn.ConstraintError, "top_k must be an int"),
    (dict(top_k=2, n_group=3), pn.ConstraintError, "n_group=3 does not divide E=16"),
    (dict(top_k=2, n_group=4, topk_group=5), pn.ConstraintError, r"topk_group=5 must be in \[1, 4\]"),
    (dict(top_k=2, n_group=4, topk_group=0), pn.ConstraintError, r"topk_group=0 must be in \[1, 4\]"),
    (dict(top_k=2, n_group=4, group_score="sum"), pn.ConstraintError, "group_score must be one of"),
    (dict(top_k=2, n_group=16, topk_group=2, group_score="top2_sum"), pn.ConstraintError,
     "at least 2 experts per group"),
    (dict(top_k=2, bias=np.zeros(15, np.float32)), pn.ShapeError, r"bias must have shape \(16,\)"),
    (dict(top_k=2, bias=np.zeros((1, 16), np.float32)), pn.ShapeError, "bias must have 1 dims"),
    (dict(top_k=2, bias=np.zeros(16)), pn.DTypeError, "bias has dtype float64"),
    (dict(top_k=2, bias=np.zeros(16, np.int32)), pn.DTypeError, "bias has dtype int32"),
    (dict(top_k=2, bias=np.full(16, np.nan, np.float32)), pn.ConstraintError, "bias has non-finite"),
    (dict(top_k=2, routed_scaling_factor=np.inf), pn.ConstraintError, "routed_scaling_factor"),
    (dict(top_k=2, eps=-1.0), pn.ConstraintError, "eps=-1.0 must be a finite number >= 0"),
    (dict(top_k=2, renormalize=1), pn.ConstraintError, "renormalize must be True or False"),
])
def test_sigmoid_bad_options(kwargs, error, match):
    top_k = kwargs.pop("top_k")
    with pytest.raises(error, match=match):
        moe.sigmoid_gating(_logits(), top_k, **kwargs)


@pytest.mark.parametrize("fn", [moe.sigmoid_gating, moe.softmax_gating])
def test_bad_logits(fn):
    with pytest.raises(pn.DTypeError, match="float64"):
        fn(np.zeros((4, 16)), 2)
    with pytest.raises(pn.DTypeError, match="int32"):
        fn(np.zeros((4, 16), np.int32), 2)
    with pytest.raises(pn.DTypeError, match="numpy array"):
        fn([[0.0] * 16], 2)
    with pytest.raises(pn.ShapeError, match="logits must have 2 dims"):
        fn(np.zeros(16, np.float32), 2)
    with pytest.raises(pn.ShapeError, match="zero-size"):
        fn(np.zeros((0, 16), np.float32), 2)
    with pytest.raises(pn.ConstraintError, match="top_k=9 must be in"):
        fn(np.zeros((4, 8), np.float32), 9)
    bad = np.zeros((4, 16), np.float32)
    bad[2, 5] = np.nan
    with pytest.raises(pn.ConstraintError, match="logits row 2"):
        fn(bad, 2)


def test_infinite_logits():
    x = np.zeros((2, 8), np.float32)
    x[0, 3] = np.inf
    x[1, 6] = -np.inf
    w, ids = moe.sigmoid_gating(x, 2)  # sigmoid saturates: inf -> 1, -inf -> 0
    assert ids[0, 0] == 3 and 6 not in ids[1]
    with pytest.raises(pn.ConstraintError, match="logits row 0"):
        moe.softmax_gating(x, 2)


def test_combine_bad_input():
    x = np.zeros((4, 2, 16), np.float32)
    with pytest.raises(pn.ShapeError, match=r"weights must have shape \(4, 2\)"):
        moe.combine(x, np.zeros((4, 3), np.float32))
    with pytest.raises(pn.ShapeError, match="expert_out must have 3 dims"):
        moe.combine(np.zeros((4, 16), np.float32), np.zeros((4, 2), np.float32))
    with pytest.raises(pn.DTypeError, match="float64"):
        moe.combine(x.astype(np.float64), np.zeros((4, 2), np.float32))
    with pytest.raises(pn.DTypeError, match="int64"):
        moe.combine(x, np.zeros((4, 2), np.int64))


def test_non_contiguous_logits_are_copied_and_counted(rng):
    base = make((40, 64), "fp32", rng)
    logits = base[:, ::2]  # [40, 32], strided
    (w, ids), rec = run_traced(moe.sigmoid_gating, logits, 4)
    assert rec.cost.workspace_bytes == 40 * 32 * 4
    check_gating(w, ids, np.ascontiguousarray(logits), 4)


def test_registered():
    names = [s.name for s in pn.strategies("moe")]
    assert {"sigmoid_gating", "softmax_gating", "combine"} <= set(names)
