"""PyPTO's comparators as tolerance policies (npu-facts 8.3): allclose_ratio, reldiff, distribution,
valid_rows / zero_tail, and the tie-aware MoE id comparison, against hand-computed cases."""

import math

import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import precision
from pypto_numba.cli import main

# --- reldiff -------------------------------------------------------------------------------------


def test_rdiff_hand_computed_floored_denominator():
    act = np.array([1.02, 0.015, 0.005, 100.5, 0.006])
    exp = np.array([1.0, 0.0, 0.0, 100.0, -0.006])
    floor = 2.0**-14 / 0.01  # 0.006103515625
    want = [0.02 / (1.02 + 1e-9),          # |d| >= diff_thd: divided by max(|a|, |e|) + 1e-9
            0.015 / (0.015 + 1e-9),        # zero golden: still divided by |a|
            0.005,                         # |d| < diff_thd: the absolute difference itself
            0.5 / (100.5 + 1e-9),
            0.012 / (floor + 1e-9)]        # both under the floor: the floor is the denominator
    np.testing.assert_allclose(precision.rdiff(act, exp), want, rtol=1e-12)


def test_reldiff_counts_points_over_diff_thd_against_pct_thd():
    exp = np.ones(40)
    act = exp.copy()
    act[:2] = 1.5  # rdiff 0.5/1.5 = 0.33 > 0.01: 2/40 = 5 % <= pct_thd 5 %
    res = precision.evaluate(act, exp, "bf16", "reldiff")
    assert res.passed and res.bad == 2 and (res.rtol, res.atol) == (0.01, 0.05)
    act[2] = 1.5  # 3/40 = 7.5 %
    res = precision.evaluate(act, exp, "bf16", "reldiff")
    assert not res.passed and res.bad == 3
    assert precision.evaluate(act, exp, "bf16", "reldiff", pct_thd=0.1).passed
    # max_diff_hd: the worst bad rdiff (0.333) must stay under it
    assert not precision.evaluate(act, exp, "bf16", "reldiff", pct_thd=0.1, max_diff_hd=0.3).passed
    assert precision.evaluate(act, exp, "bf16", "reldiff", pct_thd=0.1, max_diff_hd=0.4).passed
    # diff_thd=0.5: rdiff 0.333 < 0.5, nothing is bad; an op's rtol/atol do not apply to reldiff
    res = precision.evaluate(act, exp, "bf16", "reldiff", 1e-9, 1e-9, diff_thd=0.5)
    assert res.passed and res.bad == 0 and res.rtol == 0.5
    assert "diff_thd=0.5" in str(res)


def test_reldiff_nan_and_inf_always_fail():
    exp = np.ones(1000)
    for bad in (np.nan, np.inf):
        act = exp.copy()
        act[7] = bad  # one point in 1000 is well inside pct_thd, but NaN/Inf always fail
        assert not precision.evaluate(act, exp, "fp32", "reldiff").passed
    both = np.ones(1000)
    both[3] = np.nan  # NaN in both: allclose calls it equal, reldiff does not
    assert precision.evaluate(both, both, "fp32", "allclose").passed
    assert not precision.evaluate(both, both, "fp32", "reldiff").passed
    inf = np.ones(10)
    inf[0] = np.inf
    assert not precision.evaluate(inf, inf, "fp32", "reldiff").passed


# --- allclose_ratio ------------------------------------------------------------------------------


def test_allclose_ratio_is_the_ratio_not_gyms_rounded_count():
    exp = np.ones(300)
    act = exp.copy()
    act[:2] = 2.0  # 2/300 = 0.67 % > 0.5 %; gym's round(0.005 * 300) = round(1.5) = 2 lets it pass
    res = precision.evaluate(act, exp, "fp32", "allclose_ratio")
    assert not res.passed and (res.bad, res.allowed) == (2, 1)
    assert precision.evaluate(act, exp, "fp32", "outlier").passed
    act[1] = 1.0
    assert precision.evaluate(act, exp, "fp32", "allclose_ratio").passed  # 1/300 <= 0.5 %
    assert not precision.evaluate(act, exp, "fp32", "allclose").passed


