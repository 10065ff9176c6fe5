"""attention.flash: the fused kernel: query tiles x KV tiles, state on-chip, masked tiles skipped.

One tile task per (batch, KV head, query tile[, KV split]) (on the CPU, prefill tasks walk
``tasks.Q_GROUP`` query tiles of a KV head together); the [R = G*qv, D] query block (G
heads of the KV head, qv query positions) walks its KV tiles with the running max/sum/output kept
on-chip (UB), so no state traffic reaches GM. Tiles that are fully masked for every row of the
block are not run: with ``kv_len``, bottom-right ``causal`` and a ``window`` the allowed keys of a
row are a range ``[lo, hi)`` that moves right with the row (tiles.key_range), so the block runs the
tiles from the one holding its first row's ``lo`` to the one holding its last row's ``hi`` (a
sliding-window decode reads about W keys, not the cache). P is rounded to the storage dtype
before P@V, as on the NPU. Sinks join each row's state after its last tile (the combine's, with
split-KV), soft-capping is part of the tile softmax (tiles.tile_softmax).

Split-KV (flash-decoding): with fewer blocks than the profile has cube cores, the T run tiles of a
block are divided into ``num_splits`` contiguous ranges (``ceil(T / num_splits)`` tiles each); each
split writes its partial (m, l, O) to GM workspace and a combine kernel merges them with
log-sum-exp weights ``exp(m_s - max m)``. ``num_splits=None`` picks ``cube_cores // blocks``.

Traffic (b = itemsize, R rows, n valid keys of a run tile, state row (Dv + 2)*4 B)::

    1 kernel   read Q R*D*b per task + run tiles' K and V (n*(D+Dv)*b) [+ mask R*n*mb, mb its itemsize];
               write R*Dv*b [+ lse R*4] [+ sinks read R*4]
    split      kernel 1 writes R*(Dv+2)*4 per task instead of the output; kernel 2 (combine)
               reads num_splits*R*(Dv+2)*4 [+ sinks R*4] per block and writes R*Dv*b [+ R*4]
               workspace num_splits*B*Hq*Sq*(Dv+2)*4
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import prange

from .. import inputs
from ..errors import ConstraintError
from ..machine import cube, dtypes, tile
from ..machine.jit import device, kernel
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan, reduce_tile
from ..machine.profile import load_profile, resolve_cast_mode
from ..machine.scratch import Regions
from ..machine.vmath import exp as vexp
from ..strategy import Launch, register
from .gqa_clone import expand_plans, run_expand
from .plans import check_ub, choose_q_tile, cube_buffers, kv_len_array, merge_cube, ub_tile
from .tasks import block_geometry, group_task, query_group, query_tile
from .tiles import (
    FINAL_ELEM_OPS,
    GEMM_MIN_ROWS,
    NEG_INF,
    PV_STORAGE,
    RES_SLOTS,
    SINK_ELEM_OPS,
    SINK_ROW_OPS,
    key_range,
    load_q_block,
    merge_sink,
    merge_state,
    packed_keys,
    reset_state,
    tile_cube_flops,
    tile_pv,
    tile_pv_scores,
    tile_scores,
    tile_softmax,
    tile_vector_ops,
    write_lse,
    tile_span,
    write_out,
)
from .validation import check_gqa, check_softcap, check_window, mask_itemsize, prepare, shapes_of

COMBINE_ROW_OPS = 3  # per row and split: max, sub, exp of the weight
COMBINE_ELEM_OPS = 2  # per output element and split: w*O_s and the add
LSE_ROW_OPS = 2  # log and add
COMBINE_SINK_OPS = 4  # per row: the sink in the max, and exp(sink - m) (sub, exp) added to l

# the kernel's per-thread scratch regions, in slab order (scratch_layout gives their bounds); the
# running states are another slab (see the kernel)
_SCRATCH = Regions("q_blocks", "scores", "p_tile", "o_tile", "m_tile", "l_tile", "dot_results")
_Q_BLOCKS, _SCORES, _P_TILE, _O_TILE, _M_TILE, _L_TILE, _DOT_RESULTS = _SCRATCH.indices
_STATE = Regions("m", "l", "o")  # one query tile's running state
_STATE_M, _STATE_L, _STATE_O = _STATE.indices


@kernel
def _flash_kernel(
    q,
    k,
    v,
    out,
    lse,
    want_lse,
    kv_len,
    causal,
    left,
    right,
    scale,
    softcap,
    has_mask,
    mask,
    msb,
    msh,
    msi,
    msj,
    has_sinks,
    sinks,
    qt,
    qg,
    kv_tile,
    n_split,
    kt,
    scratch,
    scratch_at,
    state,
    state_at,
    part_m,
    part_l,
    part_o,
    cm,
):
    """One prange iteration walks ``qg`` consecutive query tiles of one (batch, KV head[, split])
    through their KV tiles together (:func:`tasks.query_group`); each query tile is its own NPU task.

    Parameters
    ----------
    q, k, v, out : kernel views [B, Hq, Sq, D], [B, Hkv, Skv, D], [B, Hkv, Skv, Dv], [B, Hq, Sq, Dv]
    lse, want_lse : fp32 [B, Hq, Sq] log-sum-exp, written when want_lse (and n_split == 1)
    kv_len : int64 [B]; causal, left, right, scale, softcap : the validated options (the window's
    bounds, validation.check_window; softcap 0: none)
    has_mask, mask, msb, msh, msi, msj : the flat mask as stored (tiles.mask_term), its (b, h, i, j)
    element strides
    has_sinks, sinks : fp32 [Hq] sink logits (with split-KV the combine adds them)
    qt, qg, kv_tile : query positions per tile, query tiles per CPU task, keys per KV tile
    n_split : KV splits per block (> 1: partials to part_*, merged by :func:`_combine_kernel`)
    kt : K packed transposed (tiles.packed_keys; empty for decode-shaped tiles)
    scratch, scratch_at : per-thread slabs and their region bounds (:func:`scratch_layout`)
    state, state_at : per-thread running states, ``qg`` of (m, l, O) each, and one's bounds
    (:func:`state_layout`)
    part_m, part_l, part_o : split partials [n_split, blocks, ...] (unused when n_split == 1)
    cm : the cast mode of P and of the output (a ``dtypes.CastMode``: one compiled kernel per mode)

    Returns the counters (tasks, gm_read, gm_write, vector_ops, cube_flops).
    """
    B, Hq, Sq, D, Hkv, Skv, Dv, G, nq, ng, Rmax = block_geometry(q, k, v, qt, qg)
    b_sz = q.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    cube_flops = 0
    for it in prange(B * Hkv * ng * n_split):
        sp = it // (B * Hkv * ng)  # split-major: the tasks of one split are contiguous
        grp = it - sp * (B * Hkv * ng)
        b, kvh, q_lo, members = group_task(grp, Hkv, nq, qg)
        sc = scratch[numba.get_thread_id()]
        at = scratch_at
        qb = at[_Q_BLOCKS]
        s = sc[at[_SCORES]:at[_SCORES + 1]]
        ph = sc[at[_P_TILE]:at[_P_TILE + 1]]
        ot = sc[at[_O_TILE]:at[_O_TILE + 1]]
        mt = sc[at[_M_TILE]:at[_M_TILE + 1]]
        lt = sc[at[_L_TILE]:at[_L_TILE + 1]]
        res = sc[at[_DOT_RESULTS]:at[_DOT_RESULTS + 1]]
        # the running states get their own array (as slices of the tile scratch, the final read
        # of l was miscompiled: reordered before the merge's write, seen with numba 0.68)
        st = state[numba.get_thread_id()]
        sw = state_at[_STATE_O + 1]  # one member's state: m, l, O (state_layout), qg of them
        om = state_at[_STATE_M]
        ol = state_at[_STATE_L]
        oo = state_at[_STATE_O]
        t_first = 1 << 62
        t_last = 0
        for u in range(members):
            i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
            lo, hi = _split_tiles(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile, n_split, sp)
            t_first = min(t_first, lo)
            t_last = max(t_last, hi)
            m0 = u * sw
            reset_state(st[m0 + om:m0 + ol], st[m0 + ol:m0 + oo], st[m0 + oo:m0 + sw], R, Dv)
            load_q_block(q, b, kvh, G, i0, qv, sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D])
            gm_read += R * D * b_sz
        for t in range(t_first, t_last):
            j0 = t * kv_tile
            n = min(kv_tile, Skv - j0)
            for u in range(members):
                i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
                lo, hi = _split_tiles(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile, n_split, sp)
                if t < lo or t >= hi:
                    continue
                use_gemm = R >= GEMM_MIN_ROWS
                piped = members == 1 and not use_gemm  # decode: a tile's P @ V with the next's Q K^T
                m0 = u * sw
                qf = sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D]  # this query tile's Q block
                if not piped or t == lo:  # else the previous tile's walk scored this one
                    tile_scores(qf, R, k, b, kvh, j0, n, s, kt, kv_tile, use_gemm, res)
                nmax = tile_softmax(s, R, n, j0, b, kvh, G, i0, qv, Sq, Skv, kv_len, causal, left, right,
                                    scale, softcap, has_mask, mask, msb, msh, msi, msj, mt, lt, ph, ph,
                                    PV_STORAGE, q, cm)
                if piped and t + 1 < hi:
                    j1 = j0 + kv_tile
                    tile_pv_scores(ph, R, n, v, b, kvh, j0, ot, nmax, qf, k, j1, min(kv_tile, Skv - j1), s, res)
                else:
                    tile_pv(ph, R, n, v, b, kvh, j0, ot, use_gemm, nmax)
                merge_state(st[m0 + om:m0 + ol], st[m0 + ol:m0 + oo], st[m0 + oo:m0 + sw],
                            mt, lt, ot, R, Dv)
                gm_read += n * D * b_sz + n * Dv * b_sz
                if has_mask:
                    gm_read += R * n * mask.itemsize
                vector_ops += tile_vector_ops(R, n, Dv, has_mask, PV_STORAGE, softcap)
                cube_flops += tile_cube_flops(R, n, D, Dv, PV_STORAGE)
        for u in range(members):
            qi = q_lo + u
            i0, qv, R = query_tile(qi, qt, Sq, G)
            m0 = u * sw
            rd, wr, ops = finish_block(st[m0 + om:m0 + ol], st[m0 + ol:m0 + oo], st[m0 + oo:m0 + sw], R, Dv,
                                       out, lse, want_lse, b, kvh, G, i0, qv, has_sinks, sinks, n_split, sp,
                                       (b * Hkv + kvh) * nq + qi, part_m, part_l, part_o, cm)
            gm_read += rd
            gm_write += wr
            vector_ops += ops
            tasks += 1
    return tasks, gm_read, gm_write, vector_ops, cube_flops


@device
def finish_block(ms, ls, os, R, Dv, out, lse, want_lse, b, kvh, G, i0, qv, has_sinks, sinks, n_split, sp, blk,
                 part_m, part_l, part_o, cm):
    """The end of a query tile's walk: the sinks, the output and the lse, or (``n_split > 1``)
    the split's partial state for :func:`_combine_kernel` -> (GM read, GM write, vector ops)."""
    rd = 0
    wr = 0
    ops = 0
    if n_split == 1:
        if has_sinks:
            merge_sink(ms, ls, os, R, Dv, sinks, kvh, G, qv)
            rd += R * 4
            ops += R * (SINK_ROW_OPS + SINK_ELEM_OPS * Dv)
        write_out(os, ls, R, Dv, out, b, kvh, G, i0, qv, cm)
        wr += R * Dv * out.itemsize
        ops += R * Dv * FINAL_ELEM_OPS
        if want_lse:
            write_lse(ms, ls, R, lse, b, kvh, G, i0, qv)
            wr += R * 4
            ops += R * LSE_ROW_OPS
        return rd, wr, ops
    pm = part_m[sp, blk]
    pl = part_l[sp, blk]
    po = part_o[sp, blk]
    for r in range(R):
        pm[r] = ms[r]
        pl[r] = ls[r]
    for i in range(R * Dv):
        po[i] = os[i]
    return rd, R * (Dv + 2) * 4, ops


