"""RoPE (split-half and GPT-J interleaved), per-head RMSNorm, and the fused Qwen3 RMSNorm+RoPE.

Math (``x[..., S, H, D]``; ``cos``, ``sin``: ``[S, R]`` or ``[..., S, R]`` broadcast over the
leading dims of x and over the H heads; ``R <= D`` even; dims ``R..D`` pass through unchanged)::

    standard     h = R/2:  out[i]   = x[i]*cos[i]     - x[h+i]*sin[i]        (i < h)
                           out[h+i] = x[h+i]*cos[h+i] + x[i]*sin[h+i]        (rotate_half, NeoX/HF)
    interleaved  out[2k]   = x[2k]*cos[2k]     - x[2k+1]*sin[2k]             (k < R/2, GPT-J)
                 out[2k+1] = x[2k+1]*cos[2k+1] + x[2k]*sin[2k+1]
    rmsnorm      y = x * rsqrt(mean(x**2, over D) + eps) * weight            (weight[D])
    fused        standard(rmsnorm(x, weight, eps), cos, sin), fp32 between the two
    cos_sin      f[p, i] = positions[p] * theta**(-2i/R); cos = cos(cat(f, f)), sin = sin(cat(f, f))

All math is fp32 with one cast to the storage dtype at the end (cos/sin and weight share x's
storage dtype). ``rmsnorm`` also accepts ``x[S, D]`` (read as H=1) and ``x[D]``.

Strategies (T = token tile, N = tokens = prod(x.shape[:-2]), n_lead = prod(x.shape[:-3]),
tasks = n_lead*ceil(S/T), b = itemsize, X = N*H*D*b = the bytes of x)::

    standard      1 vector kernel, GM read X + 2*N*R*b, write X
    interleaved   1 vector kernel, GM read X + 2*N*R*b, write X   (+ gathermask split / assemble ops)
    rmsnorm       1 vector kernel, GM read X + tasks*D*b, write X
    fused_rmsnorm 1 vector kernel, GM read X + tasks*D*b + 2*N*R*b, write X
    cos_sin       1 vector kernel, GM read 8*P + tasks*4*R (positions, inverse frequencies in
                  float64), write 2*P*R*b

``rmsnorm`` then ``standard`` costs 2 kernels and X read + X written more than ``fused_rmsnorm``
(the normed tensor makes a GM round trip): 4X of x traffic instead of 2X, so on a memory-bound
machine the fused kernel is up to 2x faster.

Tiling (npu-facts 3, the Qwen3 q/k RMSNorm+RoPE kernel): one task = T tokens x all H heads x D
(a contiguous ``T*H*D`` block of x), T from the profile's ``rope_token_tile`` (8); the last tile
of each leading index is a valid-shape tail. UB per task (last dims padded to 32 B):

- ``x_ub[T, H, D]`` storage (for 16-bit dtypes it takes the cast result back out: x is dead by then);
- 16-bit: ``xf_ub[T, H, D]`` fp32 (the widened tile, rotated in place);
- norm: ``sq_ub[T, H, D]`` fp32 (x*x, reduced over D -- a reduction tile, <= 64 KiB -- then reused
  for the normed result), ``rstd_ub[T, H, 8]`` fp32, ``w_ub[D]`` (+ ``wf_ub[D]`` fp32 for 16-bit);
- rope: ``cos_ub``, ``sin_ub[T, R]`` (+ fp32 copies for 16-bit);
- interleaved: the gathermask even/odd halves ``x_even``, ``x_odd[T, H, R/2]`` and
  ``cos_even``, ``cos_odd``, ``sin_even``, ``sin_odd[T, R/2]``, fp32.

Qwen3 q (bf16, H=16, D=128, T=8): 32 + 64 + 64 + 4 + 0.75 + 12 KiB = 176.75 KiB <= 192 KiB, and
sq_ub = 8*16*128*4 = 64 KiB: exactly the reduction limit, so T=8 is the largest token tile that
kernel could use. With the default ``token_tile`` the plan lowers T until the tiles fit (recorded
in ``plan.params["token_tile"]``); an explicit ``token_tile`` that does not fit is a TileError.

On the CPU each head row's D results are computed into a small per-thread staging row (the out
tile in UB) by one LLVM IR loop for every dtype (:func:`_rotate`: 16-lane steps, exact widening
on load, one rounding on store), and written out at once. fp32 rope alone on line-aligned head
rows skips the staging: each row goes from registers to GM, and a task walks its T tokens head
row by head row across the tokens, keeping T line streams in flight (:func:`_rotate_tokens`).
A task's output (T tokens x H x D) is one contiguous run of out; for outputs of >= ``STREAM_MIN_BYTES`` (4 MiB) every whole 64-byte line of that run is
written with a streaming (non-temporal) store -- the partial line between two head rows is
carried over in the staging row, only the partial lines at the task's two ends get plain stores
-- which skips the read-for-ownership of the destination lines that otherwise costs a third of
the DRAM traffic of this memory-bound op (whole lines: a line that gets both plain and streaming
stores, or is streamed in two halves, is the slow case). Every strategy takes ``out=`` (x's shape
and dtype; ``out=x`` works in place: a head row is read before it is written). A fresh output
costs its page faults on top (the kernel zeroes each new page before the first write): pass
``out=`` to reuse one.

Vector ops per element (cast = 1 for bf16/fp16, else 0; rows = N*H): rope 3 per rotated element
(2 mul + 1 add) + cast*(2 per rotated element + 2R per token for cos/sin); interleaved adds 2 per
rotated element (gathermask split + assemble back) and 2R per token (gathermask of cos/sin);
rmsnorm 4 per element (square, add, *rstd, *w) + 3 per row (/D, +eps, rsqrt) + cast*(2 per
element + D per task for the weight); fused = rmsnorm + rope with the casts of the norm only.
"""

from __future__ import annotations

import functools
import math as _math
import numbers

import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from . import inputs
from .errors import ConstraintError, DTypeError, ShapeError
from .machine import dtypes
from .machine.jit import device, kernel
from .machine.memo import CallMemo, memo_plan
from .machine.plan import KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from .machine import tile
from .machine.profile import load_profile
from .machine.tile import LINE, STREAM_MIN_BYTES, ScratchPool, stream_lines
from .machine.tile import copy as _copy
from .machine.tile import store_fence as _store_fence
from .strategy import Launch, register

