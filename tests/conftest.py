"""pytest fixtures shared by every test folder (the helpers themselves live in helpers.py)."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import DTYPES


@pytest.fixture
def rng():
    return np.random.default_rng(20261130)


@pytest.fixture(params=DTYPES)
def dtype(request):
    return request.param
