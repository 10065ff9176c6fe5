"""The vector unit's transcendental functions (float32 exp, tanh, erf, sigmoid, rsqrt), and the two
softmax row steps in explicit 16-lane vectors: ``rowmax`` and ``softmax_exp`` (exp, rounding of P
and the row sum).

Each formula is written once, as IR on a float32 scalar or a vector of any width (``exp_ir``,
``tanh_ir``, ``erf_ir``, ``sigmoid_ir``, ``rsqrt_ir``): the numba functions ``exp`` ... ``rsqrt``
are that IR on a scalar, and IR kernels (``softmax_exp``, GELU's span) use it on vectors, so the
scalar and vector results have the same bits by construction. ``exp_plain`` ... ``rsqrt_plain``
are the same formulas as plain numba code, the readable reference (``tests/machine/test_vmath.py``
checks all three agree bit for bit). The bf16/fp16 rounding of P is ``machine/ir/convert.py``'s
(``softmax_exp_mode``: by a cast mode, ``round_mode_ir``).

What
----
Scalar ``float32 -> float32`` functions for use inside kernels (``out[i] = tanh(x[i])``):

=============  =============================================================================
``exp(x)``     Cody-Waite range reduction ``x = n ln2 + r``, ``|r| <= ln2/2``, degree-6
               polynomial, exact two-step scaling by ``2^n`` (so subnormal results are rounded
               once). ``exp(x) = +Inf`` for ``x > 88.7228``, ``0`` for ``x < -103.97``.
``tanh(x)``    rational ``x P(x^2) / Q(x^2)`` (degrees 4/4 in ``x^2``) for ``|x| < 9``, else
               ``+-1`` (``1 - tanh(9) = 3e-8``); no exp, one division.
``erf(x)``     rational ``x P(x^2) / Q(x^2)`` (degrees 5/5 in ``x^2``) for ``|x| < 4``, else
               ``+-1`` (``1 - erf(4) = 1.5e-8``); no exp, one division.
``sigmoid(x)`` ``1 / (1 + exp(-x))`` (relative accuracy also in the tail ``x << 0``).
``rsqrt(x)``   ``1 / sqrt(x)`` with IEEE sqrt and division (no unrefined estimate).
=============  =============================================================================

Measured accuracy (``tests/machine/test_vmath.py`` asserts these, against float64 NumPy/SciPy; each grid
is 2^22 evenly spaced float32 points plus *every* float32 in a subrange holding the function's
split points; "ulp" is the float32 ulp of the exact result):

- ``exp``: measured max error 1.0 ulp (max rel error 8.5e-8) over grid [-87.3, 88.72] + every
  float32 in [0.5, 1] and [80, 88.72]; subnormal results (x in [-103.97, -87.34], 2^20 points)
  within 0.75 of the subnormal step 2^-149. Target: 4 ulp.
- ``tanh``: measured max abs error 3.0e-7 (max rel error 3.0e-7) over grid [-10, 10] + every
  float32 in [0.5, 1] and [8, 9.5]. Target: 2e-6 abs.
- ``erf``: measured max abs error 3.5e-7 (max rel error 3.5e-7) over grid [-6, 6] + every float32
  in [0.75, 1.5] and [3, 4.5]. Target: 2e-6 abs.
- ``sigmoid``: measured max abs error 9.0e-8 (max rel error 1.5e-7) over grid [-40, 40] + every
  float32 in [-1, -0.5]. Target: 2e-6 abs.
- ``rsqrt``: measured max error 1.49 ulp over every float32 in [1, 4] + 2^22 log-spaced points
  of [2^-126, 2^127]; < 1.5 ulp by construction (two correctly rounded operations).

Special values: NaN in -> NaN out for every function; ``exp(-inf) = 0``, ``exp(inf) = inf``;
``tanh(+-inf) = +-1``; ``erf(+-inf) = +-1``; ``sigmoid(-inf) = 0``, ``sigmoid(inf) = 1``;
``rsqrt(+0) = inf``, ``rsqrt(-0) = -inf`` (IEEE), ``rsqrt(inf) = 0``, ``rsqrt(x < 0) = nan``.
Large arguments saturate (``tanh(+-100) = +-1``, ``erf(+-10) = +-1``, ``sigmoid(-200) = 0``).

Why
---
``math.exp/tanh/erf`` compile to scalar libm calls (no SVML in numba), which stops loops from
vectorising. These versions are plain arithmetic, integer bit tricks and selects, without
branches or calls, so a loop over them compiles to AVX2/AVX-512 code and runs near memory
bandwidth. They are inlined (``forceinline``) and compiled with ``contract`` only
(:data:`VMATH_FASTMATH`; why: ``machine/jit.py``). Constants are float32 (a Python float
literal would promote the arithmetic to float64).

Coefficients are minimax fits of the functions named above, made for this module in float64
(Lawson-reweighted least squares; for the rationals, linearised Sanathanan-Koerner iterations)
and rounded to float32. tanh and erf are rationals rather than exp-based because that halves
their cost: the price is ~5 ulp of float32 evaluation error near +-1 instead of ~1.5, far inside
the 2e-6 target, and monotonicity only up to that error (where the exact function changes by
less than an ulp between neighbours). ``exp`` and ``sigmoid`` are monotone on the tested grids.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pypto_numba.machine import ir as irb
from pypto_numba.machine.dtypes import CastModeType, f32_as_u32, u32_as_f32
from pypto_numba.machine.ir.convert import round_mode_ir
from pypto_numba.machine.jit import device

__all__ = ["exp", "tanh", "erf", "sigmoid", "rsqrt", "rowmax", "load_max", "softmax_exp", "softmax_exp_ahead",
           "softmax_exp_mode", "exp_ir", "tanh_ir", "erf_ir", "sigmoid_ir", "rsqrt_ir", "VMATH_FASTMATH"]

VMATH_FASTMATH = frozenset({"contract"})
"""Fast-math flags of the vmath functions (see the module docstring for why not FASTMATH)."""

_vdevice = device(fastmath=set(VMATH_FASTMATH), forceinline=True)

_F = np.float32
_ONE = _F(1.0)
_HALF = _F(0.5)

# ---- exp ---------------------------------------------------------------------------------------
_LOG2E = _F(1.4426950408889634)
_LN2_HI = _F(0.693359375)  # 355/512: 9 significant bits, so n * _LN2_HI is exact for |n| < 2^15
_LN2_LO = _F(-2.1219444005469057e-4)  # ln2 - _LN2_HI
_EXP_HI = _F(89.0)  # exp(89) overflows: clamping there keeps 2^n representable and gives +Inf
_EXP_LO = _F(-104.0)  # exp(-104) < 2^-150 rounds to 0
# e^r = 1 + r + r^2 (C0 + C1 r + ... + C4 r^4) on |r| <= ln2/2; fit max rel error 3.1e-9
_EXP_C0 = _F(0.4999999403953552)
_EXP_C1 = _F(0.1666652113199234)
_EXP_C2 = _F(0.04166838899254799)
_EXP_C3 = _F(0.008368716575205326)
_EXP_C4 = _F(0.001381459878757596)

# ---- tanh --------------------------------------------------------------------------------------
# tanh x = x P(x^2) / Q(x^2) on |x| <= 9 (relative-error minimax rational fit, max 2.1e-8);
# all coefficients positive: Horner in x^2 >= 0 has no cancellation. |x| >= 9 gives +-1 (exact
# tanh(9) = 1 - 3.0e-8).
_TANH_P0 = _F(1.0)
_TANH_P1 = _F(0.13381029665470123)
_TANH_P2 = _F(0.0034955935552716255)
_TANH_P3 = _F(2.060916813206859e-05)
_TANH_P4 = _F(1.3354773287233002e-08)
_TANH_Q1 = _F(0.4671434462070465)
_TANH_Q2 = _F(0.025877002626657486)
_TANH_Q3 = _F(0.0003285643470007926)
_TANH_Q4 = _F(7.776605457365804e-07)
_TANH_SAT = _F(9.0)

# ---- erf ---------------------------------------------------------------------------------------
# erf x = x P(x^2) / Q(x^2) on |x| <= 4 (relative-error minimax rational fit, max 2.5e-8); all
# coefficients positive. |x| >= 4 gives +-1 (exact 1 - erf(4) = 1.5e-8).
_ERF_P0 = _F(1.1283791065216064)
_ERF_P1 = _F(0.1935451328754425)
_ERF_P2 = _F(0.05310175567865372)
_ERF_P3 = _F(0.0038833478465676308)
_ERF_P4 = _F(0.0002845661947503686)
_ERF_P5 = _F(1.986784127439023e-06)
_ERF_Q1 = _F(0.5048574805259705)
_ERF_Q2 = _F(0.11535003036260605)
_ERF_Q3 = _F(0.015207258053123951)
_ERF_Q4 = _F(0.0011855724733322859)
_ERF_Q5 = _F(3.742020999197848e-05)
_ERF_SAT = _F(4.0)

_EXP_C = (_EXP_C0, _EXP_C1, _EXP_C2, _EXP_C3, _EXP_C4)
_TANH_P = (_TANH_P0, _TANH_P1, _TANH_P2, _TANH_P3, _TANH_P4)
_TANH_Q = (_ONE, _TANH_Q1, _TANH_Q2, _TANH_Q3, _TANH_Q4)
_ERF_P = (_ERF_P0, _ERF_P1, _ERF_P2, _ERF_P3, _ERF_P4, _ERF_P5)
_ERF_Q = (_ONE, _ERF_Q1, _ERF_Q2, _ERF_Q3, _ERF_Q4, _ERF_Q5)


# ---- the formulas, once: IR on a float32 scalar or <L x float> vector -------------------------
# Each builds the same instructions in the same order whatever the width, with ``contract`` only
# (machine/jit.py): the scalar functions below are these on a scalar (so their bits are the
# vector kernels' bits), and the plain numba forms further down are the readable reference.


def exp_ir(builder, x, scalef=False):
    """:func:`exp` in IR: Cody-Waite reduction, degree-6 polynomial, two exact scalings by 2^n.

    ``scalef`` (``<16 x float>`` on an AVX-512F target only): the scaling is one VSCALEFPS, the
    same one rounding of ``p * 2^n`` in 1 instruction instead of 11."""
    o = irb.FOps(builder, x.type)
    # clamp with NaN going to a finite value, so the float -> int conversion below is defined
    xc = o.select(o.gt(x, _EXP_LO), x, _EXP_LO)
    xc = o.select(o.lt(xc, _EXP_HI), xc, _EXP_HI)
    n = o.floor(o.add(o.mul(xc, _LOG2E), _HALF))  # in [-150, 128]
    r = o.sub(xc, o.mul(n, _LN2_HI))  # exact
    r = o.sub(r, o.mul(n, _LN2_LO))
    poly = o.horner(r, _EXP_C)
    p = o.add(_ONE, o.add(r, o.mul(o.mul(r, r), poly)))
    # 2^n in two exact factors (2^n itself may not be a normal float32): only the last
    # multiplication rounds, which also makes subnormal and overflowing results correct
    if scalef:
        y = irb.scalef(builder, p, n)
    else:
        n1 = o.floor(o.mul(n, _HALF))
        y = o.mul(o.mul(p, o.pow2(n1)), o.pow2(o.sub(n, n1)))
    return o.select(o.eq(x, x), y, x)


def _rational_ir(builder, x, ps, qs, sat):
    """``sign(x) * min(1, |x| P(x^2) / Q(x^2))``, and ``+-1`` for ``|x| >= sat``."""
    o = irb.FOps(builder, x.type)
    a = o.abs(x)
    t = o.mul(a, a)  # may be Inf for huge |x|: that lane is replaced by 1 below
    r = o.div(o.mul(a, o.horner(t, ps)), o.horner(t, qs))
    r = o.select(o.gt(r, _ONE), _ONE, r)  # never above 1 (NaN stays NaN)
    r = o.select(o.ge(a, sat), _ONE, r)
    return o.copysign(r, x)


def tanh_ir(builder, x):
    """:func:`tanh` in IR: the rational ``x P(x^2) / Q(x^2)`` (degrees 4/4), saturated at 9."""
    return _rational_ir(builder, x, _TANH_P, _TANH_Q, _TANH_SAT)


def erf_ir(builder, x):
    """:func:`erf` in IR: the rational ``x P(x^2) / Q(x^2)`` (degrees 5/5), saturated at 4."""
    return _rational_ir(builder, x, _ERF_P, _ERF_Q, _ERF_SAT)


def sigmoid_ir(builder, x):
    """:func:`sigmoid` in IR: ``1 / (1 + exp(-x))``."""
    o = irb.FOps(builder, x.type)
    return o.div(_ONE, o.add(_ONE, exp_ir(builder, o.sub(-0.0, x))))


def rsqrt_ir(builder, x):
    """:func:`rsqrt` in IR: IEEE sqrt, then IEEE division."""
    o = irb.FOps(builder, x.type)
    return o.div(_ONE, o.sqrt(x))


def _on_scalar(formula):
    """A numba intrinsic ``float32 -> float32`` that is ``formula`` on a scalar."""

    @intrinsic
    def scalar(typingctx, x):
        if not isinstance(x, (types.Float, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            return formula(builder, args[0])

        return types.float32(types.float32), codegen  # numba casts the argument to float32

    return scalar


_exp1 = _on_scalar(exp_ir)
_tanh1 = _on_scalar(tanh_ir)
_erf1 = _on_scalar(erf_ir)
_sigmoid1 = _on_scalar(sigmoid_ir)
_rsqrt1 = _on_scalar(rsqrt_ir)


@_vdevice
def exp(x):
    """float32 e^x: measured max error 1.0 ulp over grid Y (target 4 ulp).

    Y = 2^22 points of [-87.3, 88.72] + every float32 in [0.5, 1] and [80, 88.72] (max rel error
    8.5e-8). Subnormal results are within 0.75 of the subnormal step. ``+Inf`` for
    ``x > 88.7228``, ``0`` below ``-103.97``; ``exp(-inf) = 0``, NaN -> NaN.
    """
    return _exp1(x)


@_vdevice
def tanh(x):
    """float32 tanh: measured max abs error 3.0e-7 over grid Y (target 2e-6).

    Y = 2^22 points of [-10, 10] + every float32 in [0.5, 1] and [8, 9.5] (max rel error
    3.0e-7, also for tiny |x|). ``tanh(+-inf) = +-1``, ``tanh(-0) = -0``, NaN -> NaN.
    """
    return _tanh1(x)


@_vdevice
def erf(x):
    """float32 erf: measured max abs error 3.5e-7 over grid Y (target 2e-6).

    Y = 2^22 points of [-6, 6] + every float32 in [0.75, 1.5] and [3, 4.5] (max rel error
    3.5e-7, also for tiny |x|). ``erf(+-inf) = +-1``, ``erf(-0) = -0``, NaN -> NaN.
    """
    return _erf1(x)


@_vdevice
def sigmoid(x):
    """float32 1 / (1 + e^-x): measured max abs error 9.0e-8 over grid Y (target 2e-6).

    Y = 2^22 points of [-40, 40] + every float32 in [-1, -0.5] (max rel error 1.5e-7).
    ``sigmoid(-inf) = 0``, ``sigmoid(inf) = 1``, NaN -> NaN; saturates without inf/inf.
    """
    return _sigmoid1(x)


@_vdevice
def rsqrt(x):
    """float32 1/sqrt(x): measured max error 1.49 ulp over grid Y.

    Y = every float32 in [1, 4] + 2^22 log-spaced points of [2^-126, 2^127]. IEEE sqrt then IEEE
    division: two roundings, < 1.5 ulp by construction. ``rsqrt(0) = inf``, ``rsqrt(-0) = -inf``,
    ``rsqrt(inf) = 0``, negative -> NaN, NaN -> NaN.
    """
    return _rsqrt1(x)


# ---- the readable reference: the same formulas as plain numba code ----------------------------
# (what the kernels used before the IR; tests/machine/test_vmath.py holds them bit-equal to the functions
# above)


@_vdevice
def _pow2(n):
    """2^n for an integer-valued float32 n in [-126, 127], built from its exponent bits."""
    return u32_as_f32(np.int32(n + _F(127.0)) << 23)


@_vdevice
def _copysign(m, x):
    """``|m|`` with the sign bit of ``x`` (m >= 0 here); NaN stays NaN, -0.0 keeps its sign."""
    return u32_as_f32(f32_as_u32(m) | (f32_as_u32(x) & 0x80000000))


@_vdevice
def exp_plain(x):
    """:func:`exp` as a plain numba function (the readable reference; same bits)."""
    x = _F(x)
    # clamp with NaN going to a finite value, so the float -> int conversion below is defined
    xc = x if x > _EXP_LO else _EXP_LO
    xc = xc if xc < _EXP_HI else _EXP_HI
    n = np.floor(xc * _LOG2E + _HALF)  # in [-150, 128]
    r = xc - n * _LN2_HI  # exact
    r = r - n * _LN2_LO
    p = _ONE + (r + r * r * (_EXP_C0 + r * (_EXP_C1 + r * (_EXP_C2 + r * (_EXP_C3 + r * _EXP_C4)))))
    # 2^n in two exact factors (2^n itself may not be a normal float32): only the last
    # multiplication rounds, which also makes subnormal and overflowing results correct
    n1 = np.floor(n * _HALF)
    y = (p * _pow2(n1)) * _pow2(n - n1)
    return y if x == x else x


@_vdevice
def tanh_plain(x):
    """:func:`tanh` as a plain numba function (the readable reference; same bits)."""
    x = _F(x)
    a = abs(x)
    t = a * a  # may be Inf for huge |x|: that lane is replaced by 1 below
    p = _TANH_P0 + t * (_TANH_P1 + t * (_TANH_P2 + t * (_TANH_P3 + t * _TANH_P4)))
    q = _ONE + t * (_TANH_Q1 + t * (_TANH_Q2 + t * (_TANH_Q3 + t * _TANH_Q4)))
    r = (a * p) / q
    r = _ONE if r > _ONE else r  # never above 1 (NaN stays NaN)
    r = _ONE if a >= _TANH_SAT else r
    return _copysign(r, x)


@_vdevice
def erf_plain(x):
    """:func:`erf` as a plain numba function (the readable reference; same bits)."""
    x = _F(x)
    a = abs(x)
    t = a * a
    p = _ERF_P0 + t * (_ERF_P1 + t * (_ERF_P2 + t * (_ERF_P3 + t * (_ERF_P4 + t * _ERF_P5))))
    q = _ONE + t * (_ERF_Q1 + t * (_ERF_Q2 + t * (_ERF_Q3 + t * (_ERF_Q4 + t * _ERF_Q5))))
    r = (a * p) / q
    r = _ONE if r > _ONE else r
    r = _ONE if a >= _ERF_SAT else r
    return _copysign(r, x)


@_vdevice
def sigmoid_plain(x):
    """:func:`sigmoid` as a plain numba function (the readable reference; same bits)."""
    x = _F(x)
    return _ONE / (_ONE + exp_plain(-x))


@_vdevice
def rsqrt_plain(x):
    """:func:`rsqrt` as a plain numba function (the readable reference; same bits)."""
    x = _F(x)
    return _ONE / np.sqrt(x)


# ---- rowmax ------------------------------------------------------------------------------------

_MAX_LANES = 16


def _max_step(builder, x, m):
    """Lane-wise ``x if x > m else m``: NaN in x never wins (the comparison is false)."""
    return builder.select(builder.fcmp_ordered(">", x, m), x, m)


def _count(context, builder, val, ty):
    """An element count argument as i64, negative counts as 0."""
    i64 = ir.IntType(64)
    cnt = context.cast(builder, val, ty, types.int64)
    return builder.select(builder.icmp_signed("<", cnt, ir.Constant(i64, 0)), ir.Constant(i64, 0), cnt)


@intrinsic
def rowmax(typingctx, s, base, c):
    """float32 max of ``s[base : base + c]`` (flat float32 array), ``-inf`` for ``c == 0``.

    NaN elements are skipped (``x > m`` is false for NaN); a caller that must see NaN checks for
    it when the result is ``-inf``. 16 lanes of running maxima (one 512-bit compare and select per
    16 elements), folded in halves at the end, the < 16 last elements in scalar steps. The max of
    a set does not depend on the order, so the result is exact whatever the lanes (only which of
    ``+0``/``-0`` is kept may differ, and neither changes ``s - max``). A loop of scalar maxima
    does not vectorise without the ``nnan`` flag (never used here, ``machine/jit.py``).
    """
    if not (isinstance(s, types.Array) and s.dtype == types.float32 and isinstance(c, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        f32 = ir.FloatType()
        vf = ir.VectorType(f32, _MAX_LANES)
        b0 = args[1]
        cnt = _count(context, builder, args[2], sig.args[2])
        ninf = float("-inf")
        vacc = cgutils.alloca_once_value(builder, ir.Constant(vf, [ninf] * _MAX_LANES))
        nvec = builder.udiv(cnt, ir.Constant(i64, _MAX_LANES))
        with cgutils.for_range(builder, nvec) as loop:
            off = builder.add(b0, builder.mul(loop.index, ir.Constant(i64, _MAX_LANES)))
            ptr = builder.bitcast(builder.gep(arr.data, [off]), vf.as_pointer())
            builder.store(_max_step(builder, builder.load(ptr, align=4), builder.load(vacc)), vacc)
        v = irb.fold_halves(builder, builder.load(vacc), lambda lo, hi: _max_step(builder, hi, lo))
        acc = cgutils.alloca_once_value(builder, builder.extract_element(v, ir.Constant(ir.IntType(32), 0)))
        done = builder.mul(nvec, ir.Constant(i64, _MAX_LANES))
        with cgutils.for_range(builder, builder.sub(cnt, done)) as loop:
            x = builder.load(builder.gep(arr.data, [builder.add(b0, builder.add(done, loop.index))]))
            builder.store(_max_step(builder, x, builder.load(acc)), acc)
        return builder.load(acc)

    return types.float32(s, types.uint64, c), codegen


@intrinsic
def load_max(typingctx, x, x_off, w, c, scale, mask, m_off):
    """``w[j] = fp32(x[x_off + j]) * scale + mask[m_off + j]`` for ``j < c`` (``scale`` and
    ``mask`` may be None: that part is skipped), returning the float32 max of ``w[:c]`` as
    :func:`rowmax` gives it: the load of a tile into UB and its row max in one pass.

    ``x`` a flat kernel view (float32, uint16 = bf16, int16 = fp16), ``w`` and ``mask`` flat
    float32, uint64 offsets and count. Multiply and add carry ``contract``, as a numba loop
    under ``VMATH_FASTMATH``/the kernels' flags: the bits of that loop.
    """
    none = (types.NoneType, types.Omitted)
    if not (isinstance(x, types.Array) and x.dtype in (types.float32, types.uint16, types.int16)
            and isinstance(w, types.Array) and w.dtype == types.float32 and isinstance(c, types.Integer)
            and (isinstance(scale, none) or isinstance(scale, types.Float))
            and (isinstance(mask, none) or (isinstance(mask, types.Array) and mask.dtype == types.float32))):
        return None
    has_scale = isinstance(scale, types.Float)
    has_mask = isinstance(mask, types.Array)

    def codegen(context, builder, sig, args):
        x_arr = context.make_array(sig.args[0])(context, builder, args[0])
        w_arr = context.make_array(sig.args[2])(context, builder, args[2])
        m_arr = context.make_array(sig.args[5])(context, builder, args[5]) if has_mask else None
        i64 = ir.IntType(64)
        f32 = ir.FloatType()
        xo, mo = args[1], args[6]
        cnt = _count(context, builder, args[3], sig.args[3])
        sc = context.cast(builder, args[4], sig.args[4], types.float32) if has_scale else None
        kind = sig.args[0].dtype

        def tile_at(j, lanes):
            v = irb.load_widen(builder, x_arr.data, builder.add(xo, j), kind, lanes)
            vty = v.type
            if has_scale:
                v = builder.fmul(v, sc if lanes == 1 else irb.splat(builder, sc, vty), flags=irb.CONTRACT)
            if has_mask:
                mv = irb.load(builder, m_arr.data, builder.add(mo, j), vty, 4)
                v = builder.fadd(v, mv, flags=irb.CONTRACT)
            builder.store(v, irb.ptr(builder, w_arr.data, j, vty), align=4)
            return v

        vf = ir.VectorType(f32, _MAX_LANES)
        vacc = cgutils.alloca_once_value(builder, ir.Constant(vf, [float("-inf")] * _MAX_LANES))
        nvec = builder.udiv(cnt, ir.Constant(i64, _MAX_LANES))
        with cgutils.for_range(builder, nvec) as loop:
            v = tile_at(builder.mul(loop.index, ir.Constant(i64, _MAX_LANES)), _MAX_LANES)
            builder.store(_max_step(builder, v, builder.load(vacc)), vacc)
        v = irb.fold_halves(builder, builder.load(vacc), lambda lo, hi: _max_step(builder, hi, lo))
        acc = cgutils.alloca_once_value(builder, builder.extract_element(v, ir.Constant(ir.IntType(32), 0)))
        done = builder.mul(nvec, ir.Constant(i64, _MAX_LANES))
        with cgutils.for_range(builder, builder.sub(cnt, done)) as loop:
            builder.store(_max_step(builder, tile_at(builder.add(done, loop.index), 1), builder.load(acc)), acc)
        return builder.load(acc)

    return types.float32(x, types.uint64, w, c, scale, mask, types.uint64), codegen


# ---- softmax_exp -------------------------------------------------------------------------------


_EXP_LANES = 16


def _softmax_exp_typing(s, c, p, like):
    ok = all(isinstance(a, types.Array) and a.dtype == types.float32 for a in (s, p))
    return (ok and isinstance(like, types.Array) and like.dtype in (types.float32, types.uint16, types.int16)
            and isinstance(c, types.Integer))


def _softmax_exp_codegen(mode, ahead=False):
    """The codegen of :func:`softmax_exp` rounding p by cast mode ``mode`` (``rint``: ``round_ir``);
    ``ahead``: arguments 6-8 are :func:`softmax_exp_ahead`'s array, offset and count."""

    def codegen(context, builder, sig, args):
        s_arr = context.make_array(sig.args[0])(context, builder, args[0])
        p_arr = context.make_array(sig.args[4])(context, builder, args[4])
        i64 = ir.IntType(64)
        f32 = ir.FloatType()
        b0 = args[1]
        cnt = _count(context, builder, args[2], sig.args[2])
        mval = context.cast(builder, args[3], sig.args[3], types.float32)
        like_t = sig.args[5].dtype
        has_scalef = irb.target_has(context, "avx512f")

        def one_step(lanes, off, total):
            vf = ir.VectorType(f32, lanes)
            if lanes == 1:
                x = builder.load(builder.gep(s_arr.data, [off]))
                xm = builder.fsub(x, mval)
                xv = builder.insert_element(ir.Constant(ir.VectorType(f32, 1), ir.Undefined), xm,
                                            ir.Constant(ir.IntType(32), 0))
            else:
                sp = builder.bitcast(builder.gep(s_arr.data, [off]), vf.as_pointer())
                xv = builder.fsub(builder.load(sp, align=4), irb.splat(builder, mval, vf))
            e = exp_ir(builder, xv, scalef=lanes == _EXP_LANES and has_scalef)
            r = round_mode_ir(builder, e, like_t, mode)
            pp = builder.bitcast(builder.gep(p_arr.data, [off]), vf.as_pointer())
            builder.store(r, pp, align=4)
            return builder.fadd(total, e)

        vf = ir.VectorType(f32, _EXP_LANES)
        vsum = cgutils.alloca_once_value(builder, irb.const(vf, 0.0))
        nvec = builder.udiv(cnt, ir.Constant(i64, _EXP_LANES))
        if ahead:  # one line of the next tile per vector step, the last line again past its end
            a_arr = context.make_array(sig.args[6])(context, builder, args[6])
            per_line = ir.Constant(i64, max(1, irb.LINE // context.get_abi_sizeof(context.get_data_type(sig.args[6].dtype))))
            a_lines = builder.udiv(builder.add(args[8], builder.sub(per_line, ir.Constant(i64, 1))), per_line)
            a_last = builder.sub(a_lines, ir.Constant(i64, 1))
        with cgutils.for_range(builder, nvec) as loop:
            off = builder.add(b0, builder.mul(loop.index, ir.Constant(i64, _EXP_LANES)))
            if ahead:
                with builder.if_then(builder.icmp_unsigned("!=", a_lines, ir.Constant(i64, 0))):
                    line = builder.select(builder.icmp_unsigned("<", loop.index, a_lines), loop.index, a_last)
                    irb.prefetch(builder, builder.gep(a_arr.data, [builder.add(args[7], builder.mul(line, per_line))]))
            builder.store(one_step(_EXP_LANES, off, builder.load(vsum)), vsum)
        v = irb.fold_halves(builder, builder.load(vsum), builder.fadd)
        acc = cgutils.alloca_once_value(builder, v)  # <1 x float>
        done = builder.mul(nvec, ir.Constant(i64, _EXP_LANES))
        with cgutils.for_range(builder, builder.sub(cnt, done)) as loop:
            off = builder.add(b0, builder.add(done, loop.index))
            builder.store(one_step(1, off, builder.load(acc)), acc)
        return builder.extract_element(builder.load(acc), ir.Constant(ir.IntType(32), 0))

    return codegen


@intrinsic
def softmax_exp(typingctx, s, base, c, m, p, like):
    """``p[base + j] = round_as(like, exp(s[base + j] - m))`` for ``j < c``; returns the float32 sum
    of the unrounded exps (the ``l`` of a softmax row).

    :func:`exp` in 512-bit vectors (LLVM's vectoriser may pick 256-bit, ``machine/jit.py``, and a
    softmax tile spent most of its time here), the sum in 16 lane partial sums folded in halves at the
    end, then the < 16 last elements one at a time (a fixed order: the bits do not depend on
    how the loop was compiled). ``like``: an array whose kernel dtype (float32, uint16 = bf16,
    int16 = fp16) gives the rounding of p; ``s`` and ``p`` flat float32 (may be the same array).
    """
    if not _softmax_exp_typing(s, c, p, like):
        return None
    return types.float32(s, types.uint64, c, types.float32, p, like), _softmax_exp_codegen("rint")


@intrinsic
def softmax_exp_ahead(typingctx, s, base, c, m, p, like, a, a_off, a_n):
    """:func:`softmax_exp` that also prefetches the next tile while it computes: one line of
    ``a[a_off : a_off + a_n]`` (a flat array of any dtype, uint64 offset and count) per 16-lane
    step, from its first line on. The NPU's double buffering (the MTE loads tile t+1 while the
    vector unit works on tile t): the exp is compute-bound, and without this the memory idles
    through it. A prefetch never faults and changes no result."""
    if not (_softmax_exp_typing(s, c, p, like) and isinstance(a, types.Array) and a.ndim == 1):
        return None
    return (types.float32(s, types.uint64, c, types.float32, p, like, a, types.uint64, types.uint64),
            _softmax_exp_codegen("rint", ahead=True))


@intrinsic
def softmax_exp_mode(typingctx, s, base, c, m, p, like, mode):
    """:func:`softmax_exp` with p rounded by ``mode`` (a ``dtypes.CastMode``: one specialisation
    per mode; rint is :func:`softmax_exp`'s code)."""
    if not (_softmax_exp_typing(s, c, p, like) and isinstance(mode, CastModeType)):
        return None
    return (types.float32(s, types.uint64, c, types.float32, p, like, mode),
            _softmax_exp_codegen(mode.mode))
