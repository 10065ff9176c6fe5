"""softmax over the last dim: the whole row in one UB tile, or tiled with a running max and sum.

Math (x of any rank >= 1, rows of length L = x.shape[-1]; storage dtype fp32, bf16 or fp16;
result in x's dtype)::

    v = fp32(x) * scale + mask          (scale: optional float; mask: optional additive float32,
                                         broadcastable to x, -inf allowed)
    softmax(x)[j] = cast(exp(v[j] - m) / l),   m = max_j v[j],   l = sum_j exp(v[j] - m)

All math is fp32, with one rounding to the storage dtype at the end (the division is a multiply by
the fp32 reciprocal of l, as the kernels' ``arcp`` compiles it: ``machine/tile.store_div``). A fully
masked row (every ``v[j] = -inf``, so m = -inf) returns zeros, never NaN (the formula alone gives
-inf - -inf = NaN).
NaN in x or the mask makes its row NaN, as torch.softmax (the max skips NaN, so a row of only NaN
and -inf has m = -inf and returns zeros).

Shapes: x is viewed as ``[R, L]`` with ``R = prod(x.shape[:-1])``. The mask is read as ``[Rm, L]``
rows (its leading dims broadcast onto x's; a last dim of 1, or a non-contiguous mask, is first
copied to contiguous ``[Rm, L]``, counted as workspace): each x row reads its mask row.

Strategies (n = R*L, b = itemsize of the storage dtype, k = 1 with a mask else 0)::

    softmax.whole_row  1 vector kernel  GM read n*b + k*n*4, write n*b
    softmax.online     1 vector kernel  GM read 2*(n*b + k*n*4), write n*b

- ``whole_row`` is the seed's ``amax -> sub -> exp -> sum -> div`` with the row in one UB tile: a
  task takes ``r`` rows (``row_tile``, default ``softmax_row_tile``, clamped so that the fp32
  ``[r, L]`` tile stays within the 64 KiB reduction limit, npu-facts 4.2, and so that every vector
  core gets a task when there are few rows). Its plan refuses a row whose fp32 tile exceeds that
  limit or whose buffers exceed UB (TileError: use softmax.online).
- ``online`` walks each row in column tiles of ``col_tile`` elements (``softmax_col_tile``). Pass 1
  keeps the running max ``m`` and running sum ``l`` in UB: per tile ``m' = max(m, max(v))``,
  ``l = l*exp(m - m') + sum(exp(v - m'))`` (the rescale when the max grows, as the NPU's online
  softmax in flash attention). Pass 2 reads the row again and writes ``exp(v - m)/l``. The output
  needs the final ``m`` and ``l``, so a standalone softmax over a row longer than UB cannot avoid
  the second read (the alternative, writing unnormalised ``exp`` and rescaling it, costs a GM write
  and a read more). When the row fits one column tile both strategies give the same bits.

Vector element-ops per element (p = 1 cast-in for bf16/fp16 + 1 if scale + 1 if mask, c = 1
cast-out for bf16/fp16): whole_row ``p + 5 + c`` (max, sub, exp, sum, div); online
``2p + 7 + c`` (pass 1: max, sub, exp, sum; pass 2: sub, exp, div) plus 3 per (row, column tile)
(merge of the max, exp and multiply of the rescale), counted whether the max grew or not.

UB per task (elements ``r x w``, w = L aligned for whole_row, the column tile for online): the
input tile, an fp32 work tile (exp in place), the fp32 mask tile (with a mask), the output tile
(bf16/fp16 only; fp32 writes from the work tile); online adds the ``[r]`` fp32 m and l.
Sums are serial within a row in a fixed order (16 lane partial sums, ``vmath.softmax_exp``), so the
results are the same bits for any number of threads.
"""

from __future__ import annotations

import math as _math
import numbers

import numba
import numpy as np
from numba import prange

from . import inputs
from .errors import ConstraintError, DTypeError, ShapeError, TileError
from .machine import dtypes, tile, vmath
from .machine.jit import device, kernel
from .machine.memo import memo_plan
from .machine.plan import Buffer, KernelPlan, Plan, align_elems, vector_tile
from .machine.profile import load_profile, resolve_cast_mode
from .strategy import Launch, register

