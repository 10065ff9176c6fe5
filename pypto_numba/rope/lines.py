"""How a rope task writes its staged head rows to GM: whole 64-byte lines with streaming stores.

A task's output (T tokens x H*D) is one contiguous run of ``out``. Each head row is computed
into a per-thread staging row and handed to :func:`put_row`. With ``stream``, every whole line
of the run gets a streaming (non-temporal) store: the elements before the run's first line
boundary (``pre``, from :func:`first_partial`) get plain stores, the partial line between two
head rows is carried over at the front of the staging row, and :func:`end_task` writes the
partial line at the run's end with plain stores and fences. A line that gets both plain and
streaming stores, or is streamed in two halves, is the slow case. Without ``stream`` each row
is copied out with plain stores.

The writer's state is ``(e, k, pre)``: the next element of out to write, the elements waiting
in the staging row, the plain-store elements still due before the first line boundary. All
uint64 (see machine/jit.py). ``L`` is the elements per 64-byte line (a power of two).
The writer's functions are inlined into the kernels by numba (``inline="always"``, before LLVM
sees them): the kernels compile as if the plumbing were written in place, without an extra
call's reference counting per head row.
"""

from __future__ import annotations

import numpy as np

from ..machine.ir.lines import line_head
from ..machine.jit import device
from ..machine.tile import stream_lines
from ..machine.tile import copy as _copy
from ..machine.tile import store_fence as _store_fence


@device(inline="always")
def first_partial(e, addr0, size, L, stream):
    """Elements of out from element ``e`` up to its first line boundary (plain stores); 0
    without ``stream``. ``addr0``: out's address, ``size``: its itemsize (uint64)."""
    pre = np.uint64(0)
    if stream:
        pre = line_head(addr0 + e * size, size, L)
    return pre


@device
def _flush(staged, k, of, e, pre, L):
    """Write ``staged[0:k]`` to ``of[e:e+k]``: the first ``pre`` elements (up to the task's first
    line boundary) with plain stores, then every whole 64-byte line with streaming stores; the
    rest (< one line) moves to the front of ``staged`` for the next head row. All uint64.
    Returns (e, k, pre) after the write."""
    p = min(pre, k)
    if p:
        _copy(staged, np.uint64(0), of, e, p)
    n = (k - p) & ~(L - np.uint64(1))  # whole lines (L is a power of two: no division)
    stream_lines(of, e + p, staged, p, n * np.uint64(of.itemsize))
    done = p + n
    rest = k - done
    for i in range(rest):  # ascending: safe for the overlapping move to the front
        staged[i] = staged[done + i]
    return e + done, rest, pre - p


@device(inline="always")
def put_row(staged, k, of, e, pre, L, stream):
    """Write out the ``k`` staged elements (a head row after the carried partial line).

    Parameters
    ----------
    staged, k : the staging row and its element count
    of, e : the flat output and the next element of it to write
    pre : plain-store elements still due before the task's first line boundary
    L, stream : elements per line; streaming stores or plain ones

    Returns the writer's state (e, k, pre) after the write.
    """
    if stream:
        e, k, pre = _flush(staged, k, of, e, pre, L)
    else:
        _copy(staged, np.uint64(0), of, e, k)
        e += k
        k = np.uint64(0)
    return e, k, pre


@device(inline="always")
def end_task(staged, k, of, e, stream):
    """With ``stream``: the partial line left at the task's end (plain stores), then a store fence."""
    if stream:
        _copy(staged, np.uint64(0), of, e, k)
        _store_fence()
