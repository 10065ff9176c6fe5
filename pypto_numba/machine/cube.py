"""The cube unit: tile matmul on storage-dtype operands with fp32 L0C accumulation.

Math (``a[M, K]``, ``b[N, K]``, optional ``bias[N]``; storage dtypes fp32 / bf16 / fp16)::

    c[M, N] = round_out( sum_k widen(a[m, k]) * widen(b[n, k])  (+ widen(bias[n])) )

``b`` is used transposed (``b_trans=True``, the ``weight[N, K]`` layout of a linear layer).
Products and sums are fp32 (the L0C accumulator, npu-facts 4.4); the optional bias is added to
the fp32 accumulator in the epilogue (the ``bias_tensor`` of ``pypto.matmul``, loaded into the
bias table BT) and the result is rounded **once** to the output dtype.

The tile walk (``tiles = ((mL0, mL1), (kL0, kL1), (nL0, nL1))``, checked by
:func:`pypto_numba.machine.plan.cube_tiles`, npu-facts 4.3)::

    for each output block [mL1, nL1]                       # one tile task (prange iteration)
        L0C tiles of the block = 0
        for kk in range(0, K, kL1):                         # GM -> L1: a[mL1, kL1], b[nL1, kL1]
            for each L0C tile [mL0, nL0] of the block:
                for k0 in range(kk, kk + kL1, kL0):         # L1 -> L0A [mL0, kL0], L0B [nL0, kL0]
                    L0C += L0A @ L0B^T                      # fp32 accumulate
        epilogue: (+ bias) -> round to out dtype -> GM      # L0C -> GM (fixpipe)

Every tile dim has a valid-shape tail. Exact counts of this walk (``b_x`` = itemsize)::

    tasks       = ceil(M/mL1) * ceil(N/nL1)
    GM read     = M*K*b_a*ceil(N/nL1) + N*K*b_b*ceil(M/mL1) (+ N*b_bias*ceil(M/mL1))
    GM write    = M*N*b_out
    cube FLOPs  = 2*M*N*K

:func:`plan_walk` returns these with the cube buffers (a :class:`CubeWalk`);
:func:`run_walk` runs :func:`matmul_nt_kernel` (a kernel returning the usual counters tuple).
This module knows nothing about operators: linear layers, attention etc. build on it.

CPU implementation (what makes it fast, none of it changes the NPU semantics above)
-----------------------------------------------------------------------------------
- ``L0C += L0A @ L0B^T`` is a single-precision GEMM call with ``beta = 1`` straight into the fp32
  L0C tiles (SciPy's ``cython_blas.sgemm``, bound as an external symbol so that the kernel stays
  cacheable). By default (``merge_k``) the L0 steps are merged into larger BLAS calls: one call
  per kL1 chunk for the whole [mL1, nL1] block (bf16/fp16, from the widened L1 scratch), or one
  call for the whole block and the whole of K (fp32, read in place). Small 128x128x128 calls
  spend a visible share of their time packing operands; one big call packs each panel once
  (measured: 128-blocks 0.71x NumPy, 256-blocks 0.83x). The counts are those of the walk either
  way and the sums stay fp32; only the order of the fp32 additions is BLAS's.
  ``merge_k=False`` issues one call per L0 tile and kL0 step, literally as the walk reads.
- fp32 operands are read in place from GM (the GM -> L1 -> L0 moves are lossless for fp32, so
  they are counted, not copied); bf16/fp16 operands are widened into per-thread fp32 L1 scratch
  once per ``kL1`` step (exact), then go to the same fp32 GEMM.
- BLAS must run single-threaded inside ``prange`` (the tasks are the parallelism; a threaded BLAS
  call per task would oversubscribe the 2 cores). :func:`run_walk` sets SciPy's OpenBLAS -- a
  library separate from NumPy's -- to one thread around the kernel and restores it afterwards
  (:func:`single_thread_blas`), so NumPy's own BLAS (the benchmark peer) keeps its threads.
- Skinny M (decode, ``M < SKINNY_M`` = 16 by default): hand-written loops instead of BLAS. Per
  kL1 step, every weight row of the block is streamed once against all rows of ``a`` in register
  blocks of 4 rows of ``a`` x 4 weight rows, 1 x 4 for the rows of ``a`` left over
  (:func:`gemv_rows`; fp16 weights widened on the fly; ``SKINNY_ROWS`` weight rows streamed
  side by side, prefetched ahead, the next group into L2), one fp32 partial sum per L0C value and
  kL1 step; same walk, same counts. bf16 operands are both read as stored and multiplied in pairs
  of elements (:func:`gemv_rows_pairs`: VDPBF16PS where the CPU has AVX512_BF16, else the same
  sums by FMAs); the products are exact in fp32 either way. BLAS's gemm with a tiny M packs each
  weight panel (read, write, read again) before using it: measured on the 2-core test machine
  (K = N = 4096), M = 8 streamed the weight at 0.32x (fp32) and 0.49x (bf16) of copy bandwidth
  through BLAS.
- fp32 prefill: the walk's blocks are grouped into BLAS calls of about ``GROUP_EDGE`` (1024)
  squared outputs (:func:`group_task`; counts per block as in the walk). One sgemm per 256 x 256
  block ran at 0.80-0.93x NumPy's two-threaded ``x @ w.T + b`` (M = 2048, K = N = 4096); 512 x 512
  calls at 1.02-1.11x, 1024 x 1024 calls (4 per thread there) at 1.11-1.18x in the same runs.
- Inner loops index flat views with uint64 indices: numba treats a negative int index as
  counting from the end, and when an index has a run-time offset LLVM cannot rule that out, keeps
  the wraparound select inside the loop and does not vectorise it (measured 5-7x slower). Hot
  loops also take no array views (each view bumps the parent's reference count atomically, and
  two threads doing so per row fight over one cache line).

- Register blocks for callers outside the walk: :func:`dot4x4` / :func:`dot4x2` (dot-product
  form, decode) and :func:`outer_rows` (outer-product form, 6 x 64 blocks: attention prefill,
  where a 64 x 128 x 128 tile is too small for BLAS to amortise its operand packing).

A block with several L0C tiles (``mL1 > mL0`` or ``nL1 > nL0``) keeps all of them live across its
kL1 steps; the plan's L0C rule (npu-facts 4.3) is per L0C tile, as in PyPTO. The default linear
tiles have ``mL1 == mL0`` and ``nL1 == nL0``: one L0C tile per task.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import glob
import os
import threading

import llvmlite.binding as _llvm
import numba
import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.extending import get_cython_function_address, intrinsic, overload

from ..errors import ConstraintError
from . import dtypes, tile
from .jit import device, kernel
from .plan import ITEMSIZE, KernelPlan, cube_tiles
from .profile import HardwareProfile, load_profile

__all__ = [
    "SKINNY_M",
    "blas_available",
    "CubeWalk",
    "plan_walk",
    "run_walk",
    "matmul_nt_kernel",
    "walk_task",
    "scratch",
    "single_thread_blas",
    "dynamic_tasks",
    "load_l1",
    "mma_blas",
    "epilogue",
    "outer_rows",
]

SKINNY_M = 16
"""Below this many rows of ``a`` (one 16-row cube fractal: decode) the walk uses the hand-written
skinny loops by default instead of BLAS (see the module notes). fp32 too, from one row: OpenBLAS
forwards a one-row gemm to gemv, which streamed the weight about as fast as the loops do
(M = 1, K = N = 4096, 2 threads: 1.63 vs 1.57 ms), but two or three rows to a gemm that packs
the weight first (7.0 and 7.6 ms against 1.55 and 1.82 ms)."""

# ----------------------------------------------------------------------------------------------
# BLAS binding: sgemm from SciPy's cython_blas as an external symbol (resolved at link time by
# name, so kernels calling it can be cached -- a ctypes pointer global would disable caching).

_SGEMM_SYMBOL = "pypto_numba_scipy_sgemm"
import scipy.linalg.cython_blas  # noqa: E402,F401  (loads the library that provides sgemm)

_llvm.add_symbol(_SGEMM_SYMBOL, get_cython_function_address("scipy.linalg.cython_blas", "sgemm"))
# Fortran sgemm(transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc): every arg by
# pointer, passed here as integer addresses (same ABI on 64-bit targets). Addresses instead of
# array views: slicing an array inside a prange task increments the shared array's reference
# count atomically, and two threads doing that per tile fight over one cache line.
_sgemm = types.ExternalFunction(_SGEMM_SYMBOL, types.void(*([types.intp] * 13)))
ARG_SLOTS = 16  # per-thread int32 slots: m, n, k, lda, ldb, ldc | alpha, beta | 'T', 'N'
_ONE_F32_BITS = 0x3F800000


@functools.lru_cache(maxsize=1)
def _scipy_openblas():
    """(get, set) thread-count functions of SciPy's bundled OpenBLAS, or None if not found."""
    import scipy

    base = os.path.dirname(scipy.__file__)
    patterns = (
        base + ".libs/libscipy_openblas*",  # Linux wheels
        os.path.join(base, ".dylibs", "libscipy_openblas*"),  # macOS wheels
        os.path.join(base, "linalg", "*openblas*"),
    )
    for pattern in patterns:
        for path in sorted(glob.glob(pattern)):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for prefix in ("scipy_openblas", "openblas"):
                get = getattr(lib, prefix + "_get_num_threads", None)
                put = getattr(lib, prefix + "_set_num_threads", None)
                if get is not None and put is not None:
                    get.restype = ctypes.c_int
                    put.argtypes = (ctypes.c_int,)
                    return get, put
    return None


