"""repeat_kv.expand_clone against the float64 oracle (exact: it is a copy) and its plan."""

from __future__ import annotations

import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import reference, repeat_kv
from pypto_numba.errors import ConstraintError, DTypeError, ShapeError

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced


@pytest.mark.parametrize("shape,n_rep", [((2, 3, 5, 16), 4), ((1, 1, 7, 40), 1), ((3, 2, 1, 8), 3)])
def test_expand_clone_exact(shape, n_rep, dtype, rng):
    kv = make(shape, dtype, rng)
    out, rec = run_traced(repeat_kv.expand_clone, kv, n_rep)
    assert out.dtype == NP_DTYPE[dtype] and out.shape == (shape[0], shape[1] * n_rep) + shape[2:]
    np.testing.assert_array_equal(out.astype(np.float64), reference.repeat_kv(kv, n_rep))
    assert out is not kv and not np.shares_memory(out, kv)
    assert_cost_matches_plan(rec)
    nbytes = out.nbytes
    assert rec.cost.gm_read_bytes == nbytes and rec.cost.gm_write_bytes == nbytes
    assert rec.cost.tasks == shape[0] * shape[1] * n_rep


def test_head_mapping(rng):
    kv = make((1, 2, 3, 8), "fp32", rng)
    out = repeat_kv.expand_clone(kv, 3)
    for h in range(6):
        np.testing.assert_array_equal(out[0, h], kv[0, h // 3])


def test_non_contiguous_input_is_copied_and_counted(rng):
    kv = make((2, 3, 10, 16), "bf16", rng)[:, :, ::2]
    out, rec = run_traced(repeat_kv.expand_clone, kv, 2)
    np.testing.assert_array_equal(out.astype(np.float64), reference.repeat_kv(kv, 2))
    assert rec.cost.workspace_bytes == kv.nbytes


def test_registered():
    assert [s.name for s in pn.strategies("repeat_kv")] == ["expand_clone"]
    p = repeat_kv.plan_expand_clone((1, 8, 4096, 128), 4, "bf16")
    assert p.cost.gm_write_bytes == 32 * 4096 * 128 * 2


def test_bad_inputs(rng):
    kv = make((1, 2, 3, 8), "fp32", rng)
    with pytest.raises(ConstraintError, match="n_rep"):
        repeat_kv.expand_clone(kv, 0)
    with pytest.raises(ConstraintError, match="n_rep"):
        repeat_kv.expand_clone(kv, 2.0)
    with pytest.raises(ShapeError, match="4 dims"):
        repeat_kv.expand_clone(kv[0], 2)
    with pytest.raises(ShapeError, match="zero-size"):
        repeat_kv.expand_clone(kv[:, :0], 2)
    with pytest.raises(DTypeError, match="float64"):
        repeat_kv.expand_clone(kv.astype(np.float64), 2)
    with pytest.raises(DTypeError, match="int"):
        repeat_kv.expand_clone(kv.astype(np.int16), 2)