def test_allclose_ratio_nan_is_one_failing_point_outlier_fails_outright():
    exp = np.ones(400)
    act = exp.copy()
    act[0] = np.nan  # 1/400 = 0.25 %
    assert precision.evaluate(act, exp, "fp32", "allclose_ratio").passed
    assert not precision.evaluate(act, exp, "fp32", "outlier").passed
    act[1] = np.inf
    act[2] = -np.inf  # 3/400 = 0.75 %
    assert not precision.evaluate(act, exp, "fp32", "allclose_ratio").passed


def test_allclose_ratio_uses_the_elementwise_tolerance():
    rtol, atol = precision.tolerances("allclose_ratio", "bf16")
    assert (rtol, atol) == (2.0**-7, 1e-4)
    exp = np.full(10, 2.0)
    act = exp + (atol + rtol * 2.0) * 0.99  # just inside atol + rtol*|e| everywhere
    assert precision.evaluate(act, exp, "bf16", "allclose_ratio").passed
    act[0] = 2.0 + (atol + rtol * 2.0) * 1.01  # 1/10 over: 10 % > 0.5 %
    assert not precision.evaluate(act, exp, "bf16", "allclose_ratio").passed


# --- valid_rows / zero_tail ----------------------------------------------------------------------


def test_valid_rows_drops_the_packed_tail():
    exp = np.ones((4, 50))
    act = exp.copy()
    act[3] = 7.0  # rows 3.. are the inactive tail
    assert not precision.evaluate(act, exp, "fp32", "allclose_ratio").passed
    res = precision.evaluate(act, exp, "fp32", "allclose_ratio", valid_rows=3)
    assert res.passed and res.numel == 150 and res.tail_nonzero == 50
    # zero_tail: the dropped tail must be all zeros
    assert not precision.evaluate(act, exp, "fp32", "allclose_ratio", valid_rows=3, zero_tail=True).passed
    act[3] = 0.0
    act[3, 5] = np.nan  # NaN is not zero
    res = precision.evaluate(act, exp, "fp32", "allclose_ratio", valid_rows=3, zero_tail=True)
    assert not res.passed and res.tail_nonzero == 1
    act[3, 5] = 0.0
    assert precision.evaluate(act, exp, "fp32", "allclose_ratio", valid_rows=3, zero_tail=True).passed
    # every policy takes them, and valid_axis picks the axis
    act[3] = 1.0
    act[:, 40:] = 0.0
    act[0, 41] = 3.0
    res = precision.evaluate(act, exp, "fp32", "reldiff", valid_rows=40, valid_axis=1, zero_tail=True)
    assert not res.passed and res.tail_nonzero == 1 and res.numel == 160 and res.bad == 0


def test_valid_rows_bad_values_are_clear_errors():
    a = np.ones((4, 5))
    with pytest.raises(pn.ShapeError, match=r"valid_rows must be an int in \[0, 4\]"):
        precision.evaluate(a, a, "fp32", "allclose_ratio", valid_rows=5)
    with pytest.raises(pn.ShapeError, match=r"valid_rows must be an int"):
        precision.evaluate(a, a, "fp32", "allclose_ratio", valid_rows=1.5)
    with pytest.raises(pn.ShapeError, match=r"valid_axis=2 is not an axis"):
        precision.evaluate(a, a, "fp32", "allclose_ratio", valid_rows=1, valid_axis=2)


# --- distribution --------------------------------------------------------------------------------


def test_distribution_hand_computed_and_always_passes():
    act = np.array([1.0, 2.0, 2.0, 0.0])
    exp = np.array([1.0, 2.0, 3.0, 0.0])
    res = precision.evaluate(act, exp, "bf16", "distribution")
    assert res.passed and res.verdict == "PASS"
    d = res.distribution
    assert math.isclose(d.rel_l2, 1 / math.sqrt(14), rel_tol=1e-12)
    assert math.isclose(d.cosine, 11 / (3 * math.sqrt(14)), rel_tol=1e-12)
    assert d.above == {t: 0.25 for t in precision.DIFF_THRESHOLDS}  # one point of four, rdiff 1/3
    assert d.quantiles["rel"][1.0] == pytest.approx(1 / (3 + 1e-9), rel=1e-12)
    assert d.quantiles["rel"][0.5] == 0.0
    assert d.quantiles["abs"][1.0] == 1.0
    assert d.quantiles["golden"] == {0.5: 1.0, 0.9: 2.0, 0.99: 2.0, 0.999: 2.0, 1.0: 3.0}
    assert "rel_l2=" in str(res) and "rdiff p50=" in str(res)
    garbage = precision.evaluate(np.full(4, np.nan), exp, "fp32", "distribution")
    assert garbage.passed and not garbage.distribution.finite  # a measurement, never a verdict
    assert garbage.distribution.quantiles["rel"][1.0] == math.inf