ROPE_OPS = 3  # per rotated element: 2 mul + 1 add/sub
SPLIT_OPS = 2  # interleaved, per rotated element: gathermask split + assemble back
NORM_OPS = 4  # per element: x*x, sum, *rstd, *w
ROW_OPS = 3  # per row: *1/D, +eps, rsqrt


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = T tokens x H heads x D (a pypto.loop iteration on a vector core)
#
# x and out come in as [tokens, H*D] kernel views (one token of all heads is contiguous), cos
# and sin as [table rows, R]; cbase[l] is the first table row of leading index l (broadcasting
# over the leading dims of x). Each token's H*D results are computed into a per-thread staging
# row (the out tile in UB) and then copied out to GM in one go -- with streaming stores when
# ``stream`` (large outputs).
# Per-thread scratch comes in as arguments: numba.get_num_threads() inside a kernel would make
# it uncacheable.

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
    i64 = ir.IntType(64)
    f32 = ir.FloatType()
    fty = f32 if lanes == 1 else ir.VectorType(f32, lanes)
    raw = context.get_data_type(src_kind)
    rty = raw if lanes == 1 else ir.VectorType(raw, lanes)
    name = "llvm.fma.f32" if lanes == 1 else f"llvm.fma.v{lanes}f32"
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(fty, [fty] * 3), name)

    def load(arr, off, vty, kind):
        ptr = builder.bitcast(builder.gep(arr.data, [off]), vty.as_pointer())
        return dtypes.widen_ir(builder, builder.load(ptr, align=1), kind, lanes)

    with cgutils.for_range(builder, count) as loop:
        j = builder.add(start, builder.mul(loop.index, ir.Constant(i64, lanes)))
        jh = builder.add(j, h)
        a = load(x_arr, builder.add(xo, j), rty, src_kind)
        b = load(x_arr, builder.add(xo, jh), rty, src_kind)
        cj = builder.add(co, j)
        cjh = builder.add(co, jh)
        c1 = load(c_arr, cj, fty, types.float32)
        c2 = load(c_arr, cjh, fty, types.float32)
        s1 = load(s_arr, cj, fty, types.float32)
        s2 = load(s_arr, cjh, fty, types.float32)
        lo = builder.call(fma, [a, c1, builder.fneg(builder.fmul(b, s1))])
        hi = builder.call(fma, [a, s2, builder.fmul(b, c2)])
        store(d_arr, builder.add(do, j), lo)
        store(d_arr, builder.add(do, jh), hi)


def _rows_of(kinds, *arrays):
    return all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype in kinds for a in arrays)


_F32_ONLY = (types.float32,)
_ANY_KIND = (types.float32, types.uint16, types.int16)
_U64 = types.uint64


@intrinsic
def _rotate_stream(typingctx, out, o_off, x, x_off, cf, sf, c_off, half):
    """fp32 split-half rotation of one head row straight from x to out with 64-byte streaming
    stores: ``out[o+i] = x[i]*cf[c+i] - x[h+i]*sf[c+i]``, ``out[o+h+i] = x[h+i]*cf[c+h+i] + x[i]*sf[c+h+i]``
    (x from ``x_off``, c = ``c_off``: the token's row of the cos/sin tables; i < h = ``half``, a
    multiple of 16; ``out[o_off]`` and ``out[o_off + half]`` 64-byte aligned).

    Why: computing into a staging row and then streaming it out costs an extra store and load
    per element through L1, measured 0.6-0.85x of streaming straight from registers; numba's
    vectoriser cannot emit streaming stores itself, so the loop is written in LLVM IR
    (:func:`_rotation_loop`, as :func:`_rotate`). In place (``out`` = ``x``) is safe: each step
    reads its lines before it writes them, and later steps read only lines not yet written.
    """
    if not _rows_of(_F32_ONLY, out, x, cf, sf):
        return None

    def codegen(context, builder, sig, args):
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        v16 = ir.VectorType(ir.FloatType(), V16)
        h = args[7]

        def store(arr, off, vec):
            ptr = builder.bitcast(builder.gep(arr.data, [off]), v16.as_pointer())
            builder.store(vec, ptr, align=LINE).set_metadata("nontemporal", nontemporal)

        _rotation_loop(context, builder, sig, args, store, V16, ir.Constant(h.type, 0),
                       builder.udiv(h, ir.Constant(h.type, V16)))
        return context.get_dummy_value()

    return types.void(out, _U64, x, _U64, cf, sf, _U64, _U64), codegen


@intrinsic
def _rotate(typingctx, src, s_off, dst, d_off, cf, sf, half):
    """Split-half rotation of one head row ``src[s_off:]`` (storage or fp32) into ``dst[d_off:]``
    (storage or fp32) with the fp32 tables ``cf``, ``sf`` from element 0: fp32 math, one rounding
    to ``dst``'s dtype (as :func:`dtypes.narrow`). Offsets and ``half`` are uint64.

    Written in LLVM IR (:func:`_rotation_loop`): 16-lane steps, then the < 16 last elements of
    each half one by one. As plain numba loops, 16-bit rows ran at ~2 cycles per element (LLVM
    picked 256-bit vectors, with alias checks and a scalar rest per half of 64 elements).
    """
    if not (_rows_of(_ANY_KIND, src, dst) and _rows_of(_F32_ONLY, cf, sf)):
        return None

    def codegen(context, builder, sig, args):
        src_, s_off_, dst_, d_off_, cf_, sf_, h = args
        kind = sig.args[2].dtype
        # _rotation_loop's argument order: (dst, d_off, src, s_off, cf, sf, c_off, half)
        lsig = types.void(sig.args[2], _U64, sig.args[0], _U64, sig.args[4], sig.args[5], _U64, _U64)
        largs = [dst_, d_off_, src_, s_off_, cf_, sf_, ir.Constant(h.type, 0), h]
        ety = context.get_data_type(kind)
        nv = builder.udiv(h, ir.Constant(h.type, V16))
        done = builder.mul(nv, ir.Constant(h.type, V16))
        # 16-lane steps, then the rest of each half one element at a time
        for lanes, start, count in ((V16, ir.Constant(h.type, 0), nv), (1, done, builder.sub(h, done))):
            vty = ety if lanes == 1 else ir.VectorType(ety, lanes)

            def store(arr, off, val, vty=vty, lanes=lanes):
                ptr = builder.bitcast(builder.gep(arr.data, [off]), vty.as_pointer())
                builder.store(dtypes.narrow_ir(builder, val, kind, lanes), ptr, align=1)

            _rotation_loop(context, builder, lsig, largs, store, lanes, start, count)
        return context.get_dummy_value()

    return types.void(src, _U64, dst, _U64, cf, sf, _U64), codegen


def _rotate_direct(of, o, xf, cf, sf, c, half):
    """fp32 kernels: :func:`_rotate_stream`; a no-op for 16-bit views (never called for them)."""


@overload(_rotate_direct, jit_options={"forceinline": True})
def _rotate_direct_impl(of, o, xf, cf, sf, c, half):
    if isinstance(of, types.Array) and of.dtype == types.float32:
        return lambda of, o, xf, cf, sf, c, half: _rotate_stream(of, o, xf, o, cf, sf, c, half)
    return lambda of, o, xf, cf, sf, c, half: None


