"""RoPE's rotation of one head row in LLVM IR: the staged form (:func:`_rotate`, any storage
dtype) and the fp32 streaming form (:func:`_rotate_stream`, registers straight to GM).

The readable form of both is ``rope/rotate_plain.py`` (plain numba loops, same bits).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

from ..machine import dtypes
from ..machine import ir as irb
from ..machine.ir import LINE

V16 = 16  # fp32 lanes of one 64-byte line


def _rotation_loop(context, builder, sig, args, store, lanes, start, count):
    """The rotation of one head row in LLVM IR, shared by :func:`_rotate_stream` and
    :func:`_rotate`; ``sig``/``args`` typed ``(dst, d_off, src, s_off, cf, sf, c_off, half)``.
    For ``count`` steps of ``lanes`` elements from element ``start`` of the first half
    (``lanes`` = 16: ``<16 x float>`` vectors; 1: scalars) it widens ``a = src[s+j]``,
    ``b = src[s+h+j]`` exactly and computes, in fp32,

        lo = fma(a, cf[c+j], -(b*sf[c+j])),   hi = fma(a, sf[c+h+j], b*cf[c+h+j])

    (one rounding per product that is not fused: the formula of the kernels' first version, as
    LLVM contracted it), then hands ``(dst, offset, value)`` for both to ``store``."""
    d_arr = context.make_array(sig.args[0])(context, builder, args[0])
    x_arr = context.make_array(sig.args[2])(context, builder, args[2])
    c_arr = context.make_array(sig.args[4])(context, builder, args[4])
    s_arr = context.make_array(sig.args[5])(context, builder, args[5])
    do, xo, co, h = args[1], args[3], args[6], args[7]
    src_kind = sig.args[2].dtype

    def load(arr, off, kind):
        return irb.load_widen(builder, arr.data, off, kind, lanes, align=1)

    def step(j):
        jh = builder.add(j, h)
        a = load(x_arr, builder.add(xo, j), src_kind)
        b = load(x_arr, builder.add(xo, jh), src_kind)
        cj = builder.add(co, j)
        cjh = builder.add(co, jh)
        c1 = load(c_arr, cj, types.float32)
        c2 = load(c_arr, cjh, types.float32)
        s1 = load(s_arr, cj, types.float32)
        s2 = load(s_arr, cjh, types.float32)
        lo = irb.fma(builder, a, c1, builder.fneg(builder.fmul(b, s1)))
        hi = irb.fma(builder, a, s2, builder.fmul(b, c2))
        store(d_arr, builder.add(do, j), lo)
        store(d_arr, builder.add(do, jh), hi)

    irb.steps(builder, start, count, lanes, step)


def _rows_of(kinds, *arrays):
    return all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype in kinds for a in arrays)


_F32_ONLY = (types.float32,)
_ANY_KIND = irb.STORAGE_KINDS
_U64 = types.uint64


@intrinsic
def _rotate_stream(typingctx, out, o_off, x, x_off, cf, sf, c_off, half):
    """fp32 split-half rotation of one head row straight from x to out with 64-byte streaming
    stores: ``out[o+i] = x[i]*cf[c+i] - x[h+i]*sf[c+i]``, ``out[o+h+i] = x[h+i]*cf[c+h+i] + x[i]*sf[c+h+i]``
    (x from ``x_off``, c = ``c_off``: the token's row of the cos/sin tables; i < h = ``half``, a
    multiple of 16; ``out[o_off]`` and ``out[o_off + half]`` 64-byte aligned).

    Why: computing into a staging row and then streaming it out costs an extra store and load
    per element through L1 (docs/performance.md); numba's vectoriser cannot emit streaming
    stores itself, so the loop is written in LLVM IR
    (:func:`_rotation_loop`, as :func:`_rotate`). In place (``out`` = ``x``) is safe: each step
    reads its lines before it writes them, and later steps read only lines not yet written.
    """
    if not _rows_of(_F32_ONLY, out, x, cf, sf):
        return None

    def codegen(context, builder, sig, args):
        h = args[7]

        def store(arr, off, vec):
            irb.stream_store(builder, vec, irb.ptr(builder, arr.data, off, vec.type), LINE)

        _rotation_loop(context, builder, sig, args, store, V16, ir.Constant(h.type, 0),
                       builder.udiv(h, ir.Constant(h.type, V16)))
        return context.get_dummy_value()

    return types.void(out, _U64, x, _U64, cf, sf, _U64, _U64), codegen


@intrinsic
def _rotate(typingctx, src, s_off, dst, d_off, cf, sf, half, mode=None):
    """Split-half rotation of one head row ``src[s_off:]`` (storage or fp32) into ``dst[d_off:]``
    (storage or fp32) with the fp32 tables ``cf``, ``sf`` from element 0: fp32 math, one rounding
    to ``dst``'s dtype (as :func:`dtypes.narrow`). Offsets and ``half`` are uint64.

    Written in LLVM IR (:func:`_rotation_loop`): 16-lane steps, then the < 16 last elements of
    each half one by one. As plain numba loops (kept as the readable reference:
    :func:`~pypto_numba.rope.rotate_plain.rotate_half_row`, same bits) LLVM picked 256-bit
    vectors, with alias checks and a scalar rest per half, and 16-bit rows ran slower.
    ``mode``: the cast mode (a ``dtypes.CastMode``; omitted or rint: ``ir.store_narrow``).
    """
    if not (_rows_of(_ANY_KIND, src, dst) and _rows_of(_F32_ONLY, cf, sf)
            and (mode is None or isinstance(mode, (types.NoneType, types.Omitted, dtypes.CastModeType)))):
        return None
    if not isinstance(mode, dtypes.CastModeType):
        mode = None
    cast = "rint" if mode is None else mode.mode

    def codegen(context, builder, sig, args):
        src_, s_off_, dst_, d_off_, cf_, sf_, h = args[:7]
        kind = sig.args[2].dtype
        # _rotation_loop's argument order: (dst, d_off, src, s_off, cf, sf, c_off, half)
        lsig = types.void(sig.args[2], _U64, sig.args[0], _U64, sig.args[4], sig.args[5], _U64, _U64)
        largs = [dst_, d_off_, src_, s_off_, cf_, sf_, ir.Constant(h.type, 0), h]
        nv = builder.udiv(h, ir.Constant(h.type, V16))
        done = builder.mul(nv, ir.Constant(h.type, V16))
        # 16-lane steps, then the rest of each half one element at a time
        for lanes, start, count in ((V16, ir.Constant(h.type, 0), nv), (1, done, builder.sub(h, done))):

            def store(arr, off, val, lanes=lanes):
                if cast == "rint":
                    irb.store_narrow(builder, val, arr.data, off, kind, lanes, align=1)
                else:
                    dtypes.store_narrow_mode(builder, val, arr.data, off, kind, lanes, cast, align=1)

            _rotation_loop(context, builder, lsig, largs, store, lanes, start, count)
        return context.get_dummy_value()

    # an omitted mode is typed None (numba folds the default into the call's arguments)
    return types.void(src, _U64, dst, _U64, cf, sf, _U64, types.none if mode is None else mode), codegen


def _rotate_direct(of, o, xf, cf, sf, c, half):
    """fp32 kernels: :func:`_rotate_stream`; a no-op for 16-bit views (never called for them)."""


@overload(_rotate_direct, jit_options={"forceinline": True})
def _rotate_direct_impl(of, o, xf, cf, sf, c, half):
    if irb.f32_array(of):
        return lambda of, o, xf, cf, sf, c, half: _rotate_stream(of, o, xf, o, cf, sf, c, half)
    return lambda of, o, xf, cf, sf, c, half: None

