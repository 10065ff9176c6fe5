"""Embedding lookup: ``y[*idx, :] = weight[ids[*idx], :]``.

Math and shapes: ``weight[V, H]`` (fp32, bf16 or fp16), integer ``ids`` (int32 or int64) of any
shape -> ``y[*ids.shape, H]`` in the weight's dtype. A pure data movement: no arithmetic, so every
strategy is bit-exact. Every id must lie in ``[0, V)``; the first one that does not (in C order)
raises ``IndexError`` naming its position and value, checked in Python before any kernel runs.

Strategies (n = ids.size, b = weight itemsize, s = ids itemsize, tiles of ``row_tile`` ids by
``h_tile`` columns, ``th = ceil(H/h_tile)``)::

    embedding.gather        1 vector kernel, GM read n*H*b + n*s*th, GM write n*H*b
    embedding.index_select  the same kernel for 1-D / 2-D ids (PyPTO's index_select takes a 1-2 D
                            index; higher rank raises ShapeError pointing to gather)

The two differ on the NPU in what the index may look like (npu-facts 1.2: gather takes the
[B, S] ids of a batch without a flatten), not in cost. Each tile task loads its ``row_tile``
ids into UB and gathers ``row_tile`` rows of ``h_tile`` columns. The indexed dim (V, dim 0 of
``weight``) is never split: every task views the whole of it (npu-facts 4.2: gather /
index_select need ``view[dim] >= shape[dim]`` on the indexed dim); only H is tiled, so that the
row tile fits UB.

Defaults: ``row_tile`` from the profile key ``embedding_row_tile``, halved while a tile of that
many whole rows would take more than half of UB (the other half is the double buffer of the next
task; PyPTO's embedding gathers whole rows), down to the fewest ids that fill a 32-byte block;
``h_tile`` is the largest 32-byte-aligned width for which the row tile fits that half, capped at
H rounded up to the alignment: whole rows unless even that few are larger than half of UB (or
``row_tile`` is given). Split rows cost the CPU too (a row's run of lines is cut in two).

On the CPU a row gather is a memcpy per row with no conversion (16-bit rows are copied as
``uint16`` bits). When a task holds whole rows (``h_tile >= H``, the default for typical hidden
sizes) its output is one contiguous run; for outputs of >= ``STREAM_MIN_BYTES`` (4 MiB) every
whole 64-byte line of it is written with a streaming store straight from the weight row (see
:func:`stream_lines`), which skips the read-for-ownership of the destination; rows that are
whole lines go out ``GATHER_ROWS`` at a time, a line of each loaded before any is stored
(:func:`stream_gather_rows`). A fresh result starts at the same offset within a page as the
weight, so each whole output line comes from one weight line and no load waits for a store to
the same page offset (an ``out=`` at another offset within a line works, with every load
straddling two lines). A task of a column tile streams each row's run of whole lines the
same way, GATHER_ROWS rows at a time, and writes the partial lines at the run's two ends with
plain stores. ``out=`` reuses a result array: a fresh result costs its page faults (the OS
zeroes every new page), which is about as much as the gather itself. Rows of NumPy's large
arrays start 16 bytes into a page, so every output row shares a line with the next (the joins of
:func:`stream_gather_rows`).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from numba import prange

from .. import inputs
from ..errors import DTypeError, ShapeError
from ..machine import dtypes
from ..machine.ir.lines import first_line
from ..machine.jit import device, kernel
from ..machine.memo import CallMemo, memo_plan
from ..machine.plan import ITEMSIZE, KernelPlan, Plan, align_elems, vector_tile
from ..machine.profile import load_profile, resolve_cast_mode
from ..machine.tile import (
    GATHER_ROWS,
    LINE,
    PAGE,
    STREAM_MIN_BYTES,
    ScratchPool,
    empty_in_phase,
    store_fence,
    stream_gather_rows,
    stream_lines,
    streamable,
)
from ..strategy import Launch, register

ID_DTYPES = {np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}
_COPY_VIEW = {"fp32": np.uint32, "bf16": np.uint16, "fp16": np.uint16}  # bits are copied as-is


# ---------------------------------------------------------------------------------------------
# streaming stores of whole cache lines (machine.tile.stream_lines)
#
# A row gather is a memcpy per row, and a memcpy of a large block runs at memory speed only
# with non-temporal stores of whole lines (a line written in two 32-byte halves can be flushed
# from the write-combining buffer half-full). A line that gets both plain and streaming stores
# is the worst case (the plain store pulls the line in, the streaming store evicts it again), so
# a task streams every whole line of its contiguous output range, also the lines that straddle
# two rows (assembled in a 64-byte scratch), and writes only the partial lines at its two ends
# with plain stores (machine/ir/lines.py cuts the range).


@device
def _row_elem(w_flat, ids, e, uH):
    """Element ``e`` of the gathered output (flat, uint64): ``weight[ids[e // H], e % H]``."""
    r = e // uH
    return w_flat[np.uint64(ids[r]) * uH + (e - r * uH)]


@device
def _stream_range(
    w_flat,
    ids,
    out_flat,
    e,
    stop,
    uH,
    L,
    line,
):
    """Whole lines of ``out_flat[e:stop]`` (``e`` and ``stop`` on line boundaries, uint64) from
    their weight rows by streaming stores, in order; a line that straddles rows is assembled in
    ``line`` (a LINE-byte scratch) first.

    Parameters
    ----------
    w_flat, out_flat : the flat weight and output (copy views of one itemsize)
    ids : the flat ids
    e, stop : uint64 element range of ``out_flat``, both on line boundaries
    uH : the row length H (uint64)
    L : elements per line (uint64)
    line : a LINE-byte scratch
    """
    size = np.uint64(out_flat.itemsize)
    while e < stop:
        r = e // uH
        row_end = min((r + np.uint64(1)) * uH, stop)
        full = e + (row_end - e) // L * L  # whole lines inside row r from e on
        if full > e:
            stream_lines(out_flat, e, w_flat, np.uint64(ids[r]) * uH + (e - r * uH), (full - e) * size)
            e = full
        else:  # this line straddles rows: assemble it, then stream it
            for q in range(L):
                line[q] = _row_elem(w_flat, ids, e + q, uH)
            stream_lines(out_flat, e, line, np.uint64(0), np.uint64(LINE))
            e += L


@device
def _stream_rows_lockstep(
    w_flat,
    ids,
    out_flat,
    r0,
    r1,
    uH,
    L,
    p,
    line,
):
    """Rows ``r0 .. r1`` when every row is a whole number of lines (``H % L == 0``) and each
    output row's first line boundary is ``p`` elements into it: the rows' whole lines go out
    GATHER_ROWS rows at a time (:func:`~pypto_numba.machine.tile.stream_gather_rows`), with the
    line between each two rows when ``p > 0`` (the end of one and the start of the next); the
    last rows one by one, their joins assembled in ``line``. The first ``p`` and the last
    ``L - p`` elements of the range are the caller's.

    Parameters
    ----------
    w_flat, out_flat : the flat weight and output (copy views of one itemsize)
    ids : the flat ids
    r0, r1 : the output rows
    uH : the row length H (uint64, a multiple of ``L``)
    L : elements per line (uint64)
    p : elements from an output row's start to its first line boundary (uint64, < L)
    line : a LINE-byte scratch
    """
    size = np.uint64(out_flat.itemsize)
    nbytes = (uH // L - (np.uint64(1) if p else np.uint64(0))) * L * size  # whole lines in a row
    for g0 in range(r0, r1, GATHER_ROWS):
        g1 = min(g0 + GATHER_ROWS, r1)
        if g1 - g0 == GATHER_ROWS:  # with the lines between the rows (and the next row) when p > 0
            joins = min(np.uint64(GATHER_ROWS), np.uint64(r1 - 1 - g0)) if p else np.uint64(0)
            stream_gather_rows(out_flat, w_flat, ids, np.uint64(g0), uH, p, nbytes, joins)
            continue
        for r in range(g0, g1):
            stream_lines(out_flat, np.uint64(r) * uH + p, w_flat, np.uint64(ids[r]) * uH + p, nbytes)
        if p:
            tail = L - p  # elements of row r in the line that starts tail before row r + 1
            for r in range(g0, min(g1, r1 - 1)):
                src = np.uint64(ids[r]) * uH + uH - tail
                nxt = np.uint64(ids[r + 1]) * uH
                for q in range(tail):
                    line[q] = w_flat[src + q]
                for q in range(p):
                    line[tail + q] = w_flat[nxt + q]
                stream_lines(out_flat, np.uint64(r + 1) * uH - tail, line, np.uint64(0), np.uint64(LINE))


@device
def _gather_stream(
    w_flat,
    ids,
    out_flat,
    r0,
    r1,
    uH,
    line,
):
    """Output rows ``r0 .. r1`` (a contiguous range of ``out_flat``) by whole-line streaming
    stores (rows of whole lines: :func:`_stream_rows_lockstep`); the partial lines at the two
    ends with plain stores. ``line``: a LINE-byte scratch.

    Parameters
    ----------
    w_flat, out_flat : the flat weight and output (copy views of one itemsize)
    ids : the flat ids
    r0, r1 : the output rows
    uH : the row length H (uint64)
    line : a LINE-byte scratch
    """
    size = np.uint64(out_flat.itemsize)
    L = np.uint64(LINE) // size  # elements per line
    e0 = np.uint64(r0) * uH
    e1 = np.uint64(r1) * uH
    a = first_line(out_flat, e0, e1)
    b = a + (e1 - a) // L * L  # end of the last whole line
    for e in range(e0, a):
        out_flat[e] = _row_elem(w_flat, ids, e, uH)
    if uH % L == 0:
        _stream_rows_lockstep(w_flat, ids, out_flat, r0, r1, uH, L, a - e0, line)
    else:
        _stream_range(w_flat, ids, out_flat, a, b, uH, L, line)
    for e in range(b, e1):
        out_flat[e] = _row_elem(w_flat, ids, e, uH)


@device
def _gather_stream_cols(
    w_flat,
    ids,
    out_flat,
    r0,
    r1,
    uH,
    hb,
    vh,
):
    """Columns ``hb .. hb + vh`` of output rows ``r0 .. r1`` (a task of a plan that splits H):
    each row's run by whole-line streaming stores, GATHER_ROWS rows at a time when all rows are
    a whole number of lines (then every run starts at the same offset within a line); the partial
    lines at a run's two ends (shared with the next column tile's task) with plain stores.

    Parameters
    ----------
    w_flat, out_flat : the flat weight and output (copy views of one itemsize)
    ids : the flat ids
    r0, r1 : the output rows
    uH : the row length H (uint64)
    hb, vh : the column tile's first column and width
    """
    size = np.uint64(out_flat.itemsize)
    L = np.uint64(LINE) // size
    uhb = np.uint64(hb)
    uvh = np.uint64(vh)
    for r in range(r0, r1):  # the partial lines (a run shorter than a line is all partial)
        e0 = np.uint64(r) * uH + uhb
        a = first_line(out_flat, e0, e0 + uvh)
        b = a + (e0 + uvh - a) // L * L
        src = np.uint64(ids[r]) * uH + uhb
        for c in range(a - e0):
            out_flat[e0 + c] = w_flat[src + c]
        for c in range(b - e0, uvh):
            out_flat[e0 + c] = w_flat[src + c]
        if uH % L != 0 and b > a:
            stream_lines(out_flat, a, w_flat, src + (a - e0), (b - a) * size)
    if uH % L == 0:
        e0 = np.uint64(r0) * uH + uhb
        a = first_line(out_flat, e0, e0 + uvh)
        nbytes = (e0 + uvh - a) // L * L * size
        off = uhb + (a - e0)
        if nbytes:
            for g0 in range(r0, r1, GATHER_ROWS):
                if g0 + GATHER_ROWS <= r1:
                    stream_gather_rows(out_flat, w_flat, ids, np.uint64(g0), uH, off, nbytes, np.uint64(0))
                else:
                    for r in range(g0, r1):
                        stream_lines(out_flat, np.uint64(r) * uH + off, w_flat, np.uint64(ids[r]) * uH + off, nbytes)


# ---------------------------------------------------------------------------------------------
# kernel: one prange iteration = ``row_tile`` ids x ``h_tile`` columns


@kernel(boundscheck=False)
def _gather_kernel(
    weight,
    ids,
    out,
    row_tile,
    h_tile,
    stream,
    lines,
):
    """``out[i] = weight[ids[i]]``, one prange task per tile of ids x columns -> the cost counters.
    With ``stream``: whole-line streaming stores, of the task's contiguous output rows when it
    holds whole rows (``h_tile >= H``), else of each row's run of columns; else plain row copies
    (the readable form of the streamed paths: ``tests/machine/test_ir.py`` holds the two bit-equal).

    Parameters
    ----------
    weight : ``[V, H]`` copy view (uint32 for fp32, uint16 for bf16/fp16 bits)
    ids : flat int32/int64 ids, all in ``[0, V)``
    out : ``[ids.size, H]`` copy view
    row_tile, h_tile : the plan's tile of ids by columns
    stream : whole lines with streaming stores, fenced at the end of each task
    lines : per-thread LINE-byte scratch ``[threads, L]``
    """
    n = ids.size
    H = weight.shape[1]
    uH = np.uint64(H)
    tr = (n + row_tile - 1) // row_tile
    th = (H + h_tile - 1) // h_tile
    w_flat = weight.reshape(-1)
    out_flat = out.reshape(-1)
    tasks = 0
    gm_read = 0
    gm_write = 0
    for t in prange(tr * th):
        rb = (t // th) * row_tile
        hb = (t % th) * h_tile
        vr = min(row_tile, n - rb)
        vh = min(h_tile, H - hb)
        ob = np.uint64(hb)
        if stream:
            if th == 1:
                _gather_stream(w_flat, ids, out_flat, rb, rb + vr, uH, lines[numba.get_thread_id()])
            else:
                _gather_stream_cols(w_flat, ids, out_flat, rb, rb + vr, uH, hb, vh)
            store_fence()
        else:
            for r in range(rb, rb + vr):
                # ids were range-checked before the launch; flat views, uint64 indices and no
                # per-row views (machine/jit.py)
                src = np.uint64(ids[r]) * uH + ob
                dst = np.uint64(r) * uH + ob
                for c in range(np.uint64(vh)):
                    out_flat[dst + c] = w_flat[src + c]
        tasks += 1
        gm_read += vr * ids.itemsize + vr * vh * weight.itemsize
        gm_write += vr * vh * out.itemsize
    return tasks, gm_read, gm_write, 0, 0


# ---------------------------------------------------------------------------------------------
# plans


@memo_plan
def _plan(strategy, weight_shape, ids_shape, dtype, ids_dtype, profile, row_tile, h_tile) -> Plan:
    prof = load_profile(profile)
    where = f"embedding.{strategy}"
    dtype = inputs.storage_dtype(dtype, where)
    weight_shape = tuple(int(d) for d in weight_shape)
    ids_shape = tuple(int(d) for d in ids_shape)
    if len(weight_shape) != 2:
        raise ShapeError(f"{where}: weight must be [V, H], got shape {weight_shape}")
    inputs.check_size(weight_shape, "weight", where)  # plans answer advise() too
    if any(d == 0 for d in ids_shape):
        raise ShapeError(f"{where}: ids has shape {ids_shape} with no elements; PyPTO tensors must be non-empty")
    inputs.check_size(ids_shape, "ids", where)
    inputs.check_size(ids_shape + (weight_shape[1],), "the output [*ids.shape, H]", where)
    if strategy == "index_select" and len(ids_shape) not in (1, 2):
        raise ShapeError(
            f"{where}: ids must be 1-D or 2-D (PyPTO index_select takes a 1-2 D index), got shape "
            f"{ids_shape}; use embedding.gather for ids of any shape"
        )
    if ids_dtype not in ("int32", "int64"):
        raise DTypeError(f"{where}: ids dtype must be int32 or int64, got {ids_dtype!r}")
    _, h = weight_shape
    n = math.prod(ids_shape)
    b = dtypes.itemsize(dtype)
    s = ITEMSIZE[ids_dtype]
    block = max(1, prof.align_bytes // b)
    if row_tile is None:
        row_tile = prof.tile("embedding_row_tile")
        least = max(1, prof.align_bytes // s)  # the ids tile stays a whole number of 32-byte blocks
        row_bytes = align_elems(h, dtype, prof) * b
        while h_tile is None and row_tile // 2 >= least and row_tile * row_bytes > prof.ub_bytes // 2:
            row_tile //= 2
    else:
        row_tile = inputs.positive_int(row_tile, "row_tile", where)
    if h_tile is None:
        fit = (prof.ub_bytes // 2) // (row_tile * b) // block * block
        h_tile = max(block, min(align_elems(h, dtype, prof), fit))
    else:
        h_tile = inputs.positive_int(h_tile, "h_tile", where)
    hint = (f"use a smaller row_tile or h_tile (row_tile*h_tile*{b} B must fit UB "
            f"{prof.ub_bytes} B with the ids tile)")
    buffers = (
        vector_tile("ids_ub", (row_tile,), ids_dtype, prof, where, hint),
        vector_tile("rows_ub", (row_tile, h_tile), dtype, prof, where, hint),
    )
    th = -(-h // h_tile)
    k = KernelPlan(
        name=f"embedding_{strategy}",
        unit="vector",
        tasks=-(-n // row_tile) * th,
        buffers=buffers,
        gm_read_bytes=n * h * b + n * s * th,
        gm_write_bytes=n * h * b,
    )
    return Plan(op="embedding", strategy=strategy, dtype=dtype, profile=prof, kernels=(k,),
                params={"row_tile": row_tile, "h_tile": h_tile}, hint=hint)


def plan_gather(weight_shape, ids_shape, dtype="fp32", ids_dtype="int32", *, profile=None,
                row_tile=None, h_tile=None) -> Plan:
    """Plan of :func:`gather` (no data needed)."""
    return _plan("gather", weight_shape, ids_shape, dtype, ids_dtype, profile, row_tile, h_tile)


def plan_index_select(weight_shape, ids_shape, dtype="fp32", ids_dtype="int32", *, profile=None,
                      row_tile=None, h_tile=None) -> Plan:
    """Plan of :func:`index_select` (no data needed; ids must be 1-D or 2-D)."""
    return _plan("index_select", weight_shape, ids_shape, dtype, ids_dtype, profile, row_tile, h_tile)


# ---------------------------------------------------------------------------------------------
# public strategies


@device
def _first_bad_id(ids, vocab):
    """Flat index of the first id outside ``[0, vocab)``, or -1: one pass over the ids (a negative
    id is a huge unsigned one), in blocks that vectorise, the bad block then searched in order.
    NumPy's ``(ids < 0) | (ids >= vocab)`` makes three passes and two temporaries."""
    n = ids.size
    uv = np.uint64(vocab)
    for c in range(0, n, 1024):
        stop = min(c + 1024, n)
        bad = False
        for i in range(c, stop):
            bad |= np.uint64(ids[i]) >= uv
        if bad:
            for i in range(c, stop):
                if np.uint64(ids[i]) >= uv:
                    return i
    return -1


def _check_ids(ids, vocab: int, where: str):
    """ids -> (contiguous array, dtype name, copied bytes); DTypeError / ShapeError / IndexError."""
    if not isinstance(ids, np.ndarray):
        raise DTypeError(
            f"{where}: ids must be a numpy array of int32 or int64, got {type(ids).__name__}; "
            f"use numpy.asarray(ids, dtype=numpy.int32)"
        )
    name = ID_DTYPES.get(ids.dtype)
    if name is None:
        raise DTypeError(
            f"{where}: ids have dtype {ids.dtype}; accepted: int32 or int64 (PyPTO gather / "
            f"index_select index dtypes); convert with ids.astype(numpy.int32)"
        )
    if ids.size == 0:
        raise ShapeError(f"{where}: ids has shape {ids.shape} with no elements; PyPTO tensors must be non-empty")
    inputs.check_size(ids.shape, "ids", where)  # before any copy or mask of a huge (broadcast) view
    copied = 0
    if not ids.flags.c_contiguous:
        ids = np.ascontiguousarray(ids)
        copied = ids.nbytes
    _check_id_range(ids, vocab, where)
    return ids, name, copied


def _check_id_range(ids, vocab: int, where: str):
    """IndexError naming the first id (C order) of contiguous ``ids`` outside ``[0, vocab)``."""
    flat = int(_first_bad_id(ids.reshape(-1), vocab))
    if flat >= 0:
        pos = tuple(int(i) for i in np.unravel_index(flat, ids.shape))
        value = int(ids.reshape(-1)[flat])
        raise IndexError(
            f"{where}: ids{list(pos)} = {value} is out of range [0, {vocab}) for weight with "
            f"V = {vocab} rows (first bad id in C order)"
        )


class _Call:
    """What an embedding call derives from its signature (kept per signature in ``_CALLS``; see
    :class:`~pypto_numba.machine.memo.CallMemo`): everything but the ids' range and out's memory."""

    __slots__ = ("where", "plan", "V", "H", "view", "shapes", "scratch")

    def __init__(self, where, plan, weight_shape, ids_shape, view):
        self.where, self.plan, self.view = where, plan, view
        self.V, self.H = weight_shape
        self.shapes = (weight_shape, ids_shape)
        self.scratch = ScratchPool((LINE // np.dtype(view).itemsize, view))


_CALLS = CallMemo()


def _call(strategy, weight, ids, profile, row_tile, h_tile, out):
    """Run one call: its signature's part from ``_CALLS`` when an earlier call had the same one,
    else from the full validation (which then keeps it). The ids' range is checked every time."""
    key = _CALLS.key(profile, (weight, ids, out), (strategy, row_tile, h_tile))
    c, arrays, copied = _CALLS.through(key, _prepare, strategy, weight, ids, profile, row_tile, h_tile, out)
    if arrays is None:  # a kept signature: the ids' values are new
        _check_id_range(ids, c.V, c.where)
        arrays = (weight, ids)
    return _launch(c, *arrays, out, copied)


def _prepare(strategy, weight, ids, profile, row_tile, h_tile, out):
    """Validate a call in full -> (its :class:`_Call`, (the contiguous weight, ids), the bytes
    copied to make them contiguous)."""
    where = f"embedding.{strategy}"
    wt = inputs.tensor(weight, "weight", where, min_rank=2, max_rank=2)
    if strategy == "index_select" and isinstance(ids, np.ndarray) and ids.ndim not in (1, 2):
        raise ShapeError(
            f"{where}: ids must be 1-D or 2-D (PyPTO index_select takes a 1-2 D index), got shape "
            f"{ids.shape}; use embedding.gather for ids of any shape"
        )
    ids, ids_dtype, ids_copied = _check_ids(ids, wt.shape[0], where)
    p = _plan(strategy, wt.shape, ids.shape, wt.dtype, ids_dtype, profile, row_tile, h_tile)
    c = _Call(where, p, wt.shape, ids.shape, _COPY_VIEW[wt.dtype])
    if out is not None and not (isinstance(out, np.ndarray) and out.shape == ids.shape + (c.H,)
                                and out.dtype == wt.array.dtype and out.flags.c_contiguous):
        _bad_out(c, wt.array, ids, out)
    return c, (wt.array, ids), wt.copied_bytes + ids_copied


def _bad_out(c, weight, ids, out):
    raise ShapeError(
        f"{c.where}: out must be a C-contiguous {weight.dtype} array of shape {ids.shape + (c.H,)}, "
        f"writeable and not overlapping weight, "
        f"got {getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}"
    )


def _launch(c, weight, ids, out, copied):
    """Run the kernel of a prepared call on arrays of its signature (``out=None``: a new result)."""
    h = c.H
    if out is None:
        out = empty_in_phase(ids.shape + (h,), weight.dtype, weight, PAGE)
    elif not out.flags.writeable or np.may_share_memory(out, weight):
        _bad_out(c, weight, ids, out)
    out_k = out.view(c.view).reshape(-1, h)
    # stream whole lines when the result is too large to be re-read from cache (module
    # attribute: tests lower it)
    p = c.plan
    stream = streamable(out_k, STREAM_MIN_BYTES)
    slabs = c.scratch.take()
    with Launch(p, c.shapes) as run:
        run.count(_gather_kernel(weight.view(c.view), ids.reshape(-1), out_k,
                                 p.params["row_tile"], p.params["h_tile"], stream, *slabs))
        run.workspace(copied)
    c.scratch.give(slabs)
    return out


@register("embedding", "gather", plan=plan_gather, summary="gather rows by ids of any shape (no flatten)")
def gather(weight, ids, *, profile=None, row_tile=None, h_tile=None, out=None, cast_mode=None):
    """``weight[ids]``: ``weight[V, H]``, int32/int64 ``ids`` of any shape -> ``[*ids.shape, H]``.

    ``out``: optional preallocated result (C-contiguous, the weight's dtype, ``[*ids.shape, H]``);
    reusing it saves the page faults of a fresh result. ``cast_mode`` is accepted and has no effect: rows are copied bit for bit (a bad mode name is still an error).
    """
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, "embedding.gather")
    return _call("gather", weight, ids, profile, row_tile, h_tile, out)


@register("embedding", "index_select", plan=plan_index_select, summary="index_select rows by 1-D/2-D ids")
def index_select(weight, ids, *, profile=None, row_tile=None, h_tile=None, out=None, cast_mode=None):
    """``weight[ids]`` for 1-D or 2-D ``ids`` (higher rank: use :func:`gather`); ``out`` and
    ``cast_mode`` (no effect) as gather."""
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, "embedding.index_select")
    return _call("index_select", weight, ids, profile, row_tile, h_tile, out)


from .spec import OP  # noqa: E402  (the lab's view of the op; after the strategies it names)
