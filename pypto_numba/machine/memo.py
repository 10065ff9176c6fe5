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
    """A hashable stand-in for an argument value (arrays by content: kv_len shapes some plans).

    Type-tagged, so that ``True`` and ``1``, or ``16.0`` and ``16``, which hash and compare equal,
    do not share a plan (a plan refuses a bool or a fractional tile size). Exact ints, strings and
    tuples of exact ints (shapes: the common case) are their own key. This runs on every call of
    every strategy, so the common types are tested first, by exact type.
    """
    t = type(value)
    if t is int or t is str:
        return value
    if value is None or t is bool or t is float:
        return (t, value)
    if t is tuple or t is list:
        if t is tuple and all(type(v) is int for v in value):
            return value
        return ("seq", tuple(map(_freeze, value)))
    if t is np.ndarray:
        if value.size > 4096:  # a big array as a plan argument: not worth hashing
            raise _Unhashable
        return ("nd", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, (numbers.Number, np.generic)):
        return (t, value)
    if isinstance(value, np.dtype):
        return ("dtype", value.str)
    if isinstance(value, HardwareProfile):
        return ("profile", id(value))
    try:
        hash(value)
    except TypeError:
        raise _Unhashable from None
    return ("obj", t, value)


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
            key = (_freeze(args), tuple((k, _freeze(v)) for k, v in sorted(kwargs.items())), id(prof))
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
