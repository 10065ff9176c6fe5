"""Memoised plans: a plan depends only on shapes, dtype, options and the hardware profile.

Building a plan walks its tiles in Python, which can take as long as a whole decode kernel on a
short cache; every call of a strategy builds one. ``@memo_plan`` keeps
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


class CallMemo:
    """What a strategy derives from a call's *signature*, kept per signature.

    A call validates its arguments, looks up its plan and derives its kernel's constants (tile
    sizes, table offsets, scratch shapes) from shapes, dtypes and options alone. For a decode-sized
    call that Python work is most of the call's time (docs/performance.md). A strategy keeps what it
    derived under :meth:`key` -- every array by (shape, strides, dtype), every option by value, the
    profile the call resolves to -- and a later call with the same signature only redoes what
    depends on the data: its views, the checks of ``out=``'s memory, the launch.

    Only exact ``numpy.ndarray`` arguments have a signature (a subclass, e.g. a masked array, or a
    list makes :meth:`key` return None: that call is validated in full, every time), and a strategy
    keeps an entry only for a call whose arrays it used as they are (no contiguous copy). A call
    that raises keeps nothing, so the next one raises the same error. Entries are dropped oldest
    first beyond ``maxsize``; ``get`` and ``put`` are safe from several threads.
    """

    def __init__(self, maxsize: int = MAX_PLANS):
        self.maxsize = maxsize
        self._entries: dict = {}
        self._lock = threading.Lock()

    @staticmethod
    def key(profile, arrays, options=()):
        """The signature of a call (hashable), or None when it has none (see the class).

        ``arrays``: the call's array arguments (None for an absent optional one, e.g. ``out``);
        ``options``: its other arguments (ints, floats, strings, tuples, None)."""
        try:
            prof = load_profile(profile)
        except Exception:
            return None  # the full path raises the profile's error
        key = [id(prof)]  # an entry's plan holds its profile, so the id() stays unique
        for a in arrays:
            if type(a) is np.ndarray:
                key.append((a.shape, a.strides, a.dtype))
            elif a is None:
                key.append(None)
            else:
                return None
        try:
            key.append(_freeze(tuple(options)))
        except _Unhashable:
            return None
        return tuple(key)

    def through(self, key, prepare, *args):
        """The one call protocol of a strategy that keeps calls: ``-> (entry, arrays, copied)``.

        For a ``key`` kept earlier: ``(entry, None, 0)`` (the caller uses its own arrays, as they
        are). Otherwise ``prepare(*args)`` validates in full and returns ``(entry, arrays, copied)``
        (the contiguous arrays and the bytes copied to make them so); the entry is kept only when
        nothing was copied, and that triple is returned."""
        entry = None if key is None else self._entries.get(key)
        if entry is not None:
            return entry, None, 0
        entry, arrays, copied = prepare(*args)
        if not copied:
            self.put(key, entry)
        return entry, arrays, copied

    def get(self, key):
        """The entry kept for ``key`` (None for no entry, or for a call without a signature)."""
        return None if key is None else self._entries.get(key)

    def put(self, key, entry):
        """Keep ``entry`` for ``key`` (a no-op for ``key=None``); returns ``entry``."""
        if key is not None:
            with self._lock:
                self._entries[key] = entry
                while len(self._entries) > self.maxsize:
                    del self._entries[next(iter(self._entries))]  # dicts keep insertion order
        return entry

    def clear(self):
        with self._lock:
            self._entries.clear()

    def __len__(self):
        return len(self._entries)
