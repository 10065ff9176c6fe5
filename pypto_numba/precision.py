"""Error metrics against the float64 reference, and PyPTO's pass/fail tolerance policies.

Three named policies, as PyPTO users apply them (npu-facts section 6):

``allclose``
    ``numpy.testing.assert_allclose``: every element ``|a - r| <= atol + rtol*|r|``. Most gym
    model tests. Default (rtol, atol): fp32 (1e-3, 1e-4), fp16 (1e-3, 1e-3), bf16 (2^-7, 1e-4)
    (the common bf16 convention: rtol = bf16 epsilon).
``outlier``
    gym ``compare()``: any NaN/Inf where the reference is finite fails; at most
    ``round(0.005 * numel)`` elements may break ``|a - r| <= atol + rtol*|r|`` (the 0.5 % rule).
    Same default tolerances as ``allclose``.
``dual``
    pypto ``compare_accuracy.py``: element tolerance ``(|a| + |r|)*rtol/2 + atol``; above it an
    element "warns", above 128x it "fails"; PASS iff no element fails and the warnings are at most
    ``min(max(16, sqrt(n_nonzero)/2), n_nonzero*min(rtol, atol))``. Default (rtol, atol): fp32
    (1e-3, 1e-4), fp16 (1e-3, 1e-3), bf16 (5e-3, 5e-2).

Three more, as pypto-lib's ``golden/validation.py`` names them (npu-facts 8.3):

``allclose_ratio``
    ``ratio_allclose(atol, rtol, max_error_ratio=0.005)``: allclose per point, at most 0.5 % of the
    points may fail, as the ratio ``bad / n <= 0.005`` (so ``floor(0.005 * n)`` points). It is *not*
    ``outlier``: gym's rule allows ``round(0.005 * n)`` points (Python's round: n = 300 -> 2, here
    1) and fails outright on any NaN/Inf, where here a non-finite value is one failing point (no
    separate NaN rule is documented for ``ratio_allclose``). Same default tolerances as ``allclose``.
``reldiff``
    ``ratio_reldiff(diff_thd=0.01, pct_thd=0.05, max_diff_hd=inf)``: the floored relative
    difference :func:`rdiff`; PASS iff ``count(rdiff > diff_thd) / n <= pct_thd``, the worst bad
    ``rdiff < max_diff_hd``, and no NaN/Inf anywhere (in the output or the reference). Its two
    numbers are ``(diff_thd, pct_thd)``, shown in the rtol/atol slots of :class:`Result`; an op's
    (rtol, atol) do not apply to it.
``distribution``
    ``error_distribution()``: a measurement, not a test -- it always passes. :class:`Result`'s
    ``distribution`` (rel-L2, cosine, fraction above each of :data:`DIFF_THRESHOLDS`, quantiles of
    rel diff, abs diff and golden magnitude) is what to read; ``bad`` counts the 0.5 %-rule outliers.

Options of every policy (npu-facts 8.3): ``valid_rows=N`` scores only the first N entries along
``valid_axis`` (a packed buffer's inactive tail would dilute a ratio); ``zero_tail=True`` also fails
the comparison unless that dropped tail of the output is all zeros (``Result.tail_nonzero``).

Integer outputs (MoE ids) given ``scores=`` (the float64 selection scores, [..., E]) are compared
tie-aware, like pypto-lib's ``topk_pair_compare``: an id mismatch is legal where the two picked
experts' scores are equal once rounded to the storage dtype; ``Result.ties`` counts those points.
torch's topk and our lower-index rule break such ties differently.

:func:`evaluate` always attaches the :class:`Distribution` of a float output (``Result.distribution``).

Every op's tests may pass their own (rtol, atol) -- the ones PyPTO's own tests use -- and a
comparison always names the policy and tolerances it applied.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

POLICIES = ("allclose", "outlier", "dual", "allclose_ratio", "reldiff", "distribution")
DEFAULT_POLICY = "allclose"

_TOL = {
    "allclose": {"fp32": (1e-3, 1e-4), "fp16": (1e-3, 1e-3), "bf16": (2.0**-7, 1e-4)},
    "outlier": {"fp32": (1e-3, 1e-4), "fp16": (1e-3, 1e-3), "bf16": (2.0**-7, 1e-4)},
    "dual": {"fp32": (1e-3, 1e-4), "fp16": (1e-3, 1e-3), "bf16": (5e-3, 5e-2)},
    "allclose_ratio": {"fp32": (1e-3, 1e-4), "fp16": (1e-3, 1e-3), "bf16": (2.0**-7, 1e-4)},
    "reldiff": {"fp32": (0.01, 0.05)},  # (diff_thd, pct_thd): ratio_reldiff's defaults, every dtype
    "distribution": {"fp32": (1e-3, 1e-4), "fp16": (1e-3, 1e-3), "bf16": (2.0**-7, 1e-4)},
}
OUTLIER_FRACTION = 0.005
DUAL_FAIL_FACTOR = 128.0

# mantissa bits and smallest normal exponent of each storage dtype (for ulp errors)
_FORMAT = {"fp32": (23, -126), "bf16": (7, -126), "fp16": (10, -14)}


def tolerances(policy: str, dtype: str) -> tuple:
    """Default (rtol, atol) of ``policy`` for output dtype ``dtype``."""
    _check_policy(policy)
    return _TOL[policy][dtype if dtype in _TOL[policy] else "fp32"]


def _check_policy(policy: str):
    if policy not in POLICIES:
        from .errors import PyptoNumbaError

        raise PyptoNumbaError(f"unknown tolerance policy {policy!r}; known: {', '.join(POLICIES)}")


def ulp(ref: np.ndarray, dtype: str) -> np.ndarray:
    """Spacing of ``dtype`` at the magnitude of each reference value (float64)."""
    mant, emin = _FORMAT[dtype]
    mag = np.abs(ref)
    with np.errstate(divide="ignore"):
        exp = np.where(mag > 0, np.floor(np.log2(np.where(mag > 0, mag, 1.0))), emin)
    exp = np.maximum(exp, emin)  # subnormal range: the spacing stays that of the smallest normal
    return np.exp2(exp - mant)


@dataclasses.dataclass(frozen=True)
class Result:
    """Precision of one output against its reference, and the verdict of one policy."""

    max_abs: float
    max_rel: float
    max_ulps: float
    mean_abs: float
    policy: str
    rtol: float
    atol: float
    passed: bool
    bad: int  # elements over tolerance (warnings for "dual")
    allowed: int  # elements the policy lets exceed tolerance
    numel: int
    ties: int = 0  # integer ids that differ from the reference only at a tie of their scores
    tail_nonzero: int = 0  # nonzero outputs in the tail that valid_rows dropped (zero_tail)
    distribution: object = None  # the Distribution of a float output

    @property
    def verdict(self) -> str:
        return "PASS" if self.passed else "FAIL"

    def __str__(self):
        tols = (f"diff_thd={self.rtol:g} pct_thd={self.atol:g}" if self.policy == "reldiff"
                else f"rtol={self.rtol:g} atol={self.atol:g}")
        extra = (f" ties={self.ties}" if self.ties else "") + (
            f" tail_nonzero={self.tail_nonzero}" if self.tail_nonzero else "")
        text = (f"{self.verdict} [{self.policy} {tols}] max_abs={self.max_abs:.3g} "
                f"max_rel={self.max_rel:.3g} ulps={self.max_ulps:.3g} bad={self.bad}/{self.numel}{extra}")
        if self.policy == "distribution" and self.distribution is not None:
            text += f" | {self.distribution}"
        return text


def evaluate(
    actual,
    reference,
    dtype: str,
    policy: str = DEFAULT_POLICY,
    rtol: float = None,
    atol: float = None,
    *,
    valid_rows: int = None,
    valid_axis: int = 0,
    zero_tail: bool = False,
    scores=None,
    diff_thd: float = None,
    pct_thd: float = None,
    max_diff_hd: float = math.inf,
) -> Result:
    """Compare ``actual`` (any float dtype) with the float64 ``reference`` under ``policy``.

    ``valid_rows``/``valid_axis``/``zero_tail`` and ``scores`` (tie-aware ids): see the module
    docstring. ``reldiff`` takes ``diff_thd``, ``pct_thd`` (default :func:`tolerances`') and
    ``max_diff_hd`` (the worst bad rdiff allowed), and ignores ``rtol``/``atol`` (an op's tolerances
    are allclose-style)."""
    _check_policy(policy)
    a_full = np.asarray(actual)
    integer = a_full.dtype.kind in "iub"
    a = a_full.astype(np.float64)
    r = np.asarray(reference, dtype=np.float64)
    if a.shape != r.shape:
        from .errors import ShapeError

        raise ShapeError(f"precision: actual shape {a.shape} != reference shape {r.shape}")
    tail_nonzero = 0
    if valid_rows is not None:
        a, r, tail_nonzero, keep = _valid(a, r, valid_rows, valid_axis)
        if scores is not None:
            scores = np.take(np.asarray(scores), keep, axis=valid_axis)
    d_rtol, d_atol = tolerances(policy, dtype)
    if policy == "reldiff":
        rtol = d_rtol if diff_thd is None else float(diff_thd)
        atol = d_atol if pct_thd is None else float(pct_thd)
    rtol = d_rtol if rtol is None else float(rtol)
    atol = d_atol if atol is None else float(atol)
    n = a.size
    ties = 0
    if integer and scores is not None:
        a, ties = _untie(a, r, scores, dtype)
    both_nan = np.isnan(a) & np.isnan(r)
    same_inf = np.isinf(r) & (a == r)
    exact = both_nan | same_inf
    finite_ref = np.isfinite(r)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(exact, 0.0, np.abs(a - r))
        err = np.where(np.isnan(err), np.inf, err)  # NaN where a number was due counts as infinite
        rel = err / np.maximum(np.abs(r), np.finfo(np.float64).tiny)
        ulps = err / ulp(np.where(finite_ref, r, 0.0), dtype if dtype in _FORMAT else "fp32")
    max_abs = float(err.max()) if n else 0.0
    max_rel = float(np.where(exact, 0.0, rel).max()) if n else 0.0
    max_ulps = float(np.where(exact, 0.0, ulps).max()) if n else 0.0
    mean_abs = float(np.where(np.isfinite(err), err, 0.0).mean()) if n else 0.0
    nonfinite_bad = int(np.count_nonzero(~np.isfinite(err)))
    # the 0.5 % rule of the distribution at this comparison's (rtol, atol) where they are allclose-style
    same = policy in ("allclose", "outlier", "allclose_ratio", "distribution")
    dist = None if integer else distribution(a, r, dtype if dtype in _TOL["outlier"] else "fp32",
                                             rtol if same else None, atol if same else None)

    if policy in ("allclose", "outlier", "allclose_ratio"):
        over = err > atol + rtol * np.abs(np.where(finite_ref, r, 0.0))
        bad = int(np.count_nonzero(over))
        if policy == "allclose":
            allowed = 0
        elif policy == "outlier":
            allowed = int(round(OUTLIER_FRACTION * n))
        else:
            allowed = int(math.floor(OUTLIER_FRACTION * n + 1e-9))  # bad / n <= 0.005
        passed = bad <= allowed and (policy != "outlier" or nonfinite_bad == 0)
    elif policy == "reldiff":
        rd = rdiff(a, r, rtol)
        bad_mask = rd > rtol
        bad = int(np.count_nonzero(bad_mask))
        allowed = int(math.floor(atol * n + 1e-9))
        worst = float(rd[bad_mask].max()) if bad else 0.0
        nonfinite = not (np.isfinite(a).all() and np.isfinite(r).all())
        passed = bad <= allowed and (not bad or worst < max_diff_hd) and not nonfinite
    elif policy == "distribution":
        bad, allowed, passed = (dist.outliers, dist.allowed, True) if dist is not None else (0, 0, True)
    else:
        tol = (np.abs(np.where(np.isfinite(a), a, 0.0)) + np.abs(np.where(finite_ref, r, 0.0))) * rtol / 2 + atol
        warn = err > tol
        fail = err > DUAL_FAIL_FACTOR * tol
        nonzero = int(np.count_nonzero(r))
        allowed = int(min(max(16, math.sqrt(nonzero) / 2), nonzero * min(rtol, atol)))
        bad = int(np.count_nonzero(warn))
        passed = not fail.any() and bad <= allowed
    if zero_tail and tail_nonzero:
        passed = False
    return Result(
        max_abs=max_abs,
        max_rel=max_rel,
        max_ulps=max_ulps,
        mean_abs=mean_abs,
        policy=policy,
        rtol=rtol,
        atol=atol,
        passed=bool(passed),
        bad=bad,
        allowed=allowed,
        numel=n,
        ties=ties,
        tail_nonzero=tail_nonzero,
        distribution=dist,
    )


def _valid(a, r, valid_rows, valid_axis):
    """The first ``valid_rows`` entries along ``valid_axis`` of both, and the dropped tail's nonzeros."""
    from .errors import ShapeError

    if a.ndim == 0 or not -a.ndim <= valid_axis < a.ndim:
        raise ShapeError(f"precision: valid_axis={valid_axis} is not an axis of shape {a.shape}")
    size = a.shape[valid_axis]
    if isinstance(valid_rows, bool) or not isinstance(valid_rows, (int, np.integer)) or not 0 <= valid_rows <= size:
        raise ShapeError(f"precision: valid_rows must be an int in [0, {size}] (axis {valid_axis} of "
                         f"{a.shape}), got {valid_rows!r}")
    keep = np.arange(int(valid_rows))
    tail = np.take(a, np.arange(int(valid_rows), size), axis=valid_axis)
    nonzero = int(np.count_nonzero(tail != 0))  # NaN counts as nonzero
    return np.take(a, keep, axis=valid_axis), np.take(r, keep, axis=valid_axis), nonzero, keep


def _storage_round(x, dtype: str) -> np.ndarray:
    """float64 ``x`` rounded (nearest-even) to storage dtype ``dtype``, back as float64."""
    from .machine import dtypes

    name = dtype if dtype in dtypes.STORAGE else "fp32"
    return np.asarray(x, np.float64).astype(np.float32).astype(dtypes.STORAGE[name]).astype(np.float64)


def _untie(a, r, scores, dtype):
    """Ids ``a`` with every mismatch at a tie replaced by the reference id, and the count of ties.

    A mismatch at ``[..., j]`` is a tie when ``scores[..., a]`` and ``scores[..., r]`` round to the
    same value in ``dtype`` (``scores``: [..., E], the ids' last axis indexes E)."""
    from .errors import ShapeError

    s = np.asarray(scores, dtype=np.float64)
    if s.shape[:-1] != a.shape[:-1]:
        raise ShapeError(f"precision: scores shape {s.shape} does not match ids shape {a.shape} "
                         f"(expected {a.shape[:-1]} + (E,))")
    E = s.shape[-1]
    differ = a != r
    if not differ.any():
        return a, 0
    ai, ri = a.astype(np.int64), r.astype(np.int64)
    if ai.min() < 0 or ai.max() >= E:
        return a, 0  # an id outside [0, E) is a plain mismatch
    sr = _storage_round(s, dtype)
    tie = differ & (np.take_along_axis(sr, ai, axis=-1) == np.take_along_axis(sr, np.clip(ri, 0, E - 1), axis=-1))
    return np.where(tie, r, a), int(np.count_nonzero(tie))


# ---------------------------------------------------------------------------------------------
# Layer-level error distribution (pypto-lib's golden/validation.py metrics, npu-facts 8.3)

DIFF_THRESHOLDS = (1e-3, 3e-3, 5e-3, 1e-2, 3e-2, 5e-2)
QUANTILES = (0.5, 0.9, 0.99, 0.999, 1.0)


@dataclasses.dataclass(frozen=True)
class Distribution:
    """How an output's error is spread: rel-L2, cosine similarity, the fraction of points whose
    floored relative difference exceeds each threshold, and the 0.5 % outlier rule's verdict."""

    rel_l2: float
    cosine: float
    above: dict  # threshold -> fraction of points with rdiff above it
    outliers: int  # points breaking |a - e| <= atol + rtol*|e|
    allowed: int  # round(0.005 * n)
    rtol: float
    atol: float
    numel: int
    finite: bool
    # "rel" (the floored rdiff), "abs" (|a - e|) and "golden" (|e|) -> {q: value} over QUANTILES
    quantiles: dict = dataclasses.field(default_factory=dict)

    @property
    def outlier_pass(self) -> bool:
        return self.finite and self.outliers <= self.allowed

    def __str__(self):
        above = " ".join(f">{t:g}:{100 * f:.2f}%" for t, f in self.above.items())
        rel = self.quantiles.get("rel", {})
        q = (" rdiff " + "/".join(f"p{100 * k:g}={v:.3g}" for k, v in rel.items()) if rel else "")
        return (f"rel_l2={self.rel_l2:.3g} cos={self.cosine:.6f} {above}{q} outliers={self.outliers}/{self.allowed} "
                f"({'PASS' if self.outlier_pass else 'FAIL'} 0.5% rule rtol={self.rtol:g} atol={self.atol:g})")


def rel_l2(actual, expected) -> float:
    """``||a - e|| / ||e||`` in float64 (0 when both are zero)."""
    a = np.asarray(actual).astype(np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    den = float(np.linalg.norm(e))
    with np.errstate(invalid="ignore", over="ignore"):
        num = float(np.linalg.norm(a - e))
    return num / den if den else (0.0 if num == 0 else math.inf)


def cosine(actual, expected) -> float:
    """Cosine similarity of the flattened outputs (1.0 when both are zero)."""
    a = np.asarray(actual).astype(np.float64).ravel()
    e = np.asarray(expected, dtype=np.float64).ravel()
    with np.errstate(invalid="ignore", over="ignore"):
        na, ne = float(np.linalg.norm(a)), float(np.linalg.norm(e))
        if na == 0 or ne == 0:
            return 1.0 if na == ne else 0.0
        return float(a @ e) / (na * ne)


def rdiff(actual, expected, diff_thd: float = 0.01) -> np.ndarray:
    """pypto-lib's floored relative difference: ``a = |act - exp|``, ``b = max(|act|, |exp|,
    2^-14 / diff_thd) + 1e-9``, ``a if a < diff_thd else a / b`` (NaN/Inf -> inf)."""
    a_ = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(a_ - e)
        b = np.maximum(np.maximum(np.abs(a_), np.abs(e)), 2.0**-14 / diff_thd) + 1e-9
        r = np.where(d < diff_thd, d, d / b)
    return np.where(np.isfinite(r), r, np.inf)


def distribution(actual, expected, dtype: str = "bf16", rtol: float = None, atol: float = None,
                 thresholds=DIFF_THRESHOLDS) -> Distribution:
    """The layer-level metrics of ``actual`` against the float64 ``expected`` (see :class:`Distribution`);
    (rtol, atol) of the outlier rule default to the ``outlier`` policy's for ``dtype``."""
    a = np.asarray(actual).astype(np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        from .errors import ShapeError

        raise ShapeError(f"precision: actual shape {a.shape} != expected shape {e.shape}")
    d_rtol, d_atol = tolerances("outlier", dtype)
    rtol = d_rtol if rtol is None else float(rtol)
    atol = d_atol if atol is None else float(atol)
    n = a.size
    finite = bool(np.isfinite(a).all())
    rd = rdiff(a, e)
    above = {float(t): (float(np.count_nonzero(rd > t)) / n if n else 0.0) for t in thresholds}
    with np.errstate(invalid="ignore"):
        over = ~(np.abs(a - e) <= atol + rtol * np.abs(e))
        absd = np.abs(a - e)
    absd = np.where(np.isnan(absd), np.inf, absd)
    quantiles = {}
    if n:
        for name, v in (("rel", rd), ("abs", absd), ("golden", np.abs(e))):
            q = np.quantile(v.ravel(), QUANTILES, method="lower")  # "lower": a point's own value, inf-safe
            quantiles[name] = {float(k): float(x) for k, x in zip(QUANTILES, q)}
    return Distribution(rel_l2=rel_l2(a, e), cosine=cosine(a, e), above=above, outliers=int(np.count_nonzero(over)),
                        allowed=int(round(OUTLIER_FRACTION * n)), rtol=rtol, atol=atol, numel=n, finite=finite,
                        quantiles=quantiles)


# ---------------------------------------------------------------------------------------------
# Kernel-faithful goldens: a strategy against its mirror (lab/spec.py ``mirror=True``), in ulps

MIRROR_1ULP_FRACTION = 0.999  # at least this fraction of points within 1 storage ulp
MIRROR_MAX_ULPS = 2.0  # and every point within 2


@dataclasses.dataclass(frozen=True)
class MirrorResult:
    """How far an output is from its mirror in storage ulps: the fractions of points more than 1
    and more than 2 ulps off, the worst, and the criterion's verdict (a strategy outside it has an
    algorithm bug, not a rounding difference; fp32 accumulation may tip a rounding by one ulp)."""

    frac_1ulp: float  # fraction of points more than 1 ulp off
    frac_2ulp: float  # fraction of points more than 2 ulps off
    max_ulps: float
    ok: bool
    dtype: str = "bf16"  # the storage dtype of the ulps

    @property
    def judged(self) -> bool:
        """Whether the criterion judges this output: in fp32 every kernel operation rounds as the
        storage does (fp32 transcendentals are a few ulps off), so only bf16/fp16 are judged."""
        return self.dtype in ("bf16", "fp16")

    def __str__(self):
        return (f"{'ok' if self.ok else 'BAD'} mirror max={self.max_ulps:.3g} ulps >1ulp={100 * self.frac_1ulp:.3f}% "
                f">2ulp={100 * self.frac_2ulp:.3f}%")


def mirror_check(actual, mirror, dtype: str) -> MirrorResult:
    """``actual`` against its float64 ``mirror`` in ulps of ``dtype``: ok iff at most 1 ulp at
    >= 99.9 % of points and at most 2 ulps everywhere (NaN/Inf must match exactly)."""
    a = np.asarray(actual).astype(np.float64)
    m = np.asarray(mirror, dtype=np.float64)
    if a.shape != m.shape:
        from .errors import ShapeError

        raise ShapeError(f"precision: actual shape {a.shape} != mirror shape {m.shape}")
    if a.size == 0:
        return MirrorResult(0.0, 0.0, 0.0, True, dtype)
    exact = (np.isnan(a) & np.isnan(m)) | (a == m)
    with np.errstate(invalid="ignore", over="ignore"):
        err = np.where(exact, 0.0, np.abs(a - m))
        err = np.where(np.isnan(err), np.inf, err)
        ulps = err / ulp(np.where(np.isfinite(m), m, 0.0), dtype if dtype in _FORMAT else "fp32")
    f1 = float(np.count_nonzero(ulps > 1.0)) / a.size
    f2 = float(np.count_nonzero(ulps > MIRROR_MAX_ULPS)) / a.size
    mx = float(ulps.max())
    return MirrorResult(f1, f2, mx, bool(f1 <= 1 - MIRROR_1ULP_FRACTION + 1e-12 and mx <= MIRROR_MAX_ULPS), dtype)
