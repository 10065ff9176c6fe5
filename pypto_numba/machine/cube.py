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
- Skinny M (decode): ``skinny=True`` runs hand-written loops instead of BLAS: each weight row
  is streamed once (widened on the fly into a [kL0] buffer) and dotted with up to 8 rows of
  ``a`` at a time; same walk, same counts, fp32 accumulation per L0 step. Measured on the
  2-core test machine (K = N = 4096, medians of 15 alternating runs, 1 and 2 threads) the
  merged BLAS path was as fast or faster for M = 1 and 8 in fp32 and bf16 (BLAS's gemm with a
  tiny M streams the weight panel once too), so BLAS is the default for every M
  (``SKINNY_M = 0``); the loops stay as an option and are tested.
- Inner loops index flat views with uint64 indices: numba treats a negative int index as
  counting from the end, and when an index has a run-time offset LLVM cannot rule that out, keeps
  the wraparound select inside the loop and does not vectorise it (measured 5-7x slower). Hot
  loops also take no array views (each view bumps the parent's reference count atomically, and
  two threads doing so per row fight over one cache line).

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

import llvmlite.binding as _llvm
import numba
import numpy as np
from numba import prange, types
from numba.extending import get_cython_function_address, overload

from ..errors import ConstraintError
from . import dtypes
from .jit import device, kernel
from .plan import ITEMSIZE, KernelPlan, cube_tiles
from .profile import HardwareProfile, load_profile

__all__ = [
    "SKINNY_M",
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
    "mma_rows",
    "epilogue",
]

SKINNY_M = 0
"""Below this many rows of ``a`` the walk uses the hand-written skinny loops by default (0: never;
see the module notes: the merged BLAS path measured as fast or faster for decode shapes)."""

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


@contextlib.contextmanager
def single_thread_blas():
    """Run the body with SciPy's OpenBLAS (the one kernels call) limited to one thread.

    Only SciPy's bundled OpenBLAS is touched; NumPy ships its own OpenBLAS with its own thread
    pool, which keeps its setting. Without SciPy's library on disk (other platforms) this is a
    no-op: set ``OPENBLAS_NUM_THREADS=1`` in the environment instead.
    """
    fns = _scipy_openblas()
    if fns is None:
        yield
        return
    get, put = fns
    before = get()
    if before != 1:
        put(1)
    try:
        yield
    finally:
        if before != 1:
            put(before)


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
    oc = np.uint64(c0)  # unsigned indices: see mma_rows
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


@device(boundscheck=False)
def mma_rows(c, j, a, abase, lda, m, w, wbase, k):
    """``c[i, j] += sum_q a[abase + i*lda + q] * w[wbase + q]`` for ``i < m``, ``q < k`` (8, 4, 1 rows a pass).

    The skinny (decode) L0 step on flat (1-D) views: one fp32 weight row, read once for up to 8
    rows of ``a`` (up to 8 independent fp32 sums per pass, vectorised over q; each sum is serial
    within the task). Flat arrays with uint64 indices on purpose: numba wraps negative int
    indices (x[i] with i < 0 means x[n + i]); with a run-time offset LLVM cannot prove i >= 0,
    keeps that select in the loop and does not vectorise it (measured 5-7x slower).
    """
    ku = np.uint64(k)
    wb = np.uint64(wbase)
    i = 0
    while i + 8 <= m:  # 8 rows per pass: one weight load feeds 8 FMAs
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        s4 = np.float32(0.0)
        s5 = np.float32(0.0)
        s6 = np.float32(0.0)
        s7 = np.float32(0.0)
        r0 = np.uint64(abase + i * lda)
        r1 = np.uint64(abase + (i + 1) * lda)
        r2 = np.uint64(abase + (i + 2) * lda)
        r3 = np.uint64(abase + (i + 3) * lda)
        r4 = np.uint64(abase + (i + 4) * lda)
        r5 = np.uint64(abase + (i + 5) * lda)
        r6 = np.uint64(abase + (i + 6) * lda)
        r7 = np.uint64(abase + (i + 7) * lda)
        for q in range(ku):
            x = w[wb + q]
            s0 += a[r0 + q] * x
            s1 += a[r1 + q] * x
            s2 += a[r2 + q] * x
            s3 += a[r3 + q] * x
            s4 += a[r4 + q] * x
            s5 += a[r5 + q] * x
            s6 += a[r6 + q] * x
            s7 += a[r7 + q] * x
        c[i, j] += s0
        c[i + 1, j] += s1
        c[i + 2, j] += s2
        c[i + 3, j] += s3
        c[i + 4, j] += s4
        c[i + 5, j] += s5
        c[i + 6, j] += s6
        c[i + 7, j] += s7
        i += 8
    while i + 4 <= m:
        s0 = np.float32(0.0)
        s1 = np.float32(0.0)
        s2 = np.float32(0.0)
        s3 = np.float32(0.0)
        r0 = np.uint64(abase + i * lda)
        r1 = np.uint64(abase + (i + 1) * lda)
        r2 = np.uint64(abase + (i + 2) * lda)
        r3 = np.uint64(abase + (i + 3) * lda)
        for q in range(ku):
            x = w[wb + q]
            s0 += a[r0 + q] * x
            s1 += a[r1 + q] * x
            s2 += a[r2 + q] * x
            s3 += a[r3 + q] * x
        c[i, j] += s0
        c[i + 1, j] += s1
        c[i + 2, j] += s2
        c[i + 3, j] += s3
        i += 4
    while i < m:
        s0 = np.float32(0.0)
        r0 = np.uint64(abase + i * lda)
        for q in range(ku):
            s0 += a[r0 + q] * w[wb + q]
        c[i, j] += s0
        i += 1