NEG_INF = np.float32(-np.inf)
WHOLE_ROW_OPS = 5  # max, sub, exp, sum, div
ONLINE_OPS = 7  # pass 1: max, sub, exp, sum; pass 2: sub, exp, div
ONLINE_TILE_OPS = 3  # per (row, column tile): merge of the max, exp(m - m') and l * that
STRATEGIES = ("whole_row", "online")


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = one tile task of ``rows_per_task`` rows (offsets uint64,
# machine/jit.py); ``w`` is the task's fp32 work tile in per-thread scratch


@device(forceinline=True)
def _load_max(x, x_off, mask, m_off, w, n, has_mask, has_scale, scale):
    """``w[:n] = fp32(x[x_off:][:n]) * scale + mask[m_off:][:n]`` (the optional parts skipped) and
    the max of ``w[:n]``, in one pass (``vmath.load_max``)."""
    if has_mask:
        if has_scale:
            return vmath.load_max(x, x_off, w, n, scale, mask, m_off)
        return vmath.load_max(x, x_off, w, n, None, mask, m_off)
    if has_scale:
        return vmath.load_max(x, x_off, w, n, scale, None, m_off)
    return vmath.load_max(x, x_off, w, n, None, None, m_off)


@device(forceinline=True)
def _store_zeros(out, o_off, n):
    """A fully masked row (max = -inf): zeros, never the NaN of -inf - -inf."""
    dst = out[o_off:o_off + n]
    for j in range(n):
        dst[j] = dtypes.narrow(out, np.float32(0.0))


@device(forceinline=True)
def _ahead(start, n, total):
    """Elements of the ``n`` from ``start`` that lie inside an array of ``total`` (uint64s)."""
    return min(np.uint64(n), total - start) if start < total else np.uint64(0)


@kernel
def _whole_row_kernel(
    x,
    mask,
    mrow,
    out,
    n_rows,
    length,
    rows_per_task,
    has_mask,
    has_scale,
    scale,
    ops_per_elem,
    scratch,
    cm,
    stream,
):
    """softmax of each row with the row in one work tile -> the cost counters.

    Parameters
    ----------
    x, out : flat [n_rows, length] kernel views of one storage dtype
    mask : flat [Rm, length] float32 (unused without ``has_mask``); ``mrow``: int64 mask row of each x row
    rows_per_task : rows of one task's ``[r, length]`` tile
    has_mask, has_scale, scale : the optional ``v = x*scale + mask``
    ops_per_elem : vector ops counted per element
    scratch : [threads, 1, >= length] fp32 work tiles
    cm : the cast mode of the narrowing to ``out`` (a ``dtypes.CastMode``: one kernel per mode)
    stream : the output's whole lines with streaming stores, fenced at the end of each task
    """
    n_tasks = (n_rows + rows_per_task - 1) // rows_per_task
    itemsize = x.itemsize
    mask_b = 4 if has_mask else 0
    sc = np.float32(scale)
    L = np.uint64(length)
    total = np.uint64(n_rows) * L
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(n_tasks):
        r0 = t * rows_per_task
        r1 = min(n_rows, r0 + rows_per_task)
        w = scratch[numba.get_thread_id(), 0]
        for row in range(r0, r1):
            base = np.uint64(row) * L
            m_off = np.uint64(mrow[row]) * L if has_mask else np.uint64(0)
            m = _load_max(x, base, mask, m_off, w, L, has_mask, has_scale, sc)  # load, amax
            if m == NEG_INF:
                _store_zeros(out, base, L)
                continue
            # sub, exp, sum; the next row loads while this one computes
            s = vmath.softmax_exp_ahead(w, np.uint64(0), L, m, w, w, x, base + L, _ahead(base + L, L, total))
            tile.store_div(w, np.uint64(0), out, base, L, s, stream, cm)  # div, cast
        if stream:
            tile.store_fence()
        rows = r1 - r0
        tasks += 1
        gm_read += rows * length * (itemsize + mask_b)
        gm_write += rows * length * itemsize
        vector_ops += rows * length * ops_per_elem
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _online_kernel(
    x,
    mask,
    mrow,
    out,
    n_rows,
    length,
    rows_per_task,
    col_tile,
    has_mask,
    has_scale,
    scale,
    ops_per_elem,
    scratch,
    cm,
    stream,
):
    """softmax of each row in column tiles: running max and sum, then a second pass -> the counters.

    Parameters
    ----------
    x, out, mask, mrow, rows_per_task, has_mask, has_scale, scale : as :func:`_whole_row_kernel`
    col_tile : elements of one column tile (the last one of a row is a valid-shape tail)
    ops_per_elem : vector ops counted per element (``ONLINE_TILE_OPS`` more per row and tile)
    scratch : [threads, 1, >= col_tile] fp32 work tiles
    cm, stream : the cast mode and streaming stores, as :func:`_whole_row_kernel`
    """
    n_tasks = (n_rows + rows_per_task - 1) // rows_per_task
    n_tiles = (length + col_tile - 1) // col_tile
    itemsize = x.itemsize
    mask_b = 4 if has_mask else 0
    sc = np.float32(scale)
    L = np.uint64(length)
    zero = np.uint64(0)
    total = np.uint64(n_rows) * L
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(n_tasks):
        r0 = t * rows_per_task
        r1 = min(n_rows, r0 + rows_per_task)
        w = scratch[numba.get_thread_id(), 0]
        for row in range(r0, r1):
            base = np.uint64(row) * L
            m_base = np.uint64(mrow[row]) * L if has_mask else zero
            m = NEG_INF  # running max and sum of the row (UB state)
            l = np.float32(0.0)
            for k in range(n_tiles):  # pass 1
                c0 = np.uint64(k * col_tile)
                n = np.uint64(min(col_tile, length - k * col_tile))
                m_new = max(m, _load_max(x, base + c0, mask, m_base + c0, w, n, has_mask, has_scale, sc))
                if m_new == NEG_INF:  # everything so far masked: nothing to add
                    continue
                if m_new > m:  # the max grew: rescale the sum (exp(-inf) = 0 on the first tile)
                    l = l * vmath.exp(m - m_new)
                    m = m_new
                # the next tile loads while this one computes: this row's next, or its first again
                nxt = base + c0 + n if k + 1 < n_tiles else base
                l += vmath.softmax_exp_ahead(w, zero, n, m, w, w, x, nxt, _ahead(nxt, col_tile, total))
            if m == NEG_INF:
                _store_zeros(out, base, L)
                continue
            for k in range(n_tiles):  # pass 2: exp(v - m) / l
                c0 = np.uint64(k * col_tile)
                n = np.uint64(min(col_tile, length - k * col_tile))
                _load_max(x, base + c0, mask, m_base + c0, w, n, has_mask, has_scale, sc)  # the max unused
                nxt = base + c0 + n  # this row's next tile, or the next row's first
                vmath.softmax_exp_ahead(w, zero, n, m, w, w, x, nxt, _ahead(nxt, col_tile, total))
                tile.store_div(w, zero, out, base + c0, n, l, stream, cm)
        if stream:
            tile.store_fence()
        rows = r1 - r0
        tasks += 1
        gm_read += 2 * rows * length * (itemsize + mask_b)
        gm_write += rows * length * itemsize
        vector_ops += rows * length * ops_per_elem + rows * n_tiles * ONLINE_TILE_OPS
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# plans


def _common(where, shape, dtype, prof, row_tile, has_mask, scale):
    if not isinstance(has_mask, (bool, np.bool_)):
        raise ConstraintError(f"{where}: has_mask must be a bool, got {has_mask!r}")
    _check_scale(where, scale)
    dtype = inputs.storage_dtype(dtype, where)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "x", where)
    inputs.check_size(shape, "x", where)  # plans answer advise() too: same limits as the data path
    row_tile = (prof.tile("softmax_row_tile") if row_tile is None
                else inputs.positive_int(row_tile, "row_tile", where))
    return dtype, shape, row_tile


