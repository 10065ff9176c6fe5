"""IR on values: constants and splats, lane folds, and two instruction builders that read like the
formulas (:class:`FOps` for float32, :class:`IOps` for 32-bit integers), each on a scalar or on a
``<L x ...>`` vector, so one formula builds both the scalar and the vector code."""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils

I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
CONTRACT = ("contract",)  # the one fast-math flag of IR arithmetic here (see machine/jit.py)


def lanes_of(ty):
    """Lanes of a vector type, None for a scalar type."""
    return ty.count if isinstance(ty, ir.VectorType) else None


def like(ty, elem):
    """The type with ``ty``'s shape (scalar or ``<L x>``) and element type ``elem``."""
    n = lanes_of(ty)
    return elem if n is None else ir.VectorType(elem, n)


def const(ty, value):
    """The constant ``value`` of scalar type ``ty``, or in every lane of vector type ``ty``."""
    n = lanes_of(ty)
    return ir.Constant(ty, value if n is None else [value] * n)


def splat(builder, value, vty):
    """A vector of type ``vty`` with the run-time scalar ``value`` in every lane."""
    lane0 = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(lane0, lane0, ir.Constant(ir.VectorType(I32, vty.count), [0] * vty.count))


def fold_halves(builder, v, combine):
    """Fold a ``<L x>`` vector in halves, ``combine(low, high)`` lane-wise, down to ``<1 x>``."""
    width = v.type.count
    while width > 1:
        width //= 2
        i32v = ir.VectorType(I32, width)
        lo = builder.shuffle_vector(v, v, ir.Constant(i32v, list(range(width))))
        hi = builder.shuffle_vector(v, v, ir.Constant(i32v, list(range(width, 2 * width))))
        v = combine(lo, hi)
    return v


def fma(builder, a, b, c):
    """``llvm.fma(a, b, c)``: ``a*b + c`` with one rounding, on a float32 scalar or vector."""
    n = lanes_of(a.type)
    name = "llvm.fma.f32" if n is None else f"llvm.fma.v{n}f32"
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3), name)
    return builder.call(fn, [a, b, c])


def mul_add(builder, acc, x, y):
    """``acc + x*y`` with ``contract``: LLVM fuses it into one FMA (as numba's kernels do)."""
    return builder.fadd(acc, builder.fmul(x, y, flags=CONTRACT), flags=CONTRACT)


def scalef(builder, a, n):
    """``a * 2^n`` for ``<16 x float>`` ``a`` and integer-valued ``n``, with one rounding
    (VSCALEFPS, AVX-512F; the caller checks the target): subnormal and overflowing results are
    rounded as one IEEE multiplication by the exact power of two would round them."""
    vty = a.type
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vty, vty, vty, ir.IntType(16), I32]),
        "llvm.x86.avx512.mask.scalef.ps.512")
    return builder.call(fn, [a, n, a, ir.Constant(ir.IntType(16), -1), ir.Constant(I32, 4)])  # 4: MXCSR rounding


def intrinsic_fn(builder, name, ty, nargs=1):
    """The overloaded LLVM intrinsic ``llvm.<name>.<f32|vNf32>`` on ``ty`` (e.g. floor, fabs)."""
    n = lanes_of(ty)
    suffix = "f32" if n is None else f"v{n}f32"
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(ty, [ty] * nargs), f"llvm.{name}.{suffix}")


