"""GM <-> UB tile movers: per-thread UB scratch, aligned and placed GM outputs, and the streaming
copies that write large outputs in whole 64-byte lines.

A kernel task computes a tile and writes it to GM. A plain store first reads the destination line
(read-for-ownership), so for outputs too large to be re-read from cache (``STREAM_MIN_BYTES``)
the whole lines go out with streaming (non-temporal) stores: :func:`stream_lines` copies whole
lines, :func:`stream_gather_rows` gathers rows of them, :func:`store_fence` orders them at the
end of the task; the partial lines at a span's two ends take plain stores (``machine/ir/lines.py``
cuts a span). :func:`scratch` gives each thread its own cache-line-aligned slab. The numba rules
these follow (uint64 offsets, scratch allocated in Python) are in ``machine/jit.py``; measurements
behind the constants are in ``docs/performance.md``.
"""

from __future__ import annotations

import math as _math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from . import dtypes
from . import ir as irb
from .ir.lines import LINE
from .jit import device



@intrinsic
def stream_lines(typingctx, dst, d_off, src, s_off, nbytes):
    """``dst[d_off:] <- src[s_off:]``, ``nbytes`` (a multiple of 64) with 64-byte streaming stores.

    ``dst`` and ``src`` are 1-D arrays, the offsets are element indices (uint64). The destination
    address ``dst[d_off]`` must be 64-byte aligned (a streaming store to a misaligned address
    faults); the source needs no alignment. Callers fence (:func:`store_fence`) before their
    task ends.
    """
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and dst.ndim == 1 and src.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[2])(context, builder, args[2])
        irb.copy_lines(builder, builder.gep(d.data, [args[1]]), builder.gep(s.data, [args[3]]), args[4], LINE, 1)
        return context.get_dummy_value()

    return types.void(dst, types.uint64, src, types.uint64, types.uint64), codegen


# Rows one stream_gather_rows call copies together: a gathered row is a short run of lines at a
# random place, and its reads start cold (the hardware prefetcher does not cross into the next,
# unrelated row), so rows in lockstep keep more line fills in flight than rows one by one.
GATHER_ROWS = 8


