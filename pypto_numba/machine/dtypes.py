"""Storage dtypes fp32 / bf16 / fp16 and bit-exact conversions usable inside ``@njit``.

What
----
The NPU stores tensors as fp32, bf16 or fp16 and computes on the vector unit in fp32. Numba has
no CPU float16 (and no bfloat16), so 16-bit tensors enter kernels as integer *kernel views*:

========  =====================  =====================
name      storage dtype (NumPy)  kernel view dtype
========  =====================  =====================
``fp32``  ``float32``            ``float32``
``bf16``  ``ml_dtypes.bfloat16`` ``uint16``
``fp16``  ``float16``            ``int16``
========  =====================  =====================

bf16 and fp16 use *different* integer types on purpose: the numba type of the array then tells a
kernel which storage format it holds, so one kernel source specialises to all three dtypes at
compile time (``widen`` / ``narrow`` / ``round_as`` are dispatched on the type, no runtime dtype
branch exists in any kernel).

Inside ``@njit`` code:

- scalar converters ``bf16_bits_to_f32``, ``f32_to_bf16_bits``, ``fp16_bits_to_f32``,
  ``f32_to_fp16_bits`` (bits are ``uint16`` for bf16 and ``int16`` for fp16);
- type-dispatched ``widen(s)`` (kernel-view scalar -> float32), ``narrow(a, v)`` (float32 -> a
  scalar of array ``a``'s kernel dtype, so ``out[i, j] = narrow(out, v)`` works for any rank) and
  ``round_as(a, v)`` (float32 rounded to ``a``'s storage precision and widened back; identity for
  float32 arrays, e.g. "P is rounded to bf16 before P@V");
- ``f32_as_u32`` / ``u32_as_f32``: scalar bit casts (LLVM ``bitcast``), no memory round trip.

In Python: ``STORAGE``, ``KERNEL``, ``storage_name``, ``itemsize``, ``kernel_view``,
``storage_view``, ``empty``, ``to_float32``, ``from_float32``.

Exactness
---------
All conversions are bit-exact to ``ml_dtypes.bfloat16`` and ``numpy.float16`` (tested on all
65,536 16-bit patterns and on a dense sample of the 2^32 float32 patterns, including rounding
ties, the overflow thresholds and the subnormal boundaries):

- float32 -> 16 bit rounds to nearest, ties to even; overflow goes to +-Inf as IEEE RNE says
  (fp16: ``|x| >= 65520``; bf16: ``|x| >= 0x7F7F8000``); subnormal results are produced;
  -0.0 keeps its sign.
- NaN handling follows the two references exactly: float32 -> bf16 gives the canonical quiet
  NaN ``0x7FC0`` with the input's sign (what ml_dtypes does); float32 -> fp16 keeps the sign and
  the top 10 payload bits, and a payload that would vanish becomes 1 so the result stays NaN
  (what NumPy does; it does not set the quiet bit). 16 -> 32 bit widening is exact for every
  pattern, NaN payloads included.

Why it is written this way
--------------------------
Every converter is branch-free 32-bit integer arithmetic plus selects (no table, no
data-dependent branch, no slow path: subnormal inputs convert at the same speed), so loops over
them vectorise (AVX2/AVX-512) and a parallel convert-copy runs at about the speed of a plain copy
loop. The bodies are the IR of ``machine/ir/convert.py``, one source for the scalar converters
here and the vector kernels.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic, overload

from pypto_numba.machine.ir.convert import (  # noqa: F401  (the IR forms, re-exported)
    bf16_bits_ir,
    bf16_value_ir,
    fp16_bits_ir,
    fp16_value_ir,
    narrow_ir,
    widen_ir,
)
from pypto_numba.machine.jit import device, kernel

__all__ = [
    "STORAGE",
    "KERNEL",
    "storage_name",
    "itemsize",
    "kernel_view",
    "storage_view",
    "empty",
    "to_float32",
    "from_float32",
    "f32_as_u32",
    "u32_as_f32",
    "bf16_bits_to_f32",
    "f32_to_bf16_bits",
    "fp16_bits_to_f32",
    "f32_to_fp16_bits",
    "widen",
    "narrow",
    "round_as",
]

# ----------------------------------------------------------------------------------------------
# Python-side tables
# ----------------------------------------------------------------------------------------------

STORAGE = {
    "fp32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
}
"""Storage (user-visible) NumPy dtype of each storage name."""

KERNEL = {
    "fp32": np.dtype(np.float32),
    "bf16": np.dtype(np.uint16),
    "fp16": np.dtype(np.int16),
}
"""Kernel-view NumPy dtype of each storage name (what a kernel's array argument holds)."""

_BY_DTYPE = {dt: name for name, dt in STORAGE.items()}
_BY_KERNEL_DTYPE = {dt: name for name, dt in KERNEL.items()}


def storage_name(dtype) -> str | None:
    """``"fp32"``, ``"bf16"`` or ``"fp16"`` for a storage dtype, dtype-like or name; else None.

    Accepts NumPy dtypes, scalar types (``np.float16``, ``ml_dtypes.bfloat16``), dtype strings
    (``"float32"``, ``"bfloat16"``) and the names themselves. Never raises: anything else
    (including non-native byte order, ``None`` and the integer kernel-view dtypes) gives None so
    that the caller can raise its own public error.
    """
    if dtype is None:
        return None
    if isinstance(dtype, str) and dtype in STORAGE:
        return dtype
    try:
        dt = np.dtype(dtype)
    except Exception:  # noqa: BLE001 - any failure means "not a storage dtype"
        return None
    return _BY_DTYPE.get(dt)


def itemsize(name) -> int:
    """Bytes per element of a storage name (or anything ``storage_name`` accepts): 4 or 2."""
    resolved = storage_name(name)
    if resolved is None:
        raise KeyError(f"not a storage dtype: {name!r}; expected one of {sorted(STORAGE)}")
    return STORAGE[resolved].itemsize


def kernel_view(a: np.ndarray) -> np.ndarray:
    """Zero-copy view of a storage array (float32/bfloat16/float16) as its kernel dtype."""
    name = _BY_DTYPE.get(a.dtype)
    if name is None:
        raise TypeError(
            f"kernel_view: dtype {a.dtype} is not a storage dtype; expected float32, "
            f"bfloat16 or float16"
        )
    return a.view(KERNEL[name])


def storage_view(k: np.ndarray, name) -> np.ndarray:
    """Inverse of :func:`kernel_view`: zero-copy view of a kernel-view array as storage dtype."""
    resolved = storage_name(name)
    if resolved is None:
        raise TypeError(f"storage_view: unknown storage dtype {name!r}")
    if k.dtype != KERNEL[resolved]:
        raise TypeError(
            f"storage_view: a {resolved} kernel view must have dtype {KERNEL[resolved]}, "
            f"got {k.dtype}"
        )
    return k.view(STORAGE[resolved])


def empty(shape, name):
    """A new uninitialised storage array and its kernel view (sharing memory): ``(a, kview)``."""
    resolved = storage_name(name)
    if resolved is None:
        raise TypeError(f"empty: unknown storage dtype {name!r}")
    a = np.empty(shape, STORAGE[resolved])
    return a, a.view(KERNEL[resolved])


# ----------------------------------------------------------------------------------------------
# Scalar bit casts (LLVM bitcast; vectorise to nothing)
# ----------------------------------------------------------------------------------------------


@intrinsic
def f32_as_u32(typingctx, x):
    """The IEEE-754 bits of a float32 as uint32 (a float64 argument is first cast to float32)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.IntType(32))

    # numba casts the actual argument to the signature's argument type before codegen
    return types.uint32(types.float32), codegen


@intrinsic
def u32_as_f32(typingctx, u):
    """The float32 whose bits are the low 32 bits of an integer (any integer type)."""
    if not isinstance(u, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], ir.FloatType())

    return types.float32(types.uint32), codegen


# ----------------------------------------------------------------------------------------------
# Scalar converters
#
# The bodies are the IR converters of machine/ir/convert.py on scalars (the same code serves the
# vector kernels): branch-free 32-bit integer IR, which loops vectorise with 16 lanes per AVX-512
# register (numba would type the integer arithmetic as int64: half the lanes).
# ----------------------------------------------------------------------------------------------

# Converters are integer code plus one exact float addition: compiled without fast-math flags,
# always inlined (the calling kernel's vectoriser must see them).
_converter = device(fastmath=False, forceinline=True)


@intrinsic
def _f32_to_bf16(typingctx, f):
    if not isinstance(f, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return bf16_bits_ir(builder, args[0])

    return types.uint16(types.float32), codegen


@intrinsic
def _fp16_to_f32(typingctx, h):
    if not isinstance(h, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return fp16_value_ir(builder, args[0])

    return types.float32(types.int16), codegen


@intrinsic
def _f32_to_fp16(typingctx, f):
    if not isinstance(f, types.Float):
        return None

    def codegen(context, builder, sig, args):
        return fp16_bits_ir(builder, args[0])

    return types.int16(types.float32), codegen


@_converter
def bf16_bits_to_f32(u):
    """bf16 bits (uint16, or any integer holding them in its low 16 bits) -> float32, exact."""
    return u32_as_f32((np.uint32(u) & 0xFFFF) << 16)


@_converter
def f32_to_bf16_bits(f):
    """float32 -> bf16 bits (uint16): round to nearest even; NaN -> 0x7FC0 with the sign."""
    return _f32_to_bf16(f)


@_converter
def fp16_bits_to_f32(h):
    """fp16 bits (int16, or any integer holding them in its low 16 bits) -> float32, exact.

    Inf/NaN keep their payload (not quieted), like NumPy.
    """
    return _fp16_to_f32(h)


@_converter
def f32_to_fp16_bits(f):
    """float32 -> fp16 bits (int16): round to nearest even, with subnormals and overflow to Inf.

    NaN keeps its sign and the top 10 payload bits (payload 0 becomes 1), like NumPy.
    """
    return _f32_to_fp16(f)


# ----------------------------------------------------------------------------------------------
# Type-dispatched generic helpers (plain Python bodies + numba overloads)
# ----------------------------------------------------------------------------------------------


def _dtype_name_of(a) -> str:
    dt = np.asarray(a).dtype
    name = _BY_KERNEL_DTYPE.get(dt) or _BY_DTYPE.get(dt)
    if name is None:
        raise TypeError(f"not a kernel-view or storage dtype: {dt}")
    return name


def widen(s):
    """Kernel-view value -> float32: float32 stays, uint16 is bf16 bits, int16 is fp16 bits.

    The Python body works on NumPy scalars/arrays (also storage dtypes); inside ``@njit`` the
    numba overload below is used.
    """
    arr = np.asarray(s)
    name = _dtype_name_of(arr)
    out = arr.view(STORAGE[name]).astype(np.float32)
    return out[()] if out.ndim == 0 else out


def narrow(a, v):
    """float32 value(s) -> the kernel dtype of array ``a`` (round to nearest even)."""
    name = _dtype_name_of(a)
    out = np.asarray(v, dtype=np.float32).astype(STORAGE[name]).view(KERNEL[name])
    return out[()] if out.ndim == 0 else out


def round_as(a, v):
    """float32 value(s) rounded to ``a``'s storage precision and widened back to float32."""
    name = _dtype_name_of(a)
    out = np.asarray(v, dtype=np.float32).astype(STORAGE[name]).astype(np.float32)
    return out[()] if out.ndim == 0 else out


def _kernel_scalar_type(a):
    """The numba scalar type that selects the storage format: array dtype or the scalar type."""
    t = a.dtype if isinstance(a, types.Array) else a
    if t in (types.float32, types.uint16, types.int16):
        return t
    return None


@overload(widen, jit_options={"forceinline": True})
def _widen_impl(s):
    t = _kernel_scalar_type(s)
    if t == types.float32:
        return lambda s: s
    if t == types.uint16:
        return lambda s: bf16_bits_to_f32(s)
    if t == types.int16:
        return lambda s: fp16_bits_to_f32(s)
    return None


@overload(narrow, jit_options={"forceinline": True})
def _narrow_impl(a, v):
    t = _kernel_scalar_type(a)
    if t == types.float32:
        return lambda a, v: np.float32(v)
    if t == types.uint16:
        return lambda a, v: f32_to_bf16_bits(v)
    if t == types.int16:
        return lambda a, v: f32_to_fp16_bits(v)
    return None


@overload(round_as, jit_options={"forceinline": True})
def _round_as_impl(a, v):
    t = _kernel_scalar_type(a)
    if t == types.float32:
        return lambda a, v: np.float32(v)
    if t == types.uint16:
        return lambda a, v: bf16_bits_to_f32(f32_to_bf16_bits(v))
    if t == types.int16:
        return lambda a, v: fp16_bits_to_f32(f32_to_fp16_bits(v))
    return None


# ----------------------------------------------------------------------------------------------
# Whole-array conversions
# ----------------------------------------------------------------------------------------------


@kernel
def _widen_flat(x, out):
    for i in prange(x.size):
        out[i] = widen(x[i])


@kernel
def _narrow_flat(f, out):
    for i in prange(f.size):
        out[i] = narrow(out, f[i])


def to_float32(a: np.ndarray) -> np.ndarray:
    """A new float32 array with the values of a storage array (or of a kernel-view array).

    float32, bfloat16 and float16 arrays are storage arrays; uint16 / int16 arrays are read as
    bf16 / fp16 kernel views. Parallel and exact.
    """
    a = np.asarray(a)
    name = _dtype_name_of(a)
    if name == "fp32":
        return np.array(a, dtype=np.float32, copy=True)
    k = np.asarray(a, order="C").view(KERNEL[name])
    out = np.empty(a.shape, np.float32)
    _widen_flat(k.reshape(-1), out.reshape(-1))
    return out


def from_float32(f: np.ndarray, name) -> np.ndarray:
    """A new storage array of dtype ``name`` from float32 values, rounded to nearest even.

    Inputs that are not float32 are converted to float32 first (for float64 that is a double
    rounding; pass float32 for the exact single-rounding result).
    """
    resolved = storage_name(name)
    if resolved is None:
        raise TypeError(f"from_float32: unknown storage dtype {name!r}")
    f = np.asarray(f, dtype=np.float32, order="C")
    if resolved == "fp32":
        return f.copy()
    a, k = empty(f.shape, resolved)
    _narrow_flat(f.reshape(-1), k.reshape(-1))
    return a
