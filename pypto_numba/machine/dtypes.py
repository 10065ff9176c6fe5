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
``storage_view``, ``empty``, ``to_float32``, ``from_float32``; the cast modes ``CAST_MODES``,
``cast_mode``, :class:`CastMode`.

Cast modes
----------
PyPTO's ``pl.cast`` narrows fp32 -> bf16/fp16 by one of six modes (npu-facts 8.3): ``rint``
(nearest, ties to even: everything above, and the hicann lineage's default, npu-facts 4.5),
``round`` (nearest, ties away from zero: ``pl.cast``'s default), ``floor``, ``ceil``, ``trunc``
and ``odd``. ``odd`` is *round to odd* (von Neumann rounding, "jamming"): truncate, and set the
lowest kept bit when any dropped bit is set. That is what CANN documents for ``CAST_ODD`` ("when
the dropped part is not 0 and the kept part is even, carry"), not nearest-ties-to-odd; it never
rounds a finite value to Inf. Overflow follows IEEE: ``rint``/``round`` give Inf; ``ceil`` gives
+Inf above the maximum and -max below -max, ``floor`` the mirror image; ``trunc`` and ``odd``
give +-max. Inf stays Inf, NaN stays NaN (the rint NaN rules), subnormals are produced.
(``none``, a reinterpretation, is not a narrowing.)

In kernels the mode is a :class:`CastMode` *argument*, whose numba type carries the mode: each
mode compiles its own specialisation (``rint``'s is the code above, unchanged), no kernel tests the
mode per element. ``narrow(a, v, mode)`` / ``round_as(a, v, mode)`` take it as a third argument
(omitted: rint). Which mode a strategy uses is resolved by ``profile.resolve_cast_mode``.

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
from numba.core import datamodel
from numba.extending import NativeValue, intrinsic, overload, register_model, typeof_impl, unbox

from pypto_numba.errors import PyptoNumbaError
from pypto_numba.machine.ir.convert import (  # noqa: F401  (the IR forms, re-exported)
    CAST_MODES,
    bf16_bits_ir,
    bf16_bits_mode_ir,
    bf16_value_ir,
    fp16_bits_ir,
    fp16_bits_mode_ir,
    fp16_value_ir,
    narrow_ir,
    narrow_mode_ir,
    round_mode_ir,
    widen_ir,
)
from pypto_numba.machine.ir.memory import ptr, raw_type, stream_store
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
    "CAST_MODES",
    "CastMode",
    "CastModeError",
    "cast_mode",
    "store_narrow_mode",
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
# Cast modes: a Python value whose numba type names the mode (a compile-time specialisation)
# ----------------------------------------------------------------------------------------------


class CastModeError(PyptoNumbaError):
    """An unknown cast mode."""


class CastMode:
    """A narrowing mode, passed to kernels as an argument: its numba type :class:`CastModeType`
    carries the mode, so one kernel source compiles once per mode (no per-element branch)."""

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"CastMode({self.name!r})"

    def __eq__(self, other):
        return isinstance(other, CastMode) and other.name == self.name

    def __hash__(self):
        return hash(("CastMode", self.name))

    def __reduce__(self):
        return (cast_mode, (self.name,))


_CAST_MODES = {name: CastMode(name) for name in CAST_MODES}
RINT = _CAST_MODES["rint"]


def cast_mode(mode, where: str = None) -> CastMode:
    """The :class:`CastMode` called ``mode`` (a CastMode passes through); an unknown name raises
    :class:`CastModeError` listing the modes (prefixed ``where:`` when given)."""
    if isinstance(mode, CastMode):
        return mode
    if isinstance(mode, str) and mode in _CAST_MODES:
        return _CAST_MODES[mode]
    head = f"{where}: " if where else ""
    raise CastModeError(
        f"{head}unknown cast mode {mode!r}; modes: {', '.join(CAST_MODES)} (rint = nearest even, "
        f"the hicann default; round = ties away, pl.cast's default)")


class CastModeType(types.Dummy):
    """The numba type of a :class:`CastMode`: one type per mode, no data."""

    def __init__(self, mode):
        self.mode = mode
        super().__init__(name=f"CastMode({mode})")


register_model(CastModeType)(datamodel.models.OpaqueModel)


@typeof_impl.register(CastMode)
def _typeof_cast_mode(val, c):
    return CastModeType(val.name)


@unbox(CastModeType)
def _unbox_cast_mode(typ, obj, c):
    return NativeValue(c.context.get_dummy_value())


def _mode_name(mode):
    """The mode name of an overload's ``mode`` argument type: omitted / None -> rint."""
    if mode is None or isinstance(mode, (types.Omitted, types.NoneType)):
        return "rint"
    if isinstance(mode, CastModeType):
        return mode.mode
    return None


def store_narrow_mode(builder, v, data, off, kind, lanes, mode, align=1, nontemporal=False):
    """``ir.store_narrow`` rounding by ``mode`` (rint: call ``ir.store_narrow`` itself)."""
    raw = raw_type(kind)
    p = ptr(builder, data, off, raw if lanes == 1 else ir.VectorType(raw, lanes))
    y = narrow_mode_ir(builder, v, kind, lanes, mode)
    if nontemporal:
        stream_store(builder, y, p, align)
    else:
        builder.store(y, p, align=align)


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


@intrinsic
def _f32_to_16_mode(typingctx, f, kview, mode):
    """float32 -> bits of the 16-bit kernel dtype of ``kview`` (a uint16/int16 scalar type or
    array) rounded by ``mode`` (a CastModeType)."""
    t = _kernel_scalar_type(kview)
    if not isinstance(f, types.Float) or t not in (types.uint16, types.int16) or not isinstance(mode, CastModeType):
        return None
    name = mode.mode

    def codegen(context, builder, sig, args):
        return narrow_mode_ir(builder, args[0], t, 1, name)

    return t(types.float32, kview, mode), codegen


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


def narrow(a, v, mode=None):
    """float32 value(s) -> the kernel dtype of array ``a``, rounded by ``mode`` (a CastMode or
    name; None: rint, round to nearest even)."""
    name = _dtype_name_of(a)
    m = RINT if mode is None else cast_mode(mode)
    f = np.asarray(v, dtype=np.float32)
    if m is RINT or name == "fp32":
        out = f.astype(STORAGE[name]).view(KERNEL[name])
    else:
        out = np.empty(f.shape, KERNEL[name])
        _narrow_flat_mode(np.ascontiguousarray(f).reshape(-1), out.reshape(-1), m)
    return out[()] if out.ndim == 0 else out


def round_as(a, v, mode=None):
    """float32 value(s) rounded to ``a``'s storage precision by ``mode`` and widened back."""
    name = _dtype_name_of(a)
    out = narrow(np.empty(0, KERNEL[name]), v, mode).view(STORAGE[name]).astype(np.float32)
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
def _narrow_impl(a, v, mode=None):
    t = _kernel_scalar_type(a)
    m = _mode_name(mode)
    if m is None:
        return None
    if t == types.float32:
        return lambda a, v, mode=None: np.float32(v)
    if m != "rint" and t in (types.uint16, types.int16):
        return lambda a, v, mode=None: _f32_to_16_mode(v, a, mode)
    if t == types.uint16:
        return lambda a, v, mode=None: f32_to_bf16_bits(v)
    if t == types.int16:
        return lambda a, v, mode=None: f32_to_fp16_bits(v)
    return None


@overload(round_as, jit_options={"forceinline": True})
def _round_as_impl(a, v, mode=None):
    t = _kernel_scalar_type(a)
    m = _mode_name(mode)
    if m is None:
        return None
    if t == types.float32:
        return lambda a, v, mode=None: np.float32(v)
    if m != "rint" and t == types.uint16:
        return lambda a, v, mode=None: bf16_bits_to_f32(_f32_to_16_mode(v, a, mode))
    if m != "rint" and t == types.int16:
        return lambda a, v, mode=None: fp16_bits_to_f32(_f32_to_16_mode(v, a, mode))
    if t == types.uint16:
        return lambda a, v, mode=None: bf16_bits_to_f32(f32_to_bf16_bits(v))
    if t == types.int16:
        return lambda a, v, mode=None: fp16_bits_to_f32(f32_to_fp16_bits(v))
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


@kernel
def _narrow_flat_mode(f, out, mode):
    for i in prange(f.size):
        out[i] = narrow(out, f[i], mode)


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


def from_float32(f: np.ndarray, name, mode=None) -> np.ndarray:
    """A new storage array of dtype ``name`` from float32 values, rounded by ``mode`` (a cast
    mode name or CastMode; None: rint, to nearest even).

    Inputs that are not float32 are converted to float32 first (for float64 that is a double
    rounding; pass float32 for the exact single-rounding result).
    """
    resolved = storage_name(name)
    if resolved is None:
        raise TypeError(f"from_float32: unknown storage dtype {name!r}")
    m = RINT if mode is None else cast_mode(mode, "from_float32")
    f = np.asarray(f, dtype=np.float32, order="C")
    if resolved == "fp32":
        return f.copy()
    a, k = empty(f.shape, resolved)
    if m is RINT:
        _narrow_flat(f.reshape(-1), k.reshape(-1))
    else:
        _narrow_flat_mode(f.reshape(-1), k.reshape(-1), m)
    return a