def blas_available() -> bool:
    """True when SciPy's bundled OpenBLAS library was found, so that :func:`single_thread_blas`
    can pin it to one thread: kernels may then call BLAS (``mma_blas``, ``np.dot``) inside
    ``prange``. False on platforms where the library is not found: there a threaded BLAS call
    per task would oversubscribe the cores, so callers use their hand-written loops instead."""
    return _scipy_openblas() is not None


_BLAS_LOCK = threading.Lock()
_BLAS_DEPTH = 0  # callers inside single_thread_blas, over all Python threads
_BLAS_BEFORE = 1  # SciPy's OpenBLAS thread count when the first of them entered


@contextlib.contextmanager
def single_thread_blas():
    """Run the body with SciPy's OpenBLAS (the one kernels call) limited to one thread.

    Only SciPy's bundled OpenBLAS is touched; NumPy ships its own OpenBLAS with its own thread
    pool, which keeps its setting. Without SciPy's library on disk (other platforms) this is a
    no-op: set ``OPENBLAS_NUM_THREADS=1`` in the environment instead. The setting is
    process-wide, so it is reference-counted over Python threads: the first caller in pins it,
    the last one out restores it (a thread leaving early must not unpin another's kernel).
    """
    global _BLAS_DEPTH, _BLAS_BEFORE
    fns = _scipy_openblas()
    if fns is None:
        yield
        return
    get, put = fns
    with _BLAS_LOCK:
        if _BLAS_DEPTH == 0:
            _BLAS_BEFORE = get()
            if _BLAS_BEFORE != 1:
                put(1)
        _BLAS_DEPTH += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_DEPTH -= 1
            if _BLAS_DEPTH == 0 and _BLAS_BEFORE != 1:
                put(_BLAS_BEFORE)


@contextlib.contextmanager
def dynamic_tasks(chunk: int = 1):
    """prange loops started in the body hand out ``chunk`` iterations at a time (dynamic).

    Cube tasks take 0.1-10 ms each; with numba's default static split each thread gets half of
    them up front, and on a shared machine the call waits for whichever thread the OS parks.
    (Set from Python: calling ``numba.set_parallel_chunksize`` inside a kernel disables caching.)
    """
    before = numba.get_parallel_chunksize()
    numba.set_parallel_chunksize(chunk)
    try:
        yield
    finally:
        numba.set_parallel_chunksize(before)


# ----------------------------------------------------------------------------------------------
# numba-callable building blocks