@device(boundscheck=False)
def epilogue(c, rows, cols, bias, has_bias, out, r0, c0):
    """L0C -> GM: ``out[r0+i, c0+j] = round_out(c[i, j] (+ widen(bias[c0+j])))``, one rounding."""
    oc = np.uint64(c0)  # unsigned indices: see mma_rows
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


@device(boundscheck=False)
def walk_task(t, tn, a, b, bias, out, has_bias, m1, k1, n1, m0, k0, n0, skinny, merge_k, c, a_l1, b_l1, w_l0, slots):
    """One tile task of the walk: output block ``t`` (row-major over ``tn`` column blocks).

    ``c`` [mL1, nL1] fp32 holds the block's L0C tiles; ``a_l1``/``b_l1`` fp32 L1 scratch for
    16-bit operands (fp32 operands are read in place); ``w_l0`` [1, kL0] a widened weight row
    (skinny path); ``slots`` the address of this thread's BLAS argument slots.
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
    af = src_a.reshape(-1)  # flat views for the skinny loops (see mma_rows)
    bf = src_b.reshape(-1)
    wf = w_l0.reshape(-1)
    if skinny:
        # Decode: same walk and counts, loops reordered for a CPU. The GM -> L1 moves of a are
        # counted per kL1 step as in the walk (16-bit: widened into an fp32 [mL1, K] scratch);
        # then each weight row is streamed over the whole of K (contiguous 16 KB runs that the
        # prefetchers follow, instead of kL1-sized pieces of 128 rows), with the L0 k-steps in
        # ascending order, so every c[i, j] sums exactly what the kk-outer walk sums, in the
        # same order.
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            if not f32:
                for i in range(vm):
                    ri = np.uint64(mb + i)
                    di = np.uint64(i)
                    ok = np.uint64(kk)
                    for q in range(np.uint64(vk1)):
                        src_a[di, ok + q] = dtypes.widen(a[ri, ok + q])
        ar0 = mb if f32 else 0
        for j in range(vn):
            wrow = np.uint64(nb + j)
            for kk in range(0, K, k1):
                vk1 = min(k1, K - kk)
                for ki in range(0, vk1, k0):
                    vk0 = min(k0, vk1 - ki)
                    abase = ar0 * lda + kk + ki
                    if f32:  # the weight row in place (src_b is b)
                        mma_rows(c, j, af, abase, lda, vm, bf, (nb + j) * ldb + kk + ki, vk0)
                    else:  # widen one weight row piece into L0B (unsigned indices: see mma_rows)
                        oq = np.uint64(kk + ki)
                        for q in range(np.uint64(vk0)):
                            wf[q] = dtypes.widen(b[wrow, oq + q])
                        mma_rows(c, j, af, abase, lda, vm, wf, 0, vk0)
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


@kernel
def matmul_nt_kernel(a, b, bias, out, has_bias, m1, k1, n1, m0, k0, n0, skinny, merge_k,
                     acc, a_l1, b_l1, w_l0, slots):
    """``out = round(a @ b^T (+ bias))`` by the cube walk; returns the counters tuple.

    ``a[M, K]``, ``b[N, K]``, ``bias[N]`` (any 1-element array when ``has_bias`` is False),
    ``out[M, N]``: storage kernel views (a, b, bias share one dtype; out may differ). The rest
    is per-thread scratch indexed by ``numba.get_thread_id()`` (allocated by :func:`run_walk`).
    """
    M = a.shape[0]
    N = b.shape[0]
    tm = (M + m1 - 1) // m1
    tn = (N + n1 - 1) // n1
    tasks = 0
    gm_read = 0
    gm_write = 0
    flops = 0
    slots0 = slots.ctypes.data
    for t in prange(tm * tn):
        tid = numba.get_thread_id()
        r, w, f = walk_task(t, tn, a, b, bias, out, has_bias, m1, k1, n1, m0, k0, n0, skinny, merge_k,
                            acc[tid], a_l1[tid], b_l1[tid], w_l0[tid], slots0 + tid * 4 * ARG_SLOTS)
        gm_read += r
        gm_write += w
        flops += f
        tasks += 1
    return tasks, gm_read, gm_write, 0, flops


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
        np.empty((nth, 1, k0), np.float32),  # one widened weight row (skinny, 16-bit)
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
             merge_k=True):
    """Run :func:`matmul_nt_kernel` on 2-D kernel views with a walk's tiles; returns its counters.

    ``bias_k`` is a 1-D kernel view or None; ``skinny`` forces (True) or forbids (False) the
    hand-written decode loops (default: ``M < SKINNY_M``); ``merge_k`` issues the kL0 steps of
    one kL1 chunk as one BLAS call (default) instead of one call per kL0 step (same counts, same
    fp32 accumulation; only the order of the fp32 additions inside the chunk differs).
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
        skinny = a_k.shape[0] < SKINNY_M
    skinny = bool(skinny)
    work = scratch(p["m1"], p["k1"], p["n1"], p["k0"], a_k.dtype == np.float32, skinny, k=a_k.shape[1])
    with single_thread_blas(), dynamic_tasks():
        return matmul_nt_kernel(a_k, b_k, bias_k, out_k, has_bias, p["m1"], p["k1"], p["n1"],
                                p["m0"], p["k0"], p["n0"], skinny, bool(merge_k), *work)