def _rows_per_task(row_tile, n_rows, fit, prof):
    """``row_tile`` rows, at most ``fit`` (the reduction tile), and few enough that every vector
    core gets a task when there are fewer rows than ``row_tile x vector_cores``."""
    return max(1, min(row_tile, fit, -(-n_rows // prof.vector_cores)))


def _buffers(where, rows, width, dtype, has_mask, prof, hint):
    bufs = [vector_tile("x_ub", (rows, width), dtype, prof, where, hint),
            vector_tile("w_ub", (rows, width), "fp32", prof, where, hint)]
    if has_mask:
        bufs.append(vector_tile("mask_ub", (rows, width), "fp32", prof, where, hint))
    if dtype != "fp32":
        bufs.append(vector_tile("y_ub", (rows, width), dtype, prof, where, hint))
    return bufs


def _ub_bytes_per_elem(dtype, has_mask):
    """UB bytes per tile element: input, fp32 work, fp32 mask, output (bf16/fp16 only)."""
    b = dtypes.itemsize(dtype)
    return b + 4 + (4 if has_mask else 0) + (b if dtype != "fp32" else 0)


def _ops(dtype, has_mask, scale):
    half = int(dtype != "fp32")
    return half + int(scale is not None) + int(bool(has_mask)), half


def _mix(dtype, has_mask, scale, n, steps, passes=1):
    """The vector instructions (machine/isa.py) over ``n`` elements: per pass the cast in, the
    scale and the mask, then ``steps`` ((instruction, count), ...), then the cast out."""
    pre = []
    if dtype != "fp32":
        pre.append(("TCVT", dtype, n))
    if scale is not None:
        pre.append(("TMULS", "fp32", n))
    if has_mask:
        pre.append(("TADD", "fp32", n))
    mix = [(kind, dt, count * passes) for kind, dt, count in pre]
    mix += [(kind, "fp32", n * count) for kind, count in steps]
    if dtype != "fp32":
        mix.append(("TCVT", dtype, n))
    return tuple(mix)


def _result(strategy, dtype, prof, kernel_plan, params, hint):
    return Plan(op="softmax", strategy=strategy, dtype=dtype, profile=prof, kernels=(kernel_plan,),
                params=params, hint=hint)


@memo_plan
def plan_whole_row(shape, dtype="fp32", *, has_mask=False, scale=None, profile=None, row_tile=None) -> Plan:
    """Plan of :func:`whole_row` for an input of ``shape`` and storage ``dtype`` (no data needed).

    ``has_mask``: a mask is added (its fp32 rows are read and held in UB); ``row_tile``: most rows
    per task (default ``softmax_row_tile``, clamped to the 64 KiB fp32 reduction tile).
    Raises TileError when one row does not fit: use softmax.online.
    """
    where = "softmax.whole_row"
    prof = load_profile(profile)
    dtype, shape, row_tile = _common(where, shape, dtype, prof, row_tile, has_mask, scale)
    length = shape[-1]
    n_rows = _math.prod(shape[:-1])
    width = align_elems(length, dtype, prof)
    width = align_elems(width, "fp32", prof)
    limit = prof.reduce_tile_max_bytes
    if width * 4 > limit:
        raise TileError(
            f"{where}: the row's fp32 reduction tile w_ub [1, {width}] = {width * 4} B exceeds the "
            f"{limit} B reduction tile limit of {prof.name} (rows of at most {limit // 4} elements "
            f"fit); use softmax.online, which tiles the row")
    rows = _rows_per_task(row_tile, n_rows, limit // (width * 4), prof)
    hint = "the whole row must fit one UB tile; use softmax.online, which tiles the row"
    pre, cast_out = _ops(dtype, has_mask, scale)
    ops = pre + WHOLE_ROW_OPS + cast_out
    b = dtypes.itemsize(dtype)
    n = n_rows * length
    k = KernelPlan(
        name="softmax_whole_row",
        unit="vector",
        tasks=-(-n_rows // rows),
        buffers=tuple(_buffers(where, rows, width, dtype, has_mask, prof, hint)),
        gm_read_bytes=n * b + (n * 4 if has_mask else 0),
        gm_write_bytes=n * b,
        vector_ops=n * ops,
        # max, sub, exp, sum, div as instructions
        vector_mix=_mix(dtype, has_mask, scale, n, (("TROWMAX", 1), ("TSUB", 1), ("TEXP", 1),
                                                    ("TROWSUM", 1), ("TDIV", 1))),
        vector_tile_elems=rows * width,
        vector_cols=width,
    )
    params = dict(rows_per_task=rows, length=length, n_rows=n_rows, ops_per_elem=ops, width=width)
    return _result("whole_row", dtype, prof, k, params, hint)


@memo_plan
def plan_online(shape, dtype="fp32", *, has_mask=False, scale=None, profile=None, row_tile=None,
                col_tile=None) -> Plan:
    """Plan of :func:`online` for an input of ``shape`` and storage ``dtype`` (no data needed).

    ``col_tile``: elements per column tile (default ``softmax_col_tile``, clamped to the aligned
    row; x 4 B must stay within the 64 KiB reduction limit); ``row_tile``: most rows per task
    (default ``softmax_row_tile``, clamped so that ``[rows, col_tile]`` fp32 fits that limit).
    """
    where = "softmax.online"
    prof = load_profile(profile)
    dtype, shape, row_tile = _common(where, shape, dtype, prof, row_tile, has_mask, scale)
    col_tile = (prof.tile("softmax_col_tile") if col_tile is None
                else inputs.positive_int(col_tile, "col_tile", where))
    length = shape[-1]
    n_rows = _math.prod(shape[:-1])
    limit = prof.reduce_tile_max_bytes
    block = prof.align_bytes // 2  # a multiple of 16 elements is aligned for every dtype
    hint = f"use col_tile <= {limit // 4} (fp32 elements per reduction tile), a multiple of {block}"
    width = min(col_tile, align_elems(align_elems(length, dtype, prof), "fp32", prof))
    if width * 4 > limit:
        raise TileError(f"{where}: column tile w_ub [1, {width}] fp32 = {width * 4} B exceeds the "
                        f"{limit} B reduction tile limit of {prof.name}; {hint}")
    rows = _rows_per_task(row_tile, n_rows, limit // (width * 4), prof)
    per_row = width * _ub_bytes_per_elem(dtype, has_mask)
    while rows > 1 and rows * per_row + 8 * align_elems(rows, "fp32", prof) > prof.limit("UB"):
        rows -= 1  # leave UB room for the m and l state
    bufs = _buffers(where, rows, width, dtype, has_mask, prof, hint)
    state = align_elems(rows, "fp32", prof)
    bufs += [Buffer("m_ub", "UB", (state,), "fp32"), Buffer("l_ub", "UB", (state,), "fp32")]
    pre, cast_out = _ops(dtype, has_mask, scale)
    ops = 2 * pre + ONLINE_OPS + cast_out
    n_tiles = -(-length // width)
    b = dtypes.itemsize(dtype)
    n = n_rows * length
    k = KernelPlan(
        name="softmax_online",
        unit="vector",
        tasks=-(-n_rows // rows),
        buffers=tuple(bufs),
        gm_read_bytes=2 * (n * b + (n * 4 if has_mask else 0)),
        gm_write_bytes=n * b,
        vector_ops=n * ops + n_rows * n_tiles * ONLINE_TILE_OPS,
        gm_unique_bytes=n * b + (n * 4 if has_mask else 0),  # the second pass re-reads the row
        # pass 1: max, sub, exp, sum; pass 2: sub, exp, div; per (row, tile): max, exp, mul
        vector_mix=_mix(dtype, has_mask, scale, n, (("TROWMAX", 1), ("TSUB", 2), ("TEXP", 2),
                                                    ("TROWSUM", 1), ("TDIV", 1)), passes=2)
        + (("TMAX", "fp32", n_rows * n_tiles), ("TEXP", "fp32", n_rows * n_tiles), ("TMUL", "fp32", n_rows * n_tiles)),
        vector_tile_elems=rows * width,
        vector_cols=width,
    )
    params = dict(rows_per_task=rows, col_tile=width, length=length, n_rows=n_rows, ops_per_elem=ops,
                  width=width, n_tiles=n_tiles)
    return _result("online", dtype, prof, k, params, hint)


# ---------------------------------------------------------------------------------------------
# public strategies


def _check_scale(where, scale):
    if scale is None:
        return
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not _math.isfinite(scale):
        raise ConstraintError(f"{where}: scale must be a finite float or None, got {scale!r}")


_NO_MASK = np.zeros(1, np.float32)
_NO_ROWS = np.zeros(1, np.int64)


def _mask_rows(where, mask, shape):
    """(``[Rm, L]`` contiguous float32 mask, int64 mask row of each x row, bytes copied)."""
    if not isinstance(mask, np.ndarray) or isinstance(mask, np.ma.MaskedArray):
        raise DTypeError(f"{where}: mask must be a numpy float32 array (additive, -inf allowed), "
                         f"got {type(mask).__name__}; use numpy.asarray(mask, dtype=numpy.float32)")
    if mask.dtype != np.float32:
        raise DTypeError(f"{where}: mask has dtype {mask.dtype}; it must be float32 (additive, -inf "
                         f"allowed); convert with mask.astype(numpy.float32)")
    try:
        ok = mask.ndim <= len(shape) and np.broadcast_shapes(mask.shape, shape) == tuple(shape)
    except ValueError:
        ok = False
    if not ok:
        raise ShapeError(f"{where}: mask shape {mask.shape} does not broadcast to x's shape {tuple(shape)}")
    full = (1,) * (len(shape) - mask.ndim) + mask.shape
    lead = full[:-1]
    length = shape[-1]
    n_mrows = _math.prod(lead)
    m2 = mask.reshape(n_mrows, full[-1])
    if full[-1] != length:
        m2 = np.broadcast_to(m2, (n_mrows, length))
    copied = 0
    if not m2.flags.c_contiguous:
        m2 = np.ascontiguousarray(m2)
        copied = m2.nbytes
    rows = np.broadcast_to(np.arange(n_mrows, dtype=np.int64).reshape(lead), shape[:-1]).reshape(-1)
    return m2.reshape(-1), np.ascontiguousarray(rows), copied


def _run(strategy, x, mask, scale, profile, row_tile, col_tile=None, cast_mode=None, out=None):
    where = f"softmax.{strategy}"
    xt = inputs.tensor(x, "x", where)
    _check_scale(where, scale)
    cm = resolve_cast_mode(cast_mode, profile, where, narrows=xt.dtype != "fp32")
    has_mask = mask is not None
    if strategy == "whole_row":
        p = plan_whole_row(xt.shape, xt.dtype, has_mask=has_mask, scale=scale, profile=profile, row_tile=row_tile)
    else:
        p = plan_online(xt.shape, xt.dtype, has_mask=has_mask, scale=scale, profile=profile, row_tile=row_tile,
                        col_tile=col_tile)
    m_flat, m_rows, m_copied = _mask_rows(where, mask, xt.shape) if has_mask else (_NO_MASK, _NO_ROWS, 0)
    prm = p.params
    if out is None and tile.streamable(xt.kview):
        result, out_k = tile.empty_apart(xt.shape, xt.dtype, xt.array)  # placed for streaming
    else:
        result, out_k = inputs.output(where, xt, out)
    stream = tile.stream_from(out_k, xt.kview)  # large outputs: no read for ownership
    if out is not None and has_mask and np.may_share_memory(out, mask):
        raise ConstraintError(f"{where}: out overlaps the mask, whose rows later rows still read; "
                              f"pass a separate out")
    scratch = tile.scratch(prm["width"], np.float32, 1)
    sc = 1.0 if scale is None else float(scale)
    xk, ok = xt.kview.reshape(-1), out_k.reshape(-1)
    with Launch(p, [xt.shape]) as run:
        if strategy == "whole_row":
            run.count(_whole_row_kernel(xk, m_flat, m_rows, ok, prm["n_rows"], prm["length"], prm["rows_per_task"],
                                        has_mask, scale is not None, sc, prm["ops_per_elem"], scratch, cm, stream))
        else:
            run.count(_online_kernel(xk, m_flat, m_rows, ok, prm["n_rows"], prm["length"], prm["rows_per_task"],
                                     prm["col_tile"], has_mask, scale is not None, sc, prm["ops_per_elem"], scratch,
                                     cm, stream))
        run.workspace(xt.copied_bytes + m_copied)
    return result


@register("softmax", "whole_row", plan=plan_whole_row,
          summary="amax -> sub -> exp -> sum -> div with the whole row in one UB tile")
def whole_row(x, *, mask=None, scale=None, profile=None, row_tile=None, cast_mode=None, out=None):
    """softmax over the last dim with each row in one UB tile (the seed's formulation).

    ``mask``: additive float32 array broadcastable to x (-inf masks out; a fully masked row gives
    zeros); ``scale``: x is multiplied by it first; ``row_tile``: most rows per task (default
    ``softmax_row_tile``). Rows whose fp32 tile exceeds the 64 KiB reduction limit raise TileError:
    use :func:`online`. ``cast_mode``: the rounding of the one fp32 -> bf16/fp16 cast
    (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint). ``out``: an array
    of x's shape and dtype to write into (C-contiguous; may be x itself, in place).
    """
    return _run("whole_row", x, mask, scale, profile, row_tile, cast_mode=cast_mode, out=out)


@register("softmax", "online", plan=plan_online,
          summary="column tiles with a running max and sum, then a second normalising pass")
def online(x, *, mask=None, scale=None, profile=None, row_tile=None, col_tile=None, cast_mode=None, out=None):
    """softmax over the last dim for rows of any length: running max and sum over column tiles
    (the sum rescaled when the max grows), then a second pass writing ``exp(v - m)/l``.

    ``col_tile``: elements per column tile (default ``softmax_col_tile``); other options as
    :func:`whole_row`. GM: x (and the mask) are read twice.
    """
    return _run("online", x, mask, scale, profile, row_tile, col_tile, cast_mode, out)


# --- lab spec ---
# What compare, advise and report need to know about softmax (pypto_numba/lab/spec.py).

def _reference_softmax(x, mask=None, scale=None):
    """float64 softmax over the last dim of ``x*scale + mask``; fully masked rows are zeros."""
    from .reference import f64

    v = f64(x)
    if scale is not None:
        v = v * float(scale)
    if mask is not None:
        v = v + np.asarray(mask, np.float64)
    m = v.max(axis=-1, keepdims=True)
    dead = m == -np.inf
    with np.errstate(invalid="ignore"):
        e = np.exp(v - np.where(dead, 0.0, m))
        y = e / e.sum(axis=-1, keepdims=True)
    return np.where(dead, 0.0, y)


def _softmax(profile, shape=(32, 4096), dtype="bf16", masked=False):
    from .lab import Candidate

    whole = Candidate("whole_row", lambda: (plan_whole_row(shape, dtype, has_mask=masked, profile=profile),))
    online_ = Candidate("online", lambda: (plan_online(shape, dtype, has_mask=masked, profile=profile),))
    try:  # the rule chosen here (the seed has none): whole_row when the row fits its tile
        whole.plans()
        seed = "whole_row"
    except TileError:
        seed = "online"
    return [whole, online_], seed, ()


def _softmax_tiles(profile, shape, dtype, masked):
    """tune.search's space: 1 to 32 rows per task; online's column tiles of 1024 to 16384."""
    from .lab import Candidate
    from .lab.spec import grid, pow2

    for kw in grid(row_tile=pow2(1, 32)):
        yield Candidate("whole_row", lambda kw=kw: (plan_whole_row(shape, dtype, has_mask=masked, profile=profile,
                                                                   **kw),), tiles=kw, shape=tuple(shape))
    for kw in grid(row_tile=pow2(1, 32), col_tile=pow2(1024, 16384)):
        yield Candidate("online", lambda kw=kw: (plan_online(shape, dtype, has_mask=masked, profile=profile, **kw),),
                        tiles=kw, shape=tuple(shape))


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed, normal

    return OpSpec(
        name="softmax",
        seed=Seed("whole_row", "online",
                  "the seed has no softmax row; chosen here: whole_row (one GM read) when the row's fp32 "
                  "tile fits the 64 KiB reduction limit, else online (tiled, reads x twice)"),
        inputs=Inputs(make=lambda shape, dtype, rng: (normal(shape, dtype, rng, 2.0),),
                      default_shape=(32, 4096),
                      help="x shape, e.g. 32,4096 (softmax over the last dim)"),
        reference=lambda x, strategy, mask=None, scale=None, **o: _reference_softmax(x, mask, scale),
        advise=_softmax,  # named as advise's old rule: its TypeError names it
        oracles={"softmax": _reference_softmax},
        tiles=_softmax_tiles,
    )


OP = _lab_spec()
