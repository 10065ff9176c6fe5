"""Memoised plans: a plan depends only on shapes, dtype, options and the hardware profile.

Building a plan walks its tiles in Python (100-200 us for an attention plan), which is as long as
a whole decode kernel on a short cache; every call of a strategy builds one. ``@memo_plan`` keeps
the last plans by their arguments and the profile they resolve to (the active one for
``profile=None``, so ``use_profile`` and ``PYPTO_NUMBA_PROFILE`` still apply). Plans are immutable
(frozen dataclasses whose ``params`` are read-only mappings), so sharing one is safe. A plan that
raises (TileError, ...) is not kept: the next call raises again with the same message.
"""

from __future__ import annotations

import collections
import functools
import inspect
import numbers
import threading

import numpy as np

from .profile import HardwareProfile, load_profile

MAX_PLANS = 512  # a few hundred distinct shapes per process is plenty; the oldest is dropped


class _Unhashable(Exception):
    pass


def _freeze(value):
    """A hashable stand-in for an argument value (arrays by content: kv_len shapes some plans)."""
    if value is None or isinstance(value, (str, bool, numbers.Number, np.generic)):
        return (type(value).__name__, value)
    if isinstance(value, (tuple, list)):
        return ("seq", tuple(_freeze(v) for v in value))
    if isinstance(value, np.ndarray):
        if value.size > 4096:  # a big array as a plan argument: not worth hashing
            raise _Unhashable
        return ("nd", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, HardwareProfile):
        return ("profile", id(value))
    try:
        hash(value)
    except TypeError:
        raise _Unhashable from None
    return ("obj", type(value).__name__, value)


def memo_plan(fn):
    """Decorator for ``plan_xxx(*shapes, ..., profile=None, **options) -> Plan`` (``profile``
    by keyword or position)."""
    cache: collections.OrderedDict = collections.OrderedDict()
    lock = threading.Lock()
    names = list(inspect.signature(fn).parameters)
    at = names.index("profile")  # where a positional profile sits

    @functools.wraps(fn)
    def cached(*args, **kwargs):
        given = args[at] if len(args) > at else kwargs.get("profile")
        try:
            prof = load_profile(given)
        except Exception:
            return fn(*args, **kwargs)  # let the plan raise its own error for a bad profile
        try:
            key = (_freeze(args), _freeze(sorted(kwargs.items())), id(prof))
        except _Unhashable:
            return fn(*args, **kwargs)
        with lock:
            hit = cache.get(key)
            if hit is not None:
                cache.move_to_end(key)
                return hit[0]
        plan = fn(*args, **kwargs)
        with lock:
            cache[key] = (plan, prof)  # prof kept alive so its id() stays unique
            if len(cache) > MAX_PLANS:
                cache.popitem(last=False)
        return plan

    cached.cache_clear = cache.clear
    cached.uncached = fn
    return cached
