"""LLVM IR builders of the cube's register blocks (the blocks themselves: :mod:`.blocks`;
their plain numba versions: :mod:`.blocks_plain`).

Why LLVM IR: numba's loops keep one scalar accumulator per dot product and LLVM reduces each
vectorised one with its own shuffle tree; here every accumulator is a vector register of the
chosen width (explicit ``<16 x float>`` stays 512-bit; see machine/jit.py for the 512-bit
choice). Operands ``w`` are storage kernel views (float32, uint16 = bf16, int16 = fp16) widened
exactly to fp32 on load; offsets are flat uint64 element indices into the data of a C-contiguous
array of any rank. The order of every fp32 addition is fixed by the code, so results do not
depend on the thread count.

Generic helpers (not cube-specific, candidates for a shared IR package): :func:`_vload`,
:func:`_vload_widen`, :func:`_fma`, :func:`_prefetch`, :func:`_splat`, :func:`_hsum_tree`
and the ``bfloat`` type :class:`_BFloat`.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

V16 = 16  # fp32 lanes of one 512-bit vector: the unit of dot4x2

# ``pairs`` modes of the dot blocks: how a step multiplies ``a`` by ``w``
WIDENED = None  # fp32 ``a``, ``w`` widened to fp32 on load, one FMA per element
DPBF16 = True  # bf16 ``a`` and ``w`` in pairs of elements by VDPBF16PS (AVX512_BF16)
PAIRS_FMA = False  # the same pairs sums by two FMAs (any AVX-512 CPU)
PAIRS_AUTO = "auto"  # DPBF16 when numba compiles for a CPU that has it, else PAIRS_FMA

# ``llvm.prefetch`` locality: into L1 (prefetcht0) or into L2 only (prefetcht1)
PREFETCH_L1 = 3
PREFETCH_L2 = 2


def _storage_ok(a):
    return isinstance(a, types.Array) and a.dtype in (types.float32, types.uint16, types.int16)


def _f32_array(a):
    return isinstance(a, types.Array) and a.dtype == types.float32


def _is_bf16_array(a):
    return isinstance(a, types.Array) and a.dtype == types.uint16


def _vload(builder, data, off, vty, align):
    """A vector of type ``vty`` loaded from flat element index ``off`` of pointer ``data``."""
    return builder.load(builder.bitcast(builder.gep(data, [off]), vty.as_pointer()), align=align)


def _vload_widen(builder, data, off, dtype, lanes=V16):
    """``lanes`` storage elements at flat index ``off`` -> ``<lanes x float>`` (exact widening)."""
    vf = ir.VectorType(ir.FloatType(), lanes)
    if dtype == types.float32:
        return _vload(builder, data, off, vf, 4)
    raw = _vload(builder, data, off, ir.VectorType(ir.IntType(16), lanes), 2)
    if dtype == types.uint16:  # bf16 bits -> the high half of fp32 bits
        wide = builder.zext(raw, ir.VectorType(ir.IntType(32), lanes))
        wide = builder.shl(wide, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [16] * lanes))
        return builder.bitcast(wide, vf)
    return builder.fpext(builder.bitcast(raw, ir.VectorType(ir.HalfType(), lanes)), vf)


def _fma(builder, acc, x, y):
    flags = ("contract",)  # lets LLVM fuse the multiply-add (one rounding), as numba's kernels do
    return builder.fadd(acc, builder.fmul(x, y, flags=flags), flags=flags)


def _splat(builder, x, vf):
    """Scalar ``x`` broadcast to every lane of vector type ``vf``."""
    xv = builder.insert_element(ir.Constant(vf, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(xv, xv, ir.Constant(ir.VectorType(ir.IntType(32), vf.count), [0] * vf.count))


def _prefetch(builder, ptr, locality=PREFETCH_L1):
    """Prefetch the line holding ``ptr`` into L1 (``PREFETCH_L1``) or L2 (``PREFETCH_L2``).
    A hint: never faults, changes no result."""
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])


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
                _prefetch(builder, builder.gep(w_data, [builder.add(wr, builder.add(q, ir.Constant(i64, ahead)))]))
        if far is not None:
            with builder.if_then(builder.icmp_unsigned("!=", far, ir.Constant(i64, 0))):
                for wr in wrows:
                    _prefetch(builder, builder.gep(w_data, [builder.add(builder.add(wr, far), q)]), PREFETCH_L2)
        if pairs is not WIDENED:
            _pairs_step(builder, accs, a_data, arows, w_data, wrows, q, lanes, pairs)
        else:
            ws = [_vload_widen(builder, w_data, builder.add(wr, q), w.dtype, lanes) for wr in wrows]
            for i in range(rows):
                x = _vload(builder, a_data, builder.add(arows[i], q), v16, 4)
                for j in range(cols):
                    acc = accs[cols * i + j]
                    builder.store(_fma(builder, builder.load(acc), x, ws[j]), acc)
    return [builder.load(acc) for acc in accs]


try:
    class _BFloat(ir.types._BaseFloatType):
        """LLVM's ``bfloat`` (llvmlite.ir has none): only to type VDPBF16PS's operands."""

        null = "0.0"
        intrinsic_name = "bf16"

        def __str__(self):
            return "bfloat"

    _BFloat._create_instance()
except Exception:  # an llvmlite without this (private) base class: the FMA form everywhere
    _BFloat = None


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

    ws = [_vload(builder, w_data, builder.add(wr, q), vi, 2) for wr in wrows]
    if hw:
        bf = ir.VectorType(_BFloat(), 2 * lanes)
        dp = builder.module.declare_intrinsic(
            f"llvm.x86.avx512bf16.dpbf16ps.{32 * lanes}", fnty=ir.FunctionType(vf, [vf, bf, bf]))
        ws = [builder.bitcast(v, bf) for v in ws]
    else:
        ws = [halves(v) for v in ws]
    for i, ar in enumerate(arows):
        x = _vload(builder, a_data, builder.add(ar, q), vi, 2)
        x = builder.bitcast(x, bf) if hw else halves(x)
        for j in range(cols):
            acc = accs[cols * i + j]
            if hw:
                v = builder.call(dp, [builder.load(acc), x, ws[j]])
            else:
                v = _fma(builder, _fma(builder, builder.load(acc), x[0], ws[j][0]), x[1], ws[j][1])
            builder.store(v, acc)


def _dot_codegen(context, builder, sig, args, cols, lanes, rows=4, ahead=0, pairs=None):
    """The accumulators of a ``rows`` x ``cols`` block for an intrinsic typed
    ``(a, r0, lda, w, w0, ldw, nvec, res[, far])``, and the ``res`` array they are stored to
    (``far``, ``pairs``: see :func:`_dot_block`; ``PAIRS_AUTO``: VDPBF16PS when numba compiles
    for a CPU that has it)."""
    if pairs == PAIRS_AUTO:
        pairs = _target_has_bf16_dot(context)
    a_arr = context.make_array(sig.args[0])(context, builder, args[0])
    w_arr = context.make_array(sig.args[3])(context, builder, args[3])
    r_arr = context.make_array(sig.args[7])(context, builder, args[7])
    accs = _dot_block(builder, a_arr.data, args[1], args[2], sig.args[3], w_arr.data, args[4], args[5],
                      args[6], rows, cols, lanes, ahead, args[8] if len(args) > 8 else None, pairs)
    return accs, r_arr


def _target_has_bf16_dot(context) -> bool:
    """Whether the CPU numba compiles for has AVX512_BF16 (VDPBF16PS): the feature string numba's
    codegen uses (``NUMBA_CPU_FEATURES``, else the host's), so a cached kernel matches it."""
    if _BFloat is None:
        return False
    try:
        features = context.codegen()._get_host_cpu_features()
    except Exception:  # a numba without this hook: the FMA form is right everywhere
        return False
    return "+avx512bf16" in str(features).split(",")


def _dot_intrinsic(name, codegen, stream=False, pairs=False):
    """An intrinsic typed ``void(a, r0, lda, w, w0, ldw, nvec, res[, far])`` (``far`` when
    ``stream``; see :func:`_dot_block`): ``a`` an fp32 array and ``w`` a storage array, or with
    ``pairs`` both bf16 (uint16) arrays; ``res`` fp32, offsets uint64; ``codegen`` its code
    generator."""
    u64 = types.uint64

    def typed(a, w, res, *far):
        if pairs:
            ok = _is_bf16_array(a) and _is_bf16_array(w)
        else:
            ok = _f32_array(a) and _storage_ok(w)
        if not (ok and _f32_array(res)):
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


def _hsum_tree(builder, v):
    """The sum of the lanes of vector ``v``, by a tree: 16 -> 8 -> 4 -> 2 -> 1 lanes."""
    width = v.type.count
    while width > 1:
        width //= 2
        lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
        hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                      list(range(width, 2 * width))))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))


