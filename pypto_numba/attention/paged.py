"""Paged KV cache for ``online`` and ``flash`` (vLLM's layout, npu-facts 8.4); kv_cache.write_kv fills it.

``k_cache [num_blocks, block_size, Hkv, D]`` and ``v_cache [num_blocks, block_size, Hkv, Dv]`` hold
the pages; ``block_table[b, p]`` is the page holding keys ``p*block_size .. (p+1)*block_size - 1`` of
sequence b, ``kv_len[b]`` its length. The logical cache of a sequence is
``Skv = max_blocks_per_seq * block_size`` keys long; the kernels are the dense ones' loops, except
that each KV tile is first loaded through the block table into an on-chip tile buffer (key j of the
tile comes from page ``block_table[b, (j0 + j) // block_size]``, row ``(j0 + j) % block_size``, so a
tile may span pages or sit inside one), as the NPU kernel's DMA does. Keys at or past ``kv_len[b]``
are never read (their buffer rows are zeros, and masked): unused pages and slots may hold anything.
The tile bodies (tiles.py) then run on the buffer exactly as on a dense tile, so a paged call gives
the bits of the dense call on the gathered cache with the same ``kv_tile`` and ``num_splits``.

Traffic: the dense plan's, except that K/V are read only below ``kv_len`` (``nread*(D+Dv)*b`` per
run tile, ``nread = min(n, kv_len - j0)``), and each task reads the block-table entries of the
pages its tiles touch (4 B each). The dense kernels, their plans and their machine code are not
touched: these are separate kernels, chosen in Python before any loop.

Decode-shaped blocks (``G*q_tile < GEMM_MIN_ROWS``, ``kv_tile % 4 == 0``) take paged_decode.py's
page-major kernel instead, which reads the pages without a tile buffer; the gathering kernels
here run prefill blocks and the other kv_tiles.
"""

from __future__ import annotations

import dataclasses

import numba
import numpy as np
from numba import prange

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError
from ..machine import cube, dtypes, tile
from ..machine.jit import device, kernel
from ..machine.profile import resolve_cast_mode
from ..strategy import Launch
from .flash import _combine_kernel, _split_tiles, finish_block, plan_flash, run_tiles
from .flash import scratch_layout as flash_scratch
from .flash import state_layout
from .online import _walked_tiles, plan_online
from .paged_decode import decode_call, pages_touched
from .online import scratch_layout as online_scratch
from .tasks import group_task, query_group, query_tile
from .tiles import (
    FINAL_ELEM_OPS,
    GEMM_MIN_ROWS,
    PV_COMPENSATED,
    PV_STORAGE,
    SINK_ELEM_OPS,
    SINK_ROW_OPS,
    band_keys,
    load_q_block,
    merge_sink,
    merge_state,
    reset_state,
    tile_cube_flops,
    tile_pv,
    tile_scores,
    tile_softmax,
    tile_span,
    tile_vector_ops,
    write_out,
)
from .validation import (
    PV_CODE,
    Args,
    check_kv_len,
    check_layout,
    check_mask,
    check_scale,
    check_sinks,
    check_softcap,
    check_window,
    in_layout,
)

TABLE_ENTRY_BYTES = 4  # one int32 block-table entry


# --- the tile loader ---


@device
def gather_tile(cache, table, b, kvh, j0, n, nread, bs, buf):
    """buf[0, 0, j, :] = cache[table[b, (j0+j) // bs], (j0+j) % bs, kvh, :] for j < nread, one
    page segment at a time; zeros for nread <= j < n (keys past kv_len are never read)."""
    Dc = np.uint64(cache.shape[3])
    ukvh = np.uint64(kvh)
    j = 0
    while j < nread:
        key = j0 + j
        p = key // bs
        off = key - p * bs
        seg = min(bs - off, nread - j)
        page = np.uint64(table[b, p])
        for jj in range(seg):
            row = np.uint64(off + jj)
            dst = np.uint64(j + jj)
            for d in range(Dc):
                buf[0, 0, dst, d] = cache[page, row, ukvh, d]
        j += seg
    for jj in range(nread, n):
        for d in range(Dc):
            buf[0, 0, np.uint64(jj), d] = 0


