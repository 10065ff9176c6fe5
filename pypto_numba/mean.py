"""mean: sum over one dim in fp32, divide by its length, cast back.

Math (x of any rank >= 1, storage dtype fp32, bf16 or fp16; result in the same dtype)::

    mean.sum_div(x, dim, keepdim) = cast(sum(fp32(x), dim) / x.shape[dim])

The widening comes first because PyPTO's ``sum`` is fp32-only (npu-facts 4.5); the division is an
fp32 division by the length, and the result is rounded once to the storage dtype.

Shapes: x is viewed as ``[outer, L, inner]`` with ``L = x.shape[dim]``,
``outer = prod(shape[:dim])``, ``inner = prod(shape[dim+1:])``; the result has ``outer*inner``
elements (shape with ``dim`` removed, or set to 1 with ``keepdim=True``).

Strategy (n = x.size, b = itemsize of the storage dtype, out = outer*inner)::

    mean.sum_div  1 vector kernel   GM read n*b, write out*b                  (split="ub")
                  2 vector kernels  GM read n*b + P*4, write P*4 + out*b,
                                    workspace P*4, P = out*G partials          (split="gm")

Layouts (one ``prange`` iteration = one tile task):

- ``rows`` (``inner == 1``, the reduced dim is the last one): a task takes ``r`` contiguous rows and
  sums each one tile of ``col_tile`` elements at a time: each tile sum is an fp32 partial, added to
  an fp32 accumulator that stays in UB (the two-level reduction for rows longer than a tile).
  Short rows are batched, ``r`` rows per ``[r, col_tile]`` tile.
- ``strided`` (``inner > 1``): a task owns ``inner_tile`` contiguous elements of the inner axis of
  one ``outer`` index and walks L: each ``[l_tile, inner_tile]`` tile is read as ``l_tile`` rows of
  contiguous elements (no strided gathers), summed along L into an fp32 partial row, which is added
  to an fp32 accumulator row in UB.

Split (two-level reduction across tasks): when the rows/inner blocks give fewer tasks than the
profile has vector cores and L spans several tiles, L is cut into ``G`` groups of tiles so that
every vector core gets a task (``split="auto"``, or force it with ``split="gm"``/``"ub"``). Kernel 1
writes one fp32 partial per (output element, group) to GM workspace; kernel 2 (the same kernel,
on the fp32 partials, ``L' = G``) sums them, divides by L and casts. That GM round trip is counted:
``P*4`` bytes written by kernel 1, read by kernel 2, and reported as workspace. (On the CPU a
finishing kernel with <= 1 MiB of partials runs its tasks serially: see ``SERIAL_FINISH_BYTES``.)

Napkin math, 64M fp32 elements: 256 MiB read, 4 B written per output; flat ``[64M]`` splits into
48 groups (48 tasks x 86 tiles x 64 KiB), partials 48 x 4 B -- the second kernel is negligible.
Tile defaults: ``mean_row_tile`` (fp32 elements per reduction tile, 16384 = 64 KiB),
``mean_rows_per_task`` (8), ``mean_inner_tile`` (2048) in tiles/*.toml.

Vector element-ops: 1 add per element read (+1 cast for bf16/fp16), 1 add per (row, tile) partial
folded into the accumulator, and per output 1 division (final kernel only) (+1 cast to bf16/fp16).

Reduction tiles (the fp32 tile that is summed) are checked against the 64 KiB limit
(npu-facts 4.2); float sums are serial within a task, so results are bit-identical for any number
of threads.
"""

from __future__ import annotations

import math as _math
import types

import numba
import numpy as np
from numba import prange

from . import inputs
from .errors import ConstraintError
from .machine import dtypes, tile
from .machine.jit import kernel
from .machine.memo import memo_plan
from .machine.plan import Buffer, KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from .machine.profile import load_profile, resolve_cast_mode
from .strategy import Launch, register

SPLITS = ("auto", "ub", "gm")
WHERE = "mean.sum_div"


# ---------------------------------------------------------------------------------------------
# kernels


