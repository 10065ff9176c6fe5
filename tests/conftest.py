"""pytest fixtures shared by every test folder (the helpers themselves live in helpers.py)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from helpers import DTYPES

SPREAD = "PYPTO_NUMBA_SPREAD_SLOW"


def pytest_collection_modifyitems(config, items):
    """With ``PYPTO_NUMBA_SPREAD_SLOW=1`` (tox sets it) a test marked ``slow(on="3.x")`` runs only
    on CPython 3.x (default 3.11, the env with torch): each heavy compile product runs once per
    tox run, on one interpreter, and every interpreter runs all the rest. Without it, all run."""
    if os.environ.get(SPREAD) != "1":
        return
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"
    keep, drop = [], []
    for item in items:
        mark = item.get_closest_marker("slow")
        (drop if mark is not None and mark.kwargs.get("on", "3.11") != here else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(params=DTYPES)
def dtype(request):
    return request.param
