"""precision.distribution and its parts on hand-computed cases."""

from __future__ import annotations

import math

import numpy as np

from pypto_numba import precision


def test_rel_l2_and_cosine_by_hand():
    e = np.array([3.0, 4.0])
    a = np.array([3.0, 4.5])
    assert math.isclose(precision.rel_l2(a, e), 0.5 / 5.0)
    assert math.isclose(precision.cosine(a, e), (9 + 18) / (5 * math.hypot(3, 4.5)))
    assert precision.rel_l2(np.zeros(3), np.zeros(3)) == 0.0
    assert precision.cosine(-e, e) == -1.0


def test_rdiff_is_absolute_below_the_threshold_and_relative_above():
    r = precision.rdiff(np.array([1.005, 10.5, 0.0]), np.array([1.0, 10.0, 0.02]))
    assert math.isclose(r[0], 0.005, rel_tol=1e-9)  # |d| < 0.01: absolute
    assert math.isclose(r[1], 0.5 / (10.5 + 1e-9))  # relative to max(|a|, |e|)
    # tiny values are floored at 2^-14 / 0.01
    assert math.isclose(r[2], 0.02 / (max(0.02, 2.0**-14 / 0.01) + 1e-9))
    assert precision.rdiff(np.array([np.nan]), np.array([1.0]))[0] == np.inf


def test_distribution_fractions_and_the_half_percent_rule():
    e = np.ones(1000)
    a = e.copy()
    a[:5] += 0.5  # 5 outliers = round(0.005 * 1000): the rule still passes
    d = precision.distribution(a, e, "fp32")
    assert d.outliers == 5 and d.allowed == 5 and d.outlier_pass
    assert d.above[1e-2] == 0.005 and d.above[1e-3] == 0.005
    a[5] += 0.5
    assert not precision.distribution(a, e, "fp32").outlier_pass
    a[5] = np.inf
    assert not precision.distribution(a, e, "fp32").finite