@numba.extending.intrinsic
def _as_int32_ptr(typingctx, addr):
    """An integer address as an ``int32*`` (for ``numba.carray``)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int32)))

    return types.CPointer(types.int32)(addr), codegen


def _is_f32(a):
    """True for a float32 array (its data can be used in place as an fp32 tile)."""
    return np.asarray(a).dtype == np.float32


@overload(_is_f32)
def _is_f32_impl(a):
    if isinstance(a, types.Array) and a.dtype == types.float32:
        return lambda a: True
    return lambda a: False


def _f32_source(a, scratch):
    """``a`` itself when it is float32 (read in place), else the fp32 scratch it is widened into."""
    return a if np.asarray(a).dtype == np.float32 else scratch


@overload(_f32_source)
def _f32_source_impl(a, scratch):
    if isinstance(a, types.Array) and a.dtype == types.float32:
        return lambda a, scratch: a
    return lambda a, scratch: scratch


@device(boundscheck=False)
def load_l1(src, r0, c0, rows, cols, dst):
    """GM -> L1: widen ``src[r0:r0+rows, c0:c0+cols]`` (storage kernel view) into fp32 ``dst``."""
    oc = np.uint64(c0)  # unsigned indices: see the module docstring
    for i in range(rows):
        ri = np.uint64(r0 + i)
        di = np.uint64(i)
        for j in range(np.uint64(cols)):
            dst[di, j] = dtypes.widen(src[ri, oc + j])


@device
def mma_blas(c, ldc, a, lda, b, ldb, m, n, k, slots):
    """L0C += L0A @ L0B^T by one BLAS sgemm (``beta = 1``); fp32, row-major.

    ``c``, ``a``, ``b`` are the addresses of the tiles' first elements: ``c[m, n]`` with row
    stride ``ldc``, ``a[m, k]`` (``lda``), ``b[n, k]`` (``ldb``); ``slots`` the address of this
    thread's ``ARG_SLOTS`` int32 argument slots (Fortran passes everything by pointer), filled by
    :func:`scratch`. Row-major ``C = A B^T`` is column-major ``C^T = B A^T``:
    sgemm('T', 'N', n, m, k, 1, b, ldb, a, lda, 1, c, ldc).
    """
    p = numba.carray(_as_int32_ptr(slots), (ARG_SLOTS,))
    p[0] = n
    p[1] = m
    p[2] = k
    p[3] = ldb
    p[4] = lda
    p[5] = ldc
    _sgemm(slots + 32, slots + 36, slots, slots + 4, slots + 8, slots + 24, b, slots + 12,
           a, slots + 16, slots + 28, c, slots + 20)


V16 = 16  # fp32 lanes of one 512-bit vector: the unit of dot4x2

# Why the register blocks below are written in LLVM IR: numba's loops keep one scalar
# accumulator per dot product and LLVM reduces each vectorised one with its own shuffle tree;
# here every accumulator is a vector register of the chosen width (explicit ``<16 x float>``
# stays 512-bit zmm, which LLVM's vectoriser would not pick on this CPU). Operands ``w`` are
# storage kernel views (float32, uint16 = bf16, int16 = fp16) widened exactly to fp32 on load;
# offsets are flat element indices into the data of a C-contiguous array of any rank. The order
# of every fp32 addition is fixed by the code, so results do not depend on the thread count.


def _storage_ok(a):
    return isinstance(a, types.Array) and a.dtype in (types.float32, types.uint16, types.int16)


def _f32_array(a):
    return isinstance(a, types.Array) and a.dtype == types.float32


def _is_bf16_array(a):
    return isinstance(a, types.Array) and a.dtype == types.uint16


def _vload(builder, data, off, vty, align):
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


def _prefetch(builder, ptr, locality=3):
    """Prefetch the line holding ``ptr``: ``prefetcht0`` (locality 3) or, with locality 2,
    ``prefetcht1`` (into L2, not L1). A hint: never faults, changes no result."""
    i8p = ir.IntType(8).as_pointer()
    i32 = ir.IntType(32)
    fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]))
    builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, locality), ir.Constant(i32, 1)])


def _dot_block(builder, a_data, r0, lda, w, w_data, w0, ldw, nvec, rows, cols, lanes=V16, ahead=0, far=None,
               pairs=None):
    """The rows x cols accumulators of a register-blocked dot product over ``lanes*nvec`` elements
    (``2*lanes*nvec`` with ``pairs``).

    ``ahead`` > 0: each step also prefetches every weight row ``ahead`` elements further on.
    ``far`` (an i64 value; 0 at run time: none): each step also prefetches, into L2, the same
    elements of the weight rows ``far`` elements on (the rows a later pass will read).
    ``pairs`` (bf16 ``a`` and ``w``, see :func:`_pairs_step`): None: fp32 ``a``, ``w`` widened,
    one FMA per element; True: VDPBF16PS; False: the same sums by two FMAs."""
    f32 = ir.FloatType()
    i64 = ir.IntType(64)
    v16 = ir.VectorType(f32, lanes)
    zero = ir.Constant(v16, [0.0] * lanes)
    step = lanes if pairs is None else 2 * lanes
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
                    _prefetch(builder, builder.gep(w_data, [builder.add(builder.add(wr, far), q)]), locality=2)
        if pairs is not None:
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
    the high half of fp32 bits). Both gave the same bits on the 2-core EPYC (Zen 4)."""
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
    (``far``, ``pairs``: see :func:`_dot_block`; ``pairs`` "auto": VDPBF16PS when numba compiles
    for a CPU that has it)."""
    if pairs == "auto":
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


def _store_tree_sums(builder, accs, r_arr):
    """``res[k]`` = the sum of the lanes of ``accs[k]``, by a tree: 16 -> 8 -> 4 -> 2 -> 1 lanes."""
    for k, v in enumerate(accs):
        width = v.type.count
        while width > 1:
            width //= 2
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width), list(range(width))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(ir.IntType(32), width),
                                                          list(range(width, 2 * width))))
            v = builder.fadd(lo, hi)
        total = builder.extract_element(v, ir.Constant(ir.IntType(32), 0))
        builder.store(total, builder.gep(r_arr.data, [ir.Constant(ir.IntType(64), k)]))


def _tree_sums_codegen(cols, rows=4, pairs=None):
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


dot4x2 = _dot_intrinsic("dot4x2", _tree_sums_codegen(2))
dot4x2.__doc__ = """``res[2*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])`` for i < 4, j < 2 and
``q < 16*nvec``: the linear decode register block (4 rows of x, 2 weight rows).

With 256-bit vectors a decode step with 8 rows of ``a`` needs 8 FMA lanes per weight element,
near the FMA issue limit for 16-bit weights (estimate: ~22 GB/s of bf16 weights on 2 cores);
512-bit vectors halve that. 8 vector accumulators, each reduced once at the end.
"""

dot1x4 = _dot_intrinsic("dot1x4", _tree_sums_codegen(4, rows=1))
dot1x4.__doc__ = """``res[j] = sum_q a[r0 + q] * widen(w[w0 + j*ldw + q])`` for j < 4 and ``q < 16*nvec``: one
row of ``a`` against four weight rows (decode with fewer than 4 rows of x left): one load of
``a`` per four FMAs, and four weight rows streamed side by side. Sums as :func:`dot4x2`."""
dot1x4_stream = _dot_intrinsic("dot1x4_stream", _tree_sums_codegen(4, rows=1), stream=True)
"""``dot1x4`` that also prefetches the weight rows ``far`` elements on (see :func:`_dot_block`)."""


def _dot4x4(lanes, ahead=0, stream=False, pairs=None):
    """The intrinsic ``dot4x4`` for vectors of ``lanes`` fp32 (see :func:`dot4x4`); ``ahead``:
    prefetch distance in weight elements (0: none); ``stream``: it takes a ``far`` argument;
    ``pairs``: bf16 ``a`` and ``w`` (see :func:`_dot_block`, :func:`_dot_codegen`)."""

    def codegen(context, builder, sig, args):
        vecs, r_arr = _dot_codegen(context, builder, sig, args, 4, lanes, ahead=ahead, pairs=pairs)
        _store_sums_together(builder, vecs, r_arr, lanes)
        return context.get_dummy_value()

    name = f"dot4x4_{lanes}_{ahead}" + ("_stream" if stream else "") + ("" if pairs is None else f"_pairs_{pairs}")
    return _dot_intrinsic(name, codegen, stream, pairs is not None)


# fp32 lanes of dot4x4's vectors. 256-bit: in cache as fast as 512-bit (19 ns per key at G=4,
# D=128, against 40 for numba's 4x2 loop), and unlike 512-bit (0.92-0.95x) no slower than that
# loop when K streams from DRAM (presumably AVX-512's lower core clock; measured on the 2-core Xeon)
DOT4X4_LANES = 8

dot4x4 = _dot4x4(DOT4X4_LANES)
dot4x4.__doc__ = """``res[4*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])`` for i, j < 4
and ``q < DOT4X4_LANES*nvec``: the QK^T register block of decode attention (4 query rows x 4 keys).

