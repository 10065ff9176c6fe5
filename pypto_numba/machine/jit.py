"""The numba options every kernel in pypto_numba is compiled with (one source of truth).

- ``error_model="numpy"``: division by zero gives inf/nan instead of a Python exception check,
  which is what lets loops with divisions vectorise.
- ``FASTMATH``: the fastmath subset that allows contraction (FMA), reassociation inside a task,
  approximate reciprocals and functions, but keeps NaN and Inf semantics. Blanket fastmath is
  never used: its ``nnan``/``ninf`` flags silently delete NaN checks and break -inf masking.
- ``cache=True``: machine code is cached (``NUMBA_CACHE_DIR`` or next to the source).

Float reductions are never done with ``prange`` reductions (their order would depend on the
thread count); each tile task reduces serially, so results are bit-identical for any number of
threads. ``prange`` reductions are used only for the integer cost counters.

One limit of that promise, measured with numba 0.68: a ``parallel=True`` kernel compiled in the
running process and the same kernel loaded from the on-disk cache can differ in the last bits of a
float sum that LLVM vectorised (``reassoc``) when the loop calls an inlined helper with its own
fastmath flags or bit-cast intrinsics (``vmath.exp``, ``dtypes.f32_as_u32``): a prange kernel
summing ``vmath.exp`` over rows gave one result fresh and another from the cache, every time;
the same loop without ``parallel`` or without the helper gave one result. So a process that
compiled a kernel may differ in the last bits from later processes that load it; from the first
cache hit on, every run (any thread count) gives the same bits. ``tests/test_determinism.py``
fills the cache before comparing processes.

Numba rules measured while building the kernels (each cost 2-7x when broken):

- index with unsigned offsets (``o = np.uint64(start); x[o + i]``) or loop over a slice: a signed
  index whose sign LLVM cannot prove (``for i in range(start, stop): x[i]``) keeps numba's
  negative-index wraparound select and the loop does not vectorise; this holds for every index
  of a multi-dimensional access too (``k[ub, uh, uj, d]`` with all four uint64 vectorises);
- never mix uint64 and int64 in arithmetic (numba gives float64), and ``u + 1`` with a uint64
  ``u`` is int64 again: write ``u + np.uint64(1)``;
- no array slice per element row in a hot loop: each slice updates the parent's reference count
  atomically, and two threads doing that on the same array bounce its cache line;
- a loop vectorises only with <= 8 runtime alias checks: one output and a few inputs per loop;
- ``reassoc`` lets LLVM fold a two-step exponent scaling into one overflowing constant, so
  ``machine/vmath.py`` compiles with ``contract`` only (the flags travel with each instruction
  when inlined into a FASTMATH kernel); small math helpers need ``forceinline`` or LLVM may
  leave a call in the loop and not vectorise it;
- ``numba.get_num_threads()`` inside a kernel makes it uncacheable: per-thread scratch is
  allocated in Python (``machine/tile.py``) with one cache-line-aligned slab per thread;
- ``np.dot`` inside ``prange`` needs SciPy's OpenBLAS on one thread (``machine/cube.py``), or it is
  ~40x slower;
- a fresh multi-MiB output costs page faults comparable to the kernel itself: benchmarks that
  compare bandwidth pass ``out=`` where the op offers it.
- 512-bit vectors (``NUMBA_CPU_FEATURES=...,-prefer-256-bit``) measured slower than LLVM's 256-bit
  default on the attention tiles (D=128 rows are too short to amortise them);
- the on-disk cache is keyed on the kernel's own source file: after editing a ``@device`` helper
  in another module, clear ``NUMBA_CACHE_DIR`` (or a stale kernel is loaded silently).
"""

from __future__ import annotations

import numba

FASTMATH = frozenset({"contract", "reassoc", "nsz", "arcp", "afn"})

_COMMON = dict(cache=True, error_model="numpy", fastmath=set(FASTMATH), nogil=True)


def kernel(fn=None, **overrides):
    """Decorator for a parallel tile kernel: ``@kernel`` or ``@kernel(boundscheck=False)``.

    One ``prange`` iteration of a kernel is one tile task (one ``pypto.loop`` iteration
    dispatched to an AI core).
    """
    opts = dict(_COMMON, parallel=True)
    opts.update(overrides)
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)


def device(fn=None, **overrides):
    """Decorator for a serial helper called from kernels (LLVM inlines it into the caller)."""
    opts = dict(_COMMON)
    opts.update(overrides)
    if fn is None:
        return lambda f: numba.njit(**opts)(f)
    return numba.njit(**opts)(fn)