@kernel
def _rows_kernel(
    x,
    out,
    n_rows,
    length,
    col_tile,
    rows_per_tile,
    tiles_per_task,
    groups,
    finish,
    divisor,
    cm,
):
    """Rows layout. Task t = (row block, group g): rows ``rows_per_tile``, column tiles
    ``g*tiles_per_task ..``; writes the group's sum divided by ``divisor`` for each of its rows.

    Parameters
    ----------
    x : flat [n_rows, length] kernel view
    out : flat [n_rows, groups] (storage kernel view, or fp32 partials)
    col_tile, rows_per_tile, tiles_per_task, groups : the tiling of the plan's step
    finish : the last kernel (counts the division); False: fp32 partials, ``divisor`` = 1
    divisor : what each sum is divided by (the reduced length, or 1 for partials)
    cm : the cast mode of the narrowing to a 16-bit ``out`` (a ``dtypes.CastMode``)
    """
    n_tiles = (length + col_tile - 1) // col_tile
    row_blocks = (n_rows + rows_per_tile - 1) // rows_per_tile
    in_b = x.itemsize
    out_b = out.itemsize
    cast_in = 1 if in_b == 2 else 0
    cast_out = 1 if out_b == 2 else 0
    fin = 1 if finish else 0
    div = np.float32(divisor)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(row_blocks * groups):
        rb = t // groups
        g = t - rb * groups
        r0 = rb * rows_per_tile
        r1 = min(n_rows, r0 + rows_per_tile)
        k0 = g * tiles_per_task
        k1 = min(n_tiles, k0 + tiles_per_task)
        cols = min(length, k1 * col_tile) - k0 * col_tile
        for row in range(r0, r1):
            base = row * length
            acc = np.float32(0.0)  # UB accumulator of this row
            for k in range(k0, k1):
                # a slice, not x[base + c]: numba vectorises a loop over a view (see machine/jit.py)
                seg = x[base + k * col_tile:base + min(length, (k + 1) * col_tile)]
                partial = np.float32(0.0)  # the fp32 reduction tile's sum
                for c in range(seg.size):
                    partial += dtypes.widen(seg[c])
                acc += partial
            out[row * groups + g] = dtypes.narrow(out, acc / div, cm)  # partials: div = 1, exact
        rows = r1 - r0
        tasks += 1
        gm_read += rows * cols * in_b
        gm_write += rows * out_b
        vector_ops += rows * cols * (1 + cast_in) + rows * (k1 - k0) + rows * (fin + cast_out)
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _strided_kernel(
    x,
    out,
    outer,
    length,
    inner,
    inner_tile,
    l_tile,
    ltiles_per_task,
    groups,
    finish,
    divisor,
    scratch,
    cm,
):
    """Strided layout. Task t = (o, inner block, group g): sums L-tiles ``g*ltiles_per_task ..``
    of ``l_tile`` rows of ``inner_tile`` contiguous elements.

    Parameters
    ----------
    x : flat [outer, length, inner] kernel view
    out : flat [outer, groups, inner] (storage kernel view, or fp32 partials)
    inner_tile, l_tile, ltiles_per_task, groups : the tiling of the plan's step
    finish, divisor : as :func:`_rows_kernel`
    scratch : [threads, 2, inner_tile] fp32, the partial and the accumulator rows (UB)
    cm : the cast mode, as :func:`_rows_kernel`
    """
    n_ib = (inner + inner_tile - 1) // inner_tile
    n_lt = (length + l_tile - 1) // l_tile
    per_outer = n_ib * groups
    in_b = x.itemsize
    out_b = out.itemsize
    cast_in = 1 if in_b == 2 else 0
    cast_out = 1 if out_b == 2 else 0
    fin = 1 if finish else 0
    div = np.float32(divisor)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(outer * per_outer):
        o = t // per_outer
        rem = t - o * per_outer
        ib = rem // groups
        g = rem - ib * groups
        i0 = ib * inner_tile
        w = min(inner, i0 + inner_tile) - i0
        k0 = g * ltiles_per_task
        k1 = min(n_lt, k0 + ltiles_per_task)
        rows = min(length, k1 * l_tile) - k0 * l_tile
        tid = numba.get_thread_id()
        part = scratch[tid, 0]
        acc = scratch[tid, 1]
        for i in range(w):
            acc[i] = np.float32(0.0)
        for k in range(k0, k1):
            l0 = k * l_tile
            l1 = min(length, l0 + l_tile)
            for i in range(w):
                part[i] = np.float32(0.0)
            # L-rows of w contiguous elements, four at a time: the partial row is loaded and
            # stored once per 4 input rows instead of once per row
            l = l0
            while l + 4 <= l1:
                base = (o * length + l) * inner + i0
                s0 = x[base:base + w]
                s1 = x[base + inner:base + inner + w]
                s2 = x[base + 2 * inner:base + 2 * inner + w]
                s3 = x[base + 3 * inner:base + 3 * inner + w]
                for i in range(w):
                    part[i] += (dtypes.widen(s0[i]) + dtypes.widen(s1[i])) + (
                        dtypes.widen(s2[i]) + dtypes.widen(s3[i]))
                l += 4
            while l < l1:
                base = (o * length + l) * inner + i0
                s0 = x[base:base + w]
                for i in range(w):
                    part[i] += dtypes.widen(s0[i])
                l += 1
            for i in range(w):
                acc[i] += part[i]
        ob = (o * groups + g) * inner + i0
        dst = out[ob:ob + w]
        for i in range(w):
            dst[i] = dtypes.narrow(out, acc[i] / div, cm)  # partials: div = 1, exact
        tasks += 1
        gm_read += rows * w * in_b
        gm_write += w * out_b
        vector_ops += rows * w * (1 + cast_in) + (k1 - k0) * w + w * (fin + cast_out)
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# plans


