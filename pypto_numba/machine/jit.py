"""The numba options every kernel in pypto_numba is compiled with (one source of truth).

- ``error_model="numpy"``: division by zero gives inf/nan instead of a Python exception check,
  which is what lets loops with divisions vectorise.
- ``FASTMATH``: the fastmath subset that allows contraction (FMA), reassociation inside a task,
  approximate reciprocals and functions, but keeps NaN and Inf semantics. ``fastmath=True`` is
  never used: its ``nnan``/``ninf`` flags silently delete NaN checks and break -inf masking.
- ``cache=True``: machine code is cached (``NUMBA_CACHE_DIR`` or next to the source).

Float reductions are never done with ``prange`` reductions (their order would depend on the
thread count); each tile task reduces serially, so results are bit-identical for any number of
threads. ``prange`` reductions are used only for the integer cost counters.
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