@intrinsic
def stream_gather_rows(
    typingctx,
    dst,
    src,
    ids,
    r0,
    row,
    off,
    nbytes,
    joins,
):
    """For ``k`` in ``0 .. GATHER_ROWS - 1``: ``nbytes`` (a multiple of 64) of ``src`` from element
    ``ids[r0 + k] * row + off`` to ``dst`` at ``(r0 + k) * row + off``, with 64-byte streaming stores;
    then, for ``k < joins``, the line just before dst row ``r0 + k + 1``'s first streamed one.

    ``dst``, ``src`` are 1-D arrays of one itemsize, ``ids`` 1-D of any integer dtype (every id
    checked by the caller to be a row of ``src``, ``ids[r0 + joins]`` included); ``r0``, ``row``,
    ``off``, ``joins`` are uint64 counts (``joins <= GATHER_ROWS``; with ``joins > 0``, ``0 < off <
    L``, the elements in a line). Every ``dst[(r0 + k) * row + off]`` must be 64-byte aligned (a
    streaming store to a misaligned address faults); callers fence (:func:`store_fence`) before
    their task ends.

    Each step loads one line of every row and then stores the lines, so that the loads of a step
    never wait for the streaming stores of the step before. Rows whose length is a multiple of
    4 KiB share their page offsets: loaded and stored row after row (a few lines of one row, then
    of the next), every load would hit the page offset of a store just made ("4K aliasing", see
    ``PAGE``).

    A join line (``dst`` from ``(r0 + k + 1) * row + off - L``) ends one row and starts the next:
    ``L - off`` elements from the end of src row ``ids[r0 + k]``, ``off`` from the start of src row
    ``ids[r0 + k + 1]``, read with masked loads (no element outside the two rows is touched). The
    joins of a call share one page offset too, so all are loaded (after the last step) before
    any is stored (assembling them one at a time in a scratch was slower).

    Parameters
    ----------
    dst, src : 1-D arrays of one itemsize (the output and the weight, flat)
    ids : 1-D integer ids, each a row of ``src``
    r0 : the first output row of the group (uint64)
    row : elements per row (uint64)
    off : element offset of the streamed part in each row (uint64; ``dst`` there line-aligned)
    nbytes : bytes streamed per row, a multiple of 64 (uint64)
    joins : how many join lines to write after the rows (uint64, <= GATHER_ROWS)
    """
    if not (isinstance(dst, types.Array) and isinstance(src, types.Array) and isinstance(ids, types.Array)
            and dst.ndim == 1 and src.ndim == 1 and ids.ndim == 1 and isinstance(ids.dtype, types.Integer)
            and dst.dtype.bitwidth == src.dtype.bitwidth):
        return None

    def codegen(context, builder, sig, args):
        d = context.make_array(sig.args[0])(context, builder, args[0])
        s = context.make_array(sig.args[1])(context, builder, args[1])
        ix = context.make_array(sig.args[2])(context, builder, args[2])
        r0, row, off, nbytes, joins = args[3:]
        i64 = ir.IntType(64)
        one = ir.Constant(i64, 1)
        vec = ir.VectorType(ir.IntType(32), LINE // 4)
        el = ir.IntType(sig.args[0].dtype.bitwidth)
        L = LINE * 8 // el.width
        evec = ir.VectorType(el, L)

        def row_id(r):
            rid = builder.load(builder.gep(ix.data, [r]))
            return builder.zext(rid, i64) if rid.type.width < 64 else rid  # ids are in [0, rows)

        rows = [builder.add(r0, ir.Constant(i64, k)) for k in range(GATHER_ROWS)]
        rids = [row_id(r) for r in rows]
        dps = [builder.bitcast(builder.gep(d.data, [builder.add(builder.mul(r, row), off)]), vec.as_pointer()) for r in rows]
        sps = [builder.bitcast(builder.gep(s.data, [builder.add(builder.mul(i, row), off)]), vec.as_pointer()) for i in rids]
        # join k reads src rows ids[r0 + k] and ids[r0 + k + 1]; a join past ``joins`` reads nothing
        # (all-false masks) and its second row is row r0 + k's own (always a valid index)
        live = [builder.icmp_unsigned("<", ir.Constant(i64, k), joins) for k in range(GATHER_ROWS)]
        nxt = [builder.select(live[k], rids[k + 1], rids[k]) for k in range(GATHER_ROWS - 1)]
        nxt.append(row_id(builder.select(live[-1], builder.add(rows[-1], one), rows[-1])))  # ids past the group
        with cgutils.for_range(builder, builder.udiv(nbytes, ir.Constant(i64, LINE))) as loop:
            lines = [builder.load(builder.gep(sp, [loop.index]), align=1) for sp in sps]
            for dp, v in zip(dps, lines):
                irb.stream_store(builder, v, builder.gep(dp, [loop.index]), LINE)
        # the joins: lanes [0, tail) end src row ids[r0 + k], lanes [tail, L) start ids[r0 + k + 1]
        tail = builder.sub(ir.Constant(i64, L), off)
        head = builder.icmp_unsigned("<", ir.Constant(evec, list(range(L))), irb.splat(builder, builder.trunc(tail, el), evec))
        mvec = ir.VectorType(ir.IntType(1), L)
        align = el.width // 8
        joined = []
        for k in range(GATHER_ROWS):
            on = irb.splat(builder, live[k], mvec)
            a_ptr = builder.gep(s.data, [builder.sub(builder.mul(builder.add(rids[k], one), row), tail)])
            b_ptr = builder.gep(s.data, [builder.sub(builder.mul(nxt[k], row), tail)])  # lane tail = row start
            v = irb.masked_load(builder, a_ptr, builder.and_(head, on), ir.Constant(evec, None), align)
            joined.append(irb.masked_load(builder, b_ptr, builder.and_(builder.not_(head), on), v, align))
        for k in range(GATHER_ROWS):
            with builder.if_then(live[k]):
                at = builder.sub(builder.add(builder.mul(builder.add(rows[k], one), row), off), ir.Constant(i64, L))
                irb.stream_store(builder, joined[k], builder.bitcast(builder.gep(d.data, [at]), evec.as_pointer()), LINE)
        return context.get_dummy_value()

    return types.void(dst, src, ids, types.uint64, types.uint64, types.uint64, types.uint64, types.uint64), codegen


@device
def gather_rows_plain(dst, src, ids, r0, row, off, nbytes, joins):
    """:func:`stream_gather_rows` as plain numba loops, the readable reference (the same elements
    written; plain stores, no alignment needed): the rows, then the join lines."""
    size = np.uint64(dst.itemsize)
    n = nbytes // size
    L = np.uint64(LINE) // size
    one = np.uint64(1)
    for k in range(GATHER_ROWS):
        r = r0 + np.uint64(k)
        copy(src, np.uint64(ids[r]) * row + off, dst, r * row + off, n)
    for k in range(joins):
        r = r0 + np.uint64(k)
        tail = L - off  # the end of src row ids[r], then the start of src row ids[r + 1]
        at = (r + one) * row + off - L
        copy(src, (np.uint64(ids[r]) + one) * row - tail, dst, at, tail)
        copy(src, np.uint64(ids[r + one]) * row, dst, at + tail, off)


def _store_span(context, builder, w_arr, wo, dst, do, cnt, stream, kind, cast, value):
    """``dst[do + i] = narrow(value(w_i))`` for ``i < cnt``, ``w_i`` the float32 ``w[wo + i]`` (a
    scalar or a ``<lanes x float>`` vector) and ``value(w_i, i, lanes)`` its fp32 result: one line of
    ``dst`` per step in 512-bit vectors, the partial lines at both ends one element at a time,
    the whole lines with streaming stores when ``stream`` (an i1/i8 value)."""

    def step(start, count, lanes, nt):
        def body(j):
            v = value(irb.load_widen(builder, w_arr.data, builder.add(wo, j), types.float32, lanes), j, lanes)
            dtypes.store_narrow_mode(builder, v, dst.data, builder.add(do, j), kind, lanes, cast,
                                     align=LINE if nt else 1, nontemporal=nt)

        irb.steps(builder, start, count, lanes, body)

    size = context.get_abi_sizeof(context.get_data_type(kind))
    irb.line_span(builder, builder.gep(dst.data, [do]), cnt, size, step, stream)


def _store_typing(w, dst, mode):
    return (isinstance(w, types.Array) and w.dtype == types.float32 and isinstance(dst, types.Array)
            and dst.dtype in (types.float32, types.uint16, types.int16) and isinstance(mode, dtypes.CastModeType))


def _times(builder, s, v):
    """``v * s`` for a float32 scalar ``s`` and a float32 scalar or vector ``v``."""
    return builder.fmul(v, s if v.type == s.type else irb.splat(builder, s, v.type))


@intrinsic
def store_div(typingctx, w, w_off, dst, d_off, n, d, stream, mode):
    """``dst[d_off + i] = narrow(w[w_off + i] * (1 / d))`` for ``i < n``: a float32 tile divided
    by a scalar (TDIVS), cast (TCVT, rounding by ``mode``, a ``dtypes.CastMode``) and stored to GM.

    ``w`` flat float32, ``dst`` a flat kernel view (float32, uint16 = bf16, int16 = fp16), uint64
    offsets and count, ``d`` float32. The division is what the kernels' ``arcp`` makes of a loop
    dividing by one scalar (``machine/jit.py``): ``1/d`` rounded once, then each product rounded,
    in every lane and step. One line of ``dst`` per step in 512-bit vectors, the partial lines at
    both ends one element at a time.
    ``stream``: the whole lines go out with streaming stores (the caller fences and checks
    :func:`streams_apart`; ``dst`` a whole number of elements off a line).
    """
    if not _store_typing(w, dst, mode):
        return None

    def codegen(context, builder, sig, args):
        w_arr, d_arr = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2))
        rcp = builder.fdiv(ir.Constant(ir.FloatType(), 1.0), args[5])
        _store_span(context, builder, w_arr, args[1], d_arr, args[3], args[4], args[6], sig.args[2].dtype, mode.mode,
                    lambda v, j, lanes: _times(builder, rcp, v))
        return context.get_dummy_value()

    return types.void(w, types.uint64, dst, types.uint64, types.uint64, types.float32, types.boolean, mode), codegen