def test_every_float_result_carries_its_distribution():
    exp = np.linspace(-1, 1, 64)
    res = precision.evaluate(exp * (1 + 1e-3), exp, "fp32", "allclose")
    assert res.distribution is not None and res.distribution.rel_l2 == pytest.approx(1e-3, rel=1e-9)
    ids = precision.evaluate(np.arange(4, dtype=np.int32), np.arange(4), "fp32", "allclose")
    assert ids.distribution is None


# --- tie-aware MoE ids ---------------------------------------------------------------------------


def test_id_mismatch_at_a_tie_is_legal_and_counted():
    scores = np.array([[0.5, 0.25, 0.25, 0.1], [0.9, 0.8, 0.7, 0.6]])
    ref = np.array([[0, 1], [0, 1]])
    act = np.array([[0, 2], [0, 1]], dtype=np.int32)  # 2 for 1: both score 0.25
    res = precision.evaluate(act, ref, "fp32", "allclose", 0, 0, scores=scores)
    assert res.passed and res.ties == 1 and res.max_abs == 0 and "ties=1" in str(res)
    assert not precision.evaluate(act, ref, "fp32", "allclose", 0, 0).passed  # without scores: a mismatch
    act[1, 1] = 3  # 0.6 is not 0.8
    res = precision.evaluate(act, ref, "fp32", "allclose", 0, 0, scores=scores)
    assert not res.passed and res.ties == 1 and res.bad == 1


def test_a_tie_is_equality_in_the_storage_dtype():
    scores = np.array([[1.0, 1.001, 0.5]])  # equal in bf16 (8 bits), distinct in fp16 and fp32
    ref, act = np.array([[1]]), np.array([[0]], dtype=np.int32)
    assert precision.evaluate(act, ref, "bf16", "allclose", 0, 0, scores=scores).ties == 1
    assert precision.evaluate(act, ref, "fp16", "allclose", 0, 0, scores=scores).ties == 0
    assert not precision.evaluate(act, ref, "fp32", "allclose", 0, 0, scores=scores).passed
    with pytest.raises(pn.ShapeError, match="scores shape"):
        precision.evaluate(act, ref, "bf16", "allclose", 0, 0, scores=np.ones((2, 3)))


def test_kernel_ids_against_a_higher_index_tie_break():
    """softmax_gating on bf16 logits full of exact ties, against a reference that breaks ties toward
    the higher index (as torch's topk may): legal under the tie rule, a failure without it."""
    import ml_dtypes

    rng = np.random.default_rng(3)
    logits = rng.integers(-4, 5, size=(32, 64)).astype(np.float32).astype(ml_dtypes.bfloat16)
    _, ids = pn.moe.softmax_gating(logits, 8)
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    rev = np.argsort(-p[:, ::-1], axis=-1, kind="stable")[:, :8]
    higher = p.shape[1] - 1 - rev  # ties toward the higher index
    plain = precision.evaluate(ids, higher, "bf16", "allclose", 0, 0)
    tied = precision.evaluate(ids, higher, "bf16", "allclose", 0, 0, scores=p)
    assert not plain.passed and tied.passed and tied.ties == plain.bad > 0


# --- names -------------------------------------------------------------------------------------


def test_bad_policy_names_are_refused_everywhere():
    with pytest.raises(pn.PyptoNumbaError, match=r"unknown tolerance policy 'ratio'.*allclose_ratio, reldiff, distribution"):
        precision.evaluate(np.ones(2), np.ones(2), "fp32", "ratio")
    with pytest.raises(pn.PyptoNumbaError, match="unknown tolerance policy 'reldif'"):
        pn.compare("gelu", np.ones((2, 64), np.float32), policy="reldif", repeats=1)
    with pytest.raises(SystemExit):
        main(["compare", "gelu", "--policy", "ratio_reldiff"])


