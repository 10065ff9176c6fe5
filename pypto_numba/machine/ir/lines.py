"""The one loop template of the streaming kernels: a span of elements cut at the 64-byte lines of
its destination into a head (the elements before the first line boundary), whole lines and a
tail, so that every whole line is written by one store (optionally streaming) and none is split.

- :func:`line_span` (IR): emits a step loop for each of the three parts; the caller's ``step``
  builds the loads, math and stores of one step of ``lanes`` elements;
- :func:`copy_lines` (IR): the whole-lines part of a plain copy, one streaming store per vector;
- :func:`first_line` (numba): the same cut for kernels whose head and tail are numba loops
  (:func:`line_head`: the head's length from an address).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba.core import cgutils

from ..jit import device
from .memory import stream_store
from .vector import I64

LINE = 64  # bytes: one cache line, the unit of a streaming store


def steps(builder, start, count, lanes, body):
    """``count`` steps of ``lanes`` elements from element ``start`` (i64 values): ``body(j)`` with
    ``j = start + step * lanes``."""
    with cgutils.for_range(builder, count) as loop:
        body(builder.add(start, builder.mul(loop.index, ir.Constant(I64, lanes))))


def line_span(builder, dst_elem_ptr, count, size, step, stream):
    """The ``count`` elements (i64) from ``dst_elem_ptr`` (elements of ``size`` bytes, a whole
    number of elements off a line) as head, whole lines, tail: ``step(start, n, lanes, nt)`` emits
    ``n`` steps of ``lanes`` elements from element ``start`` of the span -- the head one element at
    a time, then whole lines (``lanes = LINE // size``), then the tail one at a time. ``stream``
    (an i8/i1 value): the whole lines run with ``nt=True`` (streaming stores), else ``nt=False``."""
    c = lambda v: ir.Constant(I64, v)  # noqa: E731
    addr = builder.ptrtoint(dst_elem_ptr, I64)
    pre = builder.udiv(builder.urem(builder.sub(c(LINE), builder.urem(addr, c(LINE))), c(LINE)), c(size))
    pre = builder.select(builder.icmp_unsigned("<", pre, count), pre, count)  # at most the span
    lanes = LINE // size
    lines = builder.udiv(builder.sub(count, pre), c(lanes))
    body = builder.mul(lines, c(lanes))
    step(c(0), pre, 1, False)
    with builder.if_else(builder.trunc(stream, ir.IntType(1))) as (streamed, plain):
        with streamed:
            step(pre, lines, lanes, True)
        with plain:
            step(pre, lines, lanes, False)
    step(builder.add(pre, body), builder.sub(builder.sub(count, pre), body), 1, False)


def copy_lines(builder, dst_ptr, src_ptr, nbytes, width, src_align):
    """Copy ``nbytes // width`` vectors of ``width`` bytes from ``src_ptr`` to ``dst_ptr`` with
    streaming stores; ``dst_ptr`` must be ``width``-aligned."""
    vec = ir.VectorType(ir.IntType(32), width // 4)
    dp = builder.bitcast(dst_ptr, vec.as_pointer())
    sp = builder.bitcast(src_ptr, vec.as_pointer())
    count = builder.udiv(nbytes, ir.Constant(nbytes.type, width))
    with cgutils.for_range(builder, count) as loop:
        v = builder.load(builder.gep(sp, [loop.index]), align=src_align)
        stream_store(builder, v, builder.gep(dp, [loop.index]), width)


@device(inline="always")
def line_head(addr, size, L):
    """Elements of ``size`` bytes from byte address ``addr`` (a whole number of elements off a
    line) up to the next 64-byte line boundary, 0 on one; ``L = LINE // size`` (uint64s)."""
    return (L - addr % np.uint64(LINE) // size) % L


@device
def first_line(a, e, stop):
    """The first element of ``a[e:stop]`` (1-D, uint64 indices) that starts a 64-byte line, or
    ``stop`` when none does; ``a`` must be a whole number of elements off a line. The head of a
    span is ``a[e:first_line]``, its whole lines end at ``first + (stop - first) // L * L``."""
    size = np.uint64(a.itemsize)
    L = np.uint64(LINE) // size
    return min(e + line_head(np.uint64(a.ctypes.data) + e * size, size, L), stop)
