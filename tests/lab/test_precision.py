"""Error metrics and the three tolerance policies, on hand-computed cases."""

import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import precision


def test_exact_match_passes_every_policy():
    r = np.linspace(-3, 3, 101)
    for policy in precision.POLICIES:
        res = precision.evaluate(r.astype(np.float32), r.astype(np.float32).astype(np.float64), "fp32", policy)
        assert res.passed and res.max_abs == 0 and res.max_ulps == 0


def test_metrics_hand_computed():
    ref = np.array([1.0, 2.0, -4.0, 0.5])
    act = np.array([1.0, 2.0 + 2**-22, -4.0, 0.5 + 2**-20])
    res = precision.evaluate(act, ref, "fp32")
    assert res.max_abs == pytest.approx(2**-20)
    assert res.max_rel == pytest.approx(2**-19)
    # 0.5 has fp32 ulp 2**-24: 2**-20 / 2**-24 = 16 ulps; 2.0 has ulp 2**-22: 1 ulp
    assert res.max_ulps == pytest.approx(16)
    assert precision.ulp(np.array([1.0]), "bf16")[0] == 2**-7
    assert precision.ulp(np.array([1.0]), "fp16")[0] == 2**-10
    assert precision.ulp(np.array([0.0]), "fp16")[0] == 2**-24  # subnormal spacing


def test_allclose_policy_is_all_elements():
    ref = np.ones(1000)
    act = ref.copy()
    act[0] += 0.01  # > atol + rtol*1 for fp32 (1e-4 + 1e-3)
    res = precision.evaluate(act, ref, "fp32", "allclose")
    assert not res.passed and res.bad == 1 and res.allowed == 0
    assert res.verdict == "FAIL"


def test_outlier_policy_allows_half_a_percent():
    ref = np.ones(1000)
    act = ref.copy()
    act[:5] += 0.01  # 5 bad = round(0.005 * 1000)
    assert precision.evaluate(act, ref, "fp32", "outlier").passed
    act[5] += 0.01
    res = precision.evaluate(act, ref, "fp32", "outlier")
    assert not res.passed and res.bad == 6 and res.allowed == 5
    # any NaN where the reference is finite fails, even a single one
    act2 = ref.copy()
    act2[0] = np.nan
    assert not precision.evaluate(act2, ref, "fp32", "outlier").passed


def test_dual_policy_warn_and_fail_thresholds():
    n = 10000
    ref = np.ones(n)
    rtol, atol = precision.tolerances("dual", "fp32")
    tol = (1 + 1) * rtol / 2 + atol  # element tolerance at |a| ~ |r| ~ 1
    allowed = int(min(max(16, np.sqrt(n) / 2), n * min(rtol, atol)))  # = min(50, 1) = 1
    assert allowed == 1
    act = ref.copy()
    act[0] += 2 * tol  # one warning: allowed
    assert precision.evaluate(act, ref, "fp32", "dual").passed
    act[1] += 2 * tol  # two warnings: too many
    assert not precision.evaluate(act, ref, "fp32", "dual").passed
    act = ref.copy()
    act[0] += 200 * tol  # one element above 128x: fail outright
    assert not precision.evaluate(act, ref, "fp32", "dual").passed


def test_nan_and_inf_agreement_is_exact():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert precision.evaluate(ref.copy(), ref, "bf16", "allclose").passed
    bad = np.array([np.nan, -np.inf, -np.inf, 1.0])
    res = precision.evaluate(bad, ref, "bf16", "allclose")
    assert not res.passed and res.max_abs == np.inf


def test_per_dtype_defaults_and_overrides():
    assert precision.tolerances("allclose", "bf16") == (2**-7, 1e-4)
    assert precision.tolerances("dual", "bf16") == (5e-3, 5e-2)
    res = precision.evaluate(np.array([1.004]), np.array([1.0]), "bf16", "allclose", rtol=5e-3, atol=5e-3)
    assert res.passed and (res.rtol, res.atol) == (5e-3, 5e-3)
    assert "PASS [allclose rtol=0.005 atol=0.005]" in str(res)


def test_bad_policy_and_shape():
    with pytest.raises(pn.PyptoNumbaError, match="unknown tolerance policy 'strict'"):
        precision.evaluate(np.ones(2), np.ones(2), "fp32", "strict")
    with pytest.raises(pn.ShapeError, match="actual shape"):
        precision.evaluate(np.ones(2), np.ones(3), "fp32")