@pytest.mark.parametrize("policy", ["allclose_ratio", "reldiff", "distribution"])
def test_compare_and_cli_accept_the_new_policies(policy, capsys):
    x = np.linspace(-3, 3, 2 * 64, dtype=np.float32).reshape(2, 64)
    cmp = pn.compare("gelu", x, policy=policy, repeats=1)
    assert cmp.policy == policy and all(r.verdict == "PASS" for r in cmp.rows)
    assert all(p.policy == policy and p.distribution is not None for r in cmp.rows for p in r.precision)
    assert main(["compare", "gelu", "--shape", "2,64", "--dtype", "fp32", "--policy", policy, "--repeats", "1",
                 "--format", "json"]) == 0
    assert f'"policy": "{policy}"' in capsys.readouterr().out


def test_op_pages_show_the_distribution_per_strategy_and_dtype():
    from pypto_numba.report.markdown import distribution_table
    from pypto_numba.report.measuring import Run, worst_distribution

    exp = np.linspace(1, 2, 100)
    small = precision.evaluate(exp * (1 + 1e-4), exp, "fp32", "allclose")
    big = precision.evaluate(exp * (1 + 2e-2), exp, "bf16", "allclose")
    assert worst_distribution([small, big]) is big.distribution
    runs = [Run("tanh", "fp32", verdict="PASS", distribution=small.distribution),
            Run("tanh", "bf16", verdict="FAIL", distribution=big.distribution),
            Run("erf", "bf16", error="TileError: no")]
    lines = distribution_table(runs)
    body = [ln for ln in lines if ln.startswith(("| fp32", "| bf16"))]
    assert len(body) == 2  # the error row has no distribution
    assert body[0].startswith("| fp32 | `tanh` | 0.0001 |") and "| 0 % |" in body[0]
    assert body[1].startswith("| bf16 | `tanh` | 0.02 |") and "| 100 % | 100 % | 0 % |" in body[1]
    assert distribution_table([Run("x", "fp32", error="boom")]) == []


def test_compare_scores_ids_tie_aware_when_the_reference_gives_scores(monkeypatch):
    """compare passes a reference's extra array (the selection scores) to the id comparison; this
    row's reference breaks ties toward the higher index, against the kernels' lower-index rule."""
    import dataclasses

    import ml_dtypes

    from pypto_numba import strategy
    from pypto_numba.lab import Variant

    def reference(x, _bias, **_):
        p = np.exp(x.astype(np.float64) - x.astype(np.float64).max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        ids = p.shape[1] - 1 - np.argsort(-p[:, ::-1], axis=-1, kind="stable")[:, :8]  # ties high
        return np.take_along_axis(p, ids, -1), ids, p

    row = Variant("softmax_gating", lambda x, _bias, **o: pn.moe.softmax_gating(x, 8, **o), reference, True)
    spec = strategy.spec("moe")
    monkeypatch.setitem(strategy._SPECS, "moe", spec)  # restored after the test
    dataclasses.replace(spec, variants=lambda: [row])  # registers itself as "moe"
    logits = np.random.default_rng(3).integers(-4, 5, size=(32, 64)).astype(np.float32).astype(ml_dtypes.bfloat16)
    cmp = pn.compare("moe", logits, np.zeros(64, np.float32), repeats=1)
    weights, ids = cmp.rows[0].precision
    assert ids.ties > 0 and ids.passed and weights.passed and cmp.rows[0].verdict == "PASS"
    assert cmp.to_dict()["rows"][0]["precision"][1]["ties"] == ids.ties


def test_compare_moe_counts_ties_of_saturated_sigmoid_scores():
    """Logits in [18, 30]: every sigmoid rounds to 1.0 in fp32, so the kernel ranks all experts
    equal (lower index first) while the float64 reference ranks them by logit. The moe spec's
    references give their selection scores, so compare calls those id mismatches ties."""
    logits = np.random.default_rng(5).uniform(18.0, 30.0, size=(16, 64)).astype(np.float32)
    cmp = pn.compare("moe", logits, np.zeros(64, np.float32), repeats=1)
    sig = next(r for r in cmp.rows if r.strategy == "sigmoid_gating")
    _, ids = sig.precision
    assert ids.ties > 0 and ids.passed and ids.bad == 0
    ids_np = pn.moe.sigmoid_gating(logits, 8, bias=np.zeros(64, np.float32), n_group=8, topk_group=4)[1]
    assert (ids_np == np.arange(8)).all()  # all tied: group 0 first, then its experts by index