@intrinsic
def store_cast(typingctx, w, w_off, dst, d_off, n, stream, mode):
    """``dst[d_off + i] = narrow(w[w_off + i])`` for ``i < n``: a float32 tile cast (TCVT, by
    ``mode``) and stored to GM; arguments and streaming as :func:`store_div`'s."""
    if not _store_typing(w, dst, mode):
        return None

    def codegen(context, builder, sig, args):
        w_arr, d_arr = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2))
        _store_span(context, builder, w_arr, args[1], d_arr, args[3], args[4], args[5], sig.args[2].dtype, mode.mode,
                    lambda v, j, lanes: v)
        return context.get_dummy_value()

    return types.void(w, types.uint64, dst, types.uint64, types.uint64, types.boolean, mode), codegen


@intrinsic
def store_scale_mul(typingctx, w, w_off, s, g, dst, d_off, n, stream, mode):
    """``dst[d_off + i] = narrow((w[w_off + i] * s) * g[i])`` for ``i < n``: a float32 tile times a
    scalar (TMULS), times a float32 row ``g`` read from its start (TMUL), cast by ``mode`` and
    stored to GM (a normalisation: a row times its scale, times the weights); ``s`` float32, the
    rest as :func:`store_div`'s."""
    if not (_store_typing(w, dst, mode) and isinstance(g, types.Array) and g.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):
        w_arr, g_arr, d_arr = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 3, 4))

        def value(v, j, lanes):
            gv = irb.load_widen(builder, g_arr.data, j, types.float32, lanes)
            return builder.fmul(_times(builder, args[2], v), gv)

        _store_span(context, builder, w_arr, args[1], d_arr, args[5], args[6], args[7], sig.args[4].dtype, mode.mode,
                    value)
        return context.get_dummy_value()

    u64 = types.uint64
    return types.void(w, u64, types.float32, g, dst, u64, u64, types.boolean, mode), codegen