16 vector accumulators (8 loads per 16 FMAs), reduced *together*: each step adds the low and high
halves of two vectors' partial sums into one vector, so the 16 sums take a few shuffles each
instead of a tree per accumulator, and the last vectors hold the results in order.
"""

# the same block in 512-bit vectors (V16 lanes) for the linear decode step (gemv_rows), which
# already runs 512-bit (dot4x2)
dot4x4_v16 = _dot4x4(V16)

# Weight elements the decode block prefetches ahead on its first pass over four weight rows (1 KiB
# of fp32, 512 B of bf16 per row). At M = 8 the block does 128 MACs per weight line, so the
# out-of-order window holds few line fills and the hardware prefetcher alone lets the weight
# stream stall. Measured on the 2-core Xeon: 128 ahead 1.03-1.07x at M = 8 (fp32 and bf16 weights,
# K = 4096, N = 1024 and 4096, 2 threads), 512 no gain. On the 2-core EPYC (Zen 4), with the far
# prefetch below: 256 ahead 1.01-1.07x faster than 128 at M in {1, 4, 8}, fp32/bf16/fp16, in 4 of 4
# paired runs. Hints only: same bits.
SKINNY_AHEAD = 256

# The first pass also prefetches, into L2, the same elements of the weight rows SKINNY_ROWS rows on
# (the next group, which walk_task streams next; ``far`` = its distance in elements, 0 for the
# task's last group), so a group is on its way from DRAM while the one before it is computed: the
# near prefetch is some 80 ns ahead, short of a DRAM fill under load. Measured on the 2-core EPYC,
# K = N = 4096, 2 threads, paired runs in one process: fp32 M = 8 1.17-1.23x faster
# (2.4-2.7 -> 1.9-2.2 ms), M = 4 1.25x, bf16 M = 1 1.48x, bf16 M = 8 1.17x, fp16 M = 8 1.10x;
# a group further (16 rows) no better; a weight in L3 (N = 1024) unchanged. Same bits.
dot4x4_v16_stream = _dot4x4(V16, SKINNY_AHEAD, stream=True)

# bf16 decode in pairs (both operands bf16: the raw bits of x and of the weight, no widened copy):
# each step takes 32 elements of a row, and lane l adds the products of elements 2l+1 and 2l
# (:func:`_pairs_step`): one VDPBF16PS per 32 MACs where the CPU has AVX512_BF16, else two FMAs on
# halves split off by a mask and a shift (same bits; no widening loads). Measured on the 2-core
# EPYC, bf16 M = 8, K = N = 4096: VDPBF16PS 1.71x, the FMA form 1.10x faster than the widened
# fp32 block.
dot4x4_pairs = _dot4x4(V16, pairs="auto")
dot4x4_pairs_stream = _dot4x4(V16, SKINNY_AHEAD, stream=True, pairs="auto")
dot1x4_pairs = _dot_intrinsic("dot1x4_pairs", _tree_sums_codegen(4, rows=1, pairs="auto"), pairs=True)
dot1x4_pairs_stream = _dot_intrinsic("dot1x4_pairs_stream", _tree_sums_codegen(4, rows=1, pairs="auto"),
                                     stream=True, pairs=True)
PAIR = 2 * V16
"""bf16 elements per step of the pairs blocks."""


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
            splat = ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes)
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
                    xv = builder.insert_element(ir.Constant(vf, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
                    xv = builder.shuffle_vector(xv, xv, splat)
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


OUTER_COLS = 4 * V16
"""Columns of the widest outer-product block (:func:`outer4x64`)."""
OUTER_K = 64
"""Terms per pass of :func:`outer_rows` over a column panel (see there)."""

outer4x64 = _outer(4, 4)
outer4x64.__doc__ = """``c[c0 + i*ldc + col] = sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
``i < 4`` and ``col < 64``, the sum in ascending p (one fp32 FMA per term), started from 0 or,
with ``acc != 0``, from the values in ``c`` (continuing an earlier chunk of p): a register block of
the GEMM ``C = A B`` in outer-product form, with B's rows contiguous (prefill attention: P @ V
with V as stored, and Q K^T against K packed transposed).

16 vector accumulators (512-bit) stay in registers for the whole of k; per p, 4 loads of B and
4 broadcasts of A feed 16 FMAs. :func:`outer_rows` runs mostly ``outer6x64`` (24 accumulators,
29 of the 32 vector registers of AVX-512; 1.17x the 4-row block on 64 x 128 x 128 in cache),
then this block, ``outer1x64`` for the last rows and ``outer4x16`` / ``outer1x16`` for 16-column
tails; the < 16 last columns are the caller's.
"""
outer6x64 = _outer(6, 4)
outer1x64 = _outer(1, 4)
outer4x16 = _outer(4, 1)
outer1x16 = _outer(1, 1)


@device(boundscheck=False)
def outer_rows(c, c0, ldc, a, a0, lda, w, w0, ldw, m, ncols, k):
    """``c[c0 + i*ldc + col] = sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
    i < m, col < ncols: the outer-product blocks above over any m, ncols and k (flat offsets into
    C-contiguous arrays; ``c`` and ``a`` 1-D fp32, ``w`` any rank in a storage dtype), the columns
    past the last whole 16 in plain loops; every element is one FMA chain in ascending p."""
    uc = np.uint64(ldc)
    ua = np.uint64(lda)
    uw = np.uint64(ldw)
    uk = np.uint64(k)
    n64 = np.uint64(ncols - ncols % OUTER_COLS)
    n16 = np.uint64(ncols - ncols % V16)
    un = np.uint64(ncols)
    # Column panels outside, rows inside, and k in chunks of OUTER_K: the panel of B (OUTER_K x 64
    # fp32, 16 KiB) stays in L1 while every row block of A passes over it. A chunk after the
    # first continues the sums stored in c, so each is still one FMA chain in ascending p.
    # (A whole 128-row panel with a 512-byte row stride -- K^T tiles of 128 keys, V rows at
    # D = 128 -- maps to half of L1's sets and was evicted between row blocks: 62 vs 115
    # GFLOP/s for 64 x 128 x 128 in cache, one core.)
    for kk in range(0, max(k, 1), OUTER_K):
        kc = np.uint64(min(OUTER_K, k - kk))
        more = np.uint64(1 if kk > 0 else 0)
        ak = np.uint64(a0) + np.uint64(kk)
        wk = np.uint64(w0) + np.uint64(kk) * uw
        for col in range(np.uint64(0), n64, np.uint64(OUTER_COLS)):
            i = 0
            while i + 6 <= m:
                outer6x64(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 6
            if i + 4 <= m:
                outer4x64(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 4
            while i < m:
                outer1x64(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 1
        for col in range(n64, n16, np.uint64(V16)):
            i = 0
            while i + 4 <= m:
                outer4x16(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 4
            while i < m:
                outer1x16(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 1
    if n16 < un:
        wf = w.reshape(-1)  # w may be an array of any rank (flat offsets)
        for i in range(np.uint64(m)):
            ci = np.uint64(c0) + i * uc
            ai = np.uint64(a0) + i * ua
            for col in range(n16, un):
                c[ci + col] = np.float32(0.0)
            for p in range(uk):
                x = a[ai + p]
                wp = np.uint64(w0) + p * uw
                for col in range(n16, un):
                    c[ci + col] += x * dtypes.widen(wf[wp + col])


def _block4x4(a, r0, ua, w, w0, uw, nv, res, far, first):
    """The 4 x 4 decode block for ``a``'s dtype: :data:`dot4x4_v16` (fp32 ``a``) or
    :data:`dot4x4_pairs` (bf16 ``a``), the streaming form on the ``first`` pass."""
    raise NotImplementedError("numba-only")


def _block1x4(a, r0, ua, w, w0, uw, nv, res, far, first):
    """The 1 x 4 decode block for ``a``'s dtype (:data:`dot1x4` or :data:`dot1x4_pairs`)."""
    raise NotImplementedError("numba-only")


def _block_step(a):
    """Elements per step of the blocks for ``a``'s dtype: V16 (fp32) or PAIR (bf16)."""
    raise NotImplementedError("numba-only")