@device
def pack_tile(kb, n, width, kt):
    """kt[d*width + j] = kb[0, 0, j, d] in fp32 for j < n: the tile's K^T (tiles.packed_keys' layout)."""
    D = kb.shape[3]
    uw = np.uint64(width)
    for j in range(np.uint64(n)):
        for d in range(np.uint64(D)):
            kt[d * uw + j] = dtypes.widen(kb[0, 0, j, d])


@device
def _geometry(q, k, v, qt, qg):
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[2]
    Dv = v.shape[3]
    G = Hq // Hkv
    nq = (Sq + qt - 1) // qt
    ng = (nq + qg - 1) // qg
    return B, Hq, Sq, D, Hkv, Dv, G, nq, ng, G * min(qt, Sq)


# --- flash ---


@kernel
def _paged_flash_kernel(q, k, v, table, bs, Skv, out, lse, want_lse, kv_len, causal, left, right, scale,
                        softcap, has_mask, mask, msb, msh, msi, msj, has_sinks, sinks, qt, qg, kv_tile,
                        n_split, kbuf, vbuf, ktbuf, scratch, scratch_at, state, state_at, part_m, part_l,
                        part_o, cm):
    """flash._flash_kernel over the pages (k, v: [num_blocks, bs, Hkv, D]; ``Skv`` the logical
    length); each run tile is loaded into ``kbuf``/``vbuf`` (and packed into ``ktbuf`` for prefill
    blocks) once per CPU task and read by the tile bodies as a dense tile."""
    B, Hq, Sq, D, Hkv, Dv, G, nq, ng, Rmax = _geometry(q, k, v, qt, qg)
    b_sz = q.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    cube_flops = 0
    for it in prange(B * Hkv * ng * n_split):
        sp = it // (B * Hkv * ng)
        grp = it - sp * (B * Hkv * ng)
        b, kvh, q_lo, members = group_task(grp, Hkv, nq, qg)
        tid = numba.get_thread_id()
        sc = scratch[tid]
        at = scratch_at  # flash.scratch_layout's regions, in flash._SCRATCH order
        qb = at[0]
        s = sc[at[1]:at[2]]
        ph = sc[at[2]:at[3]]
        ot = sc[at[3]:at[4]]
        mt = sc[at[4]:at[5]]
        lt = sc[at[5]:at[6]]
        res = sc[at[6]:at[7]]
        kb = kbuf[tid]
        vb = vbuf[tid]
        kt = ktbuf[tid]
        st = state[tid]  # flash.state_layout: m, l, O
        sw = state_at[3]
        om = state_at[0]
        ol = state_at[1]
        oo = state_at[2]
        kvl = kv_len[b]
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
            gm_read += R * D * b_sz + 4 * pages_touched(lo, hi, kv_tile, kvl, bs)
        for t in range(t_first, t_last):
            j0 = t * kv_tile
            n = min(kv_tile, Skv - j0)
            nread = max(min(n, kvl - j0), 0)
            loaded = False
            for u in range(members):
                i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
                lo, hi = _split_tiles(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile, n_split, sp)
                if t < lo or t >= hi:
                    continue
                if not loaded:
                    gather_tile(k, table, b, kvh, j0, n, nread, bs, kb)
                    gather_tile(v, table, b, kvh, j0, n, nread, bs, vb)
                    if Rmax >= GEMM_MIN_ROWS:
                        pack_tile(kb, n, kv_tile, kt)
                    loaded = True
                use_gemm = R >= GEMM_MIN_ROWS
                m0 = u * sw
                qf = sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D]
                tile_scores(qf, R, kb, 0, 0, 0, n, s, kt, kv_tile, use_gemm, res)
                nmax = tile_softmax(s, R, n, j0, b, kvh, G, i0, qv, Sq, Skv, kv_len, causal, left, right,
                                    scale, softcap, has_mask, mask, msb, msh, msi, msj, mt, lt, ph, ph,
                                    PV_STORAGE, q, cm)
                tile_pv(ph, R, n, vb, 0, 0, 0, ot, use_gemm, nmax)
                merge_state(st[m0 + om:m0 + ol], st[m0 + ol:m0 + oo], st[m0 + oo:m0 + sw],
                            mt, lt, ot, R, Dv)
                gm_read += nread * (D + Dv) * b_sz
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


