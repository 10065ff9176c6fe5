"""Input validation shared by every strategy: clear errors before any kernel runs."""

import ml_dtypes
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import inputs


@pytest.mark.parametrize("dt,name", [(np.float32, "fp32"), (np.float16, "fp16"), (ml_dtypes.bfloat16, "bf16")])
def test_accepts_storage_dtypes_and_gives_kernel_view(dt, name):
    x = np.arange(6, dtype=np.float32).reshape(2, 3).astype(dt)
    t = inputs.tensor(x, "x", "op.s")
    assert t.dtype == name and t.array is x and t.copied_bytes == 0
    assert t.kview.ctypes.data == x.ctypes.data and t.kview.nbytes == x.nbytes


@pytest.mark.parametrize("bad", [np.zeros(3, np.float64), np.zeros(3, np.int32), np.zeros(3, bool),
                                 np.zeros(3, object), np.zeros(3, np.complex64)])
def test_rejects_other_dtypes(bad):
    with pytest.raises(pn.DTypeError, match=rf"op\.s: x has dtype {bad.dtype}; accepted: float32, float16 or ml_dtypes.bfloat16"):
        inputs.tensor(bad, "x", "op.s")
    with pytest.raises(TypeError):  # DTypeError is also a TypeError
        inputs.tensor(bad, "x", "op.s")


def test_rejects_non_arrays():
    with pytest.raises(pn.DTypeError, match="must be a numpy array .* got list"):
        inputs.tensor([1.0, 2.0], "x", "op.s")


def test_rank_and_empty_and_size_limits():
    with pytest.raises(pn.ShapeError, match=r"x must have at least 1 dims, got shape \(\)"):
        inputs.tensor(np.array(1.0, dtype=np.float32), "x", "op.s")
    with pytest.raises(pn.ShapeError, match=r"x must have at least 1 dims, got shape \(\)"):
        inputs.tensor(np.float32(1.0), "x", "op.s")
    with pytest.raises(pn.ShapeError, match=r"q must have 4 dims, got shape \(2, 3\)"):
        inputs.tensor(np.ones((2, 3), np.float32), "q", "attention.online", min_rank=4, max_rank=4)
    with pytest.raises(pn.ShapeError, match="zero-size dim; PyPTO tensors must be non-empty"):
        inputs.tensor(np.ones((0, 3), np.float32), "x", "op.s")
    with pytest.raises(pn.ConstraintError, match="more than PyPTO's INT32_MAX"):
        inputs.check_size((2**16, 2**16), "x", "op.s")


def test_non_contiguous_is_copied_and_counted():
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    view = base[:, ::2]
    t = inputs.tensor(view, "x", "op.s")
    assert t.array.flags.c_contiguous and t.copied_bytes == view.size * 4
    np.testing.assert_array_equal(t.array, view)
    neg = base[::-1]
    t = inputs.tensor(neg, "x", "op.s")
    np.testing.assert_array_equal(t.array, neg)


def test_options():
    assert inputs.positive_int(np.int64(8), "tile", "op.s") == 8
    for bad in (0, -3, 2.5, True, "8", None):
        with pytest.raises(pn.TileError, match="tile must be a positive integer"):
            inputs.positive_int(bad, "tile", "op.s")
    assert inputs.axis(-1, 3, "dim", "op.s") == 2
    with pytest.raises(pn.ShapeError, match=r"dim=3 is out of range for a 3-d input \(valid: -3..2\)"):
        inputs.axis(3, 3, "dim", "op.s")
    with pytest.raises(pn.ShapeError, match="dim must be an int"):
        inputs.axis(1.0, 3, "dim", "op.s")


def test_same_dtype():
    a = inputs.tensor(np.ones(2, np.float32), "a", "op.s")
    b = inputs.tensor(np.ones(2, np.float16), "b", "op.s")
    assert inputs.same_dtype("op.s", a=a, c=a) == "fp32"
    with pytest.raises(pn.DTypeError, match="a=fp32, b=fp16"):
        inputs.same_dtype("op.s", a=a, b=b)


@pytest.mark.parametrize("given, name", [("fp32", "fp32"), ("bf16", "bf16"), (np.float16, "fp16"),
                                         (np.dtype(np.float32), "fp32"), ("bfloat16", "bf16")])
def test_storage_dtype_names(given, name):
    assert inputs.storage_dtype(given, "op.plan") == name


@pytest.mark.parametrize("bad", ["fp64", "float64", np.int32, None, 3])
def test_storage_dtype_refuses_with_dtype_error(bad):
    with pytest.raises(pn.DTypeError, match=r"op\.plan: dtype .* is not a storage dtype; use fp32, bf16 or fp16"):
        inputs.storage_dtype(bad, "op.plan")
