"""IR conversions between float32 and the 16-bit storage formats (bf16, fp16), on a scalar
(``lanes=1``) or on ``<lanes x>`` vectors. Branch-free 32-bit integer code plus selects: every
path (normal, subnormal, overflow, Inf/NaN) is computed and the right one selected, so loops over
them vectorise; in i32 (numba would type the arithmetic as int64) a loop uses 16 lanes per
AVX-512 register. Bit-exact to ``ml_dtypes.bfloat16`` and ``numpy.float16`` (``machine/dtypes.py``
states the rules; ``tests/test_dtypes.py`` checks every 16-bit pattern).

Kernel-view dtypes name the storage format (``machine/dtypes.py``): numba ``float32`` is fp32,
``uint16`` is bf16 bits, ``int16`` is fp16 bits.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types

from .vector import IOps, const


def bf16_bits_ir(builder, f, lanes=1):
    """float32 (or ``<lanes x float>``) -> bf16 bits (i16): round to nearest even; NaN -> 0x7FC0
    with the sign."""
    o = IOps(builder, lanes)
    b = o.as_u32(f)
    # round to nearest even at bit 16; the carry reaches the exponent (overflow -> Inf)
    rounded = o.shr(o.add(o.add(b, 0x7FFF), o.and_(o.shr(b, 16), 1)), 16)
    qnan = o.or_(o.and_(o.shr(b, 16), 0x8000), 0x7FC0)  # ml_dtypes: canonical qNaN, signed
    is_nan = o.cmp(">", o.and_(b, 0x7FFFFFFF), 0x7F800000)
    return builder.trunc(o.select(is_nan, qnan, rounded), o.i16)


def bf16_value_ir(builder, h, lanes=1):
    """bf16 bits (i16 or ``<lanes x i16>``) -> float32, exact."""
    o = IOps(builder, lanes)
    return o.as_f32(o.shl(builder.zext(h, o.i32), 16))


def fp16_value_ir(builder, h, lanes=1):
    """fp16 bits (i16 or ``<lanes x i16>``) -> float32, exact; Inf/NaN keep their payload (not
    quieted), like NumPy."""
    o = IOps(builder, lanes)
    x = builder.zext(h, o.i32)
    sign = o.shl(o.and_(x, 0x8000), 16)
    em = o.shl(o.and_(x, 0x7FFF), 13)  # exponent and mantissa at their float32 positions
    e = o.and_(x, 0x7C00)
    normal = o.add(em, (127 - 15) << 23)  # rebias
    infnan = o.add(em, (255 - 31) << 23)  # exponent 0xFF, payload kept (not quieted)
    # subnormal m * 2^-24 = (1 + m/1024) * 2^-14 - 2^-14: normal operands, exact result
    sub = o.as_u32(builder.fsub(o.as_f32(o.add(em, 113 << 23)), o.fk(2.0**-14)))
    bits = o.select(o.cmp("==", e, 0x7C00), infnan, normal)
    bits = o.select(o.cmp("==", e, 0), sub, bits)
    return o.as_f32(o.or_(bits, sign))


def fp16_bits_ir(builder, f, lanes=1):
    """float32 (or ``<lanes x float>``) -> fp16 bits (i16): round to nearest even, with
    subnormals and overflow to Inf; NaN keeps its top 10 payload bits (NumPy)."""
    o = IOps(builder, lanes)
    b = o.as_u32(f)
    sign = o.and_(o.shr(b, 16), 0x8000)
    a = o.and_(b, 0x7FFFFFFF)
    # |f| >= 2^-14: rebias, round the 13 dropped bits to nearest even (carry may reach Inf)
    normal = o.shr(o.add(o.add(o.sub(a, (127 - 15) << 23), 0xFFF), o.and_(o.shr(a, 13), 1)), 13)
    # |f| < 2^-14: one float addition of 0.5 (whose ulp is 2^-24, the fp16 subnormal step)
    # rounds |f| to nearest even at that step; the bits above 0.5's are the fp16 bits
    # (0..0x400, where 0x400 is the smallest normal, also right)
    added = builder.fadd(o.as_f32(a), o.fk(0.5))
    sub = o.sub(o.as_u32(added), 0x3F000000)
    # NaN (NumPy): top 10 payload bits, and 1 if those are all zero so it stays NaN
    payload = o.and_(o.shr(a, 13), 0x3FF)
    nan = o.or_(o.select(o.cmp("==", payload, 0), 1, payload), 0x7C00)
    r = o.select(o.cmp("<", a, 113 << 23), sub, normal)
    r = o.select(o.cmp(">=", a, 0x477FF000), 0x7C00, r)  # 65520 (tie 65504|65536) -> Inf
    r = o.select(o.cmp(">", a, 0x7F800000), nan, r)
    return builder.trunc(o.or_(r, sign), o.i16)


def fp16_value_hw(builder, h, lanes=1):
    """fp16 bits -> float32 by the hardware conversion (``fpext`` of ``half``: ``vcvtph2ps``);
    exact, the same values as :func:`fp16_value_ir` (NaN payloads may be quieted)."""
    half = ir.HalfType() if lanes == 1 else ir.VectorType(ir.HalfType(), lanes)
    return builder.fpext(builder.bitcast(h, half), ir.FloatType() if lanes == 1 else ir.VectorType(ir.FloatType(), lanes))


def widen_ir(builder, raw, kind, lanes):
    """``<lanes x>`` kernel-view values (``kind``: numba float32, uint16 = bf16 bits or int16 =
    fp16 bits) -> ``<lanes x float>``, exactly as ``dtypes.widen``."""
    if kind == types.float32:
        return raw
    return (bf16_value_ir if kind == types.uint16 else fp16_value_ir)(builder, raw, lanes)


def narrow_ir(builder, v, kind, lanes):
    """``<lanes x float>`` -> ``<lanes x>`` values of kernel dtype ``kind``, exactly as
    ``dtypes.narrow`` (round to nearest even)."""
    if kind == types.float32:
        return v
    return (bf16_bits_ir if kind == types.uint16 else fp16_bits_ir)(builder, v, lanes)


def round_ir(builder, e, kind):
    """``dtypes.round_as`` on a ``<L x float>`` vector for kernel dtype ``kind``: float32 rounded
    to the storage precision and widened back, in the fewest instructions (bf16: round the low
    16 bits away in place; fp16: the hardware ``fptrunc``/``fpext``, IEEE round to nearest even
    with subnormals). The same values as ``widen_ir(narrow_ir(e))`` (``tests/test_ir.py``)."""
    vf = e.type
    if kind == types.float32:
        return e
    if kind == types.int16:
        half = builder.fptrunc(e, ir.VectorType(ir.HalfType(), vf.count))
        return builder.fpext(half, vf)
    vi = ir.VectorType(ir.IntType(32), vf.count)
    k = lambda v: const(vi, v)  # noqa: E731
    b = builder.bitcast(e, vi)
    lsb = builder.and_(builder.lshr(b, k(16)), k(1))
    rounded = builder.and_(builder.add(builder.add(b, k(0x7FFF)), lsb), k(0xFFFF0000))
    qnan = builder.or_(builder.and_(b, k(0x80000000)), k(0x7FC00000))
    is_nan = builder.icmp_unsigned(">", builder.and_(b, k(0x7FFFFFFF)), k(0x7F800000))
    return builder.bitcast(builder.select(is_nan, qnan, rounded), vf)


# ----------------------------------------------------------------------------------------------
# The other narrowing modes of PyPTO's cast (npu-facts 8.3). ``rint`` is the code above, unchanged;
# these build, per mode, the increment of the truncated magnitude from the dropped bits. Every
# path is computed and selected (branch-free), as above.
# ----------------------------------------------------------------------------------------------

CAST_MODES = ("rint", "round", "floor", "ceil", "trunc", "odd")


def _bump(o, q, rem, half, neg, mode):
    """The truncated magnitude ``q`` rounded by ``mode`` given the dropped bits ``rem`` (``half``:
    the value of the first dropped bit) and the sign flag ``neg`` (i1). ``odd`` is round to odd
    (von Neumann, "jamming"): truncate, then set the lowest kept bit if any dropped bit was set."""
    b = o.b
    inexact = o.cmp("!=", rem, 0)
    if mode == "trunc":
        return q
    if mode == "odd":
        return o.or_(q, b.zext(inexact, o.i32))
    if mode == "round":
        inc = o.cmp(">=", rem, half)
    elif mode == "rint":  # (the rint converters above are the ones used: this is their rule)
        inc = b.or_(o.cmp(">", rem, half), b.and_(o.cmp("==", rem, half), o.cmp("!=", o.and_(q, 1), 0)))
    elif mode == "floor":
        inc = b.and_(inexact, neg)
    elif mode == "ceil":
        inc = b.and_(inexact, b.not_(neg))
    else:
        raise ValueError(f"unknown cast mode {mode!r}; modes: {', '.join(CAST_MODES)}")
    return o.add(q, b.zext(inc, o.i32))


def bf16_bits_mode_ir(builder, f, mode, lanes=1):
    """float32 -> bf16 bits (i16) rounded by ``mode`` (one of :data:`CAST_MODES`); ``rint`` is
    :func:`bf16_bits_ir` itself. A carry into the exponent gives Inf exactly where IEEE directed
    rounding does (round: ``|x| >= 0x7F7F8000``; ceil: ``x > max``, floor: ``x < -max``); trunc and
    odd never reach Inf from a finite value. NaN -> 0x7FC0 with the sign, as rint."""
    if mode == "rint":
        return bf16_bits_ir(builder, f, lanes)
    o = IOps(builder, lanes)
    b = o.as_u32(f)
    a = o.and_(b, 0x7FFFFFFF)
    neg = o.cmp("!=", o.and_(b, 0x80000000), 0)
    mag = _bump(o, o.shr(a, 16), o.and_(a, 0xFFFF), 0x8000, neg, mode)
    rounded = o.or_(mag, o.and_(o.shr(b, 16), 0x8000))
    qnan = o.or_(o.and_(o.shr(b, 16), 0x8000), 0x7FC0)
    r = o.select(o.cmp(">", a, 0x7F800000), qnan, rounded)
    return builder.trunc(r, o.i16)


def fp16_bits_mode_ir(builder, f, mode, lanes=1):
    """float32 -> fp16 bits (i16) rounded by ``mode``; ``rint`` is :func:`fp16_bits_ir` itself.
    Normal results round the 13 dropped bits; subnormal ones (``|x| < 2^-14``) shift the 24-bit
    significand right by ``126 - e`` (at most 31: all bits dropped) and round what falls off.
    Finite ``|x| >= 65536`` overflows to Inf or to 65504 by the mode (IEEE: the nearest modes and
    the directed mode pointing outward give Inf; trunc, odd and the inward direction 65504);
    the carry out of 65504 gives Inf below 65536 as in :func:`bf16_bits_mode_ir`. Inf stays Inf;
    NaN as rint (NumPy's payload rule)."""
    if mode == "rint":
        return fp16_bits_ir(builder, f, lanes)
    o = IOps(builder, lanes)
    b = o.as_u32(f)
    sign = o.and_(o.shr(b, 16), 0x8000)
    neg = o.cmp("!=", sign, 0)
    a = o.and_(b, 0x7FFFFFFF)
    t = o.sub(a, (127 - 15) << 23)  # rebias (|x| >= 2^-14)
    normal = _bump(o, o.shr(t, 13), o.and_(t, 0x1FFF), 0x1000, neg, mode)
    e = o.shr(a, 23)
    m = o.or_(o.and_(a, 0x7FFFFF), o.select(o.cmp("==", e, 0), 0, 0x800000))
    s = o.sub(126, o.select(o.cmp("==", e, 0), 1, e))
    s = o.select(o.cmp(">", s, 31), 31, s)  # unsigned: the normal lanes' negatives become 31 too
    half = builder.shl(o.k(1), o.sub(s, 1))
    sub = _bump(o, builder.lshr(m, s), o.and_(m, o.sub(builder.shl(o.k(1), s), 1)), half, neg, mode)
    if mode == "round":
        ovf = o.k(0x7C00)
    elif mode in ("trunc", "odd"):
        ovf = o.k(0x7BFF)
    else:  # floor: -Inf / +65504; ceil: -65504 / +Inf
        ovf = o.select(neg, 0x7C00, 0x7BFF) if mode == "floor" else o.select(neg, 0x7BFF, 0x7C00)
    payload = o.and_(o.shr(a, 13), 0x3FF)
    nan = o.or_(o.select(o.cmp("==", payload, 0), 1, payload), 0x7C00)
    r = o.select(o.cmp("<", a, 113 << 23), sub, normal)
    r = o.select(o.cmp(">=", a, 0x47800000), ovf, r)  # finite |x| >= 65536
    r = o.select(o.cmp("==", a, 0x7F800000), 0x7C00, r)
    r = o.select(o.cmp(">", a, 0x7F800000), nan, r)
    return builder.trunc(o.or_(r, sign), o.i16)


def narrow_mode_ir(builder, v, kind, lanes, mode):
    """:func:`narrow_ir` rounding by ``mode``; ``rint`` is :func:`narrow_ir` itself."""
    if mode == "rint" or kind == types.float32:
        return narrow_ir(builder, v, kind, lanes)
    return (bf16_bits_mode_ir if kind == types.uint16 else fp16_bits_mode_ir)(builder, v, mode, lanes)


def round_mode_ir(builder, e, kind, mode):
    """:func:`round_ir` rounding by ``mode`` (narrow, then widen exactly); ``rint`` is
    :func:`round_ir` itself."""
    if mode == "rint" or kind == types.float32:
        return round_ir(builder, e, kind)
    lanes = e.type.count if isinstance(e.type, ir.VectorType) else 1
    r = widen_ir(builder, narrow_mode_ir(builder, e, kind, lanes, mode), kind, lanes)
    return r if r.type == e.type else builder.bitcast(r, e.type)  # <1 x float>: the lanes=1 IR is scalar
