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

Defaults: ``row_tile`` from the profile key ``embedding_row_tile``; ``h_tile`` is the largest
32-byte-aligned width for which the row tile takes at most half of UB (the other half is the
double buffer of the next task), capped at H rounded up to the alignment.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange

from . import inputs
from .errors import DTypeError, ShapeError
from .machine import dtypes
from .machine.jit import kernel
from .machine.plan import ITEMSIZE, KernelPlan, Plan, align_elems, vector_tile
from .machine.profile import load_profile
from .strategy import Launch, register

ID_DTYPES = {np.dtype(np.int32): "int32", np.dtype(np.int64): "int64"}
_COPY_VIEW = {"fp32": np.uint32, "bf16": np.uint16, "fp16": np.uint16}  # bits are copied as-is


# ---------------------------------------------------------------------------------------------
# kernel: one prange iteration = ``row_tile`` ids x ``h_tile`` columns


@kernel(boundscheck=False)
def _gather_kernel(weight, ids, out, row_tile, h_tile):
    n = ids.size
    H = weight.shape[1]
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
        for r in range(rb, rb + vr):
            # ids were range-checked before the launch. Flat views and uint64 indices: numba
            # wraps negative int indices, and with a run-time offset that select stops LLVM
            # from vectorising the row copy; no per-row views either (a view bumps the shared
            # array's reference count atomically, from both threads on one cache line).
            src = np.uint64(ids[r]) * np.uint64(H) + ob
            dst = np.uint64(r) * np.uint64(H) + ob
            for c in range(np.uint64(vh)):
                out_flat[dst + c] = w_flat[src + c]
        tasks += 1
        gm_read += vr * ids.itemsize + vr * vh * weight.itemsize
        gm_write += vr * vh * out.itemsize
    return tasks, gm_read, gm_write, 0, 0


# ---------------------------------------------------------------------------------------------
# plans


def _plan(strategy, weight_shape, ids_shape, dtype, ids_dtype, profile, row_tile, h_tile) -> Plan:
    prof = load_profile(profile)
    where = f"embedding.{strategy}"
    if dtypes.storage_name(dtype) is None:
        raise DTypeError(f"{where}: dtype must be one of fp32, bf16, fp16 (or their numpy dtypes), got {dtype!r}")
    dtype = dtypes.storage_name(dtype)
    weight_shape = tuple(int(d) for d in weight_shape)
    ids_shape = tuple(int(d) for d in ids_shape)
    if len(weight_shape) != 2:
        raise ShapeError(f"{where}: weight must be [V, H], got shape {weight_shape}")
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
    row_tile = prof.tile("embedding_row_tile") if row_tile is None else inputs.positive_int(row_tile, "row_tile", where)
    block = max(1, prof.align_bytes // b)
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
    copied = 0
    if not ids.flags.c_contiguous:
        ids = np.ascontiguousarray(ids)
        copied = ids.nbytes
    bad = (ids < 0) | (ids >= vocab)
    if bad.any():
        flat = int(np.argmax(bad.reshape(-1)))
        pos = tuple(int(i) for i in np.unravel_index(flat, ids.shape))
        value = int(ids.reshape(-1)[flat])
        raise IndexError(
            f"{where}: ids{list(pos)} = {value} is out of range [0, {vocab}) for weight with "
            f"V = {vocab} rows (first bad id in C order)"
        )
    return ids, name, copied


def _run(strategy, weight, ids, profile, row_tile, h_tile, out=None):
    where = f"embedding.{strategy}"
    wt = inputs.tensor(weight, "weight", where, min_rank=2, max_rank=2)
    if strategy == "index_select" and isinstance(ids, np.ndarray) and ids.ndim not in (1, 2):
        raise ShapeError(
            f"{where}: ids must be 1-D or 2-D (PyPTO index_select takes a 1-2 D index), got shape "
            f"{ids.shape}; use embedding.gather for ids of any shape"
        )
    ids, ids_dtype, ids_copied = _check_ids(ids, wt.shape[0], where)
    p = _plan(strategy, wt.shape, ids.shape, wt.dtype, ids_dtype, profile, row_tile, h_tile)
    h = wt.shape[1]
    if out is None:
        out = np.empty(ids.shape + (h,), dtypes.STORAGE[wt.dtype])
    elif not (isinstance(out, np.ndarray) and out.shape == ids.shape + (h,)
              and out.dtype == wt.array.dtype and out.flags.c_contiguous):
        raise ShapeError(
            f"{where}: out must be a C-contiguous {wt.array.dtype} array of shape {ids.shape + (h,)}, "
            f"got {getattr(out, 'dtype', type(out).__name__)} {getattr(out, 'shape', '')}"
        )
    view = _COPY_VIEW[wt.dtype]
    with Launch(p, [wt.shape, ids.shape]) as run:
        run.count(_gather_kernel(wt.array.view(view), ids.reshape(-1), out.view(view).reshape(-1, h),
                                 p.params["row_tile"], p.params["h_tile"]))
        run.workspace(wt.copied_bytes + ids_copied)
    return out


@register("embedding", "gather", plan=plan_gather, summary="gather rows by ids of any shape (no flatten)")
def gather(weight, ids, *, profile=None, row_tile=None, h_tile=None, out=None):
    """``weight[ids]``: ``weight[V, H]``, int32/int64 ``ids`` of any shape -> ``[*ids.shape, H]``.

    ``out``: optional preallocated result (C-contiguous, the weight's dtype, ``[*ids.shape, H]``);
    reusing it saves the page faults of a fresh result (~10-20 ms for 64 MB on this machine).
    """
    return _run("gather", weight, ids, profile, row_tile, h_tile, out)


@register("embedding", "index_select", plan=plan_index_select, summary="index_select rows by 1-D/2-D ids")
def index_select(weight, ids, *, profile=None, row_tile=None, h_tile=None, out=None):
    """``weight[ids]`` for 1-D or 2-D ``ids`` (higher rank: use :func:`gather`); ``out`` as gather."""
    return _run("index_select", weight, ids, profile, row_tile, h_tile, out)
