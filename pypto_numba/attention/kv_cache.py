"""attention.write_kv: the paged KV cache's write (vLLM's reshape_and_cache), for paged.py's layout:
one vector copy kernel (counted), planned by :func:`plan_write_kv`."""

from __future__ import annotations

import numpy as np
from numba import prange

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError
from ..machine import dtypes
from ..machine.jit import kernel
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan, align_elems, vector_tile
from ..machine.profile import load_profile, resolve_cast_mode
from ..strategy import Launch

SLOT_ENTRY_BYTES = 8  # one int64 slot_mapping entry (write_kv hands the kernel int64 slots)
# a task's UB staging tile: up to 32 KiB of tokens' K (or V) rows, as repeat_kv's copy (GM-bound:
# larger tiles buy nothing, and a task per token would pay the task overhead T times)
_TILE_BYTES = 32768


@kernel
def _write_kv_kernel(k_cache, v_cache, k_new, v_new, slots, per):
    """Task i copies tokens ``i*per ..`` (their K and V rows ``[Hkv, D]``) to their slots (-1: skipped)."""
    bs = np.int64(k_cache.shape[1])
    T, Hkv, D = k_new.shape
    Dv = v_new.shape[2]
    row = np.int64(Hkv * (D + Dv) * k_new.itemsize)
    tasks = 0
    gm_read = 0
    gm_write = 0
    for task in prange((T + per - 1) // per):
        tasks += 1
        for t in range(task * per, min(task * per + per, T)):
            s = slots[t]
            gm_read += SLOT_ENTRY_BYTES
            if s >= 0:
                blk = np.uint64(s // bs)
                off = np.uint64(s % bs)
                ut = np.uint64(t)
                for h in range(Hkv):
                    uh = np.uint64(h)
                    for d in range(D):
                        k_cache[blk, off, uh, np.uint64(d)] = k_new[ut, uh, np.uint64(d)]
                    for d in range(Dv):
                        v_cache[blk, off, uh, np.uint64(d)] = v_new[ut, uh, np.uint64(d)]
                gm_read += row
                gm_write += row
    return tasks, gm_read, gm_write, 0, 0


@memo_plan
def plan_write_kv(new_shape, cache_shape, dtype="fp32", *, v_dim=None, tokens=None, profile=None) -> Plan:
    """Plan of :func:`write_kv`: one vector kernel, a task per ``per`` new tokens (their K, then V
    rows staged through one UB tile ``[per*Hkv, D]`` of <= 32 KiB). GM read = written =
    ``tokens x Hkv x (D + Dv) x b`` (``tokens``: the new tokens with a slot, default all T), plus
    ``T x 8`` B of int64 slots read.

    ``new_shape``: k_new's ``[T, Hkv, D]``; ``cache_shape``: ``[num_blocks, block_size, Hkv, D]``;
    ``v_dim``: v's last dim (None: D)."""
    where = "attention.write_kv"
    prof = load_profile(profile)
    dtype = inputs.storage_dtype(dtype, where)
    T, Hkv, D = (int(x) for x in new_shape)
    if len(cache_shape) != 4 or tuple(int(x) for x in cache_shape[2:]) != (Hkv, D):
        raise ShapeError(f"{where}: new tokens {tuple(new_shape)} [T, Hkv, D] and cache {tuple(cache_shape)} "
                         f"[num_blocks, block_size, Hkv, D] must share Hkv and D")
    Dv = D if v_dim is None else int(v_dim)
    live = T if tokens is None else int(tokens)
    if not 0 <= live <= T:
        raise ConstraintError(f"{where}: tokens={live} must lie in [0, T = {T}] (the new tokens with a slot)")
    b = dtypes.itemsize(dtype)
    cols = align_elems(max(D, Dv), dtype, prof)
    per = max(1, min(T, _TILE_BYTES // (Hkv * cols * b)))
    buf = vector_tile("kv_ub", (per * Hkv, cols), dtype, prof, where)
    moved = live * Hkv * (D + Dv) * b
    k = KernelPlan(name="write_kv", unit="vector", tasks=-(-T // per), buffers=(buf,),
                   gm_read_bytes=moved + T * SLOT_ENTRY_BYTES, gm_write_bytes=moved, workspace_bytes=0)
    return Plan(op="attention", strategy="write_kv", dtype=dtype, profile=prof, kernels=(k,),
                params={"tokens": live, "per_task": per, "block_size": int(cache_shape[1])})


def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping, *, profile=None, cast_mode=None):
    """Write T new tokens into the paged caches in place (vLLM's reshape_and_cache).

    ``k_new [T, Hkv, D]``, ``v_new [T, Hkv, Dv]`` in the caches' dtype; ``slot_mapping[T]`` int32 or
    int64, ``slot = block * block_size + offset``, -1 skips the token (padding). Token t goes to
    ``k_cache[slot // block_size, slot % block_size] = k_new[t]`` (and v alike). Slots must lie in
    ``[0, num_blocks * block_size)`` and be distinct (-1 excepted). Returns None. One counted copy
    kernel (:func:`plan_write_kv`), recorded by ``trace()`` as ``attention.write_kv``; not a
    registered strategy (compare/advise do not list it). ``cast_mode`` is accepted and has no
    effect: tokens are copied bit for bit (a bad mode name is still an error)."""
    where = "attention.write_kv"
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, where)
    for name, x in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not isinstance(x, np.ndarray) or x.ndim != 4:
            raise ShapeError(f"{where}: {name} must be a numpy array [num_blocks, block_size, Hkv, D], got "
                             f"{getattr(x, 'shape', type(x).__name__)}")
        if not x.flags.c_contiguous or not x.flags.writeable:
            raise ConstraintError(f"{where}: {name} must be a writeable C-contiguous array (it is written in "
                                  f"place); allocate it with numpy.empty/zeros")
    kc = inputs.tensor(k_cache, "k_cache", where, min_rank=4, max_rank=4)
    vc = inputs.tensor(v_cache, "v_cache", where, min_rank=4, max_rank=4)
    kn = inputs.tensor(k_new, "k_new", where, min_rank=3, max_rank=3)
    vn = inputs.tensor(v_new, "v_new", where, min_rank=3, max_rank=3)
    inputs.same_dtype(where, k_cache=kc, v_cache=vc, k_new=kn, v_new=vn)
    NB, bs, Hkv, D = kc.shape
    if vc.shape[:3] != kc.shape[:3]:
        raise ShapeError(f"{where}: k_cache {kc.shape} and v_cache {vc.shape} must share "
                         f"[num_blocks, block_size, Hkv]")
    T = kn.shape[0]
    if kn.shape != (T, Hkv, D) or vn.shape != (T, Hkv, vc.shape[3]):
        raise ShapeError(f"{where}: k_new {kn.shape} and v_new {vn.shape} must be [T, Hkv, D] = "
                         f"[T, {Hkv}, {D}] and [T, {Hkv}, {vc.shape[3]}] (the caches' heads and dims)")
    if not isinstance(slot_mapping, np.ndarray) or slot_mapping.dtype not in (np.int32, np.int64):
        raise DTypeError(f"{where}: slot_mapping must be a numpy int32 or int64 array [T], got "
                         f"{getattr(slot_mapping, 'dtype', type(slot_mapping).__name__)}; use "
                         f"numpy.asarray(slots, numpy.int64)")
    if slot_mapping.shape != (T,):
        raise ShapeError(f"{where}: slot_mapping must have shape [T] = ({T},), one slot per new token, "
                         f"got {slot_mapping.shape}")
    slots = np.ascontiguousarray(slot_mapping, dtype=np.int64)
    bad = np.flatnonzero((slots < -1) | (slots >= NB * bs))
    if bad.size:
        t = int(bad[0])
        raise ConstraintError(f"{where}: slot_mapping[{t}] = {int(slots[t])} is outside [0, num_blocks * "
                              f"block_size = {NB * bs}) (or -1 to skip the token)")
    live = np.flatnonzero(slots >= 0)
    uniq, counts = np.unique(slots[live], return_counts=True)
    if (counts > 1).any():
        s = int(uniq[np.argmax(counts > 1)])
        ts = [int(t) for t in live[slots[live] == s]]
        raise ConstraintError(f"{where}: slot {s} appears more than once in slot_mapping (tokens {ts}); each "
                              f"slot holds one token: give each a distinct slot, or -1 to skip")
    p = plan_write_kv(kn.shape, kc.shape, kn.dtype, v_dim=vn.shape[2], tokens=live.size, profile=profile)
    with Launch(p, (kc.shape, vc.shape, kn.shape, vn.shape, slots.shape)) as run:
        run.count(_write_kv_kernel(kc.kview, vc.kview, kn.kview, vn.kview, slots, np.int64(p.params["per_task"])))
        run.workspace(kn.copied_bytes + vn.copied_bytes)