class FOps:
    """float32 IR on a scalar or a ``<L x float>`` vector (``ty``), each instruction with
    ``contract`` only: the backend fuses a multiply into the add that uses it, as it does in a
    numba function compiled with ``contract``. Python floats are constants (float32: exact)."""

    def __init__(self, builder, ty):
        self.b = builder
        self.ty = ty
        self.ity = like(ty, I32)

    def k(self, v):
        return const(self.ty, float(v))

    def _v(self, x):
        return self.k(x) if isinstance(x, (float, int, np.floating)) else x

    def mul(self, a, b):
        return self.b.fmul(self._v(a), self._v(b), flags=CONTRACT)

    def add(self, a, b):
        return self.b.fadd(self._v(a), self._v(b), flags=CONTRACT)

    def sub(self, a, b):
        return self.b.fsub(self._v(a), self._v(b), flags=CONTRACT)

    def div(self, a, b):
        return self.b.fdiv(self._v(a), self._v(b), flags=CONTRACT)

    def abs(self, a):
        return self.b.call(intrinsic_fn(self.b, "fabs", self.ty), [a])

    def floor(self, a):
        return self.b.call(intrinsic_fn(self.b, "floor", self.ty), [a])

    def sqrt(self, a):
        return self.b.call(intrinsic_fn(self.b, "sqrt", self.ty), [a])

    def gt(self, a, b):
        return self.b.fcmp_ordered(">", self._v(a), self._v(b))

    def lt(self, a, b):
        return self.b.fcmp_ordered("<", self._v(a), self._v(b))

    def ge(self, a, b):
        return self.b.fcmp_ordered(">=", self._v(a), self._v(b))

    def eq(self, a, b):
        return self.b.fcmp_ordered("==", self._v(a), self._v(b))

    def select(self, c, a, b):
        return self.b.select(c, self._v(a), self._v(b))

    def horner(self, t, coeffs):
        """``c0 + t*(c1 + t*(c2 + ...))`` for ``coeffs = (c0, c1, ...)``, innermost first."""
        acc = self.k(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.add(c, self.mul(t, acc))
        return acc

    def pow2(self, n):
        """2^n for integer-valued float32 ``n`` in [-126, 127], built from its exponent bits."""
        bits = self.b.shl(self.b.fptosi(self.add(n, 127.0), self.ity), const(self.ity, 23))
        return self.b.bitcast(bits, self.ty)

    def copysign(self, m, x):
        """``m``'s bits with ``x``'s sign bit (``m >= 0``; NaN stays NaN, -0.0 keeps its sign)."""
        sign = self.b.and_(self.b.bitcast(x, self.ity), const(self.ity, 0x80000000))
        return self.b.bitcast(self.b.or_(self.b.bitcast(m, self.ity), sign), self.ty)


class IOps:
    """One 32-bit integer IR instruction per call, so bit-level converters read like formulas.
    ``lanes`` > 1: the same instructions on ``<lanes x i32>`` (integer constants are splatted)."""

    def __init__(self, builder, lanes=1):
        self.b = builder
        self.lanes = lanes
        self.i32 = I32 if lanes == 1 else ir.VectorType(I32, lanes)
        self.f32 = F32 if lanes == 1 else ir.VectorType(F32, lanes)
        self.i16 = ir.IntType(16) if lanes == 1 else ir.VectorType(ir.IntType(16), lanes)

    def k(self, v):
        return const(self.i32, v & 0xFFFFFFFF)

    def fk(self, v):
        return const(self.f32, v)

    def _v(self, x):
        return self.k(x) if isinstance(x, int) else x

    def _binary(instruction):
        def op(self, x, y):
            return getattr(self.b, instruction)(self._v(x), self._v(y))
        return op

    def _shift(instruction):
        def op(self, x, n):
            return getattr(self.b, instruction)(self._v(x), self.k(n))
        return op

    add, sub, and_, or_ = _binary("add"), _binary("sub"), _binary("and_"), _binary("or_")
    shr, shl = _shift("lshr"), _shift("shl")  # logical shifts by a constant
    del _binary, _shift

    def cmp(self, op, x, y):
        return self.b.icmp_unsigned(op, self._v(x), self._v(y))

    def select(self, c, x, y):
        return self.b.select(c, self._v(x), self._v(y))

    def as_f32(self, x):
        return self.b.bitcast(self._v(x), self.f32)

    def as_u32(self, f):
        return self.b.bitcast(f, self.i32)