@device
def _rotate_tokens(of, xf, cflat, sflat, x0, c0, valid, H, uD, uR, uHD):
    """fp32 rope of ``valid`` consecutive tokens (x and out from flat element ``x0``, the tables
    from flat element ``c0``) straight from x to out (:func:`_rotate_stream`), head row by head
    row *across* the tokens: head h of token 0, 1, ... then head h+1. Each token's ``H*D`` run
    is its own stream of lines, so the task keeps ``valid`` streams of DRAM reads and writes in
    flight instead of one: 1.10-1.18x over walking one token at a time (copy-bound, 2 threads,
    x[4096, 32, 128]). Every head row takes the same operations either way (same bits)."""
    size = np.uint64(of.itemsize)
    uhalf = uR // np.uint64(2)
    for h in range(H):
        hoff = x0 + np.uint64(h) * uD
        for t in range(valid):
            off = hoff + np.uint64(t) * uHD
            _rotate_direct(of, off, xf, cflat, sflat, c0 + np.uint64(t) * uR, uhalf)
            stream_lines(of, off + uR, xf, off + uR, (uD - uR) * size)  # pass-through dims


@device
def _flush(staged, k, of, e, pre, L):
    """Write ``staged[0:k]`` to ``of[e:e+k]``: the first ``pre`` elements (up to the task's first
    line boundary) with plain stores, then every whole 64-byte line with streaming stores; the
    rest (< one line) moves to the front of ``staged`` for the next head row. All uint64.
    Returns (e, k, pre) after the write."""
    p = min(pre, k)
    if p:
        _copy(staged, np.uint64(0), of, e, p)
    n = (k - p) & ~(L - np.uint64(1))  # whole lines (L is a power of two: no division)
    stream_lines(of, e + p, staged, p, n * np.uint64(of.itemsize))
    done = p + n
    rest = k - done
    for i in range(rest):  # ascending: safe for the overlapping move to the front
        staged[i] = staged[done + i]
    return e + done, rest, pre - p


