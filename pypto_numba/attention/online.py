"""attention.online: online softmax over KV tiles, running state in GM workspace (PyPTO decode).

One tile task per (batch, KV head, query tile) (on the CPU, prefill tasks walk ``tasks.Q_GROUP``
query tiles of a KV head together): the G query heads of the KV head and ``qv`` query positions
form one [R = G*qv, D] block (head-loop reuse: each K/V tile is loaded once for all G
heads, nothing is copied). The task walks all ``ceil(Skv / kv_tile)`` KV tiles (tail tile with a
valid shape; kv_len and causal are applied by masking, nothing is skipped, as in the PyPTO loop
over a padded cache), except, with a ``window``, the tiles wholly outside the window band of its
rows (tiles.band_keys: a sliding-window decode walks about W keys), and per tile computes
S = QK^T (fp32), scale, mask, local max/exp/sum, P in the storage dtype (``pv``), O = PV (fp32),
and merges (m, l, O) into the running state, which lives
in GM workspace between tiles (``is_loop_begin`` writes it, later tiles read and write it, the
last tile reads it and writes the output). Sinks join the state after the last tile
(tiles.merge_sink); soft-capping is part of the tile softmax.

Traffic (b = itemsize, R = G*qv rows, n_t walked tiles (ceil(Skv/kv_tile) without a window),
state row = (Dv + 2)*4 B)::

    read   per task: Q R*D*b + n_t tiles of K (n*D*b) and V (n*Dv*b) [+ mask R*n*mb, mb its itemsize]
           + state R*(Dv+2)*4 at tiles 1..n_t-1 [+ sinks R*4]
    write  per task: state R*(Dv+2)*4 at tiles 0..n_t-2, output R*Dv*b
    workspace  B*Hq*Sq*(Dv+2)*4 (0 when n_t = 1)

1 kernel (+2 copy kernels with gqa="expand_clone").
"""

from __future__ import annotations

import collections
import functools

import numba
import numpy as np
from numba import prange

from .. import inputs
from ..machine import cube, dtypes, tile
from ..machine.jit import device, kernel
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan, reduce_tile
from ..machine.profile import load_profile, resolve_cast_mode
from ..machine.scratch import Regions
from ..strategy import Launch, register
from .gqa_clone import expand_plans, run_expand
from .plans import check_ub, choose_q_tile, cube_buffers, kv_len_array, merge_cube, ub_tile
from .tasks import block_geometry, group_task, query_group, query_tile
from .tiles import (
    FINAL_ELEM_OPS,
    GEMM_MIN_ROWS,
    PV_COMPENSATED,
    RES_SLOTS,
    SINK_ELEM_OPS,
    SINK_ROW_OPS,
    band_keys,
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
    tile_span,
    tile_vector_ops,
    write_out,
)
from .validation import PV_CODE, check_gqa, check_pv, check_softcap, check_window, mask_itemsize, prepare, shapes_of

# the kernel's per-thread scratch regions, in slab order (scratch_layout gives their bounds)
_SCRATCH = Regions("q_blocks", "scores", "p_hi", "p_lo", "o_tile", "o_lo", "m_tile", "l_tile", "dot_results")
_Q_BLOCKS, _SCORES, _P_HI, _P_LO, _O_TILE, _O_LO, _M_TILE, _L_TILE, _DOT_RESULTS = _SCRATCH.indices


