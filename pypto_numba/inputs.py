"""Validation of public inputs, done in Python before any kernel runs.

Every check names the op and strategy (``where``), the argument, the offending value, the limit
and a way out. Nothing reaches a kernel unless its shape, dtype and size are valid, so kernels
never read outside an array.
"""

from __future__ import annotations

import dataclasses
import math
import numbers

import numpy as np

from .errors import ConstraintError, DTypeError, ShapeError, TileError
from .machine import dtypes, tile

ACCEPTED = "float32, float16 or ml_dtypes.bfloat16"
INT32_MAX = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Tensor:
    """A validated storage tensor: the contiguous array, its storage dtype name and kernel view."""

    array: np.ndarray
    dtype: str
    kview: np.ndarray
    copied_bytes: int  # > 0 when a non-contiguous input was copied (counted as workspace)

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def ndim(self) -> int:
        return self.array.ndim


def tensor(x, name: str, where: str, *, min_rank: int = 1, max_rank: int = None) -> Tensor:
    """Validate a floating-point storage tensor argument."""
    if isinstance(x, np.generic):  # a numpy scalar: judged as the 0-d array it is
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise DTypeError(
            f"{where}: {name} must be a numpy array of {ACCEPTED}, got {type(x).__name__}; "
            f"use numpy.asarray({name}, dtype=numpy.float32)"
        )
    if isinstance(x, np.ma.MaskedArray):  # kernels read the data, so the mask would be ignored
        raise DTypeError(
            f"{where}: {name} is a numpy masked array; its mask would be ignored. Pass "
            f"{name}.filled(value) (or numpy.asarray({name}) to use the data as it is)"
        )
    kind = dtypes.storage_name(x.dtype)
    if kind is None:
        raise DTypeError(
            f"{where}: {name} has dtype {x.dtype}; accepted: {ACCEPTED}; "
            f"convert with {name}.astype(numpy.float32)"
        )
    check_rank(x.shape, name, where, min_rank=min_rank, max_rank=max_rank)
    check_size(x.shape, name, where)
    copied = 0
    if not x.flags.c_contiguous:
        x = np.ascontiguousarray(x)
        copied = x.nbytes
    return Tensor(array=x, dtype=kind, kview=dtypes.kernel_view(x), copied_bytes=copied)


def storage_dtype(dtype, where: str, name: str = "dtype") -> str:
    """The storage dtype name ("fp32", "bf16", "fp16") of a plan's ``dtype`` argument (a name, a
    NumPy dtype or a scalar type); anything else is a :class:`DTypeError`, the one error every
    plan raises for it."""
    kind = dtypes.storage_name(dtype)
    if kind is None:
        raise DTypeError(
            f"{where}: {name} {dtype!r} is not a storage dtype; use fp32, bf16 or fp16 (numpy.float32, "
            f"ml_dtypes.bfloat16, numpy.float16)"
        )
    return kind


def check_rank(shape, name: str, where: str, *, min_rank: int = 1, max_rank: int = None):
    rank = len(shape)
    if rank < min_rank or (max_rank is not None and rank > max_rank):
        want = f"{min_rank}" if max_rank == min_rank else (
            f"at least {min_rank}" if max_rank is None else f"{min_rank} to {max_rank}"
        )
        raise ShapeError(f"{where}: {name} must have {want} dims, got shape {tuple(shape)}")


def check_size(shape, name: str, where: str):
    if any(d == 0 for d in shape):
        raise ShapeError(
            f"{where}: {name} has shape {tuple(shape)} with a zero-size dim; PyPTO tensors must be "
            f"non-empty"
        )
    n = math.prod(shape)
    if n > INT32_MAX:
        raise ConstraintError(
            f"{where}: {name} has {n} elements, more than PyPTO's INT32_MAX = {INT32_MAX} limit on "
            f"shape size; split the tensor"
        )


def same_dtype(where: str, **named: Tensor) -> str:
    """All named tensors share one storage dtype; returns it."""
    kinds = {name: t.dtype for name, t in named.items()}
    if len(set(kinds.values())) > 1:
        listed = ", ".join(f"{n}={k}" for n, k in kinds.items())
        raise DTypeError(f"{where}: inputs must share one storage dtype, got {listed}; cast them to one")
    return next(iter(kinds.values()))


def positive_int(value, name: str, where: str, *, error=TileError) -> int:
    """An option that must be a positive integer (tile sizes, counts)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise error(f"{where}: {name} must be a positive integer, got {value!r}")
    if value <= 0:
        raise error(f"{where}: {name} must be a positive integer, got {value}")
    return int(value)


def axis(dim, ndim: int, name: str, where: str) -> int:
    """Normalise a (possibly negative) dim index."""
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, numbers.Integral):
        raise ShapeError(f"{where}: {name} must be an int, got {dim!r}")
    if not -ndim <= dim < ndim:
        raise ShapeError(f"{where}: {name}={dim} is out of range for a {ndim}-d input (valid: {-ndim}..{ndim - 1})")
    return int(dim) % ndim


def output(where: str, xt: Tensor, out):
    """A new output, or the caller's ``out=`` (same shape and dtype, C-contiguous; may be x itself)."""
    if out is None:
        return tile.aligned_empty(xt.shape, xt.dtype)
    check_out_signature(where, xt, out)
    check_out_memory(where, xt.array, out)
    return out, dtypes.kernel_view(out)


def check_out_signature(where: str, xt: Tensor, out):
    """What ``out=`` must satisfy by its signature: a numpy array of x's dtype and shape,
    C-contiguous (:class:`~pypto_numba.machine.memo.CallMemo` keeps this per signature)."""
    if not isinstance(out, np.ndarray) or dtypes.storage_name(out.dtype) != xt.dtype:
        got = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise DTypeError(f"{where}: out must be a numpy array of x's dtype ({xt.dtype}), got {got}")
    if out.shape != xt.shape:
        raise ShapeError(f"{where}: out must have x's shape {xt.shape}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ConstraintError(f"{where}: out must be a writeable C-contiguous array")


def check_out_memory(where: str, x: np.ndarray, out: np.ndarray):
    """What ``out=`` must satisfy beyond its signature (shape, strides, dtype): writeable, and x
    itself or apart from x. A strategy that kept the rest of its checks for the signature
    (:class:`~pypto_numba.machine.memo.CallMemo`) still runs this on every call."""
    if not out.flags.writeable:
        raise ConstraintError(f"{where}: out must be a writeable C-contiguous array")
    if tile.address(out) != tile.address(x) and np.may_share_memory(out, x):
        raise ConstraintError(f"{where}: out overlaps x partially; pass out=x (in place) or a separate array")
