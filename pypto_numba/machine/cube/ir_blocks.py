"""LLVM IR builders of the cube's register blocks (the blocks themselves: :mod:`.blocks`;
their plain numba versions: :mod:`.blocks_plain`).

Why LLVM IR: numba's loops keep one scalar accumulator per dot product and LLVM reduces each
vectorised one with its own shuffle tree; here every accumulator is a vector register of the
chosen width (explicit ``<16 x float>`` stays 512-bit; see machine/jit.py for the 512-bit
choice). Operands ``w`` are storage kernel views (float32, uint16 = bf16, int16 = fp16) widened
exactly to fp32 on load; offsets are flat uint64 element indices into the data of a C-contiguous
array of any rank. The order of every fp32 addition is fixed by the code, so results do not
depend on the thread count. The generic IR (loads, widening, FMA, prefetch, splat, lane folds,
operand checks, ``bfloat``) is :mod:`pypto_numba.machine.ir`'s; only the blocks are here.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .. import ir as irb
from ..ir import PREFETCH_L2

V16 = 16  # fp32 lanes of one 512-bit vector: the unit of dot4x2

# ``pairs`` modes of the dot blocks: how a step multiplies ``a`` by ``w``
WIDENED = None  # fp32 ``a``, ``w`` widened to fp32 on load, one FMA per element
DPBF16 = True  # bf16 ``a`` and ``w`` in pairs of elements by VDPBF16PS (AVX512_BF16)
PAIRS_FMA = False  # the same pairs sums by two FMAs (any AVX-512 CPU)
PAIRS_AUTO = "auto"  # DPBF16 when numba compiles for a CPU that has it, else PAIRS_FMA

def _load_widen(builder, data, off, kind, lanes):
    """``lanes`` storage elements at flat index ``off`` -> ``<lanes x float>`` (exact widening;
    fp16 by ``vcvtph2ps``), aligned to the element."""
    return irb.load_widen(builder, data, off, kind, lanes, align=4 if kind == types.float32 else 2, fp16_hw=True)


def _dot_block(
    builder,
    a_data,
    r0,
    lda,
    w,
    w_data,
    w0,
    ldw,
    nvec,
    rows,
    cols,
    lanes=V16,
    ahead=0,
    far=None,
    pairs=WIDENED,
):
    """The rows x cols accumulators of a register-blocked dot product over ``lanes*nvec`` elements
    (``2*lanes*nvec`` in pairs).

    Parameters
    ----------
    a_data, r0, lda : pointer to ``a``'s data, first row's offset, row stride (i64 values)
    w, w_data, w0, ldw : ``w``'s numba type, its data pointer, first row's offset, row stride
    nvec : steps of ``lanes`` (pairs: ``2*lanes``) elements
    rows, cols : rows of ``a`` and of ``w`` in the block
    ahead : > 0: each step also prefetches every weight row ``ahead`` elements further on
    far : an i64 value (0 at run time: none): each step also prefetches, into L2, the same
        elements of the weight rows ``far`` elements on (the rows a later pass will read)
    pairs : ``WIDENED``, ``DPBF16`` or ``PAIRS_FMA`` (see :func:`_pairs_step`)
    """
    f32 = ir.FloatType()
    i64 = ir.IntType(64)
    v16 = ir.VectorType(f32, lanes)
    zero = ir.Constant(v16, [0.0] * lanes)
    step = lanes if pairs is WIDENED else 2 * lanes
    accs = [cgutils.alloca_once_value(builder, zero) for _ in range(rows * cols)]
    arows = [builder.add(r0, builder.mul(lda, ir.Constant(i64, i))) for i in range(rows)]
    wrows = [builder.add(w0, builder.mul(ldw, ir.Constant(i64, j))) for j in range(cols)]
    with cgutils.for_range(builder, nvec) as loop:
        q = builder.mul(loop.index, ir.Constant(i64, step))
        if ahead:
            for wr in wrows:
                irb.prefetch(builder, builder.gep(w_data, [builder.add(wr, builder.add(q, ir.Constant(i64, ahead)))]))
        if far is not None:
            with builder.if_then(builder.icmp_unsigned("!=", far, ir.Constant(i64, 0))):
                for wr in wrows:
                    irb.prefetch(builder, builder.gep(w_data, [builder.add(builder.add(wr, far), q)]), PREFETCH_L2)
        if pairs is not WIDENED:
            _pairs_step(builder, accs, a_data, arows, w_data, wrows, q, lanes, pairs)
        else:
            ws = [_load_widen(builder, w_data, builder.add(wr, q), w.dtype, lanes) for wr in wrows]
            for i in range(rows):
                x = irb.load(builder, a_data, builder.add(arows[i], q), v16, 4)
                for j in range(cols):
                    acc = accs[cols * i + j]
                    builder.store(irb.mul_add(builder, builder.load(acc), x, ws[j]), acc)
    return [builder.load(acc) for acc in accs]


def _pairs_step(builder, accs, a_data, arows, w_data, wrows, q, lanes, hw):
    """One step of a bf16 block over elements ``q .. q + 2*lanes`` of every row: lane ``l`` of
    each accumulator adds ``a[2l+1] * w[2l+1]``, then ``a[2l] * w[2l]`` (each product exact in
    fp32, each sum rounded): what VDPBF16PS does (``hw``; it also flushes subnormals to zero),
    else two FMAs on the odd and even elements, split off by a mask and a shift (bf16 bits are
    the high half of fp32 bits). tests/test_cube.py checks both against one NumPy model."""
    i64 = ir.IntType(64)
    vf = ir.VectorType(ir.FloatType(), lanes)
    vi = ir.VectorType(ir.IntType(32), lanes)  # a bf16 pair per lane: the odd element high
    cols = len(wrows)

    def halves(v):
        odd = builder.and_(v, ir.Constant(vi, [-65536] * lanes))  # 0xFFFF0000
        even = builder.shl(v, ir.Constant(vi, [16] * lanes))
        return builder.bitcast(odd, vf), builder.bitcast(even, vf)

    ws = [irb.load(builder, w_data, builder.add(wr, q), vi, 2) for wr in wrows]
    if hw:
        bf = ir.VectorType(irb.BFloat(), 2 * lanes)
        dp = builder.module.declare_intrinsic(
            f"llvm.x86.avx512bf16.dpbf16ps.{32 * lanes}", fnty=ir.FunctionType(vf, [vf, bf, bf]))
        ws = [builder.bitcast(v, bf) for v in ws]
    else:
        ws = [halves(v) for v in ws]
    for i, ar in enumerate(arows):
        x = irb.load(builder, a_data, builder.add(ar, q), vi, 2)
        x = builder.bitcast(x, bf) if hw else halves(x)
        for j in range(cols):
            acc = accs[cols * i + j]
            if hw:
                v = builder.call(dp, [builder.load(acc), x, ws[j]])
            else:
                v = irb.mul_add(builder, irb.mul_add(builder, builder.load(acc), x[0], ws[j][0]), x[1], ws[j][1])
            builder.store(v, acc)


def _dot_codegen(context, builder, sig, args, cols, lanes, rows=4, ahead=0, pairs=None):
    """The accumulators of a ``rows`` x ``cols`` block for an intrinsic typed
    ``(a, r0, lda, w, w0, ldw, nvec, res[, far])``, and the ``res`` array they are stored to
    (``far``, ``pairs``: see :func:`_dot_block`; ``PAIRS_AUTO``: VDPBF16PS when numba compiles
    for a CPU that has it)."""
    if pairs == PAIRS_AUTO:
        pairs = irb.target_has_bf16_dot(context)
    a_arr = context.make_array(sig.args[0])(context, builder, args[0])
    w_arr = context.make_array(sig.args[3])(context, builder, args[3])
    r_arr = context.make_array(sig.args[7])(context, builder, args[7])
    accs = _dot_block(builder, a_arr.data, args[1], args[2], sig.args[3], w_arr.data, args[4], args[5],
                      args[6], rows, cols, lanes, ahead, args[8] if len(args) > 8 else None, pairs)
    return accs, r_arr


def _dot_intrinsic(name, codegen, stream=False, pairs=False):
    """An intrinsic typed ``void(a, r0, lda, w, w0, ldw, nvec, res[, far])`` (``far`` when
    ``stream``; see :func:`_dot_block`): ``a`` an fp32 array and ``w`` a storage array, or with
    ``pairs`` both bf16 (uint16) arrays; ``res`` fp32, offsets uint64; ``codegen`` its code
    generator."""
    u64 = types.uint64

    def typed(a, w, res, *far):
        if pairs:
            ok = irb.bf16_array(a) and irb.bf16_array(w)
        else:
            ok = irb.f32_array(a) and irb.storage_array(w)
        if not (ok and irb.f32_array(res)):
            return None
        return types.void(a, u64, u64, w, u64, u64, u64, res, *far), codegen

    if stream:
        def dot(typingctx, a, r0, lda, w, w0, ldw, nvec, res, far):
            return typed(a, w, res, u64)
    else:
        def dot(typingctx, a, r0, lda, w, w0, ldw, nvec, res):
            return typed(a, w, res)
    dot.__name__ = name
    return intrinsic(dot)


def _store_tree_sums(builder, accs, r_arr):
    """``res[k]`` = the sum of the lanes of ``accs[k]``, by a tree: 16 -> 8 -> 4 -> 2 -> 1 lanes."""
    for k, v in enumerate(accs):
        total = builder.extract_element(irb.fold_halves(builder, v, builder.fadd), ir.Constant(ir.IntType(32), 0))
        builder.store(total, builder.gep(r_arr.data, [ir.Constant(ir.IntType(64), k)]))


def _tree_sums_codegen(cols, rows=4, pairs=WIDENED):
    """Code generator of a ``rows`` x ``cols`` 512-bit block reduced by :func:`_store_tree_sums`."""

    def codegen(context, builder, sig, args):
        accs, r_arr = _dot_codegen(context, builder, sig, args, cols, V16, rows=rows, pairs=pairs)
        _store_tree_sums(builder, accs, r_arr)
        return context.get_dummy_value()

    return codegen


def _store_sums_together(builder, vecs, r_arr, lanes):
    """``res[k]`` = the sum of the lanes of ``vecs[k]`` (16 vectors), reduced *together*: each
    step adds the low and high halves of two vectors' partial sums into one vector, so the 16
    sums take a few shuffles each instead of a tree per vector, and the last vectors hold the
    results in order. The same additions as :func:`_store_tree_sums`, so the same bits."""
    i32 = ir.IntType(32)
    parts = lanes  # partial sums per accumulator in each vector (lanes // parts accumulators)
    while parts > 1:
        half = parts // 2
        accs2 = 2 * (lanes // parts)  # accumulators in the concatenation of two vectors
        lo_mask = [acc * parts + p for acc in range(accs2) for p in range(half)]
        hi_mask = [acc * parts + half + p for acc in range(accs2) for p in range(half)]
        nxt = []
        for x, y in zip(vecs[0::2], vecs[1::2]):
            lo = builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, lanes), lo_mask))
            hi = builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(i32, lanes), hi_mask))
            nxt.append(builder.fadd(lo, hi))
        vecs = nxt
        parts = half
    for idx, vec in enumerate(vecs):  # 16 // lanes vectors of results, in order
        ptr = builder.gep(r_arr.data, [ir.Constant(ir.IntType(64), idx * lanes)])
        builder.store(vec, builder.bitcast(ptr, vec.type.as_pointer()), align=4)


def _dot4x4(lanes, ahead=0, stream=False, pairs=WIDENED):
    """The intrinsic ``dot4x4`` for vectors of ``lanes`` fp32 (see :func:`dot4x4`); ``ahead``:
    prefetch distance in weight elements (0: none); ``stream``: it takes a ``far`` argument;
    ``pairs``: bf16 ``a`` and ``w`` (see :func:`_dot_block`, :func:`_dot_codegen`)."""

    def codegen(context, builder, sig, args):
        vecs, r_arr = _dot_codegen(context, builder, sig, args, 4, lanes, ahead=ahead, pairs=pairs)
        _store_sums_together(builder, vecs, r_arr, lanes)
        return context.get_dummy_value()

    name = f"dot4x4_{lanes}_{ahead}" + ("_stream" if stream else "") + ("" if pairs is WIDENED else f"_pairs_{pairs}")
    return _dot_intrinsic(name, codegen, stream, pairs is not WIDENED)


def _outer(rows, vecs, lanes=V16):
    """The intrinsic ``outer{rows}x{vecs*lanes}`` (see :func:`outer4x64`)."""

    def outer(typingctx, c, c0, ldc, a, a0, lda, w, w0, ldw, k, acc):
        if not (irb.f32_array(c) and irb.f32_array(a) and irb.storage_array(w)):
            return None

        def codegen(context, builder, sig, args):
            c_arr = context.make_array(sig.args[0])(context, builder, args[0])
            a_arr = context.make_array(sig.args[3])(context, builder, args[3])
            w_arr = context.make_array(sig.args[6])(context, builder, args[6])
            c0_, ldc_, a0_, lda_ = args[1], args[2], args[4], args[5]
            w0_, ldw_, k_ = args[7], args[8], args[9]
            f32 = ir.FloatType()
            i64 = ir.IntType(64)
            vf = ir.VectorType(f32, lanes)
            zero = ir.Constant(vf, [0.0] * lanes)
            cptrs = []
            for i in range(rows):
                crow = builder.add(c0_, builder.mul(ldc_, ir.Constant(i64, i)))
                for v in range(vecs):
                    ptr = builder.gep(c_arr.data, [builder.add(crow, ir.Constant(i64, v * lanes))])
                    cptrs.append(builder.bitcast(ptr, vf.as_pointer()))
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(rows * vecs)]
            with builder.if_then(builder.icmp_unsigned("!=", args[10], ir.Constant(i64, 0))):
                for acc_, ptr in zip(accs, cptrs):  # continue the sums already in c
                    builder.store(builder.load(ptr, align=4), acc_)
            arows = [builder.add(a0_, builder.mul(lda_, ir.Constant(i64, i))) for i in range(rows)]
            with cgutils.for_range(builder, k_) as loop:
                p = loop.index
                wrow = builder.add(w0_, builder.mul(ldw_, p))
                ws = [_load_widen(builder, w_arr.data, builder.add(wrow, ir.Constant(i64, v * lanes)),
                                  w.dtype, lanes) for v in range(vecs)]
                for i in range(rows):
                    x = builder.load(builder.gep(a_arr.data, [builder.add(arows[i], p)]))
                    xv = irb.splat(builder, x, vf)
                    for v in range(vecs):
                        acc = accs[vecs * i + v]
                        builder.store(irb.mul_add(builder, builder.load(acc), xv, ws[v]), acc)
            for acc_, ptr in zip(accs, cptrs):
                builder.store(builder.load(acc_), ptr, align=4)
            return context.get_dummy_value()

        u64 = types.uint64
        return types.void(c, u64, u64, a, u64, u64, w, u64, u64, u64, u64), codegen

    outer.__name__ = f"outer{rows}x{vecs * lanes}"
    return intrinsic(outer)


def _pv4(keys, lanes=V16):
    """The intrinsic ``pv4x{keys}`` (see :func:`.blocks.pv4x4`)."""

    def pv(typingctx, o, oo, ldo, p, po, ldp, v, va, ldv, nvec):
        if not (irb.f32_array(o) and irb.f32_array(p) and irb.storage_array(v)):
            return None

        def codegen(context, builder, sig, args):
            o_arr, p_arr, v_arr = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 3, 6))
            oo_, ldo_, po_, ldp_, va_, ldv_, nvec_ = args[1], args[2], args[4], args[5], args[7], args[8], args[9]
            i64 = ir.IntType(64)
            vf = ir.VectorType(ir.FloatType(), lanes)

            def at(base, stride, i):
                return builder.add(base, builder.mul(stride, ir.Constant(i64, i)))

            orows = [at(oo_, ldo_, i) for i in range(4)]
            vrows = [at(va_, ldv_, e) for e in range(keys)]
            ps = [[irb.splat(builder, irb.load(builder, p_arr.data, builder.add(at(po_, ldp_, i), ir.Constant(i64, e)),
                                               ir.FloatType(), 4), vf)
                   for e in range(keys)] for i in range(4)]
            with cgutils.for_range(builder, nvec_) as loop:
                c = builder.mul(loop.index, ir.Constant(i64, lanes))
                ws = [_load_widen(builder, v_arr.data, builder.add(vr, c), v.dtype, lanes) for vr in vrows]
                for i in range(4):
                    ptr = irb.ptr(builder, o_arr.data, builder.add(orows[i], c), vf)
                    acc = builder.load(ptr, align=4)
                    for e in range(keys):  # o + p0 v0 + p1 v1 + ..., one FMA each in key order
                        acc = irb.mul_add(builder, acc, ps[i][e], ws[e])
                    builder.store(acc, ptr, align=4)
            return context.get_dummy_value()

        u64 = types.uint64
        return types.void(o, u64, u64, p, u64, u64, v, u64, u64, u64), codegen

    pv.__name__ = f"pv4x{keys}"
    return intrinsic(pv)