@overload(_block4x4, jit_options={"forceinline": True})
def _block4x4_impl(a, r0, ua, w, w0, uw, nv, res, far, first):
    stream, plain = (dot4x4_pairs_stream, dot4x4_pairs) if _is_bf16_array(a) else (dot4x4_v16_stream, dot4x4_v16)

    def impl(a, r0, ua, w, w0, uw, nv, res, far, first):
        if first:
            stream(a, r0, ua, w, w0, uw, nv, res, far)
        else:
            plain(a, r0, ua, w, w0, uw, nv, res)
    return impl


@overload(_block1x4, jit_options={"forceinline": True})
def _block1x4_impl(a, r0, ua, w, w0, uw, nv, res, far, first):
    stream, plain = (dot1x4_pairs_stream, dot1x4_pairs) if _is_bf16_array(a) else (dot1x4_stream, dot1x4)

    def impl(a, r0, ua, w, w0, uw, nv, res, far, first):
        if first:
            stream(a, r0, ua, w, w0, uw, nv, res, far)
        else:
            plain(a, r0, ua, w, w0, uw, nv, res)
    return impl


@overload(_block_step, jit_options={"forceinline": True})
def _block_step_impl(a):
    step = PAIR if _is_bf16_array(a) else V16
    return lambda a: np.uint64(step)


@device(boundscheck=False)
def _rows_by_4(c, j0, m, n, a, ab, ua, w, wbase, uw, ku, res, far):
    """The part of :func:`gemv_rows` / :func:`gemv_rows_pairs` shared by both: every group of 4
    weight rows against all rows of ``a``, in 4 x 4 blocks, then 1 x 4 blocks for the rows of
    ``a`` left over (the first pass over the weight rows streams them: ``far``), each result plus
    the rest of its row past the blocks' last whole step (plain code) added to ``c``. Returns the
    first weight row not done (``n`` rounded down to 4)."""
    nv = ku // _block_step(a)
    kv = nv * _block_step(a)
    ufar = np.uint64(far)
    j = 0
    while j + 4 <= n:
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        i = 0
        while i + 4 <= m:
            r0 = ab + np.uint64(i) * ua
            _block4x4(a, r0, ua, w, w0, uw, nv, res, ufar, i == 0)
            for ii in range(np.uint64(4)):
                ri = r0 + ii * ua
                for jj in range(np.uint64(4)):
                    wj = w0 + jj * uw
                    s = res[ii * np.uint64(4) + jj]
                    for q in range(kv, ku):  # the rest of the row (less than one step)
                        s += dtypes.widen(a[ri + q]) * dtypes.widen(w[wj + q])
                    c[i + ii, j0 + j + jj] += s
            i += 4
        while i < m:
            ri = ab + np.uint64(i) * ua
            _block1x4(a, ri, ua, w, w0, uw, nv, res, ufar, i == 0)  # i == 0: fewer than 4 rows
            for jj in range(np.uint64(4)):
                wj = w0 + jj * uw
                s = res[jj]
                for q in range(kv, ku):  # the rest of the row (less than one step)
                    s += dtypes.widen(a[ri + q]) * dtypes.widen(w[wj + q])
                c[i, j0 + j + jj] += s
            i += 1
        j += 4
    return j


@device(boundscheck=False)
def gemv_rows(c, j0, m, n, a, abase, lda, w, wbase, ldw, k, res, far):
    """``c[i, j0+j] += sum_q a[abase + i*lda + q] * widen(w[wbase + j*ldw + q])``, i < m, j < n, q < k.

    The decode (skinny) step on flat views: ``a`` fp32 (rows of x), ``w`` the weight in its
    storage dtype, widened on the fly (exact). Register blocks of 4 rows of ``a`` x 4 weight rows
    (:func:`dot4x4_v16`: 8 loads per 16 FMAs, and each row of ``a`` is re-read from L1/L2 once
    per 4 weight rows), then 4 x 2 (:func:`dot4x2`: 6 loads per 8 FMAs) for a last pair, 512-bit
    vectors, then the < 16-element rest in plain code. Rows of ``a`` left over take 1 x 4 blocks
    (:func:`dot1x4`: M=1 decode with bf16 weights 1.18x faster than a plain loop per weight row);
    weight rows left over use plain loops (the 4-row part is :func:`_rows_by_4`, shared with
    :func:`gemv_rows_pairs`). The first pass over each four weight rows prefetches
    them SKINNY_AHEAD elements ahead (a hint past a row's end reads nothing) and, when ``far`` is
    not 0, the same elements of the rows ``far`` elements on into L2 (the rows the caller streams
    next; those rows must exist). With 8
    rows of ``a`` (128 KiB at K = 4096, from L2) the 4 x 2 blocks alone ran at ~11 GB/s of
    weight whether the weight came from DRAM or from cache: bound by the re-reads of ``a``, not
    by memory. ``res``: 16 fp32 scratch slots. Every sum is serial within the task;
    uint64 indices (module docstring).
    """
    ku = np.uint64(k)
    nv = ku // np.uint64(V16)
    kv = nv * np.uint64(V16)
    ua = np.uint64(lda)
    uw = np.uint64(ldw)
    ab = np.uint64(abase)
    j = _rows_by_4(c, j0, m, n, a, ab, ua, w, wbase, uw, ku, res, far)
    while j + 2 <= n:
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        w1 = w0 + uw
        i = 0
        while i + 4 <= m:
            r0 = ab + np.uint64(i) * ua
            r1 = r0 + ua
            r2 = r1 + ua
            r3 = r2 + ua
            dot4x2(a, r0, ua, w, w0, uw, nv, res)  # the 16-lane vectors (512-bit)
            s00 = res[0]
            s01 = res[1]
            s10 = res[2]
            s11 = res[3]
            s20 = res[4]
            s21 = res[5]
            s30 = res[6]
            s31 = res[7]
            for q in range(kv, ku):  # the rest of the row (< 16 elements)
                v0 = dtypes.widen(w[w0 + q])
                v1 = dtypes.widen(w[w1 + q])
                x0 = a[r0 + q]
                x1 = a[r1 + q]
                x2 = a[r2 + q]
                x3 = a[r3 + q]
                s00 += x0 * v0
                s01 += x0 * v1
                s10 += x1 * v0
                s11 += x1 * v1
                s20 += x2 * v0
                s21 += x2 * v1
                s30 += x3 * v0
                s31 += x3 * v1
            c[i, j0 + j] += s00
            c[i, j0 + j + 1] += s01
            c[i + 1, j0 + j] += s10
            c[i + 1, j0 + j + 1] += s11
            c[i + 2, j0 + j] += s20
            c[i + 2, j0 + j + 1] += s21
            c[i + 3, j0 + j] += s30
            c[i + 3, j0 + j + 1] += s31
            i += 4
        while i < m:
            r0 = ab + np.uint64(i) * ua
            s00 = np.float32(0.0)
            s01 = np.float32(0.0)
            for q in range(ku):
                x0 = a[r0 + q]
                s00 += x0 * dtypes.widen(w[w0 + q])
                s01 += x0 * dtypes.widen(w[w1 + q])
            c[i, j0 + j] += s00
            c[i, j0 + j + 1] += s01
            i += 1
        j += 2
    if j < n:  # the last weight row of an odd count
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        for i in range(m):
            r0 = ab + np.uint64(i) * ua
            s00 = np.float32(0.0)
            for q in range(ku):
                s00 += a[r0 + q] * dtypes.widen(w[w0 + q])
            c[i, j0 + j] += s00