@kernel
def _online_kernel(
    q,
    k,
    v,
    out,
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
    pv_mode,
    kt,
    scratch,
    scratch_at,
    ws_m,
    ws_l,
    ws_o,
    cm,
):
    """One prange iteration walks ``qg`` consecutive query tiles of one (batch, KV head) through
    the KV tiles together (:func:`tasks.query_group`); each query tile is its own NPU task with
    its state in ``ws_*[task]``.

    Parameters
    ----------
    q, k, v, out : kernel views [B, Hq, Sq, D], [B, Hkv, Skv, D], [B, Hkv, Skv, Dv], [B, Hq, Sq, Dv]
    kv_len : int64 [B]; causal, left, right, scale, softcap : the validated options (the window's
    bounds, validation.check_window; softcap 0: none)
    has_mask, mask, msb, msh, msi, msj : the flat mask as stored (tiles.mask_term), its (b, h, i, j)
    element strides
    has_sinks, sinks : fp32 [Hq] sink logits
    qt, qg, kv_tile : query positions per tile, query tiles per CPU task, keys per KV tile
    pv_mode : PV_STORAGE, PV_COMPENSATED or PV_FP32 (tiles.py)
    kt : K packed transposed (tiles.packed_keys; empty for decode-shaped tiles)
    scratch, scratch_at : per-thread slabs and their region bounds (:func:`scratch_layout`)
    ws_m, ws_l, ws_o : the running state per NPU task (GM workspace)
    cm : the cast mode of P and of the output (a ``dtypes.CastMode``: one compiled kernel per mode)

    Returns the counters (tasks, gm_read, gm_write, vector_ops, cube_flops).
    """
    B, Hq, Sq, D, Hkv, Skv, Dv, G, nq, ng, Rmax = block_geometry(q, k, v, qt, qg)
    b_sz = q.itemsize
    state_row = (Dv + 2) * 4
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    cube_flops = 0
    for it in prange(B * Hkv * ng):
        b, kvh, q_lo, members = group_task(it, Hkv, nq, qg)
        sc = scratch[numba.get_thread_id()]
        at = scratch_at
        qb = at[_Q_BLOCKS]
        s = sc[at[_SCORES]:at[_SCORES + 1]]
        ph = sc[at[_P_HI]:at[_P_HI + 1]]
        pl = sc[at[_P_LO]:at[_P_LO + 1]]
        ot = sc[at[_O_TILE]:at[_O_TILE + 1]]
        ot2 = sc[at[_O_LO]:at[_O_LO + 1]]
        mt = sc[at[_M_TILE]:at[_M_TILE + 1]]
        lt = sc[at[_L_TILE]:at[_L_TILE + 1]]
        res = sc[at[_DOT_RESULTS]:at[_DOT_RESULTS + 1]]
        t_first = 1 << 62
        t_last = 0
        for u in range(members):
            task = (b * Hkv + kvh) * nq + q_lo + u
            i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
            lo, hi = _walked_tiles(b, i0, qv, Sq, Skv, kv_len, left, right, kv_tile)
            t_first = min(t_first, lo)
            t_last = max(t_last, hi)
            if lo == hi:  # no tile in the window band: the state of a row without keys
                reset_state(ws_m[task], ws_l[task], ws_o[task], R, Dv)
            load_q_block(q, b, kvh, G, i0, qv, sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D])
            gm_read += R * D * b_sz
        for t in range(t_first, t_last):
            j0 = t * kv_tile
            n = min(kv_tile, Skv - j0)
            for u in range(members):
                task = (b * Hkv + kvh) * nq + q_lo + u
                i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
                lo, hi = _walked_tiles(b, i0, qv, Sq, Skv, kv_len, left, right, kv_tile)
                if t < lo or t >= hi:
                    continue
                use_gemm = R >= GEMM_MIN_ROWS
                piped = members == 1 and not use_gemm  # decode: a tile's P @ V with the next's Q K^T
                ms = ws_m[task]
                ls = ws_l[task]
                os = ws_o[task]
                qf = sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D]  # this query tile's Q block
                if not piped or t == lo:  # else the previous tile's walk scored this one
                    tile_scores(qf, R, k, b, kvh, j0, n, s, kt, kv_tile, use_gemm, res)
                nmax = tile_softmax(s, R, n, j0, b, kvh, G, i0, qv, Sq, Skv, kv_len, causal, left, right,
                                    scale, softcap, has_mask, mask, msb, msh, msi, msj, mt, lt, ph, pl,
                                    pv_mode, q, cm)
                if piped and t + 1 < hi:
                    j1 = j0 + kv_tile
                    tile_pv_scores(ph, R, n, v, b, kvh, j0, ot, nmax, qf, k, j1, min(kv_tile, Skv - j1), s, res)
                else:
                    tile_pv(ph, R, n, v, b, kvh, j0, ot, use_gemm, nmax)
                if pv_mode == PV_COMPENSATED:
                    tile_pv(pl, R, n, v, b, kvh, j0, ot2, use_gemm, nmax)
                    for i in range(R * Dv):
                        ot[i] += ot2[i]
                gm_read += n * D * b_sz + n * Dv * b_sz
                if has_mask:
                    gm_read += R * n * mask.itemsize
                if t == lo:  # is_loop_begin: the tile's state becomes the running state
                    for r in range(R):
                        ms[r] = mt[r]
                        ls[r] = lt[r]
                    for i in range(R * Dv):
                        os[i] = ot[i]
                else:  # read the state from GM workspace, merge
                    gm_read += R * state_row
                    merge_state(ms, ls, os, mt, lt, ot, R, Dv)
                if t < hi - 1:  # not is_loop_end: write the state back to GM workspace
                    gm_write += R * state_row
                vector_ops += tile_vector_ops(R, n, Dv, has_mask, pv_mode, softcap)
                cube_flops += tile_cube_flops(R, n, D, Dv, pv_mode)
        for u in range(members):
            task = (b * Hkv + kvh) * nq + q_lo + u
            i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
            if has_sinks:  # at is_loop_end, on chip
                merge_sink(ws_m[task], ws_l[task], ws_o[task], R, Dv, sinks, kvh, G, qv)
                gm_read += R * 4
                vector_ops += R * (SINK_ROW_OPS + SINK_ELEM_OPS * Dv)
            write_out(ws_o[task], ws_l[task], R, Dv, out, b, kvh, G, i0, qv, cm)
            gm_write += R * Dv * b_sz
            vector_ops += R * Dv * FINAL_ELEM_OPS
            tasks += 1
    return tasks, gm_read, gm_write, vector_ops, cube_flops


