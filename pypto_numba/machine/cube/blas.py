"""BLAS binding and thread control of the cube unit.

sgemm from SciPy's ``cython_blas`` bound as an external symbol (:func:`mma_blas`), and the
context managers that run cube kernels with SciPy's OpenBLAS on one thread
(:func:`single_thread_blas`) and with prange iterations handed out dynamically
(:func:`dynamic_tasks`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import os
import threading

import llvmlite.binding as _llvm
import numba
from numba import types
from numba.extending import get_cython_function_address

from ..jit import device

# sgemm from SciPy's cython_blas as an external symbol (resolved at link time by name, so kernels
# calling it can be cached -- a ctypes pointer global would disable caching).

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

    Cube tasks are long and uneven; with numba's default static split each thread gets its share
    up front, and on a shared machine the call waits for whichever thread the OS parks.
    (Set from Python: calling ``numba.set_parallel_chunksize`` inside a kernel disables caching.)
    """
    before = numba.get_parallel_chunksize()
    numba.set_parallel_chunksize(chunk)
    try:
        yield
    finally:
        numba.set_parallel_chunksize(before)


@numba.extending.intrinsic
def _as_int32_ptr(typingctx, addr):
    """An integer address as an ``int32*`` (for ``numba.carray``)."""
    if not isinstance(addr, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], context.get_value_type(types.CPointer(types.int32)))

    return types.CPointer(types.int32)(addr), codegen


@device
def mma_blas(
    c,
    ldc,
    a,
    lda,
    b,
    ldb,
    m,
    n,
    k,
    slots,
):
    """L0C += L0A @ L0B^T by one BLAS sgemm (``beta = 1``); fp32, row-major.

    Row-major ``C = A B^T`` is column-major ``C^T = B A^T``:
    sgemm('T', 'N', n, m, k, 1, b, ldb, a, lda, 1, c, ldc).

    Parameters
    ----------
    c, ldc : address of the fp32 tile ``c[m, n]`` (first element) and its row stride
    a, lda : address of ``a[m, k]`` and its row stride
    b, ldb : address of ``b[n, k]`` and its row stride
    m, n, k : the GEMM's sizes
    slots : address of this thread's ``ARG_SLOTS`` int32 argument slots (Fortran passes
        everything by pointer), filled by :func:`~.plan.scratch`
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
