"""Shared test helpers: storage dtypes, random inputs, and the plan == counted check."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pypto_numba as pn

DTYPES = ("fp32", "bf16", "fp16")
NP_DTYPE = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def make(shape, dtype: str, rng: np.random.Generator, scale: float = 1.0, loc: float = 0.0) -> np.ndarray:
    """A random normal array of ``shape`` in storage ``dtype``."""
    return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(NP_DTYPE[dtype])


def run_traced(fn, *args, **kwargs):
    """Call a strategy under trace(); return (result, record)."""
    with pn.trace() as t:
        out = fn(*args, **kwargs)
    assert len(t.records) == 1, [r.strategy for r in t.records]
    return out, t.records[0]


def assert_cost_matches_plan(record):
    """The Cost the kernels counted equals the Cost the plan predicted, field by field."""
    diff = record.cost.differences(record.planned)
    assert not diff, f"{record.op}.{record.strategy}: counted != planned: {diff}"


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(params=DTYPES)
def dtype(request):
    return request.param