def _groups(n_tiles: int, base_tasks: int, use_gm: bool, prof):
    """(tiles_per_task, groups): cut L into just enough groups for every vector core to get a task."""
    if not use_gm:
        return n_tiles, 1
    wanted = min(n_tiles, max(1, -(-prof.vector_cores // base_tasks)))
    per_task = -(-n_tiles // wanted)
    return per_task, -(-n_tiles // per_task)


def _use_gm(split: str, n_tiles: int, base_tasks: int, prof) -> bool:
    if split == "auto":  # fewer tasks than vector cores leaves cores idle: split L across tasks
        return n_tiles > 1 and base_tasks < prof.vector_cores
    return split == "gm"


def _rows_kernel_plan(name, n_rows, length, din, dout, finish, split, prof, row_tile, rows_per_task, hint):
    col_tile = min(row_tile, align_elems(length, din, prof))
    rows = max(1, min(rows_per_task, n_rows, row_tile // col_tile))
    n_tiles = -(-length // col_tile)
    row_blocks = -(-n_rows // rows)
    use_gm = _use_gm(split, n_tiles, row_blocks, prof)
    per_task, groups = _groups(n_tiles, row_blocks, use_gm, prof)
    dout = "fp32" if use_gm else dout
    finish = finish and not use_gm
    buffers = [vector_tile("x_ub", (rows, col_tile), din, prof, WHERE, hint)]
    if din != "fp32":
        buffers.append(Buffer("x32_ub", "UB", (rows, col_tile), "fp32"))
    reduce_tile(Buffer("sum_tile", "UB", (rows, col_tile), "fp32"), prof, WHERE, hint)
    buffers.append(Buffer("acc_ub", "UB", (align_elems(rows, "fp32", prof),), "fp32"))
    if dout != "fp32":
        buffers.append(Buffer("y_ub", "UB", (align_elems(rows, dout, prof),), dout))
    b_in, b_out = dtypes.itemsize(din), dtypes.itemsize(dout)
    cast_in, cast_out = int(b_in == 2), int(b_out == 2)
    n_out = n_rows * groups
    k = KernelPlan(
        name=name + ("_partial" if use_gm else ""),
        unit="vector",
        tasks=row_blocks * groups,
        buffers=tuple(buffers),
        gm_read_bytes=n_rows * length * b_in,
        gm_write_bytes=n_out * b_out,
        workspace_bytes=n_out * 4 if use_gm else 0,
        vector_ops=n_rows * length * (1 + cast_in) + n_rows * n_tiles + n_out * (int(finish) + cast_out),
    )
    params = dict(kernel="rows", col_tile=col_tile, rows_per_tile=rows, tiles_per_task=per_task,
                  groups=groups, finish=finish, out_dtype=dout)
    return k, params


def _strided_kernel_plan(name, outer, length, inner, din, dout, finish, split, prof, row_tile, inner_tile, hint):
    width = min(inner_tile, align_elems(inner, din, prof))
    l_tile = max(1, min(length, row_tile // width))
    n_ib = -(-inner // width)
    n_lt = -(-length // l_tile)
    base_tasks = outer * n_ib
    use_gm = _use_gm(split, n_lt, base_tasks, prof)
    per_task, groups = _groups(n_lt, base_tasks, use_gm, prof)
    dout = "fp32" if use_gm else dout
    finish = finish and not use_gm
    buffers = [vector_tile("x_ub", (l_tile, width), din, prof, WHERE, hint)]
    if din != "fp32":
        buffers.append(Buffer("x32_ub", "UB", (l_tile, width), "fp32"))
    reduce_tile(Buffer("sum_tile", "UB", (l_tile, width), "fp32"), prof, WHERE, hint)
    buffers += [Buffer("part_ub", "UB", (width,), "fp32"), Buffer("acc_ub", "UB", (width,), "fp32")]
    if dout != "fp32":
        buffers.append(Buffer("y_ub", "UB", (width,), dout))
    b_in, b_out = dtypes.itemsize(din), dtypes.itemsize(dout)
    cast_in, cast_out = int(b_in == 2), int(b_out == 2)
    n_out = outer * groups * inner
    k = KernelPlan(
        name=name + ("_partial" if use_gm else ""),
        unit="vector",
        tasks=base_tasks * groups,
        buffers=tuple(buffers),
        gm_read_bytes=outer * length * inner * b_in,
        gm_write_bytes=n_out * b_out,
        workspace_bytes=n_out * 4 if use_gm else 0,
        vector_ops=outer * length * inner * (1 + cast_in) + outer * n_lt * inner
        + n_out * (int(finish) + cast_out),
    )
    params = dict(kernel="strided", inner_tile=width, l_tile=l_tile, ltiles_per_task=per_task,
                  groups=groups, finish=finish, out_dtype=dout)
    return k, params


@memo_plan
def plan_sum_div(shape, dtype="fp32", *, dim=-1, keepdim=False, profile=None, row_tile=None,
                 rows_per_task=None, inner_tile=None, split="auto") -> Plan:
    """Plan of :func:`sum_div` for an input of ``shape`` and storage ``dtype`` (no data needed).

    ``row_tile``: elements of one fp32 reduction tile (default ``mean_row_tile``; x 4 B must stay
    within the 64 KiB reduction limit); ``rows_per_task``: most short rows batched into one tile
    (``mean_rows_per_task``); ``inner_tile``: contiguous inner elements per task when ``dim`` is
    not the last (``mean_inner_tile``); ``split``: "auto", "ub" (one kernel) or "gm" (partials
    through GM workspace, a second kernel).
    """
    prof = load_profile(profile)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "x", WHERE)
    inputs.check_size(shape, "x", WHERE)
    dtype = inputs.storage_dtype(dtype, WHERE)
    d = inputs.axis(dim, len(shape), "dim", WHERE)
    if not isinstance(keepdim, (bool, np.bool_)):
        raise ConstraintError(f"{WHERE}: keepdim must be a bool, got {keepdim!r}")
    if split not in SPLITS:
        raise ConstraintError(f"{WHERE}: split must be one of {SPLITS}, got {split!r}")
    row_tile = prof.tile("mean_row_tile") if row_tile is None else inputs.positive_int(row_tile, "row_tile", WHERE)
    rows_per_task = (prof.tile("mean_rows_per_task") if rows_per_task is None
                     else inputs.positive_int(rows_per_task, "rows_per_task", WHERE))
    inner_tile = (prof.tile("mean_inner_tile") if inner_tile is None
                  else inputs.positive_int(inner_tile, "inner_tile", WHERE))
    outer = _math.prod(shape[:d])
    length = shape[d]
    inner = _math.prod(shape[d + 1:])
    block = prof.align_bytes // dtypes.itemsize(dtype)
    hint = (f"use row_tile <= {prof.reduce_tile_max_bytes // 4} (fp32 elements per reduction tile) "
            f"and tiles that are multiples of {block} elements")
    if inner == 1:
        k1, p1 = _rows_kernel_plan("mean_rows", outer, length, dtype, dtype, True, split, prof,
                                   row_tile, rows_per_task, hint)
        kernels, steps = [k1], [p1]
        if not p1["finish"]:  # split: kernel 1 wrote fp32 partials
            k2, p2 = _rows_kernel_plan("mean_rows_finish", outer, p1["groups"], "fp32", dtype, True, "ub",
                                       prof, row_tile, rows_per_task, hint)
            kernels.append(k2)
            steps.append(p2)
    else:
        k1, p1 = _strided_kernel_plan("mean_strided", outer, length, inner, dtype, dtype, True, split,
                                      prof, row_tile, inner_tile, hint)
        kernels, steps = [k1], [p1]
        if not p1["finish"]:  # split: kernel 1 wrote fp32 partials
            k2, p2 = _strided_kernel_plan("mean_strided_finish", outer, p1["groups"], inner, "fp32", dtype,
                                          True, "ub", prof, row_tile, inner_tile, hint)
            kernels.append(k2)
            steps.append(p2)
    out_shape = shape[:d] + ((1,) if keepdim else ()) + shape[d + 1:]
    params = dict(dim=d, keepdim=bool(keepdim), outer=outer, length=length, inner=inner,
                  out_shape=out_shape, split="gm" if len(kernels) == 2 else "ub",
                  row_tile=row_tile, rows_per_task=rows_per_task, inner_tile=inner_tile, steps=tuple(steps))
    return Plan(op="mean", strategy="sum_div", dtype=dtype, profile=prof, kernels=tuple(kernels),
                params=params, hint=hint)


# ---------------------------------------------------------------------------------------------
# public strategy


def _serial_copy(fn, name):
    """The same kernel body compiled without ``parallel`` (prange runs as range), own cache entry."""
    f = types.FunctionType(fn.__code__, fn.__globals__, name, fn.__defaults__, fn.__closure__)
    f.__qualname__ = name
    f.__doc__ = fn.__doc__
    return kernel(parallel=False)(f)


# The finishing kernel of a split sums a few fp32 partials. When they are small its tile tasks run
# one after the other on the calling thread: a parallel launch right after the big one costs more
# than those microseconds of work (docs/performance.md). Same tasks, counts and bits; only the CPU
# schedule differs.
SERIAL_FINISH_BYTES = 1 << 20
_rows_kernel_serial = _serial_copy(_rows_kernel.py_func, "_rows_kernel_serial")
_strided_kernel_serial = _serial_copy(_strided_kernel.py_func, "_strided_kernel_serial")


def _launch(step, src, dst, outer, length, inner, divisor, scratch, cm, after_split=False):
    serial = after_split and src.nbytes <= SERIAL_FINISH_BYTES
    if step["kernel"] == "rows":
        k = _rows_kernel_serial if serial else _rows_kernel
        return k(src, dst, outer, length, step["col_tile"], step["rows_per_tile"],
                 step["tiles_per_task"], step["groups"], step["finish"], divisor, cm)
    k = _strided_kernel_serial if serial else _strided_kernel
    return k(src, dst, outer, length, inner, step["inner_tile"], step["l_tile"],
             step["ltiles_per_task"], step["groups"], step["finish"], divisor, scratch, cm)


@register("mean", "sum_div", plan=plan_sum_div, summary="fp32 sum over dim, divide by its length, cast back")
def sum_div(x, dim=-1, keepdim=False, *, profile=None, row_tile=None, rows_per_task=None,
            inner_tile=None, split="auto", cast_mode=None):
    """Mean over ``dim``: widen to fp32, sum, divide by ``x.shape[dim]``, cast back to x's dtype.

    ``dim``: int, negative allowed. ``keepdim``: keep the reduced dim with length 1. Tile options
    and ``split`` as :func:`plan_sum_div`. ``cast_mode``: the rounding of the final fp32 ->
    bf16/fp16 cast (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint).
    """
    xt = inputs.tensor(x, "x", WHERE)
    cm = resolve_cast_mode(cast_mode, profile, WHERE, narrows=xt.dtype != "fp32")
    p = plan_sum_div(xt.shape, xt.dtype, dim=dim, keepdim=keepdim, profile=profile, row_tile=row_tile,
                     rows_per_task=rows_per_task, inner_tile=inner_tile, split=split)
    prm = p.params
    outer, length, inner = prm["outer"], prm["length"], prm["inner"]
    steps = prm["steps"]
    out, out_k = dtypes.empty(prm["out_shape"], xt.dtype)
    width = max(s.get("inner_tile", 1) for s in steps)
    scratch = tile.scratch(width if inner > 1 else 1, np.float32, 2)
    src = xt.kview.reshape(-1)
    with Launch(p, [xt.shape]) as run:
        if len(steps) == 1:
            run.count(_launch(steps[0], src, out_k.reshape(-1), outer, length, inner, length, scratch, cm))
        else:
            groups = steps[0]["groups"]
            ws = np.empty(outer * groups * inner, np.float32)  # GM workspace: fp32 partials
            run.count(_launch(steps[0], src, ws, outer, length, inner, 1.0, scratch, dtypes.RINT),
                      workspace_bytes=ws.nbytes)
            run.count(_launch(steps[1], ws, out_k.reshape(-1), outer, groups, inner, length, scratch, cm,
                              after_split=True))
        run.workspace(xt.copied_bytes)
    return out


# --- lab spec ---
# What compare, advise and report need to know about mean (pypto_numba/lab/spec.py).

def _reference_mean(x, dim: int = -1, keepdim: bool = False):
    from .reference import f64

    return f64(x).mean(axis=dim, keepdims=keepdim)


def _mean(profile, shape=(8, 4096), dim=-1, dtype="bf16"):
    from .lab import Candidate

    return [Candidate("sum_div", lambda: (plan_sum_div(shape, dtype, dim=dim, profile=profile),))], None, ()


def _mean_tiles(profile, shape, dim, dtype):
    """tune.search's space: reduction tiles of 2048 to 16384 fp32 elements x 1 to 32 rows per task
    (dim last), or inner tiles of 256 to 4096 (dim not last)."""
    from .lab import Candidate
    from .lab.spec import grid, pow2

    last = dim in (-1, len(shape) - 1)
    axes = (dict(row_tile=pow2(2048, 16384), rows_per_task=pow2(1, 32)) if last else
            dict(row_tile=pow2(2048, 16384), inner_tile=pow2(256, 4096)))
    for kw in grid(**axes):
        yield Candidate("sum_div", lambda kw=kw: (plan_sum_div(shape, dtype, dim=dim, profile=profile, **kw),),
                        tiles=kw, shape=tuple(shape))


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed, normal

    return OpSpec(
        name="mean",
        seed=Seed("sum_div", None, "sum(dim)/N with the fp32 cast before sum; no alternative"),
        inputs=Inputs(make=lambda shape, dtype, rng: (normal(shape, dtype, rng, 1.0, 0.5),),
                      default_shape=(8, 4096),
                      help="x shape, e.g. 8,4096 (reduced over --dim, default -1)"),
        reference=lambda x, strategy, dim=-1, keepdim=False, **o: _reference_mean(x, dim, keepdim),
        advise=_mean,  # named as advise's old rule: its TypeError names it
        oracles={"mean": _reference_mean},
        tiles=_mean_tiles,
    )


OP = _lab_spec()
