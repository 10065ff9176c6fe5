"""attention.write_kv: the paged KV cache's write (vLLM's reshape_and_cache), for paged.py's layout."""

from __future__ import annotations

import numpy as np

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError


def write_kv(k_cache, v_cache, k_new, v_new, slot_mapping):
    """Write T new tokens into the paged caches in place (vLLM's reshape_and_cache).

    ``k_new [T, Hkv, D]``, ``v_new [T, Hkv, Dv]`` in the caches' dtype; ``slot_mapping[T]`` int32 or
    int64, ``slot = block * block_size + offset``, -1 skips the token (padding). Token t goes to
    ``k_cache[slot // block_size, slot % block_size] = k_new[t]`` (and v alike). Slots must lie in
    ``[0, num_blocks * block_size)`` and be distinct (-1 excepted). Returns None. A validated NumPy
    assignment, not a registered strategy (it has no plan or counted cost)."""
    where = "attention.write_kv"
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
    slots = slot_mapping.astype(np.int64)
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
    blocks, offs = slots[live] // bs, slots[live] % bs
    k_cache[blocks, offs] = kn.array[live]
    v_cache[blocks, offs] = vn.array[live]