# --- online ---


@kernel
def _paged_online_kernel(q, k, v, table, bs, Skv, out, kv_len, causal, left, right, scale, softcap,
                         has_mask, mask, msb, msh, msi, msj, has_sinks, sinks, qt, qg, kv_tile, pv_mode,
                         kbuf, vbuf, ktbuf, scratch, scratch_at, ws_m, ws_l, ws_o, cm):
    """online._online_kernel over the pages (see :func:`_paged_flash_kernel`): it walks the dense
    kernel's tiles (all of the logical cache, or the window band's), reading no page past kv_len."""
    B, Hq, Sq, D, Hkv, Dv, G, nq, ng, Rmax = _geometry(q, k, v, qt, qg)
    b_sz = q.itemsize
    state_row = (Dv + 2) * 4
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    cube_flops = 0
    for it in prange(B * Hkv * ng):
        b, kvh, q_lo, members = group_task(it, Hkv, nq, qg)
        tid = numba.get_thread_id()
        sc = scratch[tid]
        at = scratch_at  # online.scratch_layout's regions, in online._SCRATCH order
        qb = at[0]
        s = sc[at[1]:at[2]]
        ph = sc[at[2]:at[3]]
        pl = sc[at[3]:at[4]]
        ot = sc[at[4]:at[5]]
        ot2 = sc[at[5]:at[6]]
        mt = sc[at[6]:at[7]]
        lt = sc[at[7]:at[8]]
        res = sc[at[8]:at[9]]
        kb = kbuf[tid]
        vb = vbuf[tid]
        kt = ktbuf[tid]
        kvl = kv_len[b]
        t_first = 1 << 62
        t_last = 0
        for u in range(members):
            task = (b * Hkv + kvh) * nq + q_lo + u
            i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
            lo, hi = _walked_tiles(b, i0, qv, Sq, Skv, kv_len, left, right, kv_tile)
            t_first = min(t_first, lo)
            t_last = max(t_last, hi)
            if lo == hi:
                reset_state(ws_m[task], ws_l[task], ws_o[task], R, Dv)
            load_q_block(q, b, kvh, G, i0, qv, sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D])
            gm_read += R * D * b_sz + 4 * pages_touched(lo, hi, kv_tile, kvl, bs)
        for t in range(t_first, t_last):
            j0 = t * kv_tile
            n = min(kv_tile, Skv - j0)
            nread = max(min(n, kvl - j0), 0)
            loaded = False
            for u in range(members):
                task = (b * Hkv + kvh) * nq + q_lo + u
                i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
                lo, hi = _walked_tiles(b, i0, qv, Sq, Skv, kv_len, left, right, kv_tile)
                if t < lo or t >= hi:
                    continue
                if not loaded:
                    gather_tile(k, table, b, kvh, j0, n, nread, bs, kb)
                    gather_tile(v, table, b, kvh, j0, n, nread, bs, vb)
                    if Rmax >= GEMM_MIN_ROWS:
                        pack_tile(kb, n, kv_tile, kt)
                    loaded = True
                use_gemm = R >= GEMM_MIN_ROWS
                ms = ws_m[task]
                ls = ws_l[task]
                os = ws_o[task]
                qf = sc[qb + u * Rmax * D:qb + (u + 1) * Rmax * D]
                tile_scores(qf, R, kb, 0, 0, 0, n, s, kt, kv_tile, use_gemm, res)
                nmax = tile_softmax(s, R, n, j0, b, kvh, G, i0, qv, Sq, Skv, kv_len, causal, left, right,
                                    scale, softcap, has_mask, mask, msb, msh, msi, msj, mt, lt, ph, pl,
                                    pv_mode, q, cm)
                tile_pv(ph, R, n, vb, 0, 0, 0, ot, use_gemm, nmax)
                if pv_mode == PV_COMPENSATED:
                    tile_pv(pl, R, n, vb, 0, 0, 0, ot2, use_gemm, nmax)
                    for i in range(R * Dv):
                        ot[i] += ot2[i]
                gm_read += nread * (D + Dv) * b_sz
                if has_mask:
                    gm_read += R * n * mask.itemsize
                if t == lo:
                    for r in range(R):
                        ms[r] = mt[r]
                        ls[r] = lt[r]
                    for i in range(R * Dv):
                        os[i] = ot[i]
                else:
                    gm_read += R * state_row
                    merge_state(ms, ls, os, mt, lt, ot, R, Dv)
                if t < hi - 1:
                    gm_write += R * state_row
                vector_ops += tile_vector_ops(R, n, Dv, has_mask, pv_mode, softcap)
                cube_flops += tile_cube_flops(R, n, D, Dv, pv_mode)
        for u in range(members):
            task = (b * Hkv + kvh) * nq + q_lo + u
            i0, qv, R = query_tile(q_lo + u, qt, Sq, G)
            if has_sinks:
                merge_sink(ws_m[task], ws_l[task], ws_o[task], R, Dv, sinks, kvh, G, qv)
                gm_read += R * 4
                vector_ops += R * (SINK_ROW_OPS + SINK_ELEM_OPS * Dv)
            write_out(ws_o[task], ws_l[task], R, Dv, out, b, kvh, G, i0, qv, cm)
            gm_write += R * Dv * b_sz
            vector_ops += R * Dv * FINAL_ELEM_OPS
            tasks += 1
    return tasks, gm_read, gm_write, vector_ops, cube_flops