@device
def _walked_tiles(b, i0, qv, Sq, Skv, kv_len, left, right, kv_tile):
    """KV tiles ``[t0, t1)`` the query tile at ``i0`` (``qv`` positions) walks: those holding keys
    of its rows' window band (the band moves right with the row); every tile without a window."""
    lo, _ = band_keys(b, i0, Sq, Skv, kv_len, left, right)
    _, hi = band_keys(b, i0 + qv - 1, Sq, Skv, kv_len, left, right)
    return tile_span(lo, hi, kv_tile)


@functools.lru_cache(maxsize=256)
def scratch_layout(Rmax, D, Dv, kv_tile, qg=1):
    """The kernel's per-thread scratch: the members' Q blocks, then the tile buffers they share."""
    return _SCRATCH.carve(q_blocks=qg * Rmax * D, scores=Rmax * kv_tile, p_hi=Rmax * kv_tile,
                          p_lo=Rmax * kv_tile, o_tile=Rmax * Dv, o_lo=Rmax * Dv, m_tile=Rmax,
                          l_tile=Rmax, dot_results=RES_SLOTS)


@memo_plan
def plan_online(q_shape, k_shape, v_shape=None, dtype="fp32", *, profile=None, kv_tile=None,
                q_tile=None, pv="storage", causal=False, kv_len=None, has_mask=False,
                gqa="head_loop", window=None, softcap=None, has_sinks=False, mask_dtype="fp32") -> Plan:
    """Plan of :func:`online` (shapes [B, H, S, D]; no data needed; kv_len shapes the walked tiles
    only with a window; ``softcap`` (a value or None) and ``has_sinks`` add their vector work;
    ``mask_dtype``: the mask as stored, "fp32", "bf16", "fp16" or "bool", read at its itemsize)."""
    where = "attention.online"
    prof = load_profile(profile)
    B, Hq, Sq, D, Hkv, Skv, Dv = shapes_of(q_shape, k_shape, v_shape, where)
    check_pv(pv, where)
    check_gqa(gqa, where)
    causal, window, left, right = check_window(window, causal, Sq, Skv, where)
    cap = check_softcap(softcap, where)
    has_sinks = bool(has_sinks)
    mb = mask_itemsize(mask_dtype, where)
    expand = expand_plans(B, Hq, Hkv, Skv, D, Dv, dtype, prof, gqa)
    if expand:
        Hkv = Hq
    G = Hq // Hkv
    kv_tile = prof.tile("attention_kv_tile") if kv_tile is None else inputs.positive_int(kv_tile, "kv_tile", where)
    hint = "use a smaller kv_tile or q_tile"
    p_dtype = "fp32" if pv == "fp32" else dtype

    def tile_buffers(Rmax):
        ub = [
            ub_tile("s_ub", Rmax, kv_tile, "fp32", prof),
            ub_tile("p_ub", Rmax, kv_tile, p_dtype, prof),
            ub_tile("o_tile_ub", Rmax, Dv, "fp32", prof),
            ub_tile("o_state_ub", Rmax, Dv, "fp32", prof),
            ub_tile("ml_state_ub", Rmax, 16, "fp32", prof),  # m and l, 8 fp32 (32 B) each
        ]
        if pv == "compensated":
            ub.append(ub_tile("p_lo_ub", Rmax, kv_tile, dtype, prof))
        if has_mask:
            ub.append(ub_tile("mask_ub", Rmax, kv_tile, mask_dtype, prof))
        check_ub(where, ub, prof, hint)
        reduce_tile(ub[0], prof, where, hint)
        qk = cube_buffers(where, Rmax, D, kv_tile, dtype, dtype, prof, hint)
        pv_buf = cube_buffers(where, Rmax, kv_tile, Dv, p_dtype, dtype, prof, hint)
        return tuple(ub) + merge_cube(qk, pv_buf)

    qt, buffers = choose_q_tile(q_tile, tile_buffers, G, Sq, "attention_q_tile", prof, where)
    b = dtypes.itemsize(dtype)
    nq = -(-Sq // qt)
    n_t = -(-Skv // kv_tile)

    gm_read = gm_write = vector_ops = cube_flops = 0
    pv_mode = PV_CODE[pv]
    state_row = (Dv + 2) * 4
    # (query rows, walked tiles) -> tasks per KV head: the kernel's rule (_walked_tiles) run as Python
    spans = collections.Counter()
    if window is None:
        for qi in range(nq):
            spans[(G * min(qt, Sq - qi * qt), 0, n_t)] += B
    else:
        lens = kv_len_array(kv_len, B, Skv)
        for bi in range(B):
            for qi in range(nq):
                i0, qv = qi * qt, min(qt, Sq - qi * qt)
                lo = band_keys.py_func(bi, i0, Sq, Skv, lens, left, right)[0]
                hi = band_keys.py_func(bi, i0 + qv - 1, Sq, Skv, lens, left, right)[1]
                spans[(G * qv, *tile_span.py_func(int(lo), int(hi), kv_tile))] += 1
    for (R, t0, t1), count in spans.items():
        walked = max(t1 - t0, 1) - 1  # tiles after the first: each reads and writes the state once
        per_read = R * D * b + walked * R * state_row
        per_write = R * Dv * b + walked * R * state_row
        per_vec = R * Dv * FINAL_ELEM_OPS
        per_flops = 0
        if has_sinks:
            per_read += R * 4
            per_vec += R * (SINK_ROW_OPS + SINK_ELEM_OPS * Dv)
        for t in range(t0, t1):
            n = min(kv_tile, Skv - t * kv_tile)
            per_read += n * (D + Dv) * b + (R * n * mb if has_mask else 0)
            per_vec += tile_vector_ops(R, n, Dv, bool(has_mask), pv_mode, cap)
            per_flops += tile_cube_flops(R, n, D, Dv, pv_mode)
        gm_read += count * Hkv * per_read
        gm_write += count * Hkv * per_write
        vector_ops += count * Hkv * per_vec
        cube_flops += count * Hkv * per_flops
    workspace = B * Hq * Sq * state_row if n_t > 1 else 0
    kp = KernelPlan(name="online_softmax", unit="mixed", tasks=B * Hkv * nq, buffers=buffers,
                    gm_read_bytes=gm_read, gm_write_bytes=gm_write, workspace_bytes=workspace,
                    cube_flops=cube_flops, vector_ops=vector_ops)
    return Plan(op="attention", strategy="online", dtype=dtype, profile=prof, kernels=expand + (kp,),
                params={"kv_tile": kv_tile, "q_tile": qt, "pv": pv, "gqa": gqa, "window": window,
                        "softcap": softcap, "sinks": has_sinks}, hint=hint)


@register("attention", "online", plan=plan_online,
          summary="online softmax over KV tiles, state in GM workspace (PyPTO decode)")
def online(q, k, v, *, scale=None, causal=False, kv_len=None, mask=None, gqa="head_loop",
           kv_tile=None, q_tile=None, pv="storage", window=None, softcap=None, sinks=None, block_table=None,
           profile=None, layout="bhsd", cast_mode=None):
    """Attention by online softmax over ``kv_tile`` KV tiles (see the module docstring).

    ``pv``: "storage" rounds P to the storage dtype before P@V (the NPU), "compensated" adds a
    second P@V with the rounding residual (summed in fp32), "fp32" keeps P in fp32.
    ``window``, ``softcap``, ``sinks``: see :func:`validation.validate`. ``block_table`` (int32
    [B, max_blocks_per_seq], with ``kv_len``): k and v are paged caches [num_blocks, block_size,
    Hkv, D] (paged.py).
    ``mask``: additive fp32/bf16/fp16 or bool (True = keep), broadcastable to [B, Hq, Sq, Skv];
    ``layout``: "bhsd" or "bshd" ([B, S, H, D] q/k/v and result); see the package docstring.
    ``cast_mode``: the rounding of the vector casts, P (both parts with "compensated") and the output
    (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint).
    """
    where = "attention.online"
    if block_table is not None:
        from .paged import paged_call  # here: paged.py imports this module

        return paged_call("online", q, k, v, block_table=block_table, kv_len=kv_len, scale=scale, causal=causal,
                          mask=mask, gqa=gqa, window=window, softcap=softcap, sinks=sinks, profile=profile,
                          kv_tile=kv_tile, q_tile=q_tile, pv=pv, layout=layout, cast_mode=cast_mode)
    a, p = prepare(where, q, k, v, profile, lambda a: plan_online(
        a.q.shape, a.k.shape, a.v.shape, a.dtype, profile=profile, kv_tile=kv_tile, q_tile=q_tile, pv=pv,
        causal=a.causal, kv_len=a.kv_len, has_mask=a.has_mask, gqa=a.gqa, **a.plan_options()),
        scale=scale, causal=causal, kv_len=kv_len, mask=mask, gqa=gqa, window=window, softcap=softcap,
        sinks=sinks, options=(kv_tile, q_tile, pv), layout=layout)
    kvt, qt = p.params["kv_tile"], p.params["q_tile"]
    cm = resolve_cast_mode(cast_mode, profile, where)  # a bad name is refused for fp32 too
    cm = cm if a.dtype != "fp32" else dtypes.RINT  # fp32 never narrows: one kernel for every mode
    out, out_k = a.empty_out()
    with Launch(p, a.shapes) as run:
        kk, vk = run_expand(a, run)
        Hkv = kk.shape[1]
        G = a.Hq // Hkv
        nq = -(-a.Sq // qt)
        Rmax = G * qt
        tasks = a.B * Hkv * nq
        qg = query_group(tasks, nq, Rmax)
        layout = scratch_layout(Rmax, a.D, a.Dv, kvt, qg)
        scratch = tile.scratch(layout.total, np.float32)
        ws_m = np.empty((tasks, Rmax), np.float32)
        ws_l = np.empty((tasks, Rmax), np.float32)
        ws_o = np.empty((tasks, Rmax * a.Dv), np.float32)
        msb, msh, msi, msj = a.mask_strides
        kt = packed_keys(kk, kvt, Rmax)
        with cube.dynamic_tasks(1):
            counted = _online_kernel(a.q.kview, kk, vk, out_k, a.kv_len, a.causal, a.left, a.right,
                                     a.scale, a.softcap, a.has_mask, a.mask_flat, msb, msh, msi, msj,
                                     a.has_sinks, a.sinks, qt, qg, kvt,
                                     PV_CODE[p.params["pv"]], kt, scratch, layout.bounds,
                                     ws_m, ws_l, ws_o, cm)
        run.count(counted, workspace_bytes=p.kernels[-1].workspace_bytes)
        run.workspace(a.copied_bytes)
    return out