@intrinsic
def store_fence(typingctx):
    """A full memory fence (``mfence``): streaming stores are weakly ordered, so each task that
    issued them fences before it ends (as memcpy does after its non-temporal loop)."""

    def codegen(context, builder, sig, args):
        irb.fence(builder)
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def prefetch(typingctx, a, idx):
    """Hint the cache to load the line holding flat element ``idx`` of C-contiguous ``a``.

    The CPU's side of the NPU's double buffering (the MTE loads tile t+1 while the cube and
    vector units work on tile t): a streaming kernel that computes between loads keeps more
    cache-line fills in flight this way than the hardware prefetcher alone. A prefetch never
    faults and changes no result.
    """
    if not isinstance(a, types.Array) or not isinstance(idx, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        irb.prefetch(builder, builder.gep(ary.data, [args[1]]))  # into all levels
        return context.get_dummy_value()

    return types.void(a, idx), codegen


@device
def prefetch_row(a, b, h, j):
    """Prefetch row ``a[b, h, j, :]`` of a C-contiguous 4-D array (no-op past the last row)."""
    if j >= a.shape[2]:
        return
    row = a.shape[3]
    start = np.uint64(((b * a.shape[1] + h) * a.shape[2] + j) * row)
    step = np.uint64(max(64 // a.itemsize, 1))
    for off in range(np.uint64(0), np.uint64(row), step):
        prefetch(a, start + off)


# Inner loops index with uint64 offsets, take no per-row array slices and have one output and few
# inputs: the numba rules of machine/jit.py.


@device
def copy(src, s_off, dst, d_off, n):
    """``dst[d_off:d_off+n] = src[s_off:s_off+n]`` (same dtype; uint64 offsets and count)."""
    for i in range(n):
        dst[d_off + i] = src[s_off + i]


ALIGN = LINE  # bytes: scratch slabs start on their own cache line
# Outputs of at least this many bytes are written with streaming stores: they do not fit the
# host's caches (an estimate: the share of L2 + L3 one call can expect on a shared host), so
# caching them gains nothing. Smaller outputs (decode steps) stay in cache for their consumer.
STREAM_MIN_BYTES = 4 << 20


@numba.njit(cache=True, nogil=True)
def _address(a):
    return a.ctypes.data


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def address(a: np.ndarray) -> int:
    """The address of ``a``'s data, through a numba call (``a.ctypes.data`` runs NumPy's slower
    Python-level ctypes helpers on every op call that checks its output's alignment). Arrays of
    dtypes numba does not type (bfloat16, float16) are read through an unsigned view."""
    if a.dtype.kind != "u":
        a = a.view(_UINT[a.itemsize])
    return int(_address(a))


def _empty_at(shape, dtype, target: int, period: int) -> np.ndarray:
    """A new C-contiguous array whose data starts ``target`` bytes past a multiple of ``period``
    (``target`` a multiple of the itemsize)."""
    dt = np.dtype(dtype)
    n = _math.prod(shape)
    buf = np.empty(n + period // dt.itemsize, dt)
    first = (target - address(buf)) % period // dt.itemsize
    return buf[first : first + n].reshape(shape)


def aligned_empty(shape, name):
    """A new storage array whose data starts on a 64-byte boundary, and its kernel view."""
    a = _empty_at(shape, dtypes.STORAGE[name], 0, ALIGN)
    return a, dtypes.kernel_view(a)


def empty_in_phase(shape, dtype, like: np.ndarray, period: int = ALIGN) -> np.ndarray:
    """A new C-contiguous array whose data starts at the same byte offset within a cache line as
    ``like``'s (within a ``period``, a multiple of the line: ``PAGE`` also keeps the two apart for
    streaming, :func:`streams_apart`). A kernel that copies rows of ``like`` to equal offsets of the
    new array then loads and stores whole lines together (a line-straddling load costs two line
    fills)."""
    return _empty_at(shape, dtype, address(like) % period, period)


PAGE = 4096  # bytes: loads and stores are matched for dependence on their low 12 address bits
# A load whose address is up to this many bytes past a pending streaming store's, modulo a page,
# waits for that store ("4K aliasing"). An element-wise kernel that loads src[i] and streams
# dst[i] a few lines later hits it on every line when dst starts just past src within a page.
ALIAS_WINDOW = 512


def streams_apart(dst: np.ndarray, src: np.ndarray) -> bool:
    """Whether ``dst`` can be streamed from loads of ``src`` at equal offsets without 4K aliasing
    (``ALIAS_WINDOW``): dst does not start 1 to ALIAS_WINDOW - 1 bytes past src within a page."""
    return not 0 < (address(dst) - address(src)) % PAGE < ALIAS_WINDOW


def empty_apart(shape, name, like: np.ndarray):
    """A new 64-byte-aligned storage array (and its kernel view) placed for streaming from
    ``like`` (:func:`streams_apart`): it starts less than a line *before* ``like`` within a page."""
    a = _empty_at(shape, dtypes.STORAGE[name], address(like) % PAGE // ALIGN * ALIGN, PAGE)  # like's line
    return a, dtypes.kernel_view(a)


def scratch(cols, name_or_dtype, *lead):
    """Per-thread scratch ``[n_threads, *lead, cols]``: each thread's slab starts on its own cache
    line (64-byte aligned, padded by a line) so that two threads never write to one line."""
    dt = np.dtype(name_or_dtype)
    per_line = ALIGN // dt.itemsize
    cols_padded = -(-cols // per_line) * per_line + per_line
    rows = numba.config.NUMBA_NUM_THREADS  # thread ids stay below it whatever set_num_threads says
    n = rows * _math.prod(lead) * cols_padded
    buf = np.empty(n + per_line, dt)
    first = (-address(buf) % ALIGN) // dt.itemsize
    return buf[first : first + n].reshape((rows, *lead, cols_padded))


class ScratchPool:
    """Per-thread scratch slabs (:func:`scratch`) of one kind of call, reused from call to call.

    ``specs``: one ``(cols, dtype, *lead)`` per slab. :meth:`take` hands out a free set (or makes
    one), :meth:`give` returns it. Kernels release the GIL, so two Python threads can run one op at
    once: each takes its own set (``list.pop``/``append`` are atomic), never a shared one.
    """

    def __init__(self, *specs):
        self._specs = specs
        self._free = []

    def take(self) -> tuple:
        try:
            return self._free.pop()
        except IndexError:
            return tuple(scratch(*spec) for spec in self._specs)

    def give(self, slabs: tuple):
        self._free.append(slabs)


def stream_from(dst, *srcs, min_bytes: int = STREAM_MIN_BYTES) -> bool:
    """Write ``dst`` with streaming stores: it is :func:`streamable` and starts just past none of
    the ``srcs`` a kernel loads from while it stores (:func:`streams_apart`: 4K aliasing)."""
    return streamable(dst, min_bytes) and all(streams_apart(dst, s) for s in srcs)


def streamable(out_k, min_bytes: int = STREAM_MIN_BYTES) -> bool:
    """Stream the output (non-temporal stores) when it is too large to be re-read from cache and
    starts a whole number of elements off a line (so its whole lines can be found)."""
    return out_k.nbytes >= min_bytes and out_k.itemsize in (2, 4) and address(out_k) % out_k.itemsize == 0