@device
def _split_tiles(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile, n_split, sp):
    """KV tiles [lo, hi) that split ``sp`` of the query tile at ``i0`` (``qv`` rows) runs: its
    ``T`` run tiles ``[t0, t0 + T)`` (from its first row's first allowed key to its last row's
    last, :func:`run_span`) cut into ``n_split`` ranges of ``ceil(T/n_split)``."""
    t0, t1 = run_span(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile)
    T = t1 - t0
    per = (T + n_split - 1) // n_split
    lo = t0 + min(sp * per, T)
    return lo, min(lo + per, t1)


@device
def run_span(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile):
    """The KV tiles ``[t0, t1)`` the query tile at ``i0`` (``qv`` positions) runs: the allowed
    keys of a row are a range that moves right with the row, so the block's keys are its first
    row's ``lo`` to its last row's ``hi``."""
    lo, _ = key_range(b, i0, Sq, Skv, kv_len, causal, left, right)
    _, hi = key_range(b, i0 + qv - 1, Sq, Skv, kv_len, causal, left, right)
    return tile_span(lo, hi, kv_tile)


# The combine is a separate NPU kernel (counted as one), but on the CPU it runs on the calling
# thread: it touches num_splits*B*Hq*Sq*(Dv+2) floats (split-KV only runs when there are fewer
# blocks than cores, so a few KiB), and a parallel region costs a wake-up of the other thread,
# which on a loaded host can take as long as the whole decode step.
@kernel(parallel=False)
def _combine_kernel(part_m, part_l, part_o, out, lse, want_lse, Hkv, qt, has_sinks, sinks, cm):
    """The split partials merged by log-sum-exp weights; the output cast by cast mode ``cm``."""
    n_split = part_m.shape[0]
    B, Hq, Sq, Dv = out.shape
    G = Hq // Hkv
    nq = (Sq + qt - 1) // qt
    b_sz = out.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    w = np.empty(n_split, np.float32)  # a row's split weights exp(m_s - m) (one buffer: a serial kernel)
    o = np.empty(Dv, np.float32)  # a row's weighted sum, split by split (vectorises over d)
    for blk in prange(B * Hkv * nq):
        b = blk // (Hkv * nq)
        rem = blk - b * (Hkv * nq)
        kvh = rem // nq
        qi = rem - kvh * nq
        i0 = qi * qt
        qv = min(qt, Sq - i0)
        R = G * qv
        for r in range(R):
            g = r // qv
            ii = r - g * qv
            h = kvh * G + g
            m = NEG_INF
            for sp in range(n_split):
                pm = part_m[sp, blk, r]
                m = pm if pm != pm else max(m, pm)  # a NaN split max makes the row NaN
                if m != m:
                    break
            if has_sinks and m == m:  # the sink column (no value) is in the row max
                m = max(m, sinks[h])
            l = np.float32(0.0)
            if m == NEG_INF:
                for d in range(Dv):
                    out[b, h, i0 + ii, d] = dtypes.narrow(out, np.float32(0.0))
                if want_lse:
                    lse[b, h, i0 + ii] = NEG_INF
                continue
            for sp in range(n_split):
                w[sp] = vexp(part_m[sp, blk, r] - m)
                l += w[sp] * part_l[sp, blk, r]
            if has_sinks:
                l += vexp(sinks[h] - m)
            inv = np.float32(1.0) / l
            o[:] = np.float32(0.0)
            for sp in range(n_split):
                ws = w[sp]
                for d in range(Dv):
                    o[d] += ws * part_o[sp, blk, r * Dv + d]
            for d in range(Dv):
                out[b, h, i0 + ii, d] = dtypes.narrow(out, o[d] * inv, cm)
            if want_lse:
                lse[b, h, i0 + ii] = m + np.float32(np.log(l)) if m == m else m
        gm_read += n_split * R * (Dv + 2) * 4
        gm_write += R * Dv * b_sz
        vector_ops += R * (n_split * (COMBINE_ROW_OPS + COMBINE_ELEM_OPS * Dv) + FINAL_ELEM_OPS * Dv)
        if has_sinks:
            gm_read += R * 4
            vector_ops += R * COMBINE_SINK_OPS
        if want_lse:
            gm_write += R * 4
            vector_ops += R * LSE_ROW_OPS
        tasks += 1
    return tasks, gm_read, gm_write, vector_ops, 0


