"""The numba rules of pypto_numba, stated once (other modules refer here), and the options every
kernel is compiled with.

Compile options
---------------
- ``error_model="numpy"``: division by zero gives inf/nan instead of a Python exception check,
  which is what lets loops with divisions vectorise.
- ``FASTMATH``: the fast-math subset of every kernel: contraction (FMA), reassociation inside a
  task, approximate reciprocals and functions, but NaN and Inf semantics kept. Blanket fastmath
  is never used: its ``nnan``/``ninf`` flags silently delete NaN checks and break -inf masking.
- Math helpers (``machine/vmath.py``) compile with ``contract`` only (``VMATH_FASTMATH``):
  ``reassoc`` lets LLVM fold exp's two-step scaling ``(p * 2^n1) * 2^n2`` into one overflowing
  ``p * 2^128`` and undo the Cody-Waite reduction, ``arcp``/``afn`` could turn ``1/sqrt(x)``
  into an estimate that is wrong at 0 and Inf. LLVM's flags are per instruction, so a helper
  keeps its flags when inlined into a ``FASTMATH`` kernel; hand-built IR (``machine/ir``)
  carries ``contract`` only, so it gives the bits of the numba helper it mirrors.
- Small helpers called in loops need ``forceinline=True``: above LLVM's inlining threshold a
  call stays in the loop and the loop does not vectorise.
- ``cache=True``: machine code is cached (``NUMBA_CACHE_DIR`` or next to the source).

Indexing
--------
- Index with unsigned offsets (``o = np.uint64(start); x[o + i]``) or loop over a slice: a
  signed index whose sign LLVM cannot prove (``for i in range(start, stop): x[i]``) keeps numba's
  negative-index wraparound select and the loop does not vectorise (vector loads become gathers
  or scalar code); this holds for every index of a multi-dimensional access too (``k[ub, uh, uj,
  d]`` with all four uint64 vectorises).
- Never mix uint64 and int64 in arithmetic (numba gives float64), and ``u + 1`` with a uint64
  ``u`` is int64 again: write ``u + np.uint64(1)``.
- No array slice per element row in a hot loop: each slice updates the parent's reference count
  atomically, and two threads doing that on the same array bounce its cache line.
- A loop vectorises only with <= 8 runtime alias checks: one output and a few inputs per loop.
- Numba types scalar integer arithmetic as int64, so bit tricks on float32 lanes that should
  vectorise 16 to a register are written as i32 IR (``machine/ir/convert.py``).

Vector width
------------
Numba loops leave the vector width to LLVM's cost model for the host CPU: on the Xeon the kernels
were first measured on it picks 256-bit vectors (``prefer-256-bit``), on the AMD EPYC hosts
(Zen 4, Zen 5) 512-bit ones.
Forcing 512-bit on the Xeon (``NUMBA_CPU_FEATURES=...,-prefer-256-bit``) made the attention tiles
slower (D = 128 rows are too short to amortise them), so no kernel overrides the CPU's choice.
The compute-bound inner loops that gain from 512-bit vectors whatever the CPU are written in IR
with explicit 16-lane fp32 vectors instead (``vmath.softmax_exp``/``rowmax``, GELU's span, rope's
rotation, the cube's register blocks, decode attention's QK^T and P @ V blocks): the width is
chosen per loop, where it was measured faster.

Threads and determinism
-----------------------
Float reductions are never done with ``prange`` reductions (their order would depend on the
thread count); each tile task reduces serially, so results are bit-identical for any number of
threads. ``prange`` reductions are used only for the integer cost counters. Per-thread scratch is
allocated in Python (``machine/tile.py``, one cache-line-aligned slab per thread) because
``numba.get_num_threads()`` inside a kernel makes it uncacheable. ``np.dot`` inside ``prange``
needs SciPy's OpenBLAS on one thread (``machine/cube/blas.py``).

Cache pitfalls
--------------
- The on-disk cache is keyed on the kernel's own source file: after editing a ``@device`` helper
  or an intrinsic's IR in another module, clear ``NUMBA_CACHE_DIR`` (or a stale kernel is loaded
  silently).
- A ``parallel=True`` kernel compiled in the running process and the same kernel loaded from the
  cache can differ in the last bits of a float sum that LLVM vectorised (``reassoc``) when the
  loop calls an inlined helper with its own fastmath flags or bit-cast intrinsics (``vmath.exp``,
  ``dtypes.f32_as_u32``); seen with numba 0.68, every time, and not without ``parallel`` or
  without the helper. From the first cache hit on, every run (any thread count) gives the same
  bits: ``tests/contracts/test_determinism.py`` fills the cache before comparing processes, and a bits
  check compares fresh caches with fresh caches (``tools/bits.py``).

Benchmarks that compare bandwidth pass ``out=`` where the op offers it: a fresh multi-MiB output
costs page faults comparable to the kernel itself.
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
