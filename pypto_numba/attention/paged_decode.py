"""Paged decode, page-major: one CPU task walks the KV tiles of a (batch, query tile, split) for a
group of KV heads at once, reading each block of 4 keys of every head of the group straight from
its page.

vLLM's layout stores a key's heads side by side (``[page, token, Hkv, D]``): one head's keys are
D-element runs ``Hkv*D`` apart. Read head by head, as the dense tasks do, this machine streams
them at about a third of the read bandwidth; read key-major over the heads, at nearly all of it
(docs/performance-attention.md). The arithmetic of every head is the dense kernel's: the same tile bodies
(decode_tiles.py) over the same tiles and splits, blocks of 4 keys in order and the merge per
tile, so the result has the bits of the dense call on the gathered cache. Only the CPU's loop
order changes; the NPU model (the plan, the counters) still counts one task per KV head.

Where 2 or 4 key rows share a 4 KiB CPU page (bf16 at Hkv * D = 1024: 2 KiB rows), Q K^T takes
its blocks of 4 keys as every 2nd (4th) key, so that the walk reads each page in one ascending
run: a block of 4 adjacent keys reads the page's rows interleaved, and the L2 streamer (one
stream per page) then falls behind. A score's sum does not depend on the block's other keys.

Used for decode-shaped blocks (``G*q_tile < GEMM_MIN_ROWS``) with ``kv_tile % 4 == 0``: a
4-key block then never spans pages (block sizes are multiples of 16). Keys at or past
``kv_len[b]`` are never read from a page that holds none below it; their scores are zeros and
masked, as in paged.py.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..machine import cube, tile
from ..machine.jit import device, kernel
from ..strategy import Launch
from .decode_tiles import ADJACENT, pv_keys, scores_keys
from .flash import _combine_kernel, _split_tiles, finish_block, state_layout
from .online import _walked_tiles
from .online import scratch_layout as online_scratch
from .strided import flat1d
from .tasks import query_tile
from .tiles import (
    PV_COMPENSATED,
    PV_STORAGE,
    load_q_block,
    merge_state,
    reset_state,
    tile_cube_flops,
    tile_softmax,
    tile_vector_ops,
)
from .validation import PV_CODE

PAGE_BYTES = 4096  # the CPU's page: its L2 streamer follows one ascending stream per page


@device
def pages_touched(t0, t1, kv_tile, kvl, bs):
    """Pages holding the keys below ``kvl`` of KV tiles ``[t0, t1)``."""
    lo = t0 * kv_tile
    hi = min(t1 * kv_tile, kvl)
    if hi <= lo:
        return 0
    return (hi - 1) // bs - lo // bs + 1


def head_groups(tasks, Hkv, threads):
    """KV-head groups per (batch, query tile, split): the fewest (a divisor of Hkv) that give
    every thread a task. Fewer heads per task read shorter runs of each key row, which costs more
    than an uneven share of tasks (docs/performance-attention.md)."""
    for g in range(1, Hkv + 1):
        if Hkv % g == 0 and tasks * g >= threads:
            return g
    return Hkv


def rows_per_page(row_bytes):
    """Key rows (of ``row_bytes``, all heads) in one CPU page: 1 to 4."""
    return max(1, min(4, PAGE_BYTES // row_bytes))


@device
def _key_offset(table, b, key, bs, Hkv, h0, D):
    """Flat offset of head h0 of key ``key`` of sequence b in the page holding it (uint64)."""
    p = key // bs
    return ((np.uint64(table[b, p]) * np.uint64(bs) + np.uint64(key - p * bs)) * np.uint64(Hkv)
            + np.uint64(h0)) * np.uint64(D)


@kernel
def paged_decode_kernel(q, k, v, table, bs, Skv, out, lse, want_lse, kv_len, causal, left, right, scale,
                        softcap, has_mask, mask, msb, msh, msi, msj, has_sinks, sinks, qt, kv_tile, n_split,
                        nhg, kpg, online, pv_mode, scratch, at, state, state_at, part_m, part_l, part_o, cm):
    """Decode over the pages for ``flash`` (``online`` False: split tiles, partials when
    ``n_split > 1``) or ``online`` (its walked tiles, ``pv_mode``, and its state's GM round trip
    per tile in the counters). ``at``: online.scratch_layout's bounds for all rows of a head
    group (head ``hh`` owns rows ``hh*Rmax ..``); ``state``: flash.state_layout per head."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[2]
    Dv = v.shape[3]
    G = Hq // Hkv
    nq = (Sq + qt - 1) // qt
    Rmax = G * min(qt, Sq)
    b_sz = q.itemsize
    state_row = (Dv + 2) * 4
    kf = flat1d(k)
    vf = flat1d(v)
    uks = np.uint64(Hkv * D)  # key stride within a page
    uvs = np.uint64(Hkv * Dv)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    cube_flops = 0
    for it in prange(B * nq * n_split * nhg):
        hg = it % nhg
        rest = it // nhg
        sp = rest % n_split
        rest = rest // n_split
        qi = rest % nq
        b = rest // nq
        h0 = hg * Hkv // nhg
        nh = (hg + 1) * Hkv // nhg - h0
        tid = numba.get_thread_id()
        sc = scratch[tid]
        st = state[tid]
        sw = state_at[3]
        i0, qv, R = query_tile(qi, qt, Sq, G)
        kvl = kv_len[b]
        if online:
            lo, hi = _walked_tiles(b, i0, qv, Sq, Skv, kv_len, left, right, kv_tile)
        else:
            lo, hi = _split_tiles(b, i0, qv, Sq, Skv, kv_len, causal, left, right, kv_tile, n_split, sp)
        nmax = np.zeros(nh, np.int64)
        for hh in range(nh):
            m0 = hh * sw
            reset_state(st[m0 + state_at[0]:m0 + state_at[1]], st[m0 + state_at[1]:m0 + state_at[2]],
                        st[m0 + state_at[2]:m0 + sw], R, Dv)
            load_q_block(q, b, h0 + hh, G, i0, qv, sc[at[0] + hh * Rmax * D:at[0] + (hh + 1) * Rmax * D])
            gm_read += R * D * b_sz + 4 * pages_touched(lo, hi, kv_tile, kvl, bs)
        res = sc[at[8]:at[9]]  # cube.dot4x4's results
        uRD = np.uint64(Rmax * D)
        uRT = np.uint64(Rmax * kv_tile)
        uRV = np.uint64(Rmax * Dv)
        uq = np.uint64(at[0])
        us = np.uint64(at[1])
        uph = np.uint64(at[2])
        upl = np.uint64(at[3])
        uot = np.uint64(at[4])
        uo2 = np.uint64(at[5])
        for t in range(lo, hi):
            j0 = t * kv_tile
            n = min(kv_tile, Skv - j0)
            nread = max(min(n, kvl - j0), 0)
            un = np.uint64(n)
            n4 = n - n % 4
            # QK^T: blocks of 4 keys for every head of the group. Where ``kpg`` key rows share a
            # 4 KiB page, a group of 4*kpg keys goes as kpg blocks of every kpg-th key, so that
            # each page is read in one ascending run (the prefetcher follows one stream a page)
            done = 0
            while done < n4 and done < nread:
                jg = j0 + done
                g = kpg  # plain blocks of 4 where the group would cross a page, kv_len or n4
                if done + 4 * g > min(n4, nread) or jg // bs != (jg + 4 * g - 1) // bs:
                    g = 1
                ug = np.uint64(g)
                for par in range(g):
                    kj = _key_offset(table, b, jg + par, bs, Hkv, h0, D)
                    for hh in range(nh):
                        uh = np.uint64(hh)
                        scores_keys(sc, uq + uh * uRD, R, D, kf, kj + uh * np.uint64(D), uks * ug, 4, sc,
                                    us + uh * uRT + np.uint64(done + par), un, ug, res)
                done += 4 * g
            if n4 < nread:  # the tile's last n % 4 keys (one 4-aligned block of a page)
                kj = _key_offset(table, b, j0 + n4, bs, Hkv, h0, D)
                for hh in range(nh):
                    uh = np.uint64(hh)
                    scores_keys(sc, uq + uh * uRD, R, D, kf, kj + uh * np.uint64(D), uks, n - n4, sc,
                                us + uh * uRT + np.uint64(n4), un, ADJACENT, res)
                done = n
            for hh in range(nh):  # keys of pages never read (past kv_len): zero scores, masked
                for r in range(R):
                    for j in range(done, n):
                        sc[us + np.uint64(hh) * uRT + np.uint64(r * n + j)] = np.float32(0.0)
            # the tile softmax per head
            jmax = 0
            for hh in range(nh):
                nmax[hh] = tile_softmax(
                    sc[at[1] + hh * Rmax * kv_tile:at[1] + (hh + 1) * Rmax * kv_tile], R, n, j0, b, h0 + hh, G, i0,
                    qv, Sq, Skv, kv_len, causal, left, right, scale, softcap, has_mask, mask, msb, msh, msi, msj,
                    sc[at[6] + hh * Rmax:at[6] + (hh + 1) * Rmax], sc[at[7] + hh * Rmax:at[7] + (hh + 1) * Rmax],
                    sc[at[2] + hh * Rmax * kv_tile:at[2] + (hh + 1) * Rmax * kv_tile],
                    sc[at[3] + hh * Rmax * kv_tile:at[3] + (hh + 1) * Rmax * kv_tile], pv_mode, q, cm)
                jmax = max(jmax, nmax[hh])
                ot = sc[at[4] + hh * Rmax * Dv:at[4] + (hh + 1) * Rmax * Dv]
                for i in range(R * Dv):
                    ot[i] = np.float32(0.0)
                if pv_mode == PV_COMPENSATED:
                    ot2 = sc[at[5] + hh * Rmax * Dv:at[5] + (hh + 1) * Rmax * Dv]
                    for i in range(R * Dv):
                        ot2[i] = np.float32(0.0)
            # P @ V: blocks of 4 keys for every head, one key at a time past its multiple of 4
            for jj in range(0, jmax, 4):
                vj = _key_offset(table, b, j0 + jj, bs, Hkv, h0, Dv)
                uj = np.uint64(jj)
                for hh in range(nh):
                    nm = nmax[hh]
                    uh = np.uint64(hh)
                    vh = vj + uh * np.uint64(Dv)
                    if jj + 4 <= nm - nm % 4:
                        pv_keys(sc, uph + uh * uRT + uj, R, un, vf, vh, uvs, 4, sc, uot + uh * uRV, Dv)
                        if pv_mode == PV_COMPENSATED:
                            pv_keys(sc, upl + uh * uRT + uj, R, un, vf, vh, uvs, 4, sc, uo2 + uh * uRV, Dv)
                    else:
                        for e in range(min(4, max(nm - jj, 0))):
                            ue = np.uint64(e)
                            pv_keys(sc, uph + uh * uRT + uj + ue, R, un, vf, vh + ue * uvs, uvs, 1, sc,
                                    uot + uh * uRV, Dv)
                            if pv_mode == PV_COMPENSATED:
                                pv_keys(sc, upl + uh * uRT + uj + ue, R, un, vf, vh + ue * uvs, uvs, 1, sc,
                                        uo2 + uh * uRV, Dv)
            # the merge per head, and the counters of one NPU task per head
            for hh in range(nh):
                m0 = hh * sw
                ms = st[m0 + state_at[0]:m0 + state_at[1]]
                ls = st[m0 + state_at[1]:m0 + state_at[2]]
                os = st[m0 + state_at[2]:m0 + sw]
                mt = sc[at[6] + hh * Rmax:at[6] + (hh + 1) * Rmax]
                lt = sc[at[7] + hh * Rmax:at[7] + (hh + 1) * Rmax]
                ot = sc[at[4] + hh * Rmax * Dv:at[4] + (hh + 1) * Rmax * Dv]
                if pv_mode == PV_COMPENSATED:
                    ot2 = sc[at[5] + hh * Rmax * Dv:at[5] + (hh + 1) * Rmax * Dv]
                    for i in range(R * Dv):
                        ot[i] += ot2[i]
                if online and t == lo:  # online's first tile is its state (no merge)
                    for r in range(R):
                        ms[r] = mt[r]
                        ls[r] = lt[r]
                    for i in range(R * Dv):
                        os[i] = ot[i]
                else:
                    merge_state(ms, ls, os, mt, lt, ot, R, Dv)
                gm_read += nread * (D + Dv) * b_sz
                if has_mask:
                    gm_read += R * n * mask.itemsize
                if online:
                    if t > lo:
                        gm_read += R * state_row
                    if t < hi - 1:
                        gm_write += R * state_row
                vector_ops += tile_vector_ops(R, n, Dv, has_mask, pv_mode, softcap)
                cube_flops += tile_cube_flops(R, n, D, Dv, pv_mode)
        for hh in range(nh):
            kvh = h0 + hh
            m0 = hh * sw
            rd, wr, ops = finish_block(st[m0 + state_at[0]:m0 + state_at[1]], st[m0 + state_at[1]:m0 + state_at[2]],
                                       st[m0 + state_at[2]:m0 + sw], R, Dv, out, lse, want_lse, b, kvh, G, i0, qv,
                                       has_sinks, sinks, n_split, sp, (b * Hkv + kvh) * nq + qi, part_m, part_l,
                                       part_o, cm)
            gm_read += rd
            gm_write += wr
            vector_ops += ops
            tasks += 1
    return tasks, gm_read, gm_write, vector_ops, cube_flops