@device(boundscheck=False)
def gemv_rows_pairs(c, j0, m, n, a, abase, lda, w, wbase, ldw, k, res, far):
    """:func:`gemv_rows` for bf16 ``a`` and ``w`` (both raw bf16 bits, flat): the same blocks in
    pairs (:data:`dot4x4_pairs`, :data:`dot1x4_pairs`; the first pass over four weight rows
    streams them as in gemv_rows), then the < 32-element rest of each row in plain code, and
    plain loops for the weight rows left over (fewer than 4). Every product is exact in fp32."""
    ku = np.uint64(k)
    ua = np.uint64(lda)
    uw = np.uint64(ldw)
    ab = np.uint64(abase)
    j = _rows_by_4(c, j0, m, n, a, ab, ua, w, wbase, uw, ku, res, far)
    while j < n:  # weight rows left over
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        for i in range(m):
            r0 = ab + np.uint64(i) * ua
            s00 = np.float32(0.0)
            for q in range(ku):
                s00 += dtypes.widen(a[r0 + q]) * dtypes.widen(w[w0 + q])
            c[i, j0 + j] += s00
        j += 1


def _pairs(a):
    """True when the decode loops run in bf16 pairs for operand ``a`` (bf16, i.e. uint16 views)."""
    return np.asarray(a).dtype == np.uint16


@overload(_pairs)
def _pairs_impl(a):
    if _is_bf16_array(a):
        return lambda a: True
    return lambda a: False


