"""MoE option checks (Python, before any kernel)."""

from __future__ import annotations

import math as _math
import numbers

import numpy as np

from ..errors import ConstraintError, DTypeError
from ..machine import dtypes

GROUP_SCORES = ("max", "top2_sum")


def _int_option(value, name, where, low, high=None, why=""):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ConstraintError(f"{where}: {name} must be an int, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConstraintError(f"{where}: {name}={value} must be {limit}{why}")
    return value


def _real_option(value, name, where, *, non_negative=False):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ConstraintError(f"{where}: {name} must be a real number, got {value!r}")
    value = float(value)
    if not _math.isfinite(value) or (non_negative and value < 0):
        want = "a finite number >= 0" if non_negative else "a finite number"
        raise ConstraintError(f"{where}: {name}={value!r} must be {want}")
    return value


def _bool_option(value, name, where):
    if not isinstance(value, (bool, np.bool_)):
        raise ConstraintError(f"{where}: {name} must be True or False, got {value!r}")
    return bool(value)


def _routing_options(where, E, top_k, n_group, topk_group, group_score):
    """Validate the selection options for E experts; returns (top_k, n_group, topk_group, top2)."""
    n_group = _int_option(n_group, "n_group", where, 1, E, f" (E={E} experts)")
    if E % n_group:
        raise ConstraintError(
            f"{where}: n_group={n_group} does not divide E={E}; the experts form n_group equal "
            f"groups (use a divisor of {E})"
        )
    topk_group = _int_option(topk_group, "topk_group", where, 1, n_group, f" (n_group={n_group})")
    if group_score not in GROUP_SCORES:
        raise ConstraintError(f"{where}: group_score must be one of {GROUP_SCORES}, got {group_score!r}")
    top2 = group_score == "top2_sum"
    if n_group > 1 and top2 and E // n_group < 2:
        raise ConstraintError(
            f"{where}: group_score='top2_sum' needs at least 2 experts per group, got "
            f"E/n_group = {E // n_group}; use group_score='max' or fewer groups"
        )
    eligible = E if n_group == 1 else topk_group * (E // n_group)
    why = (f" (the {topk_group} best of {n_group} groups hold {eligible} eligible experts)"
           if n_group > 1 else f" (E={E} experts)")
    top_k = _int_option(top_k, "top_k", where, 1, eligible, why)
    return top_k, n_group, topk_group, top2


def _dtype_name(dtype, where, name="dtype"):
    kind = dtypes.storage_name(dtype)
    if kind is None:
        raise DTypeError(f"{where}: {name} {dtype!r} is not fp32, bf16 or fp16")
    return kind