def decode_call(strategy, p, a, table, bs, out, out_k, cm, return_lse):
    """Decode-shaped blocks: paged_decode's page-major kernel (the plan's tiles and splits)."""
    kvt, qt = p.params["kv_tile"], p.params["q_tile"]
    flash = strategy == "flash"
    n_split = p.params["num_splits"] if flash else 1
    nq = -(-a.Sq // qt)
    Rmax = a.G * min(qt, a.Sq)
    nhg = head_groups(a.B * nq * n_split, a.Hkv, numba.get_num_threads())
    rows = Rmax * -(-a.Hkv // nhg)  # the rows of a head group
    layout = online_scratch(rows, a.D, a.Dv, kvt)
    state_at = state_layout(Rmax, a.Dv)
    blocks = a.B * a.Hkv * nq
    ps, pb = (n_split, blocks) if n_split > 1 else (1, 1)
    lse = np.empty((a.B, a.Hq, a.Sq), np.float32)
    want = bool(return_lse) and flash
    msb, msh, msi, msj = a.mask_strides
    pv_mode = PV_CODE[p.params["pv"]] if not flash else PV_STORAGE
    with Launch(p, (a.q.shape, a.k.shape, a.v.shape)) as run:
        scratch = tile.scratch(layout.total, np.float32)
        state = tile.scratch(-(-a.Hkv // nhg) * state_at.total, np.float32)
        part_m = np.empty((ps, pb, Rmax), np.float32)
        part_l = np.empty((ps, pb, Rmax), np.float32)
        part_o = np.empty((ps, pb, Rmax * a.Dv), np.float32)
        with cube.dynamic_tasks(1):
            counted = paged_decode_kernel(
                a.q.kview, a.k.kview, a.v.kview, table, bs, a.Skv, out_k, lse, want, a.kv_len, a.causal, a.left,
                a.right, a.scale, a.softcap, a.has_mask, a.mask_flat, msb, msh, msi, msj, a.has_sinks, a.sinks,
                qt, kvt, n_split, nhg, rows_per_page(a.Hkv * a.D * a.k.kview.itemsize), not flash, pv_mode,
                scratch, layout.bounds, state, state_at.bounds, part_m, part_l, part_o, cm)
        run.count(counted, workspace_bytes=p.kernels[0].workspace_bytes)
        if n_split > 1:
            run.count(_combine_kernel(part_m, part_l, part_o, out_k, lse, want, a.Hkv, qt, a.has_sinks,
                                      a.sinks, cm))
        run.workspace(a.copied_bytes)
    return (out, lse) if flash and return_lse else out