def _skinny_rows(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
    """The decode step for one group of weight rows: :func:`gemv_rows_pairs` on ``a`` (flat raw
    bf16) when the operands are bf16, else :func:`gemv_rows` on ``af`` (flat fp32); ``a0`` and
    ``lda`` index the array used."""
    raise NotImplementedError("numba-only")


@overload(_skinny_rows)
def _skinny_rows_impl(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
    if _is_bf16_array(a):
        def impl(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
            gemv_rows_pairs(c, j0, m, n, a, a0, lda, w, wbase, ldw, k, res, far)
    else:
        def impl(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
            gemv_rows(c, j0, m, n, af, a0, lda, w, wbase, ldw, k, res, far)
    return impl


@device(boundscheck=False)
def epilogue(c, rows, cols, bias, has_bias, out, r0, c0):
    """L0C -> GM: ``out[r0+i, c0+j] = round_out(c[i, j] (+ widen(bias[c0+j])))``, one rounding."""
    oc = np.uint64(c0)  # unsigned indices: see the module docstring
    if has_bias:
        for i in range(rows):
            ro = np.uint64(r0 + i)
            ri = np.uint64(i)
            for j in range(np.uint64(cols)):
                out[ro, oc + j] = dtypes.narrow(out, c[ri, j] + dtypes.widen(bias[oc + j]))
    else:
        for i in range(rows):
            ro = np.uint64(r0 + i)
            ri = np.uint64(i)
            for j in range(np.uint64(cols)):
                out[ro, oc + j] = dtypes.narrow(out, c[ri, j])


# Weight rows the decode path streams together over the whole of K (gemv_rows walks them as two
# 4-row register blocks per kL1 step): 8 rows are 8 line streams in flight instead of 4,
# 1.01-1.05x at M in {1, 8}, K = N = 4096 (2 threads, fp32 and bf16). Same sums, same bits.
SKINNY_ROWS = 8


@device(boundscheck=False)
def walk_task(t, tn, a, b, bias, out, has_bias, m1, k1, n1, m0, k0, n0, skinny, merge_k, c, a_l1, b_l1, w_l0, slots):
    """One tile task of the walk: output block ``t`` (row-major over ``tn`` column blocks).

    ``c`` [mL1, nL1] fp32 holds the block's L0C tiles; ``a_l1``/``b_l1`` fp32 L1 scratch for
    16-bit operands (fp32 operands are read in place); ``w_l0`` scratch for the skinny path
    (the result slots of :func:`dot4x4_v16`); ``slots`` the address of this thread's BLAS argument slots.
    Returns (gm_read, gm_write, flops).
    """
    M, K = a.shape
    N = b.shape[0]
    f32 = _is_f32(a)
    gm_read = 0
    flops = 0
    mb = (t // tn) * m1
    nb = (t % tn) * n1
    vm = min(m1, M - mb)
    vn = min(n1, N - nb)
    for i in range(vm):
        for j in range(vn):
            c[i, j] = 0.0
    src_a = _f32_source(a, a_l1)
    src_b = _f32_source(b, b_l1)
    lda = src_a.shape[1]
    ldb = src_b.shape[1]
    ldc = c.shape[1]
    pa = src_a.ctypes.data  # addresses for BLAS, taken once per task
    pb = src_b.ctypes.data
    pc = c.ctypes.data
    af = src_a.reshape(-1)  # flat view for the skinny loops (see gemv_rows)
    wf = w_l0.reshape(-1)
    if skinny:
        # Decode: same walk and counts, loops reordered for a CPU. The GM -> L1 moves of a are
        # counted per kL1 step as in the walk (fp16: widened into an fp32 [mL1, K] scratch; fp32
        # and bf16 are read in place);
        # then each group of SKINNY_ROWS weight rows is streamed once over the whole of K (sequential
        # streams the prefetchers follow, rather than kL1-sized pieces of 128 rows at a 16 KB
        # stride) against all rows of a (register blocks, see gemv_rows), each L0C value accumulating
        # one fp32 partial sum per kL1 step, in ascending k as in the walk. a ([mL1, K] fp32,
        # 128 KiB for 8 x 4096) stays in L2.
        pairs = _pairs(a)  # bf16: a is read in place, in pairs (gemv_rows_pairs)
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            if not (f32 or pairs):
                for i in range(vm):
                    ri = np.uint64(mb + i)
                    di = np.uint64(i)
                    ok = np.uint64(kk)
                    for q in range(np.uint64(vk1)):
                        src_a[di, ok + q] = dtypes.widen(a[ri, ok + q])
        in_place = f32 or pairs
        lda_s = K if in_place else lda  # rows of a in place, or of the widened scratch
        a0 = mb * K if in_place else 0
        araw = a.reshape(-1)
        bw = b.reshape(-1)  # the weight in its storage dtype, widened on the fly
        for jb in range(0, vn, SKINNY_ROWS):  # weight rows streamed together over the whole of K
            vj = min(SKINNY_ROWS, vn - jb)
            far = SKINNY_ROWS * K if jb + 2 * SKINNY_ROWS <= vn else 0  # the next group, if whole
            for kk in range(0, K, k1):
                vk1 = min(k1, K - kk)
                _skinny_rows(c, jb, vm, vj, araw, af, a0 + kk, lda_s, bw, (nb + jb) * K + kk, K, vk1, wf, far)
        flops += 2 * vm * vn * K
    elif f32 and merge_k:
        # fp32 operands are used in place, so the kL1 chunks need no staging on the CPU: the
        # whole block (all its L0C tiles, the whole of K) is one BLAS call, which packs each
        # operand panel once. Counts per kL1 step and L0 tile as in the walk; the sums stay
        # fp32 (in BLAS's order).
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
        mma_blas(pc, ldc, pa + 4 * mb * lda, lda, pb + 4 * nb * ldb, ldb, vm, vn, K, slots)
        flops += 2 * vm * vn * K
    else:
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            # where the L1 tile lives: in place in GM (fp32) or in the widened scratch
            ar0 = mb
            ac0 = kk
            br0 = nb
            bc0 = kk
            if not f32:
                load_l1(a, mb, kk, vm, vk1, src_a)
                load_l1(b, nb, kk, vn, vk1, src_b)
                ar0 = 0
                ac0 = 0
                br0 = 0
                bc0 = 0
            if merge_k:  # the whole L1 block (all its L0 tiles and kL0 steps): one BLAS call
                mma_blas(pc, ldc, pa + 4 * (ar0 * lda + ac0), lda, pb + 4 * (br0 * ldb + bc0), ldb,
                         vm, vn, vk1, slots)
                flops += 2 * vm * vn * vk1
            else:  # one BLAS call per L0 tile and kL0 step, as the walk reads
                for mi in range(0, vm, m0):
                    vm0 = min(m0, vm - mi)
                    for ni in range(0, vn, n0):
                        vn0 = min(n0, vn - ni)
                        for ki in range(0, vk1, k0):
                            vk0 = min(k0, vk1 - ki)
                            mma_blas(pc + 4 * (mi * ldc + ni), ldc,
                                     pa + 4 * ((ar0 + mi) * lda + ac0 + ki), lda,
                                     pb + 4 * ((br0 + ni) * ldb + bc0 + ki), ldb, vm0, vn0, vk0, slots)
                            flops += 2 * vm0 * vn0 * vk0
    epilogue(c, vm, vn, bias, has_bias, out, mb, nb)
    if has_bias:
        gm_read += vn * bias.itemsize  # GM -> BT
    return gm_read, vm * vn * out.itemsize, flops


@device(boundscheck=False)
def group_task(bi0, bi1, bj0, bj1, a, b, bias, out, has_bias, m1, k1, n1, c, slots):
    """Blocks ``[bi0, bi1) x [bj0, bj1)`` of the walk (fp32 operands, merged K) by one BLAS call.

    Counts every block of the group exactly as :func:`walk_task` does (GM -> L1 per kL1 step,
    the bias per block, one write per block); ``c`` holds the group's fp32 accumulators.
    Returns (tasks, gm_read, gm_write, flops).
    """
    M, K = a.shape
    N = b.shape[0]
    gm_read = 0
    gm_write = 0
    flops = 0
    tasks = 0
    for bi in range(bi0, bi1):
        vm = min(m1, M - bi * m1)
        for bj in range(bj0, bj1):
            vn = min(n1, N - bj * n1)
            for kk in range(0, K, k1):
                vk1 = min(k1, K - kk)
                gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            if has_bias:
                gm_read += vn * bias.itemsize  # GM -> BT
            gm_write += vm * vn * out.itemsize
            flops += 2 * vm * vn * K
            tasks += 1
    r0 = bi0 * m1
    c0 = bj0 * n1
    rows = min(M, bi1 * m1) - r0
    cols = min(N, bj1 * n1) - c0
    for i in range(rows):
        for j in range(cols):
            c[i, j] = 0.0
    lda = a.shape[1]
    ldb = b.shape[1]
    mma_blas(c.ctypes.data, c.shape[1], a.ctypes.data + 4 * r0 * lda, lda, b.ctypes.data + 4 * c0 * ldb, ldb,
             rows, cols, K, slots)
    epilogue(c, rows, cols, bias, has_bias, out, r0, c0)
    return tasks, gm_read, gm_write, flops


@kernel
def matmul_nt_kernel(a, b, bias, out, has_bias, m1, k1, n1, m0, k0, n0, skinny, merge_k, gm, gn,
                     acc, a_l1, b_l1, w_l0, slots):
    """``out = round(a @ b^T (+ bias))`` by the cube walk; returns the counters tuple.

    ``a[M, K]``, ``b[N, K]``, ``bias[N]`` (any 1-element array when ``has_bias`` is False),
    ``out[M, N]``: storage kernel views (a, b, bias share one dtype; out may differ). The rest
    is per-thread scratch indexed by ``numba.get_thread_id()`` (allocated by :func:`run_walk`).
    ``gm x gn`` > 1 (fp32, merged K only): each prange iteration runs a group of gm x gn walk
    blocks as one BLAS call (:func:`group_task`); the counts stay per block.
    """
    M = a.shape[0]
    N = b.shape[0]
    tm = (M + m1 - 1) // m1
    tn = (N + n1 - 1) // n1
    gtm = (tm + gm - 1) // gm
    gtn = (tn + gn - 1) // gn
    grouped = gm * gn > 1
    tasks = 0
    gm_read = 0
    gm_write = 0
    flops = 0
    slots0 = slots.ctypes.data
    for g in prange(gtm * gtn):
        tid = numba.get_thread_id()
        bi0 = (g // gtn) * gm
        bj0 = (g % gtn) * gn
        bi1 = min(tm, bi0 + gm)
        bj1 = min(tn, bj0 + gn)
        if grouped:
            t, r, w, f = group_task(bi0, bi1, bj0, bj1, a, b, bias, out, has_bias, m1, k1, n1, acc[tid],
                                    slots0 + tid * 4 * ARG_SLOTS)
            tasks += t
            gm_read += r
            gm_write += w
            flops += f
        else:
            for bi in range(bi0, bi1):
                for bj in range(bj0, bj1):
                    r, w, f = walk_task(bi * tn + bj, tn, a, b, bias, out, has_bias, m1, k1, n1, m0, k0, n0,
                                        skinny, merge_k, acc[tid], a_l1[tid], b_l1[tid], w_l0[tid],
                                        slots0 + tid * 4 * ARG_SLOTS)
                    gm_read += r
                    gm_write += w
                    flops += f
                    tasks += 1
    return tasks, gm_read, gm_write, 0, flops


GROUP_EDGE = 1024
"""fp32 prefill on the CPU: walk blocks are grouped into BLAS calls of about GROUP_EDGE x
GROUP_EDGE outputs (see :func:`run_walk`)."""


def _groups(m: int, n: int, m1: int, n1: int, threads: int):
    """(gm, gn): blocks per BLAS call for the fp32 merged-K path, keeping >= 4 calls per thread.

    ``threads`` is the process's thread pool size (``NUMBA_NUM_THREADS``), not the current
    ``numba.get_num_threads()``: the grouping (and so BLAS's order of the fp32 additions) must
    not change with ``set_num_threads``, so results stay bit-identical for any thread count."""
    tm, tn = -(-m // m1), -(-n // n1)
    gm = max(1, min(tm, GROUP_EDGE // m1))
    gn = max(1, min(tn, GROUP_EDGE // n1))
    while (gm > 1 or gn > 1) and -(-tm // gm) * -(-tn // gn) < 4 * threads:
        if gm >= gn:
            gm = max(1, gm // 2)
        else:
            gn = max(1, gn // 2)
    return gm, gn


def scratch(m1: int, k1: int, n1: int, k0: int, a_is_f32: bool, skinny: bool, threads: int = None, k: int = 0):
    """Per-thread scratch of one :func:`matmul_nt_kernel` call (allocated once per call).

    ``k`` (the full K) sizes the skinny path's widened copy of a: [mL1, K] instead of [mL1, kL1].
    """
    nth = numba.get_num_threads() if threads is None else threads
    la = 1 if a_is_f32 else m1
    lb = 1 if (a_is_f32 or skinny) else n1
    slots = np.zeros((nth, ARG_SLOTS), np.int32)
    slots[:, 6:8] = _ONE_F32_BITS  # alpha = beta = 1.0f
    slots[:, 8] = ord("T")  # little-endian: the first byte of the slot is the character
    slots[:, 9] = ord("N")
    return (
        np.empty((nth, m1, n1), np.float32),  # L0C tiles of one block
        np.empty((nth, la, max(k, k1) if skinny else k1), np.float32),  # fp32 copy of a (16-bit only)
        np.empty((nth, lb, k1), np.float32),  # fp32 L1 copy of b (16-bit, not skinny)
        np.empty((nth, 1, max(k0, 16)), np.float32),  # skinny: the 16 result slots of dot4x4_v16
        slots,  # BLAS argument slots
    )


# ----------------------------------------------------------------------------------------------
# plan


@dataclasses.dataclass(frozen=True)
class CubeWalk:
    """The cube walk for one matmul: resolved tiles, cube buffers and the exact counts."""

    m: int
    k: int
    n: int
    tiles: tuple  # ((mL0, mL1), (kL0, kL1), (nL0, nL1))
    a_dtype: str
    b_dtype: str
    out_dtype: str
    bias_dtype: str | None
    buffers: tuple
    tasks: int
    gm_read_bytes: int
    gm_write_bytes: int
    cube_flops: int

    @property
    def params(self) -> dict:
        (m0, m1), (k0, k1), (n0, n1) = self.tiles
        return {"m1": m1, "k1": k1, "n1": n1, "m0": m0, "k0": k0, "n0": n0}

    def kernel_plan(self, name: str, extra_buffers=()) -> KernelPlan:
        """A KernelPlan for a kernel that is exactly this walk (plus any extra buffers)."""
        return KernelPlan(
            name=name,
            unit="cube",
            tasks=self.tasks,
            buffers=tuple(self.buffers) + tuple(extra_buffers),
            gm_read_bytes=self.gm_read_bytes,
            gm_write_bytes=self.gm_write_bytes,
            cube_flops=self.cube_flops,
        )


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def plan_walk(m: int, k: int, n: int, tiles, a_dtype: str, b_dtype: str = None, out_dtype: str = None,
              *, bias_dtype: str = None, profile=None, where: str = "cube") -> CubeWalk:
    """Validate ``tiles`` for ``a[m, k] @ b[n, k]^T`` and return the walk's buffers and counts.

    Raises TileError (via :func:`~pypto_numba.machine.plan.cube_tiles`: the buffer, its bytes
    and its budget) and ConstraintError when ``k`` exceeds the matmul inner-axis limit.
    """
    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    b_dtype = b_dtype or a_dtype
    out_dtype = out_dtype or a_dtype
    m, k, n = int(m), int(k), int(n)
    if k > prof.matmul_inner_max:
        raise ConstraintError(
            f"{where}: K = {k} exceeds the matmul inner (last) axis limit {prof.matmul_inner_max} "
            f"of {prof.name} (npu-facts 4.4); split K into chunks and add the partial products"
        )
    buffers = cube_tiles(tiles, a_dtype, b_dtype, prof, where, bias=bias_dtype is not None)
    (m0, m1), (k0, k1), (n0, n1) = ((int(x), int(y)) for x, y in tiles)
    tm, tn = _cdiv(m, m1), _cdiv(n, n1)
    reads = m * k * ITEMSIZE[a_dtype] * tn + n * k * ITEMSIZE[b_dtype] * tm
    if bias_dtype is not None:
        reads += n * ITEMSIZE[bias_dtype] * tm
    return CubeWalk(
        m=m, k=k, n=n, tiles=((m0, m1), (k0, k1), (n0, n1)),
        a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, bias_dtype=bias_dtype,
        buffers=tuple(buffers), tasks=tm * tn,
        gm_read_bytes=reads, gm_write_bytes=m * n * ITEMSIZE[out_dtype],
        cube_flops=2 * m * n * k,
    )


def run_walk(a_k: np.ndarray, b_k: np.ndarray, bias_k, out_k: np.ndarray, walk_or_params, *, skinny=None,
             merge_k=True, group=True):
    """Run :func:`matmul_nt_kernel` on 2-D kernel views with a walk's tiles; returns its counters.

    ``bias_k`` is a 1-D kernel view or None; ``skinny`` forces (True) or forbids (False) the
    hand-written decode loops (default: ``M < SKINNY_M``); ``merge_k`` issues the kL0 steps of
    one kL1 chunk as one BLAS call (default) instead of one call per kL0 step (same counts, same
    fp32 accumulation; only the order of the fp32 additions inside the chunk differs); ``group``
    (fp32 with ``merge_k``, ``M >= SKINNY_M`` only) runs groups of walk blocks as one BLAS call of about
    ``GROUP_EDGE`` x ``GROUP_EDGE`` outputs (same counts, per block).
    """
    p = walk_or_params.params if isinstance(walk_or_params, CubeWalk) else walk_or_params
    if a_k.dtype != b_k.dtype or (bias_k is not None and bias_k.dtype != a_k.dtype):
        # the kernel picks "fp32 in place" vs "widen into L1" from a's dtype alone
        raise TypeError(f"run_walk: a, b and bias must share one kernel dtype, got {a_k.dtype}, "
                        f"{b_k.dtype}, {None if bias_k is None else bias_k.dtype}")
    if a_k.ndim != 2 or b_k.ndim != 2 or a_k.shape[1] != b_k.shape[1] or out_k.shape != (a_k.shape[0], b_k.shape[0]):
        raise ValueError(f"run_walk: need a[M, K], b[N, K], out[M, N]; got {a_k.shape}, {b_k.shape}, {out_k.shape}")
    has_bias = bias_k is not None
    if not has_bias:
        bias_k = np.zeros(1, a_k.dtype)
    if skinny is None:
        m = a_k.shape[0]
        skinny = m < SKINNY_M
    skinny = bool(skinny)
    if skinny and a_k.dtype == np.float32 and tile.address(a_k) % tile.ALIGN:
        # decode reads fp32 rows of a in place, with every 64-byte vector load of them split
        # across two lines when a is off a line (NumPy's large arrays start 16 bytes past one);
        # a line-aligned copy (128 KiB at M = 8, K = 4096) made the call 1.05x faster
        aligned, _ = tile.aligned_empty(a_k.shape, "fp32")
        aligned[...] = a_k
        a_k = aligned
    gm = gn = 1
    # prefill only: a decode-shaped gemm (a few rows) is forwarded to gemv by OpenBLAS, and
    # wider calls made it slower (M = 1, one thread: 12 ms grouped vs 5 ms per block)
    if a_k.dtype == np.float32 and merge_k and not skinny and group and a_k.shape[0] >= SKINNY_M:
        gm, gn = _groups(a_k.shape[0], b_k.shape[0], p["m1"], p["n1"], numba.config.NUMBA_NUM_THREADS)
    work = scratch(p["m1"] * gm, p["k1"], p["n1"] * gn, p["k0"], a_k.dtype == np.float32, skinny, k=a_k.shape[1])
    with single_thread_blas(), dynamic_tasks():
        return matmul_nt_kernel(a_k, b_k, bias_k, out_k, has_bias, p["m1"], p["k1"], p["n1"],
                                p["m0"], p["k0"], p["n0"], skinny, bool(merge_k), gm, gn, *work)