@functools.lru_cache(maxsize=256)
def state_layout(Rmax, Dv):
    """One query tile's running state in the kernel's state slab (qg of them per thread)."""
    return _STATE.carve(m=Rmax, l=Rmax, o=Rmax * Dv)


@functools.lru_cache(maxsize=256)
def scratch_layout(Rmax, D, Dv, kv_tile, qg=1):
    """The kernel's per-thread scratch: the members' Q blocks, then the tile buffers they share."""
    return _SCRATCH.carve(q_blocks=qg * Rmax * D, scores=Rmax * kv_tile, p_tile=Rmax * kv_tile,
                          o_tile=Rmax * Dv, m_tile=Rmax, l_tile=Rmax, dot_results=RES_SLOTS)


def run_tiles(B, Hkv, G, Sq, Skv, qt, kv_tile, kv_len, causal, left=None, right=None):
    """(T0, T1)[b, qi]: the KV tiles ``[T0, T1)`` a block runs (the kernel's rule, :func:`run_span`,
    run as Python: no compile for the plan). ``left``/``right``: the window's bounds (None: none)."""
    kv_len = kv_len_array(kv_len, B, Skv)
    big = Skv + Sq  # validation.check_window's "no bound"
    left = big if left is None else left
    right = big if right is None else right
    keys, span = key_range.py_func, tile_span.py_func
    nq = -(-Sq // qt)
    T0 = np.zeros((B, nq), dtype=np.int64)
    T1 = np.zeros((B, nq), dtype=np.int64)
    for b in range(B):
        for qi in range(nq):
            i0 = qi * qt
            last = min(i0 + qt, Sq) - 1
            lo = keys(b, i0, Sq, Skv, kv_len, causal, left, right)[0]
            hi = keys(b, last, Sq, Skv, kv_len, causal, left, right)[1]
            T0[b, qi], T1[b, qi] = span(int(lo), int(hi), kv_tile)
    return T0, T1


@memo_plan
def plan_flash(q_shape, k_shape, v_shape=None, dtype="fp32", *, profile=None, q_tile=None,
               kv_tile=None, num_splits=None, return_lse=False, causal=False, kv_len=None,
               has_mask=False, gqa="head_loop", window=None, softcap=None, has_sinks=False,
               mask_dtype="fp32") -> Plan:
    """Plan of :func:`flash` (shapes [B, H, S, D]; ``kv_len``/``causal``/``window`` decide the
    skipped tiles; ``softcap`` (a value or None) and ``has_sinks`` add their vector work;
    ``mask_dtype``: the mask as stored, "fp32", "bf16", "fp16" or "bool", read at its itemsize)."""
    where = "attention.flash"
    prof = load_profile(profile)
    B, Hq, Sq, D, Hkv, Skv, Dv = shapes_of(q_shape, k_shape, v_shape, where)
    check_gqa(gqa, where)
    causal, window, left, right = check_window(window, causal, Sq, Skv, where)
    cap = check_softcap(softcap, where)
    has_sinks = bool(has_sinks)
    mb = mask_itemsize(mask_dtype, where)
    expand = expand_plans(B, Hq, Hkv, Skv, D, Dv, dtype, prof, gqa)
    if expand:
        Hkv = Hq
    G = Hq // Hkv
    kv_tile = prof.tile("flash_kv_tile") if kv_tile is None else inputs.positive_int(kv_tile, "kv_tile", where)
    hint = "use a smaller kv_tile or q_tile"

    def tile_buffers(Rmax):
        ub = [
            ub_tile("s_ub", Rmax, kv_tile, "fp32", prof),
            ub_tile("p_ub", Rmax, kv_tile, dtype, prof),
            ub_tile("o_tile_ub", Rmax, Dv, "fp32", prof),
            ub_tile("o_state_ub", Rmax, Dv, "fp32", prof),
            ub_tile("ml_state_ub", Rmax, 32, "fp32", prof),  # tile m, l and state m, l
        ]
        if has_mask:
            ub.append(ub_tile("mask_ub", Rmax, kv_tile, mask_dtype, prof))
        check_ub(where, ub, prof, hint)
        reduce_tile(ub[0], prof, where, hint)
        qk = cube_buffers(where, Rmax, D, kv_tile, dtype, dtype, prof, hint)
        pv_buf = cube_buffers(where, Rmax, kv_tile, Dv, dtype, dtype, prof, hint)
        return tuple(ub) + merge_cube(qk, pv_buf)

    qt, buffers = choose_q_tile(q_tile, tile_buffers, G, Sq, "flash_q_tile", prof, where)
    nq = -(-Sq // qt)
    n_t = -(-Skv // kv_tile)
    blocks = B * Hkv * nq
    if num_splits is None:
        n_split = max(1, min(prof.cube_cores // blocks, n_t)) if blocks < prof.cube_cores else 1
    else:
        # more splits than KV tiles would only add empty ones: capped at the tile count
        n_split = min(inputs.positive_int(num_splits, "num_splits", where), max(1, n_t))
    b = dtypes.itemsize(dtype)
    Rmax = G * qt

    T0, T1 = run_tiles(B, Hkv, G, Sq, Skv, qt, kv_tile, kv_len, causal, left, right)
    if window is not None:  # a window runs a few of the n_t tiles: no more splits than a block runs
        n_split = min(n_split, max(1, int((T1 - T0).max())))
    state_row = (Dv + 2) * 4
    gm_read = gm_write = vector_ops = cube_flops = 0
    for bi in range(B):
        for qi in range(nq):
            R = G * min(qt, Sq - qi * qt)
            t0, Tb = int(T0[bi, qi]), int(T1[bi, qi] - T0[bi, qi])
            per = -(-Tb // n_split)
            rd = n_split * R * D * b
            vec = flops = 0
            for sp in range(n_split):
                lo = t0 + min(sp * per, Tb)
                hi = min(lo + per, t0 + Tb)
                for t in range(lo, hi):
                    n = min(kv_tile, Skv - t * kv_tile)
                    rd += n * (D + Dv) * b + (R * n * mb if has_mask else 0)
                    vec += tile_vector_ops(R, n, Dv, bool(has_mask), PV_STORAGE, cap)
                    flops += tile_cube_flops(R, n, D, Dv, PV_STORAGE)
            if n_split == 1:
                wr = R * Dv * b + (R * 4 if return_lse else 0)
                vec += R * Dv * FINAL_ELEM_OPS + (R * LSE_ROW_OPS if return_lse else 0)
                if has_sinks:
                    rd += R * 4
                    vec += R * (SINK_ROW_OPS + SINK_ELEM_OPS * Dv)
            else:
                wr = n_split * R * state_row
            gm_read += Hkv * rd
            gm_write += Hkv * wr
            vector_ops += Hkv * vec
            cube_flops += Hkv * flops
    workspace = n_split * B * Hq * Sq * state_row if n_split > 1 else 0
    kernels = [KernelPlan(name="flash", unit="mixed", tasks=blocks * n_split, buffers=buffers,
                          gm_read_bytes=gm_read, gm_write_bytes=gm_write, workspace_bytes=workspace,
                          cube_flops=cube_flops, vector_ops=vector_ops)]
    if n_split > 1:
        rows = B * Hq * Sq
        comb_ub = (ub_tile("part_ub", Rmax, Dv + 2, "fp32", prof),
                   ub_tile("acc_ub", Rmax, Dv, "fp32", prof),
                   ub_tile("out_ub", Rmax, Dv, dtype, prof))
        check_ub(where, comb_ub, prof, hint)
        kernels.append(KernelPlan(
            name="flash_combine", unit="vector", tasks=blocks, buffers=comb_ub,
            gm_read_bytes=n_split * rows * state_row + (rows * 4 if has_sinks else 0),
            gm_write_bytes=rows * Dv * b + (rows * 4 if return_lse else 0),
            vector_ops=rows * (n_split * (COMBINE_ROW_OPS + COMBINE_ELEM_OPS * Dv) + FINAL_ELEM_OPS * Dv)
            + (rows * LSE_ROW_OPS if return_lse else 0) + (rows * COMBINE_SINK_OPS if has_sinks else 0)))
    return Plan(op="attention", strategy="flash", dtype=dtype, profile=prof,
                kernels=expand + tuple(kernels),
                params={"kv_tile": kv_tile, "q_tile": qt, "num_splits": n_split, "gqa": gqa,
                        "return_lse": bool(return_lse), "window": window, "softcap": softcap,
                        "sinks": has_sinks}, hint=hint)


@register("attention", "flash", plan=plan_flash,
          summary="fused flash kernel: state on-chip, masked tiles skipped, split-KV for decode")
def flash(q, k, v, *, scale=None, causal=False, kv_len=None, mask=None, gqa="head_loop",
          q_tile=None, kv_tile=None, num_splits=None, return_lse=False, window=None, softcap=None,
          sinks=None, block_table=None, profile=None, layout="bhsd", cast_mode=None):
    """Fused flash attention (see the module docstring). ``return_lse=True`` -> (out, lse fp32 [B, Hq, Sq]).

    ``block_table`` (int32 [B, max_blocks_per_seq], with ``kv_len``): k and v are paged caches
    [num_blocks, block_size, Hkv, D] (paged.py).

    ``window``, ``softcap``, ``sinks``: see :func:`validation.validate` (sliding window, Gemma 2
    soft-capping, gpt-oss sinks); the lse includes the sink.
    ``mask``: additive fp32/bf16/fp16 or bool (True = keep), broadcastable to [B, Hq, Sq, Skv];
    ``layout``: "bhsd" or "bshd" ([B, S, H, D] q/k/v and result); see the package docstring.
    ``cast_mode``: the rounding of the vector casts, P and the output (the combine's with split-KV)
    (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint).
    """
    where = "attention.flash"
    if not isinstance(return_lse, (bool, np.bool_)):
        raise ConstraintError(f"{where}: return_lse must be True or False, got {return_lse!r}")
    if block_table is not None:
        from .paged import paged_call  # here: paged.py imports this module

        return paged_call("flash", q, k, v, block_table=block_table, kv_len=kv_len, scale=scale, causal=causal,
                          mask=mask, gqa=gqa, window=window, softcap=softcap, sinks=sinks, profile=profile,
                          kv_tile=kv_tile, q_tile=q_tile, num_splits=num_splits, return_lse=return_lse, layout=layout,
                          cast_mode=cast_mode)
    a, p = prepare(where, q, k, v, profile, lambda a: plan_flash(
        a.q.shape, a.k.shape, a.v.shape, a.dtype, profile=profile, q_tile=q_tile, kv_tile=kv_tile,
        num_splits=num_splits, return_lse=return_lse, causal=a.causal, kv_len=a.kv_len,
        has_mask=a.has_mask, gqa=a.gqa, **a.plan_options()),
        scale=scale, causal=causal, kv_len=kv_len, mask=mask, gqa=gqa, window=window, softcap=softcap,
        sinks=sinks, options=(q_tile, kv_tile, num_splits, return_lse), layout=layout)
    kvt, qt, n_split = p.params["kv_tile"], p.params["q_tile"], p.params["num_splits"]
    cm = resolve_cast_mode(cast_mode, profile, where)  # a bad name is refused for fp32 too
    cm = cm if a.dtype != "fp32" else dtypes.RINT  # fp32 never narrows: one kernel for every mode
    out, out_k = a.empty_out()
    lse = np.empty((a.B, a.Hq, a.Sq), np.float32)
    want = bool(return_lse)
    with Launch(p, a.shapes) as run:
        kk, vk = run_expand(a, run)
        Hkv = kk.shape[1]
        G = a.Hq // Hkv
        Rmax = G * qt
        blocks = a.B * Hkv * (-(-a.Sq // qt))
        qg = query_group(blocks, -(-a.Sq // qt), Rmax, n_split)
        layout = scratch_layout(Rmax, a.D, a.Dv, kvt, qg)
        scratch = tile.scratch(layout.total, np.float32)
        state_at = state_layout(Rmax, a.Dv)
        state = tile.scratch(qg * state_at.total, np.float32)
        ps = n_split if n_split > 1 else 1
        pb = blocks if n_split > 1 else 1
        part_m = np.empty((ps, pb, Rmax), np.float32)
        part_l = np.empty((ps, pb, Rmax), np.float32)
        part_o = np.empty((ps, pb, Rmax * a.Dv), np.float32)
        msb, msh, msi, msj = a.mask_strides
        kt = packed_keys(kk, kvt, Rmax)
        with cube.dynamic_tasks(1):
            counted = _flash_kernel(a.q.kview, kk, vk, out_k, lse, want, a.kv_len, a.causal, a.left,
                                    a.right, a.scale, a.softcap, a.has_mask, a.mask_flat, msb, msh, msi,
                                    msj, a.has_sinks, a.sinks, qt, qg, kvt, n_split, kt, scratch,
                                    layout.bounds, state, state_at.bounds, part_m, part_l, part_o, cm)
        run.count(counted, workspace_bytes=p.kernels[len(p.kernels) - (2 if n_split > 1 else 1)].workspace_bytes)
        if n_split > 1:
            run.count(_combine_kernel(part_m, part_l, part_o, out_k, lse, want, Hkv, qt, a.has_sinks, a.sinks, cm))
        run.workspace(a.copied_bytes)
    if return_lse:
        return out, lse
    return out