def _store_tree_sums(builder, accs, r_arr):
    """``res[k]`` = the sum of the lanes of ``accs[k]`` (:func:`_hsum_tree`)."""
    for k, v in enumerate(accs):
        builder.store(_hsum_tree(builder, v), builder.gep(r_arr.data, [ir.Constant(ir.IntType(64), k)]))


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
        if not (_f32_array(c) and _f32_array(a) and _storage_ok(w)):
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
                ws = [_vload_widen(builder, w_arr.data, builder.add(wrow, ir.Constant(i64, v * lanes)),
                                   w.dtype, lanes) for v in range(vecs)]
                for i in range(rows):
                    x = builder.load(builder.gep(a_arr.data, [builder.add(arows[i], p)]))
                    xv = _splat(builder, x, vf)
                    for v in range(vecs):
                        acc = accs[vecs * i + v]
                        builder.store(_fma(builder, builder.load(acc), xv, ws[v]), acc)
            for acc_, ptr in zip(accs, cptrs):
                builder.store(builder.load(acc_), ptr, align=4)
            return context.get_dummy_value()

        u64 = types.uint64
        return types.void(c, u64, u64, a, u64, u64, w, u64, u64, u64, u64), codegen

    outer.__name__ = f"outer{rows}x{vecs * lanes}"
    return intrinsic(outer)
