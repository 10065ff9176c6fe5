"""The exact-arithmetic switch: every strategy in fp32 storage, no rounding to a 16-bit format.

``with use_exact(): ...`` (or ``PYPTO_NUMBA_EXACT=1``) widens every bf16/fp16 array argument of
every public strategy call to fp32 before the strategy sees it, so the strategy's cast points (P
before P@V, ``math="storage"``, the output itself) round to fp32 only. Compared with the same
strategy's normal run this separates an algorithm error from precision loss (as NKI's simulator
offers). The results are then fp32: the one documented exception to "results keep the input's
storage dtype". Plans are priced as the fp32 runs they are; ``Record.exact`` and compare's header
say so. An ``out=`` buffer must then be fp32 (a 16-bit one is refused: it would round again).

The switch in force is, like :func:`~pypto_numba.use_profile`: the innermost ``use_exact(...)`` of
the current thread/context, else ``$PYPTO_NUMBA_EXACT`` (``1``/``true``/``yes``/``on`` turn it on),
else off. ``use_exact(False)`` turns it off inside an outer ``use_exact()``.
"""

from __future__ import annotations

import contextvars
import functools
import os

import numpy as np

ENV_VAR = "PYPTO_NUMBA_EXACT"
_ON = ("1", "true", "yes", "on")

_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("pypto_numba_exact", default=None)


def exact_active() -> bool:
    """Whether strategies run exact: innermost ``use_exact``, else ``$PYPTO_NUMBA_EXACT``, else off."""
    current = _ACTIVE.get()
    if current is not None:
        return current
    return os.environ.get(ENV_VAR, "").strip().lower() in _ON


class use_exact:
    """Run every strategy in fp32 storage: ``with use_exact(): ...`` (``use_exact(False)``: off).

    Called without ``with`` it switches for the current context until :meth:`restore` (or the end
    of the thread)."""

    def __init__(self, on: bool = True):
        if not isinstance(on, (bool, np.bool_)):
            from .errors import PyptoNumbaError

            raise PyptoNumbaError(f"use_exact: on must be True or False, got {on!r}")
        self.on = bool(on)
        self._token = _ACTIVE.set(self.on)

    def restore(self):
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None

    def __enter__(self) -> bool:
        return self.on

    def __exit__(self, *exc):
        self.restore()
        return False


_NARROW = frozenset({np.dtype(np.float16)})


def _narrow(a) -> bool:
    return isinstance(a, np.ndarray) and (a.dtype in _NARROW or a.dtype.name == "bfloat16")


def _widen(a):
    return a.astype(np.float32) if _narrow(a) else a


def exact_aware(fn, where: str):
    """Wrap strategy ``fn`` (keeping name, docstring, signature) to widen its inputs under exact."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not exact_active():
            return fn(*args, **kwargs)
        out = kwargs.get("out")
        if _narrow(out):
            from .errors import DTypeError

            raise DTypeError(f"{where}: under use_exact() the result is fp32, but out= is {out.dtype}; "
                             f"pass an fp32 out= or none, or leave use_exact()")
        return fn(*(_widen(a) for a in args), **{k: _widen(v) for k, v in kwargs.items()})

    return call