@kernel
def _norm_rope_kernel(x, weight, cos, sin, cbase, out, S, H, T, eps, do_norm, do_rope, cast, stream, direct, fscratch, oscratch):
    """rmsnorm (do_norm), standard rope (do_rope), or both fused with fp32 in between.

    x and out are [tokens, H*D] kernel views; a task's output (T tokens x H*D) is one contiguous
    run of ``out``. Each head row is computed into a small staging row (the out tile in UB) and
    written out at once: with ``stream``, by whole-line streaming stores (the partial lines at
    the two ends of the task with plain stores, the partial line between two head rows carried
    over in the staging row), else by plain stores. ``direct`` (fp32 rope without norm, every
    head row and its rotary halves line-aligned): no staging, the task's tokens rotated head row
    by head row across the tokens (:func:`_rotate_tokens`).
    """
    HD = x.shape[1]
    D = HD // H
    R = cos.shape[1] if do_rope else 0
    uD = np.uint64(D)
    uR = np.uint64(R)
    uHD = np.uint64(HD)
    uhalf = np.uint64(R // 2)
    n_lead = cbase.size
    s_tiles = (S + T - 1) // T
    b = x.itemsize
    inv_d = np.float32(1.0 / D)
    eps32 = np.float32(eps)
    one = np.float32(1.0)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    cflat = cos.reshape(-1)
    sflat = sin.reshape(-1)
    size = np.uint64(out.itemsize)
    L = np.uint64(LINE) // size  # elements per cache line
    addr0 = np.uint64(of.ctypes.data)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_lead * s_tiles):
        lead = task // s_tiles
        s0 = (task % s_tiles) * T
        valid = min(T, S - s0)  # valid shape of the tail tile
        tid = numba.get_thread_id()
        y = fscratch[tid, 0]  # the fp32 row (norm)
        wf = fscratch[tid, 1]
        cf = fscratch[tid, 2]
        sf = fscratch[tid, 3]
        staged = oscratch[tid]  # one head row + the carried partial line
        if do_norm:
            for j in range(D):
                wf[j] = dtypes.widen(weight[j])
        row0 = lead * S + s0
        e = np.uint64(row0) * uHD  # next element of out to write
        k = np.uint64(0)  # elements waiting in staged
        pre = np.uint64(0)  # elements before the task's first line boundary (plain stores)
        if stream:
            pre = (L - (addr0 + e * size) % np.uint64(LINE) // size) % L
        if direct:  # fp32 rope alone, line-aligned head rows: from registers to GM, no staging
            _rotate_tokens(of, xf, cflat, sflat, e, np.uint64(cbase[lead] + s0) * uR, valid, H, uD, uR, uHD)
        for t in range(0 if direct else valid):
            if do_rope:  # this token's cos/sin rows, widened (flat, uint64: vectorised)
                cb = np.uint64(cbase[lead] + s0 + t) * uR
                for i in range(uR):
                    cf[i] = dtypes.widen(cflat[cb + i])
                for i in range(uR):
                    sf[i] = dtypes.widen(sflat[cb + i])
            xb = np.uint64(row0 + t) * uHD
            for h in range(H):
                off = xb + np.uint64(h) * uD
                if do_norm:
                    ss = np.float32(0.0)
                    for j in range(uD):
                        v = dtypes.widen(xf[off + j])
                        y[j] = v
                        ss += v * v
                    rstd = one / np.sqrt(ss * inv_d + eps32)
                    for j in range(uD):
                        y[j] = y[j] * rstd * wf[j]
                    _rotate(y, np.uint64(0), staged, k, cf, sf, uhalf)  # fp32 in, one cast
                    for j in range(uR, uD):
                        staged[k + j] = dtypes.narrow(staged, y[j])
                else:
                    _rotate(xf, off, staged, k, cf, sf, uhalf)
                    _copy(xf, off + uR, staged, k + uR, uD - uR)  # pass-through: bit copy
                k += uD
                if stream:
                    e, k, pre = _flush(staged, k, of, e, pre, L)
                else:
                    _copy(staged, np.uint64(0), of, e, k)
                    e += k
                    k = np.uint64(0)
        if stream:
            _copy(staged, np.uint64(0), of, e, k)  # the partial line at the task's end
            _store_fence()
        rows = valid * H
        tasks += 1
        gm_read += rows * D * b
        gm_write += rows * D * b
        ops = 0
        if do_norm:
            gm_read += D * b
            ops += rows * D * NORM_OPS + rows * ROW_OPS + cast * (rows * D * 2 + D)
        if do_rope:
            gm_read += 2 * valid * R * b
            ops += rows * R * ROPE_OPS + cast * valid * R * 2
            if not do_norm:
                ops += cast * rows * R * 2
        vector_ops += ops
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _interleaved_kernel(x, cos, sin, cbase, out, S, H, T, cast, stream, fscratch, oscratch):
    """GPT-J RoPE: gathermask even/odd split (modes 1/2) to fp32, rotate, assemble interleaved."""
    HD = x.shape[1]
    D = HD // H
    R = cos.shape[1]
    uD = np.uint64(D)
    uR = np.uint64(R)
    uhalf = np.uint64(R // 2)
    uHD = np.uint64(HD)
    two = np.uint64(2)
    n_lead = cbase.size
    s_tiles = (S + T - 1) // T
    b = x.itemsize
    xf = x.reshape(-1)
    of = out.reshape(-1)
    size = np.uint64(out.itemsize)
    L = np.uint64(LINE) // size
    addr0 = np.uint64(of.ctypes.data)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_lead * s_tiles):
        lead = task // s_tiles
        s0 = (task % s_tiles) * T
        valid = min(T, S - s0)
        tid = numba.get_thread_id()
        # x_even, x_odd, cos_even, cos_odd, sin_even, sin_odd, y_even, y_odd (fp32, R/2 each)
        xe = fscratch[tid, 0]
        xo = fscratch[tid, 1]
        ce = fscratch[tid, 2]
        co = fscratch[tid, 3]
        se = fscratch[tid, 4]
        so = fscratch[tid, 5]
        ye = fscratch[tid, 6]
        yo = fscratch[tid, 7]
        staged = oscratch[tid]  # one head row + the carried partial line (see _norm_rope_kernel)
        row0 = lead * S + s0
        e = np.uint64(row0) * uHD
        kk = np.uint64(0)
        pre = np.uint64(0)
        if stream:
            pre = (L - (addr0 + e * size) % np.uint64(LINE) // size) % L
        for t in range(valid):
            crow = cbase[lead] + s0 + t
            for k in range(uhalf):  # gathermask mode 1 (even) and mode 2 (odd) of cos and sin
                ce[k] = dtypes.widen(cos[crow, two * k])
                co[k] = dtypes.widen(cos[crow, two * k + 1])
                se[k] = dtypes.widen(sin[crow, two * k])
                so[k] = dtypes.widen(sin[crow, two * k + 1])
            xb = np.uint64(row0 + t) * uHD
            for h in range(H):
                off = xb + np.uint64(h) * uD
                for k in range(uhalf):
                    xe[k] = dtypes.widen(xf[off + two * k])
                for k in range(uhalf):
                    xo[k] = dtypes.widen(xf[off + two * k + 1])
                for k in range(uhalf):  # rotate the halves
                    ye[k] = xe[k] * ce[k] - xo[k] * se[k]
                for k in range(uhalf):
                    yo[k] = xo[k] * co[k] + xe[k] * so[k]
                for k in range(uhalf):  # assemble back into pairs, one cast
                    staged[kk + two * k] = dtypes.narrow(staged, ye[k])
                    staged[kk + two * k + 1] = dtypes.narrow(staged, yo[k])
                _copy(xf, off + uR, staged, kk + uR, uD - uR)
                kk += uD
                if stream:
                    e, kk, pre = _flush(staged, kk, of, e, pre, L)
                else:
                    _copy(staged, np.uint64(0), of, e, kk)
                    e += kk
                    kk = np.uint64(0)
        if stream:
            _copy(staged, np.uint64(0), of, e, kk)  # the partial line at the task's end
            _store_fence()
        rows = valid * H
        tasks += 1
        gm_read += rows * D * b + 2 * valid * R * b
        gm_write += rows * D * b
        vector_ops += rows * R * (ROPE_OPS + SPLIT_OPS) + valid * 2 * R + cast * (rows * R * 2 + valid * R * 2)
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _cos_sin_kernel(positions, inv_freq, cos, sin, T):
    """HF tables cos/sin(cat(f, f)), f = position * inverse frequency, in float64, one cast."""
    P = positions.size
    half = inv_freq.size
    R = 2 * half
    b = cos.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange((P + T - 1) // T):
        p0 = task * T
        valid = min(T, P - p0)
        for p in range(p0, p0 + valid):
            for i in range(half):
                angle = positions[p] * inv_freq[i]
                c = dtypes.narrow(cos, np.float32(_math.cos(angle)))
                s = dtypes.narrow(sin, np.float32(_math.sin(angle)))
                cos[p, i] = c
                cos[p, half + i] = c
                sin[p, i] = s
                sin[p, half + i] = s
        tasks += 1
        gm_read += valid * 8 + half * 8
        gm_write += 2 * valid * R * b
        vector_ops += valid * half * 3 + valid * 2 * R  # angle, cos, sin; casts of both tables
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# shapes and plans


def _geometry(where, x_shape, cos_shape=None, *, rope=True, norm_only=False):
    """(n_lead, S, H, D, R) of ``x[..., S, H, D]`` (and of the tables ``cos[..., S, R]``).

    ``norm_only`` (rmsnorm) also reads x[S, D] as H=1 and x[D] as S=H=1.
    """
    x_shape = tuple(int(d) for d in x_shape)
    if norm_only:
        inputs.check_rank(x_shape, "x", where, min_rank=1)
        full = (1,) * max(0, 3 - len(x_shape)) + x_shape
        if len(x_shape) == 2:  # x[S, D]: one head per token
            full = (x_shape[0], 1, x_shape[1])
    else:
        if len(x_shape) < 3:
            raise ShapeError(
                f"{where}: x must be x[..., S, H, D] (at least 3 dims), got shape {x_shape}; "
                f"for one head use x[:, None, :]"
            )
        full = x_shape
    inputs.check_size(x_shape, "x", where)
    S, H, D = full[-3:]
    n_lead = _math.prod(full[:-3])
    R = 0
    if rope:
        R = D if cos_shape is None else int(cos_shape[-1])
        if cos_shape is not None:
            _check_tables(where, x_shape, tuple(int(d) for d in cos_shape))
    return n_lead, S, H, D, R


def _check_tables(where, x_shape, c_shape):
    if len(c_shape) < 2:
        raise ShapeError(f"{where}: cos/sin must be [S, R] or [..., S, R], got shape {c_shape}")
    inputs.check_size(c_shape, "cos", where)
    S, D = x_shape[-3], x_shape[-1]
    R = c_shape[-1]
    if R % 2:
        raise ShapeError(f"{where}: rotary dim R = cos.shape[-1] = {R} must be even")
    if R > D:
        raise ShapeError(f"{where}: rotary dim R = cos.shape[-1] = {R} exceeds head dim D = {D}")
    if c_shape[-2] != S:
        raise ShapeError(
            f"{where}: cos/sin have {c_shape[-2]} positions (shape {c_shape}) but x has S = {S} "
            f"(x shape {x_shape}, layout x[..., S, H, D]); slice the tables to cos[:S]"
        )
    lead, clead = x_shape[:-3], c_shape[:-2]
    extra = len(clead) - len(lead)
    ok = extra <= 0 or all(d == 1 for d in clead[:extra])
    clead = clead[max(extra, 0):]
    aligned = lead[len(lead) - len(clead):]
    if not ok or any(c not in (1, d) for c, d in zip(clead, aligned)):
        raise ShapeError(
            f"{where}: cos/sin leading dims {c_shape[:-2]} do not broadcast to x's leading dims "
            f"{lead} (cos/sin {c_shape}, x {x_shape})"
        )


@functools.lru_cache(maxsize=64)
def _table_rows(x_shape, c_shape, S):
    """cbase[l]: first table row used by leading index l of x (int64, one per leading index).

    Kept per shape (the kernels only read it): building it takes NumPy ~6 us, and ~80 us right
    after a large call has flushed the caches -- 1.5 % of a 64 MiB rope."""
    lead, clead = x_shape[:-3], c_shape[:-2]
    n_c = _math.prod(clead)
    clead = clead[max(len(clead) - len(lead), 0):]
    idx = np.arange(n_c, dtype=np.int64).reshape(clead) if clead else np.zeros((), np.int64)
    return np.ascontiguousarray(np.broadcast_to(idx, lead).reshape(-1) * S)


def _buffers(kind, T, H, D, R, dtype, prof):
    """The UB tiles of one task (last dims padded to 32 B), as listed in the module docstring."""
    wide = dtype != "fp32"
    Ds, Df = align_elems(D, dtype, prof), align_elems(D, "fp32", prof)
    out = [("x_ub", (T, H, Ds), dtype)]
    if wide:
        out.append(("xf_ub", (T, H, Df), "fp32"))
    if kind in ("rmsnorm", "fused_rmsnorm"):
        out += [
            ("sq_ub", (T, H, Df), "fp32"),
            ("rstd_ub", (T, H, align_elems(1, "fp32", prof)), "fp32"),
            ("w_ub", (Ds,), dtype),
        ]
        if wide:
            out.append(("wf_ub", (Df,), "fp32"))
    if kind != "rmsnorm":
        Rs, Rf = align_elems(R, dtype, prof), align_elems(R, "fp32", prof)
        out += [("cos_ub", (T, Rs), dtype), ("sin_ub", (T, Rs), dtype)]
        if wide:
            out += [("cosf_ub", (T, Rf), "fp32"), ("sinf_ub", (T, Rf), "fp32")]
    if kind == "interleaved":
        Hf = align_elems(R // 2, "fp32", prof)
        out += [("x_even", (T, H, Hf), "fp32"), ("x_odd", (T, H, Hf), "fp32")]
        out += [(n, (T, Hf), "fp32") for n in ("cos_even", "cos_odd", "sin_even", "sin_odd")]
    return out


def _nbytes(specs):
    return sum(_math.prod(shape) * dtypes.itemsize(dt) for _, shape, dt in specs)


def _max_token_tile(kind, H, D, R, dtype, prof):
    """Largest token tile whose buffers fit UB (and, with a norm, the 64 KiB reduction limit)."""
    one, two = (_nbytes(_buffers(kind, t, H, D, R, dtype, prof)) for t in (1, 2))
    per_token = two - one  # every buffer but the weight is linear in T
    t_max = (prof.ub_bytes - (one - per_token)) // per_token
    if kind in ("rmsnorm", "fused_rmsnorm"):  # sq_ub[T, H, D] fp32 is a reduction tile
        t_max = min(t_max, prof.reduce_tile_max_bytes // (H * align_elems(D, "fp32", prof) * 4))
    return max(0, t_max)


@memo_plan
def _plan(kind, x_shape, cos_shape, dtype, profile, token_tile) -> Plan:
    prof = load_profile(profile)
    where = f"rope.{kind}"
    name = dtypes.storage_name(dtype)
    if name is None:
        raise DTypeError(f"{where}: dtype {dtype!r} is not a storage dtype; use fp32, bf16 or fp16")
    norm = kind in ("rmsnorm", "fused_rmsnorm")
    n_lead, S, H, D, R = _geometry(where, x_shape, cos_shape, rope=kind != "rmsnorm", norm_only=kind == "rmsnorm")
    if kind != "rmsnorm" and cos_shape is None and D % 2:
        raise ShapeError(f"{where}: full rotary needs an even head dim, got D = {D}")
    t_max = _max_token_tile(kind, H, D, R, name, prof)
    if t_max:
        hint = f"use token_tile <= {t_max}"
    else:
        hint = (
            f"one token of H={H} heads x D={D} {name} does not fit; process fewer heads per call "
            f"(slices of the H axis)"
        )
    if token_tile is None:
        T = max(1, min(int(prof.tile("rope_token_tile")), t_max))
    else:
        T = inputs.positive_int(token_tile, "token_tile", where)
    bufs = [vector_tile(n, shape, dt, prof, where, hint) for n, shape, dt in _buffers(kind, T, H, D, R, name, prof)]
    if norm:
        reduce_tile(next(b for b in bufs if b.name == "sq_ub"), prof, where, hint)
    b = dtypes.itemsize(name)
    cast = int(name != "fp32")
    N = n_lead * S
    rows = N * H
    tasks = n_lead * -(-S // T)
    gm_read = rows * D * b
    ops = 0
    if norm:
        gm_read += tasks * D * b
        ops += rows * D * NORM_OPS + rows * ROW_OPS + cast * (rows * D * 2 + tasks * D)
    if kind != "rmsnorm":
        gm_read += 2 * N * R * b
        ops += rows * R * ROPE_OPS + cast * N * R * 2
        if kind == "interleaved":
            ops += rows * R * SPLIT_OPS + N * 2 * R
        if not norm:
            ops += cast * rows * R * 2
    k = KernelPlan(
        name=f"rope_{kind}",
        unit="vector",
        tasks=tasks,
        buffers=tuple(bufs),
        gm_read_bytes=gm_read,
        gm_write_bytes=rows * D * b,
        vector_ops=ops,
    )
    return Plan(op="rope", strategy=kind, dtype=name, profile=prof, kernels=(k,),
                params={"token_tile": T, "rot_dim": R}, hint=hint)


def plan_standard(x_shape, cos_shape=None, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`standard` for ``x_shape`` and table shape ``cos_shape`` (default ``[S, D]``)."""
    return _plan("standard", x_shape, cos_shape, dtype, profile, token_tile)


def plan_interleaved(x_shape, cos_shape=None, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`interleaved` (shapes as :func:`plan_standard`)."""
    return _plan("interleaved", x_shape, cos_shape, dtype, profile, token_tile)


def plan_rmsnorm(x_shape, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`rmsnorm` for ``x_shape``."""
    return _plan("rmsnorm", x_shape, None, dtype, profile, token_tile)


def plan_fused_rmsnorm(x_shape, cos_shape=None, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`fused_rmsnorm` (shapes as :func:`plan_standard`)."""
    return _plan("fused_rmsnorm", x_shape, cos_shape, dtype, profile, token_tile)


@memo_plan
def plan_cos_sin(positions_shape, rot_dim, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`cos_sin` for ``positions`` of ``positions_shape``."""
    prof = load_profile(profile)
    where = "rope.cos_sin"
    name = dtypes.storage_name(dtype)
    if name is None:
        raise DTypeError(
            f"{where}: dtype {dtype!r} is not a storage dtype; use numpy.float32, numpy.float16 or "
            f"ml_dtypes.bfloat16"
        )
    shape = tuple(int(d) for d in positions_shape)
    inputs.check_rank(shape, "positions", where, min_rank=1)
    inputs.check_size(shape, "positions", where)
    R = _rot_dim(rot_dim, where)
    inputs.check_size(shape + (R,), "each cos/sin output table", where)
    P = _math.prod(shape)
    T = prof.tile("rope_token_tile") if token_tile is None else inputs.positive_int(token_tile, "token_tile", where)
    specs = [("pos_ub", (align_elems(T, "fp32", prof),), "fp32"),
             ("angle_ub", (T, align_elems(R // 2, "fp32", prof)), "fp32"),
             ("cos_ub", (T, align_elems(R, name, prof)), name),
             ("sin_ub", (T, align_elems(R, name, prof)), name)]
    if name != "fp32":
        specs += [("cosf_ub", (T, align_elems(R, "fp32", prof)), "fp32"),
                  ("sinf_ub", (T, align_elems(R, "fp32", prof)), "fp32")]
    per_token = _nbytes(specs) // T
    hint = f"use token_tile <= {max(1, prof.ub_bytes // max(per_token, 1) - 1)}"
    bufs = [vector_tile(n, s, dt, prof, where, hint) for n, s, dt in specs]
    tasks = -(-P // T)
    b = dtypes.itemsize(name)
    k = KernelPlan(
        name="rope_cos_sin",
        unit="vector",
        tasks=tasks,
        buffers=tuple(bufs),
        gm_read_bytes=P * 8 + tasks * (R // 2) * 8,
        gm_write_bytes=2 * P * R * b,
        vector_ops=P * (R // 2) * 3 + P * 2 * R,
    )
    return Plan(op="rope", strategy="cos_sin", dtype=name, profile=prof, kernels=(k,),
                params={"token_tile": T, "rot_dim": R}, hint=hint)


def _rot_dim(rot_dim, where):
    if isinstance(rot_dim, (bool, np.bool_)) or not isinstance(rot_dim, numbers.Integral) or rot_dim <= 0:
        raise ShapeError(f"{where}: rot_dim must be a positive even integer, got {rot_dim!r}")
    if rot_dim % 2:
        raise ShapeError(f"{where}: rot_dim must be even (cos/sin repeat R/2 frequencies), got {rot_dim}")
    return int(rot_dim)


# ---------------------------------------------------------------------------------------------
# public strategies


def _eps(eps, where):
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real) or not (
        _math.isfinite(float(eps)) and float(eps) >= 0.0
    ):
        raise ConstraintError(f"{where}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _tables(where, xt, cos, sin):
    ct = inputs.tensor(cos, "cos", where, min_rank=2)
    st = inputs.tensor(sin, "sin", where, min_rank=2)
    if ct.shape != st.shape:
        raise ShapeError(f"{where}: cos and sin must have the same shape, got {ct.shape} and {st.shape}")
    if ct.dtype != xt.dtype or st.dtype != xt.dtype:
        raise DTypeError(
            f"{where}: cos/sin must have x's dtype ({xt.dtype}), got cos={ct.dtype}, sin={st.dtype}; "
            f"cast them, e.g. cos.astype(x.dtype), or build them with rope.cos_sin(..., dtype=x.dtype)"
        )
    return ct, st


def _weight(where, xt, weight):
    wt = inputs.tensor(weight, "weight", where, min_rank=1)
    D = xt.shape[-1]
    if wt.shape != (D,):
        raise ShapeError(f"{where}: weight must have shape ({D},) (the last dim of x {xt.shape}), got {wt.shape}")
    if wt.dtype != xt.dtype:
        raise DTypeError(f"{where}: weight must have x's dtype ({xt.dtype}), got {wt.dtype}; cast it with weight.astype(x.dtype)")
    return wt


def _streamable(out_k):
    """Streaming stores for outputs of at least ``STREAM_MIN_BYTES`` (module attribute: tests lower it)."""
    return tile.streamable(out_k, STREAM_MIN_BYTES)


_DUMMY = {name: np.zeros((1, 2), dt) for name, dt in dtypes.KERNEL.items()}


class _Call:
    """What a rope call derives from its signature: its plan, geometry and kernel constants
    (kept per signature in ``_CALLS``; see :class:`~pypto_numba.machine.memo.CallMemo`)."""

    __slots__ = ("kind", "where", "plan", "S", "H", "D", "R", "T", "cbase", "dtype", "kdt", "eps", "shapes", "scratch")

    def __init__(self, kind, where, plan, geometry, cbase, dtype, eps, shapes, scratch):
        self.kind, self.where, self.plan = kind, where, plan
        _, self.S, self.H, self.D, self.R = geometry
        self.T = plan.params["token_tile"]
        self.cbase, self.dtype, self.kdt = cbase, dtype, dtypes.KERNEL[dtype]
        self.eps, self.shapes, self.scratch = eps, shapes, scratch


_CALLS = CallMemo()


def _call(kind, x, weight, cos, sin, eps, profile, token_tile, out):
    """Run one rope call: what its signature determines comes from ``_CALLS`` when an earlier
    call had the same one, else from the full validation (which then keeps it)."""
    key = _CALLS.key(profile, (x, weight, cos, sin, out), (kind, eps, token_tile))
    c = _CALLS.get(key)
    if c is not None:
        return _launch(c, x, weight, cos, sin, out, 0)
    c, arrays, copied = _prepare(kind, x, weight, cos, sin, eps, profile, token_tile, out)
    if not copied:
        _CALLS.put(key, c)
    return _launch(c, *arrays, out, copied)


def _prepare(kind, x, weight, cos, sin, eps, profile, token_tile, out):
    """Validate a call in full -> (its :class:`_Call`, the contiguous arrays the kernel reads
    (x, weight, cos, sin; None where unused), the bytes copied to make them contiguous)."""
    where = f"rope.{kind}"
    norm = kind in ("rmsnorm", "fused_rmsnorm")
    rope = kind != "rmsnorm"
    xt = inputs.tensor(x, "x", where)  # rank checked by _geometry (with the layout in the message)
    ct = st = wt = None
    if rope:
        ct, st = _tables(where, xt, cos, sin)
    if norm:
        wt = _weight(where, xt, weight)
        eps = _eps(eps, where)
    p = _plan(kind, xt.shape, ct.shape if rope else None, xt.dtype, profile, token_tile)
    geometry = _geometry(where, xt.shape, ct.shape if rope else None, rope=rope, norm_only=not rope)
    n_lead, S, H, D, R = geometry
    if out is not None:
        inputs.check_out_signature(where, xt, out)  # its memory: every call, in _launch
    cbase = _table_rows(xt.shape, ct.shape, S) if rope else np.zeros(n_lead, np.int64)
    staged = (D + LINE // dtypes.itemsize(xt.dtype), dtypes.KERNEL[xt.dtype])
    if kind == "interleaved":
        # x_even, x_odd, cos_even, cos_odd, sin_even, sin_odd, y_even, y_odd (fp32), and the
        # staged output head row (+ a carried line)
        scratch = ScratchPool((R // 2, np.float32, 8), staged)
    else:  # fp32 row, weight, cos, sin; and the staged output head row (+ a carried line)
        scratch = ScratchPool((max(D, R), np.float32, 4), staged)
    shapes = [a.shape for a in (xt, wt, ct, st) if a is not None]
    c = _Call(kind, where, p, geometry, cbase, xt.dtype, float(eps if norm else 0.0), shapes, scratch)
    copied = xt.copied_bytes + sum(a.copied_bytes for a in (wt, ct, st) if a is not None)
    arrays = [None if a is None else a.array for a in (xt, wt, ct, st)]
    return c, arrays, copied


def _launch(c, x, weight, cos, sin, out, copied):
    """Run the kernel of a prepared call on arrays of its signature (``out=None``: a new result)."""
    H, D, R, kdt = c.H, c.D, c.R, c.kdt
    if out is None:
        result, out_k = tile.aligned_empty(x.shape, c.dtype)
    else:
        inputs.check_out_memory(c.where, x, out)
        result, out_k = out, out.view(kdt)
    rope = c.kind != "rmsnorm"
    dummy = _DUMMY[c.dtype]
    ck = cos.view(kdt).reshape(-1, R) if rope else dummy
    sk = sin.view(kdt).reshape(-1, R) if rope else dummy
    xk = x.view(kdt).reshape(-1, H * D)
    ok = out_k.reshape(-1, H * D)
    stream = _streamable(out_k)
    cast = int(c.dtype != "fp32")
    slabs = c.scratch.take()
    with Launch(c.plan, c.shapes) as run:
        if c.kind == "interleaved":
            counted = _interleaved_kernel(xk, ck, sk, c.cbase, ok, c.S, H, c.T, cast, stream, *slabs)
        else:
            norm = c.kind != "standard"
            # fp32 rope alone, with every head row (and its second rotary half) starting on a line
            line = LINE // out_k.itemsize
            direct = bool(stream and rope and not norm and c.dtype == "fp32" and tile.address(out_k) % LINE == 0
                          and D % line == 0 and (R // 2) % line == 0)
            wk = weight.view(kdt) if norm else dummy[0]
            counted = _norm_rope_kernel(xk, wk, ck, sk, c.cbase, ok, c.S, H, c.T, c.eps, norm, rope, cast,
                                        stream, direct, *slabs)
        run.count(counted)
        run.workspace(copied)
    c.scratch.give(slabs)
    return result


@register("rope", "standard", plan=plan_standard, summary="split-half (rotate_half, NeoX/HF) RoPE, one vector kernel")
def standard(x, cos, sin, *, profile=None, token_tile=None, out=None):
    """Split-half RoPE of ``x[..., S, H, D]`` with HF tables ``cos, sin[..., S, R]``.

    ``out[..., :R] = x[..., :R]*cos + cat(-x2, x1)*sin`` with ``x1, x2`` the halves of
    ``x[..., :R]``; dims ``R..D`` are copied. ``token_tile``: tokens per task (default: the
    profile's ``rope_token_tile``, lowered until the tiles fit UB); ``out=``: write the result
    there (x's shape and dtype; ``out=x`` works in place).
    """
    return _call("standard", x, None, cos, sin, 0.0, profile, token_tile, out)


@register("rope", "rmsnorm", plan=plan_rmsnorm, summary="per-head RMSNorm over D, one vector kernel (then apply a rope strategy)")
def rmsnorm(x, weight, eps=1e-6, *, profile=None, token_tile=None, out=None):
    """RMSNorm over the last dim: ``x * rsqrt(mean(x**2) + eps) * weight``, fp32 inside, one cast.

    ``x[..., S, H, D]`` (also ``x[S, D]``, ``x[D]``), ``weight[D]``. Options as :func:`standard`.
    """
    return _call("rmsnorm", x, weight, None, None, eps, profile, token_tile, out)


@register("rope", "fused_rmsnorm", plan=plan_fused_rmsnorm, summary="Qwen3 q/k RMSNorm + split-half RoPE in one kernel, fp32 between")
def fused_rmsnorm(x, weight, cos, sin, eps=1e-6, *, profile=None, token_tile=None, out=None):
    """``standard(rmsnorm(x, weight, eps), cos, sin)`` in one kernel, fp32 in between, one cast.

    Saves one kernel and one GM round trip of x (write + read of the normed tensor) over
    :func:`rmsnorm` followed by :func:`standard`. Options as :func:`standard`.
    """
    return _call("fused_rmsnorm", x, weight, cos, sin, eps, profile, token_tile, out)


@register("rope", "interleaved", plan=plan_interleaved, summary="GPT-J pairs via gathermask even/odd split, output interleaved")
def interleaved(x, cos, sin, *, profile=None, token_tile=None, out=None):
    """GPT-J RoPE of ``x[..., S, H, D]``: pairs ``(2k, 2k+1)`` rotated, output interleaved.

    ``out[2k] = x[2k]*cos[2k] - x[2k+1]*sin[2k]``, ``out[2k+1] = x[2k+1]*cos[2k+1] + x[2k]*sin[2k+1]``
    for ``k < R/2``; dims ``R..D`` are copied. Like PyPTO's InterleaveRope the kernel splits x,
    cos and sin into even/odd halves (gathermask modes 1/2) in fp32, but it assembles the result
    back into the input's interleaved layout. Options as :func:`standard`.
    """
    return _call("interleaved", x, None, cos, sin, 0.0, profile, token_tile, out)


def cos_sin(positions, rot_dim, theta=10000.0, dtype=np.float32, *, profile=None, token_tile=None):
    """HF-layout tables ``(cos, sin)``, each ``[*positions.shape, rot_dim]`` in ``dtype``.

    ``f[p, i] = positions[p] * theta**(-2i/rot_dim)`` (i < rot_dim/2), ``cos = cos(cat(f, f))``,
    ``sin = sin(cat(f, f))``. Angles and cos/sin are computed in float64 and rounded once to
    float32 (then to bf16/fp16: a double rounding that can differ from a single one only on a
    16-bit tie). HF computes the angles in fp32, which is off by up to ``|position| * 2**-24``
    radians. ``positions``: integer or float array (any shape), e.g. ``numpy.arange(S)``.
    """
    where = "rope.cos_sin"
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iuf":
        raise DTypeError(
            f"{where}: positions must be an integer or float array, got dtype {pos.dtype}; "
            f"use numpy.arange(S)"
        )
    if not (isinstance(theta, numbers.Real) and not isinstance(theta, (bool, np.bool_))
            and _math.isfinite(float(theta)) and float(theta) > 0.0):
        raise ConstraintError(f"{where}: theta must be a finite number > 0, got {theta!r}")
    p = plan_cos_sin(pos.shape, rot_dim, dtype, profile=profile, token_tile=token_tile)
    pos64 = np.ascontiguousarray(pos, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(pos64)):
        raise ConstraintError(f"{where}: positions must be finite")
    R = p.params["rot_dim"]
    inv_freq = float(theta) ** (-np.arange(0, R, 2, dtype=np.float64) / R)
    shape = pos.shape + (R,)
    c, ck = dtypes.empty(shape, p.dtype)
    s, sk = dtypes.empty(shape, p.dtype)
    with Launch(p, [pos.shape]) as run:
        run.count(_cos_sin_kernel(pos64, inv_freq, ck.reshape(-1, R), sk.reshape(-1, R), p.params["token_tile"]))
    return c, s


# --- lab spec ---
# What compare, advise and report need to know about rope (pypto_numba/lab/spec.py).

def _reference_rmsnorm(x, weight, eps: float = 1e-6):
    """``x * rsqrt(mean(x**2, -1) + eps) * weight``."""
    from .reference import f64

    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(weight)


def _reference_tables(cos, sin):
    """cos/sin ``[..., S, R]`` -> broadcastable to ``x[..., S, H, R]``."""
    from .reference import f64

    return f64(cos)[..., :, None, :], f64(sin)[..., :, None, :]


def _reference_standard(x, cos, sin):
    """Split-half (rotate_half) RoPE on the first R = cos.shape[-1] dims of ``x[..., S, H, D]``."""
    from .reference import f64

    x = f64(x)
    c, s = _reference_tables(cos, sin)
    rot = c.shape[-1]
    half = rot // 2
    out = x.copy()
    x1, x2 = x[..., :half], x[..., half:rot]
    out[..., :rot] = x[..., :rot] * c + np.concatenate([-x2, x1], axis=-1) * s
    return out


def _reference_interleaved(x, cos, sin):
    """GPT-J pairs: ``out[2k] = x[2k]cos[2k] - x[2k+1]sin[2k]``, ``out[2k+1] = x[2k+1]cos[2k+1] + x[2k]sin[2k+1]``."""
    from .reference import f64

    x = f64(x)
    c, s = _reference_tables(cos, sin)
    rot = c.shape[-1]
    out = x.copy()
    xe, xo = x[..., 0:rot:2], x[..., 1:rot:2]
    out[..., 0:rot:2] = xe * c[..., 0::2] - xo * s[..., 0::2]
    out[..., 1:rot:2] = xo * c[..., 1::2] + xe * s[..., 1::2]
    return out


def _reference_fused_rmsnorm(x, weight, cos, sin, eps: float = 1e-6):
    return _reference_standard(_reference_rmsnorm(x, weight, eps), cos, sin)


def _reference_cos_sin(positions, rot_dim: int, theta: float = 10000.0):
    """HF tables: ``f[p, i] = positions[p] * theta**(-2i/rot_dim)``, ``cos(cat(f, f))``, ``sin(cat(f, f))``."""
    pos = np.asarray(positions, dtype=np.float64)
    inv = theta ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    f = pos[..., None] * inv
    emb = np.concatenate([f, f], axis=-1)
    return np.cos(emb), np.sin(emb)


def _lab_inputs(shape, dtype, rng):
    """x ``[..., S, H, D]``, an RMSNorm weight near 1 and Qwen3's tables (theta 1e6)."""
    from .lab import normal
    from .machine import dtypes

    S, H, D = shape[-3:]
    cos, sin = _reference_cos_sin(np.arange(S), D, theta=1e6)
    store = dtypes.STORAGE[dtype]
    return (normal(shape, dtype, rng), normal((D,), dtype, rng, 0.1, 1.0),
            cos.astype(np.float32).astype(store), sin.astype(np.float32).astype(store))


def _lab_variants():
    from .lab import Variant

    return [
        Variant("standard", lambda x, w, c, s, **o: standard(x, c, s, **o),
                lambda x, w, c, s, **o: _reference_standard(x, c, s), True),
        Variant("interleaved", lambda x, w, c, s, **o: interleaved(x, c, s, **o),
                lambda x, w, c, s, **o: _reference_interleaved(x, c, s)),
        Variant("rmsnorm+standard", lambda x, w, c, s, **o: standard(rmsnorm(x, w, **o), c, s, **o),
                lambda x, w, c, s, **o: _reference_fused_rmsnorm(x, w, c, s)),
        Variant("fused_rmsnorm", lambda x, w, c, s, **o: fused_rmsnorm(x, w, c, s, **o),
                lambda x, w, c, s, **o: _reference_fused_rmsnorm(x, w, c, s)),
    ]


def _rope(
    profile,
    tokens=128,
    heads=16,
    head_dim=128,
    rot_dim=None,
    dtype="bf16",
    adjacent_rmsnorm=True,
    layout="split_half",
):
    from .lab import Candidate

    x = (tokens, heads, head_dim)
    cs = (tokens, rot_dim or head_dim)
    if layout == "interleaved":
        return [Candidate("interleaved", lambda: (plan_interleaved(x, cs, dtype, profile=profile),))], "interleaved", ()
    if not adjacent_rmsnorm:
        return [Candidate("standard", lambda: (plan_standard(x, cs, dtype, profile=profile),))], "standard", ()
    cands = [
        Candidate("rmsnorm+standard", lambda: (plan_rmsnorm(x, dtype, profile=profile),
                                               plan_standard(x, cs, dtype, profile=profile)), fused=False),
        Candidate("fused_rmsnorm", lambda: (plan_fused_rmsnorm(x, cs, dtype, profile=profile),)),
    ]
    return cands, "fused_rmsnorm", ("RMSNorm directly precedes RoPE (adjacent_rmsnorm=True): the seed's case for fusion",)


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed, Tolerance

    return OpSpec(
        name="rope",
        seed=Seed("standard", "fused_rmsnorm", "fuse RMSNorm+RoPE when the two are adjacent: saves GM traffic"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(128, 16, 128),
                      help="x shape [..., S, H, D], e.g. 128,16,128 (Qwen3 q, theta 1e6)"),
        variants=_lab_variants,
        tolerance=Tolerance(half=(1e-2, 1e-2)),  # npu-facts 3
        advise=_rope,  # named as advise's old rule: its TypeError names it
        oracles={
            "rmsnorm": _reference_rmsnorm,
            "rope_standard": _reference_standard,
            "rope_interleaved": _reference_interleaved,
            "rope_fused_rmsnorm": _reference_fused_rmsnorm,
            "cos_sin": _reference_cos_sin,
        },
    )


OP = _lab_spec()