# --- validation ---


def validate_paged(q, k_cache, v_cache, where, *, block_table, kv_len, scale, causal, mask, gqa, window,
                   softcap, sinks, layout="bhsd"):
    """-> (:class:`validation.Args` of the logical dense call, int32 table, block_size).

    ``block_table``: int32 ``[B, max_blocks_per_seq]`` (int64 is accepted and converted, its
    values must fit int32); only the entries of the pages below ``kv_len[b]`` are read and checked,
    the others (padding, e.g. -1) are ignored. ``kv_len`` is required. ``layout`` is q's and the
    result's ("bshd": ``[B, Sq, Hq, D]``); the caches keep vLLM's layout."""
    if not isinstance(block_table, np.ndarray):
        raise DTypeError(f"{where}: block_table must be a numpy int32 array [B, max_blocks_per_seq], got "
                         f"{type(block_table).__name__}; use numpy.asarray(block_table, numpy.int32)")
    if block_table.dtype not in (np.int32, np.int64):
        raise DTypeError(f"{where}: block_table must be int32 (or int64, converted), got dtype "
                         f"{block_table.dtype}; convert with block_table.astype(numpy.int32)")
    kc = inputs.tensor(k_cache, "k_cache", where, min_rank=4, max_rank=4)
    vc = inputs.tensor(v_cache, "v_cache", where, min_rank=4, max_rank=4)
    qt = in_layout(inputs.tensor(q, "q", where, min_rank=4, max_rank=4), check_layout(layout, where))
    B, Hq, Sq, D = qt.shape
    NB, bs, Hkv, Dk = kc.shape
    if vc.shape[:3] != kc.shape[:3]:
        raise ShapeError(f"{where}: k_cache {kc.shape} and v_cache {vc.shape} must share "
                         f"[num_blocks, block_size, Hkv]")
    if Dk != D:
        raise ShapeError(f"{where}: head dim of k_cache ({Dk}) differs from q ({D}); k_cache is "
                         f"[num_blocks, block_size, Hkv, D] = {kc.shape}, q {qt.shape}")
    if Hq % Hkv:
        raise ShapeError(f"{where}: Hq={Hq} is not a multiple of the cache's Hkv={Hkv} (k_cache "
                         f"[num_blocks, block_size, Hkv, D] = {kc.shape}; GQA needs Hq % Hkv == 0)")
    if bs % 16:
        raise ConstraintError(f"{where}: block_size = {bs} (k_cache.shape[1]) must be a multiple of 16; "
                              f"allocate the cache with block_size 16, 32, 64 or 128")
    if block_table.ndim != 2 or block_table.shape[0] != B or block_table.shape[1] < 1:
        raise ShapeError(f"{where}: block_table must have shape [B, max_blocks_per_seq] = ({B}, n >= 1), "
                         f"got {block_table.shape}")
    if kv_len is None:
        raise ConstraintError(f"{where}: a paged call needs kv_len=[B] (the sequence lengths) with the "
                              f"block_table")
    Skv = block_table.shape[1] * bs
    lens = np.asarray(kv_len)
    if lens.dtype.kind in "iu" and lens.shape == (B,) and lens.size and lens.max() > Skv:
        bad = int(np.argmax(lens))
        raise ConstraintError(
            f"{where}: kv_len[{bad}] = {int(lens[bad])} is beyond the sequence's blocks: the block table "
            f"has {block_table.shape[1]} entries per sequence x block_size {bs} = {Skv} keys; pass a "
            f"table with at least {-(-int(lens[bad]) // bs)} entries per sequence")
    lens, _ = check_kv_len(kv_len, B, Skv, where)
    need = -(-lens // bs)
    used = np.arange(block_table.shape[1])[None, :] < need[:, None]
    bad = used & ((block_table < 0) | (block_table >= NB))
    if bad.any():
        bi, pi = (int(x[0]) for x in np.nonzero(bad))
        raise ConstraintError(
            f"{where}: block_table[{bi}, {pi}] = {int(block_table[bi, pi])} is outside [0, num_blocks="
            f"{NB}); sequence {bi} (kv_len {int(lens[bi])}) uses its first {int(need[bi])} entries")
    if gqa != "head_loop":
        raise ConstraintError(f"{where}: a paged call runs gqa='head_loop' only (got {gqa!r}); the query "
                              f"heads of a KV head read each loaded tile; drop gqa or pass gqa='head_loop'")
    a = Args()
    a.layout = layout
    a.dtype = inputs.same_dtype(where, q=qt, k_cache=kc, v_cache=vc)
    a.q, a.k, a.v = qt, kc, vc
    a.B, a.Hq, a.Hkv, a.Sq, a.Skv, a.D, a.Dv, a.G = B, Hq, Hkv, Sq, Skv, D, vc.shape[3], Hq // Hkv
    a.copied_bytes = qt.copied_bytes + kc.copied_bytes + vc.copied_bytes
    a.scale = check_scale(scale, D, where)
    if not isinstance(causal, (bool, np.bool_)):
        raise ConstraintError(f"{where}: causal must be True or False, got {causal!r}")
    a.causal, a.window, a.left, a.right = check_window(window, bool(causal), Sq, Skv, where)
    a.kv_len, a.kv_len_given = lens, True
    a.has_mask, a.mask_flat, a.mask_strides, a.mask_dtype = check_mask(mask, (B, Hq, Sq, Skv), where)
    a.gqa = gqa
    a.softcap = check_softcap(softcap, where)
    a.has_sinks, a.sinks = check_sinks(sinks, Hq, where)
    return a, np.ascontiguousarray(block_table, dtype=np.int32), bs


# --- plans ---


def _task_spans(strategy, plan, B, Sq, Skv, kv_len, causal, left, right):
    """(b, t0, t1) of every task of one KV head: the KV tiles it runs (the kernels' rules)."""
    kvt, qt = plan.params["kv_tile"], plan.params["q_tile"]
    nq = -(-Sq // qt)
    spans = []
    if strategy == "flash":
        n_split = plan.params["num_splits"]
        T0, T1 = run_tiles(B, 1, 1, Sq, Skv, qt, kvt, kv_len, causal, left, right)
        for b in range(B):
            for qi in range(nq):
                t0, T = int(T0[b, qi]), int(T1[b, qi] - T0[b, qi])
                per = -(-T // n_split)
                for sp in range(n_split):
                    lo = t0 + min(sp * per, T)
                    spans.append((b, lo, min(lo + per, t0 + T)))
        return spans
    for b in range(B):
        for qi in range(nq):
            i0, qv = qi * qt, min(qt, Sq - qi * qt)
            lo = band_keys.py_func(b, i0, Sq, Skv, kv_len, left, right)[0]
            hi = band_keys.py_func(b, i0 + qv - 1, Sq, Skv, kv_len, left, right)[1]
            spans.append((b, *tile_span.py_func(int(lo), int(hi), kvt)))
    return spans


def plan_paged(strategy, q_shape, cache_shape, table_shape, v_shape=None, dtype="fp32", *, kv_len,
               profile=None, **options):
    """Plan of a paged ``flash`` or ``online`` call: the dense plan of the logical cache
    ``[B, Hkv, max_blocks_per_seq * block_size, D]``, with K/V read only below ``kv_len`` and
    the block-table entries of each task's pages (4 B each) added to its reads.

    ``cache_shape``: ``[num_blocks, block_size, Hkv, D]``; ``v_shape``: v_cache's (None: the
    same); ``table_shape``: ``[B, max_blocks_per_seq]``; ``options``: the strategy's plan options."""
    if strategy not in ("flash", "online"):
        raise ConstraintError(f"attention.plan_paged: strategy must be 'flash' or 'online', got {strategy!r}")
    B, Hq, Sq, D = (int(x) for x in q_shape)
    _, bs, Hkv, Dk = (int(x) for x in cache_shape)
    Dv = Dk if v_shape is None else int(v_shape[3])
    Skv = int(table_shape[1]) * bs
    lens = np.asarray(kv_len, dtype=np.int64).reshape(B)
    plan_fn = plan_flash if strategy == "flash" else plan_online
    dense = plan_fn((B, Hq, Sq, D), (B, Hkv, Skv, Dk), (B, Hkv, Skv, Dv), dtype, profile=profile,
                    kv_len=lens, **options)
    causal, _, left, right = check_window(options.get("window"), bool(options.get("causal", False)), Sq, Skv,
                                          f"attention.{strategy}")
    kvt = dense.params["kv_tile"]
    b_sz = dtypes.itemsize(dense.dtype)
    delta = 0
    for b, t0, t1 in _task_spans(strategy, dense, B, Sq, Skv, lens, causal, left, right):
        kvl = int(lens[b])
        for t in range(t0, t1):
            j0 = t * kvt
            n = min(kvt, Skv - j0)
            delta += (max(min(n, kvl - j0), 0) - n) * (Dk + Dv) * b_sz
        delta += TABLE_ENTRY_BYTES * pages_touched.py_func(t0, t1, kvt, kvl, bs)
    main = dense.kernels[0]
    kernels = (dataclasses.replace(main, gm_read_bytes=main.gm_read_bytes + Hkv * delta),) + dense.kernels[1:]
    return dataclasses.replace(dense, kernels=kernels, params=dict(dense.params, block_size=bs, paged=True))


# --- calls ---


def _tile_buffers(kv_tile, D, Dv, kdtype, Rmax):
    """Per-thread tile buffers: K and V tiles as loaded, and K^T packed for prefill blocks."""
    threads = numba.config.NUMBA_NUM_THREADS
    kbuf = np.empty((threads, 1, 1, kv_tile, D), kdtype)
    vbuf = np.empty((threads, 1, 1, kv_tile, Dv), kdtype)
    ktbuf = np.empty((threads, D * kv_tile if Rmax >= GEMM_MIN_ROWS else 1), np.float32)
    return kbuf, vbuf, ktbuf


def paged_call(strategy, q, k_cache, v_cache, *, block_table, kv_len, scale, causal, mask, gqa, window,
               softcap, sinks, profile, kv_tile=None, q_tile=None, num_splits=None, return_lse=False,
               pv="storage", layout="bhsd", cast_mode=None):
    """The paged path of :func:`flash.flash` and :func:`online.online` (their ``block_table=``;
    ``cast_mode`` rounds P and the output as the dense kernels do)."""
    where = f"attention.{strategy}"
    a, table, bs = validate_paged(q, k_cache, v_cache, where, block_table=block_table, kv_len=kv_len,
                                  scale=scale, causal=causal, mask=mask, gqa=gqa, window=window,
                                  softcap=softcap, sinks=sinks, layout=layout)
    opts = dict(kv_tile=kv_tile, q_tile=q_tile, causal=a.causal, has_mask=a.has_mask, **a.plan_options())
    if strategy == "flash":
        opts.update(num_splits=num_splits, return_lse=return_lse)
    else:
        opts.update(pv=pv)
    p = plan_paged(strategy, a.q.shape, a.k.shape, table.shape, a.v.shape, a.dtype, kv_len=a.kv_len,
                   profile=profile, **opts)
    kvt, qt = p.params["kv_tile"], p.params["q_tile"]
    cm = resolve_cast_mode(cast_mode, profile, where)  # a bad name is refused for fp32 too
    cm = cm if a.dtype != "fp32" else dtypes.RINT  # fp32 never narrows: one kernel for every mode
    Rmax = a.G * qt
    nq = -(-a.Sq // qt)
    out, out_k = a.empty_out()
    kk, vk = a.k.kview, a.v.kview
    msb, msh, msi, msj = a.mask_strides
    shapes = (a.q.shape, a.k.shape, a.v.shape)
    if Rmax < GEMM_MIN_ROWS and kvt % 4 == 0:
        return decode_call(strategy, p, a, table, bs, out, out_k, cm, return_lse)
    kbuf, vbuf, ktbuf = _tile_buffers(kvt, a.D, a.Dv, kk.dtype, Rmax)
    if strategy == "flash":
        n_split = p.params["num_splits"]
        lse = np.empty((a.B, a.Hq, a.Sq), np.float32)
        want = bool(return_lse)
        blocks = a.B * a.Hkv * nq
        with Launch(p, shapes) as run:
            qg = query_group(blocks, nq, Rmax, n_split)
            layout = flash_scratch(Rmax, a.D, a.Dv, kvt, qg)
            scratch = tile.scratch(layout.total, np.float32)
            state_at = state_layout(Rmax, a.Dv)
            state = tile.scratch(qg * state_at.total, np.float32)
            ps, pb = (n_split, blocks) if n_split > 1 else (1, 1)
            part_m = np.empty((ps, pb, Rmax), np.float32)
            part_l = np.empty((ps, pb, Rmax), np.float32)
            part_o = np.empty((ps, pb, Rmax * a.Dv), np.float32)
            with cube.dynamic_tasks(1):
                counted = _paged_flash_kernel(
                    a.q.kview, kk, vk, table, bs, a.Skv, out_k, lse, want, a.kv_len, a.causal, a.left,
                    a.right, a.scale, a.softcap, a.has_mask, a.mask_flat, msb, msh, msi, msj, a.has_sinks,
                    a.sinks, qt, qg, kvt, n_split, kbuf, vbuf, ktbuf, scratch, layout.bounds, state,
                    state_at.bounds, part_m, part_l, part_o, cm)
            run.count(counted, workspace_bytes=p.kernels[0].workspace_bytes)
            if n_split > 1:
                run.count(_combine_kernel(part_m, part_l, part_o, out_k, lse, want, a.Hkv, qt, a.has_sinks,
                                          a.sinks, cm))
            run.workspace(a.copied_bytes)
        return (out, lse) if return_lse else out
    tasks = a.B * a.Hkv * nq
    with Launch(p, shapes) as run:
        qg = query_group(tasks, nq, Rmax)
        layout = online_scratch(Rmax, a.D, a.Dv, kvt, qg)
        scratch = tile.scratch(layout.total, np.float32)
        ws_m = np.empty((tasks, Rmax), np.float32)
        ws_l = np.empty((tasks, Rmax), np.float32)
        ws_o = np.empty((tasks, Rmax * a.Dv), np.float32)
        with cube.dynamic_tasks(1):
            counted = _paged_online_kernel(
                a.q.kview, kk, vk, table, bs, a.Skv, out_k, a.kv_len, a.causal, a.left, a.right, a.scale,
                a.softcap, a.has_mask, a.mask_flat, msb, msh, msi, msj, a.has_sinks, a.sinks, qt, qg, kvt,
                PV_CODE[p.params["pv"]], kbuf, vbuf, ktbuf, scratch, layout.bounds, ws_m, ws_l, ws_o, cm)
        run.count(counted, workspace_bytes=p.kernels[0].workspace_bytes)
        run.workspace(a.copied_bytes)
    return out

