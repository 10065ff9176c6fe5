"""The tile bodies every attention strategy runs: Q K^T, the tile softmax, P @ V, the merge.

Layout of one tile task (the PyPTO GQA decode layout, npu-facts 2.1): the ``G = Hq // Hkv`` query
heads of KV head ``kvh`` and ``qv`` query positions ``i0 .. i0+qv-1`` form one ``[R = G*qv, D]``
block, row ``r = g*qv + ii`` holding ``q[b, kvh*G + g, i0 + ii]``. The KV axis is walked in
``kv_tile`` tiles; a tail tile has the valid shape ``n = min(kv_tile, Skv - j0)``.

Per KV tile (the rounding points of the NPU)::

    S = Q K^T            fp32 accumulation of storage-dtype operands (cube, L0C)
    S = S*scale + mask   fp32 (vector)
    S = c*tanh(S/c)      with ``softcap`` c (Gemma 2: after the scale, before the mask)
    m = rowmax(S)        over the allowed keys only: a range [lo, hi) of each row (kv_len, causal
                         and the window's right edge bound hi, the window's left edge lo)
    p = exp(S - m)       fp32; disallowed keys give p = 0
    l = rowsum(p)        fp32, of the unrounded p
    P = round(p)         storage dtype, by the cast mode (pv="storage"); "compensated": P_hi + P_lo,
                         two matmuls
    O = P V              fp32 accumulation
    merge:  m' = max(m_s, m); a = exp(m_s - m'); c = exp(m - m'); l' = a l_s + c l; O' = a O_s + c O

and at the end ``out = O / l`` (0 when ``l == 0``: fully masked rows give zeros, never NaN), cast
once to the storage dtype by the cast mode. A row whose tile has no allowed key (or whose keys are all ``-inf``
after the mask) contributes ``m = -inf, l = 0, O = 0`` and the merge leaves the state unchanged.
Attention sinks (one logit per query head, no value) join the state once, after the last tile
(:func:`merge_sink`), so they are in the row max, the sum and the lse, and never in P @ V.

Decode-shaped tiles (few rows) run the 4-key blocks of decode_tiles.py, which stream K and V once
with the G rows reusing each K/V row from L1 (QK^T: blocks of 4 rows x 4 keys,
:func:`machine.cube.dot4x4`; PV: 4 rows x 4 keys per pass over the O rows), and prefetch the K/V
rows ``PREFETCH_ROWS`` keys ahead (the NPU double-buffers its GM->L1 loads the same way). A task
walking one query tile runs a KV tile's P @ V and the next tile's Q K^T block by block in turns
(:func:`tile_pv_scores`), so that V and K stream together. Tiles with >= GEMM_MIN_ROWS rows
(prefill) use the outer-product register blocks of
:func:`machine.cube.outer_rows` (mostly 6 rows x 64 columns in 24 fp32 vector accumulators):
P @ V reads V as stored, Q K^T reads K packed transposed once per call (:func:`packed_keys`,
shared by all query tiles of a head). Every score and output element is one chain of fp32 FMAs
in ascending order of its reduction index, so the bits do not depend on the thread count. The
tile softmax uses the 16-lane :func:`machine.vmath.rowmax` and :func:`machine.vmath.softmax_exp`,
every row's max before the exps. Measurements: docs/performance-attention.md.
"""

from __future__ import annotations

import math

import numpy as np
from numba import prange, types
from numba.extending import overload

from ..machine import cube, dtypes
from ..machine.jit import device, kernel
from ..machine.tile import aligned_empty
from ..machine.vmath import exp as vexp  # the vector unit's exp (<= 4 ulp, exp(-inf) = 0)
from ..machine.vmath import rowmax as vrowmax  # the vector unit's row max (skips NaN)
from ..machine.vmath import softmax_exp_mode as vsoftmax_exp  # exp(s - m) -> P rounded by a cast mode, and its sum
from ..machine.vmath import tanh as vtanh  # the vector unit's tanh (soft-capping)
from .decode_tiles import ADJACENT, pv_keys, scores_keys
from .strided import flat1d, flat_rows, key_row, pack_keys_strided, prefetch_key

GEMM_MIN_ROWS = 16  # tiles with at least this many rows (prefill) use cube.outer_rows for QK^T and PV
PREFETCH_ROWS = 16  # decode loops prefetch the K/V row this many keys ahead (8 KiB of fp32 at D=128)
RES_SLOTS = 16  # fp32 scratch slots per thread for the results of cube.dot4x4 (tile_scores)
NEG_INF = np.float32(-np.inf)

# how P meets V (the ``pv`` option; validation.PV_CODE maps its names to these codes)
PV_STORAGE = 0  # P rounded to the storage dtype (the NPU)
PV_COMPENSATED = 1  # P_hi + P_lo, both in the storage dtype: two P@V summed in fp32
PV_FP32 = 2  # P kept in fp32

# vector element-ops per (row, key) of a processed tile: scale, max, sub, exp, sum, cast of P;
# +1 with a mask (add), +2 for the compensated residual (sub, cast)
TILE_OPS = 6
# per row of a processed tile: merge m' (1), a and c (2 sub + 2 exp), l' (3) = 8, and 3 per
# output element (a*O_s, c*O, add); the compensated option adds one per output element (O_hi+O_lo)
MERGE_ROW_OPS = 8
MERGE_ELEM_OPS = 3
# per output row: divide by l and cast (per element)
FINAL_ELEM_OPS = 2
# per (row, key) of a processed tile with soft-capping: divide, tanh, multiply
SOFTCAP_OPS = 3
# the sink joins a row's state like a tile (MERGE_ROW_OPS), and scales its output (1 per element)
SINK_ROW_OPS = MERGE_ROW_OPS
SINK_ELEM_OPS = 1


def mask_term(m):
    """The additive score term of mask element ``m`` (the kernels read the mask as stored): a
    bool keeps its key (True: 0) or drops it (False: -inf), torch SDPA's convention; an fp32,
    bf16 or fp16 value (kernel view) is added as its fp32 value."""
    if isinstance(m, (bool, np.bool_)):
        return np.float32(0.0) if m else NEG_INF
    return dtypes.widen(m)


@overload(mask_term, jit_options={"forceinline": True})
def _mask_term_impl(m):
    if isinstance(m, types.Boolean):
        return lambda m: np.float32(0.0) if m else NEG_INF
    return lambda m: dtypes.widen(m)


@device
def load_q_block(q, b, kvh, G, i0, qv, qf):
    """qf[r*D + d] = q[b, kvh*G + g, i0 + ii, d] (fp32), r = g*qv + ii."""
    D = q.shape[3]
    for g in range(G):
        for ii in range(qv):
            base = (g * qv + ii) * D
            for d in range(D):
                qf[base + d] = dtypes.widen(q[b, kvh * G + g, i0 + ii, d])


@device
def tile_scores(qf, R, k, b, h, j0, n, s, kt, ktw, use_gemm, res):
    """s[r*n + j] = sum_d qf[r, d] * k[b, h, j0 + j, d] in fp32 (R rows, n keys); ``res``: 16 fp32
    scratch slots (the results of :func:`cube.dot4x4`).

    ``use_gemm`` (prefill): the outer-product blocks of :func:`cube.outer_rows` against ``kt``,
    the keys packed transposed by :func:`packed_keys` in tiles of ``ktw`` keys (``j0`` a multiple
    of ``ktw``); each score is summed over d in ascending order.
    """
    D = k.shape[3]
    if use_gemm:
        tile = (b * k.shape[1] + h) * ((k.shape[2] + ktw - 1) // ktw) + j0 // ktw  # packed tile index
        cube.outer_rows(s, 0, n, qf, 0, D, kt, np.uint64(tile) * np.uint64(D * ktw), ktw, R, n, D)
        return
    # decode: the walk with no P @ V
    tile_pv_scores(None, R, 0, None, b, h, j0, None, 0, qf, k, j0, n, s, res)


@device
def tile_pv(p, R, n, v, b, h, j0, o, use_gemm, nmax):
    """o[r*Dv + c] = sum_{j < n} p[r*n + j] * v[b, h, j0 + j, c] in fp32 (overwrites o).

    ``nmax``: keys past it have p = 0 in every row (allowed prefix), so the loops stop there.
    ``use_gemm`` (prefill): the outer-product blocks of :func:`cube.outer_rows`, V read as stored
    (each output summed over the keys in ascending order).
    """
    Dv = v.shape[3]
    if use_gemm:
        # only the nmax keys some row may attend: V past kv_len may hold anything (a cache slot
        # never written), and 0 * inf would be NaN
        row, uvs = key_row(v, b, h, j0)  # flat v[b, h, j0, 0], and the key stride (strided.py)
        cube.outer_rows(o, 0, Dv, p, 0, n, flat_rows(v), row, uvs, R, Dv, nmax)
        return
    # decode: the walk with no Q K^T
    tile_pv_scores(p, R, n, v, b, h, j0, o, nmax, None, None, j0, 0, None, None)


@device
def tile_pv_scores(p, R, n, v, b, h, j0, o, nmax, qf, k, j1, n1, s, res):
    """The decode walk (decode_tiles.py): ``o = P V`` of the tile at ``j0`` (P ``p``, ``n`` keys,
    the first ``nmax`` allowed) and ``s = Q K^T`` of the next tile at ``j1`` (``n1`` keys), their
    4-key blocks taken in turns, so that V and K stream together while the blocks compute.
    Q K^T: blocks of 4 keys, then the last ``n1 % 4``; P @ V: blocks of 4 keys, then one key at
    a time up to ``nmax``. A side whose arrays are None (``p`` or ``qf``) is pruned at compile
    time: :func:`tile_scores` and :func:`tile_pv` are the one-sided walks. Each score and output
    element is the same operations in the same order whether a side runs alone or with the
    other, so the three agree bit for bit."""
    if p is not None:
        Dv = v.shape[3]
        for i in range(R * Dv):
            o[i] = np.float32(0.0)
        vf = flat1d(v)
        vrow, uvs = key_row(v, b, h, j0)  # flat v[b, h, j0, 0], and the key stride (strided.py)
        un = np.uint64(n)
    if qf is not None:
        D = k.shape[3]
        kf = flat1d(k)
        krow, uks = key_row(k, b, h, j1)
        un1 = np.uint64(n1)
    j4 = nmax - nmax % 4
    n4 = n1 - n1 % 4
    for jj in range(0, max(j4, n4), 4):
        j = np.uint64(jj)
        if qf is not None:
            if jj < n4:
                for e in range(4):
                    prefetch_key(k, b, h, j1 + jj + PREFETCH_ROWS + e)
                scores_keys(qf, np.uint64(0), R, D, kf, krow + j * uks, uks, 4, s, j, un1, ADJACENT, res)
        if p is not None:
            if jj < j4:
                for e in range(4):
                    prefetch_key(v, b, h, j0 + jj + PREFETCH_ROWS + e)
                pv_keys(p, j, R, un, vf, vrow + j * uvs, uvs, 4, o, np.uint64(0), Dv)
    if qf is not None:
        if n4 < n1:
            j = np.uint64(n4)
            scores_keys(qf, np.uint64(0), R, D, kf, krow + j * uks, uks, n1 - n4, s, j, un1, ADJACENT, res)
    if p is not None:
        for jj in range(j4, nmax):
            j = np.uint64(jj)
            pv_keys(p, j, R, un, vf, vrow + j * uvs, uvs, 1, o, np.uint64(0), Dv)


@device
def key_range(b, i, Sq, Skv, kv_len, causal, left, right):
    """Keys ``[lo, hi)`` query position i of batch b may attend (``0 <= lo <= hi <= Skv``).

    On the bottom-right diagonal ``i' = i + kv_len[b] - Sq``: keys below kv_len, ``j <= i'`` when
    causal, and the window band ``-right <= i' - j <= left``. No window: ``left = right = Skv + Sq``
    (validation.check_window), which bounds nothing, so ``lo = 0``.
    """
    kvl = kv_len[b]
    ip = i + kvl - Sq
    hi = min(kvl, ip + right + 1)
    if causal:
        hi = min(hi, ip + 1)
    hi = max(min(hi, Skv), 0)
    return min(max(ip - left, 0), hi), hi


@device
def band_keys(b, i, Sq, Skv, kv_len, left, right):
    """Keys ``[lo, hi)`` of the window band of query position i alone (kv_len and causal not
    applied): what ``online`` skips outside; all of ``[0, Skv)`` without a window."""
    ip = i + kv_len[b] - Sq
    hi = max(min(ip + right + 1, Skv), 0)
    return min(max(ip - left, 0), hi), hi


@device
def tile_span(lo, hi, kv_tile):
    """The KV tiles ``[t0, t1)`` holding keys ``[lo, hi)``; ``(0, 0)`` for an empty range."""
    if hi <= lo:
        return 0, 0
    return lo // kv_tile, (hi + kv_tile - 1) // kv_tile


@device
def tile_softmax(
    s,
    R,
    n,
    j0,
    b,
    kvh,
    G,
    i0,
    qv,
    Sq,
    Skv,
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
    mt,
    lt,
    ph,
    pl,
    pv_mode,
    like,
    cm,
):
    """Scale, soft-cap, mask, tile-local max/exp/sum; P rounded like ``like``'s storage dtype by
    cast mode ``cm`` (the vector unit's cast).

    Writes ph (and pl only for PV_COMPENSATED, so pl may alias ph otherwise) [R, n], mt[R], lt[R].
    Returns the largest allowed key count in the tile (keys past it have p = 0 in every row).

    Parameters
    ----------
    s : the tile's scores [R, n] (flat fp32), scaled and masked in place
    R, n, j0 : block rows, valid keys, the tile's first key
    b, kvh, G, i0, qv : batch, KV head, query heads per KV head, first query position, positions
    Sq, Skv, kv_len, causal, left, right : what decides the allowed keys (:func:`key_range`)
    scale, softcap : the scale, and the soft-cap c (0: none; else ``c * tanh(s / c)`` after the scale)
    has_mask, mask, msb, msh, msi, msj : the flat mask as stored (:func:`mask_term`) and its strides
    mt, lt : the tile's row max and row sum (out)
    ph, pl : P, and the rounding residual for PV_COMPENSATED (out)
    pv_mode : PV_STORAGE, PV_COMPENSATED or PV_FP32
    like : an array of the storage dtype (P is rounded to it)
    cm : the cast mode of P's rounding (a ``dtypes.CastMode``: one compiled body per mode)
    """
    # two passes over the rows: every row's max first, then the exps, so the exp of a row does not
    # wait on its max's dependent chain (the same operations, so the same bits)
    nmax = 0
    for r in range(R):
        lo, c = _tile_keys(r, qv, i0, b, Sq, Skv, kv_len, causal, left, right, j0, n)
        nmax = max(nmax, c)
        base = np.uint64(r * n)  # the row in the flat tiles (uint64: vectorised loops)
        ul = np.uint64(lo)
        uc = np.uint64(c)
        if softcap > 0:  # Gemma 2's order: scale, cap, then the mask
            g = r // qv
            i = i0 + r - g * qv
            mbase = b * msb + (kvh * G + g) * msh + i * msi + j0 * msj
            for j in range(lo, c):
                x = s[base + np.uint64(j)] * scale
                x = softcap * vtanh(x / softcap)
                if has_mask:
                    x += mask_term(mask[mbase + j * msj])
                s[base + np.uint64(j)] = x
        elif has_mask:
            g = r // qv
            i = i0 + r - g * qv
            mbase = b * msb + (kvh * G + g) * msh + i * msi + j0 * msj
            for j in range(lo, c):
                s[base + np.uint64(j)] = s[base + np.uint64(j)] * scale + mask_term(mask[mbase + j * msj])
        else:
            for j in range(ul, uc):
                s[base + j] = s[base + j] * scale
        m = vrowmax(s, base + ul, c - lo)
        if m == NEG_INF:  # all allowed scores -inf, or NaN (the max skips NaN): NaN propagates
            for j in range(ul, uc):
                if s[base + j] != s[base + j]:
                    m = np.float32(np.nan)
                    break
        mt[r] = m
    for r in range(R):
        lo, c = _tile_keys(r, qv, i0, b, Sq, Skv, kv_len, causal, left, right, j0, n)
        base = np.uint64(r * n)
        ul = np.uint64(lo)
        uc = np.uint64(c)
        m = mt[r]
        total = np.float32(0.0)
        if m == NEG_INF:  # no allowed key in this tile (or all -inf through the mask)
            ul = np.uint64(0)
            uc = np.uint64(0)
        elif pv_mode == PV_FP32:  # P in fp32 (s is a float32 array: no rounding)
            total = vsoftmax_exp(s, base + ul, c - lo, m, ph, s, cm)
        elif pv_mode == PV_COMPENSATED:  # compensated: P_hi + P_lo, both in the storage dtype
            total = vsoftmax_exp(s, base + ul, c - lo, m, ph, s, cm)
            for j in range(ul, uc):
                e = ph[base + j]
                hi = dtypes.round_as(like, e, cm)
                ph[base + j] = hi
                pl[base + j] = dtypes.round_as(like, e - hi, cm)
        else:
            total = vsoftmax_exp(s, base + ul, c - lo, m, ph, like, cm)
        for j in range(ul):  # keys before the window's left edge
            ph[base + j] = np.float32(0.0)
        for j in range(uc, np.uint64(n)):
            ph[base + j] = np.float32(0.0)
        if pv_mode == PV_COMPENSATED:
            for j in range(ul):
                pl[base + j] = np.float32(0.0)
            for j in range(uc, np.uint64(n)):
                pl[base + j] = np.float32(0.0)
        lt[r] = total
    return nmax


@device
def _tile_keys(r, qv, i0, b, Sq, Skv, kv_len, causal, left, right, j0, n):
    """Allowed keys ``[lo, c)`` of block row ``r`` in the tile at ``j0`` (``n`` keys), 0 <= lo <= c <= n."""
    i = i0 + r - (r // qv) * qv
    lo, hi = key_range(b, i, Sq, Skv, kv_len, causal, left, right)
    c = max(min(hi - j0, n), 0)
    return min(max(lo - j0, 0), c), c


@device
def merge_state(ms, ls, os, mt, lt, ot, R, Dv):
    """Online-softmax merge of a tile (mt, lt, ot) into the state (ms, ls, os), in place."""
    for r in range(R):
        m_new = max(ms[r], mt[r])
        if mt[r] != mt[r] or ms[r] != ms[r]:  # max() drops NaN: a NaN tile max must reach the state
            m_new = np.float32(np.nan)
        if m_new == NEG_INF:
            continue
        a = vexp(ms[r] - m_new)
        c = vexp(mt[r] - m_new)
        ls[r] = a * ls[r] + c * lt[r]
        ms[r] = m_new
        base = np.uint64(r * Dv)
        for d in range(np.uint64(Dv)):
            os[base + d] = a * os[base + d] + c * ot[base + d]


@device
def merge_sink(ms, ls, os, R, Dv, sinks, kvh, G, qv):
    """The sink of each row's query head (``sinks[kvh*G + g]``, a logit with no value) joins the
    state as one more softmax column: ``m' = max(m, sink)``, ``l' = exp(m - m') l + exp(sink - m')``,
    ``O' = exp(m - m') O``. A row without keys becomes ``(sink, 1, 0)`` (zeros out, lse = sink);
    a NaN row stays NaN."""
    for r in range(R):
        sk = sinks[kvh * G + r // qv]
        m = ms[r]
        if m != m:
            continue
        base = np.uint64(r * Dv)
        if m == NEG_INF:  # O may hold 0 * inf from a V row other rows attend: the row is zeros
            ms[r] = sk
            ls[r] = np.float32(1.0)
            for d in range(np.uint64(Dv)):
                os[base + d] = np.float32(0.0)
            continue
        m_new = max(m, sk)
        a = vexp(m - m_new)
        ls[r] = a * ls[r] + vexp(sk - m_new)
        ms[r] = m_new
        for d in range(np.uint64(Dv)):
            os[base + d] = a * os[base + d]


@device
def reset_state(ms, ls, os, R, Dv):
    for r in range(R):
        ms[r] = NEG_INF
        ls[r] = np.float32(0.0)
    for i in range(R * Dv):
        os[i] = np.float32(0.0)


@device
def write_out(os, ls, R, Dv, out, b, kvh, G, i0, qv, cm):
    """out[b, kvh*G+g, i0+ii, :] = os[r] / ls[r], one cast to the storage dtype (the vector unit's,
    by cast mode ``cm``). l == 0 (a fully masked row) gives exact zeros, whatever O holds: its P
    row is 0, but 0 * a non-finite V value inside kv_len is NaN (a NaN row has l = NaN and stays
    NaN)."""
    for r in range(R):
        g = r // qv
        ii = r - g * qv
        h = kvh * G + g
        l = ls[r]
        inv = np.float32(1.0) / l if l > 0 else np.float32(0.0)
        base = r * Dv
        if l == 0:
            for d in range(Dv):
                out[b, h, i0 + ii, d] = dtypes.narrow(out, np.float32(0.0))
            continue
        for d in range(Dv):
            out[b, h, i0 + ii, d] = dtypes.narrow(out, os[base + d] * inv, cm)


@device
def write_lse(ms, ls, R, lse, b, kvh, G, i0, qv):
    for r in range(R):
        g = r // qv
        ii = r - g * qv
        l = ls[r]
        if l != l:
            lse[b, kvh * G + g, i0 + ii] = l  # NaN row
        else:
            lse[b, kvh * G + g, i0 + ii] = ms[r] + np.float32(math.log(l)) if l > 0 else NEG_INF


@device
def tile_vector_ops(R, n, Dv, has_mask, pv_mode, softcap):
    """Vector element-ops of one processed tile (softmax pieces + merge; ``softcap`` > 0: capped)."""
    per = (TILE_OPS + (1 if has_mask else 0) + (2 if pv_mode == PV_COMPENSATED else 0)
           + (SOFTCAP_OPS if softcap > 0 else 0))
    merge = MERGE_ROW_OPS + (MERGE_ELEM_OPS + (1 if pv_mode == PV_COMPENSATED else 0)) * Dv
    return R * n * per + R * merge


@device
def tile_cube_flops(R, n, D, Dv, pv_mode):
    return 2 * R * n * D + 2 * R * n * Dv * (2 if pv_mode == PV_COMPENSATED else 1)


# prefill: K packed transposed (CPU layout for the outer-product blocks)


@kernel(boundscheck=False)
def _pack_keys_kernel(k, width, kt):
    B, H, S, D = k.shape
    nt = (S + width - 1) // width
    uw = np.uint64(width)
    kf = k.reshape(-1)
    for task in prange(B * H * nt):
        bh = task // nt
        t = task - bh * nt
        b = bh // H
        h = bh - b * H
        j0 = t * width
        n = min(width, S - j0)
        uD = np.uint64(D)
        base = np.uint64(task) * uD * uw
        src = ((np.uint64(b) * np.uint64(H) + np.uint64(h)) * np.uint64(S) + np.uint64(j0)) * uD
        un = np.uint64(n)
        # 16 keys at a time: their rows stay in L1 while each d writes one 64-byte line of K^T
        # (key by key, every write went to another line of the tile)
        for jb in range(np.uint64(0), un, np.uint64(16)):
            je = min(jb + np.uint64(16), un)
            for d in range(uD):
                for j in range(jb, je):
                    kt[base + d * uw + j] = dtypes.widen(kf[src + j * uD + d])
    return 0


def packed_keys(k, width: int, rows: int):
    """K transposed per KV tile for the prefill blocks of :func:`tile_scores`: flat fp32
    ``[B*Hkv*ceil(Skv/width), D, width]`` (tile t of head (b, h) holds ``k[b, h, t*width + j, d]``
    at ``[d, j]``), widened exactly from 16-bit storage. ``rows``: the most rows a tile of the
    call has; below GEMM_MIN_ROWS (decode) no tile uses it and an empty array is returned.

    A CPU layout, not NPU traffic (the cube reads K^T from L1 without a copy): it is built once
    per call and shared by every query tile of a head, so the blocks of the Q K^T GEMM need no
    horizontal sums and no per-tile transposes.
    """
    if rows < GEMM_MIN_ROWS:
        return np.empty(0, np.float32)
    B, H, S, D = k.shape
    nt = -(-S // width)
    # on 64-byte lines: the blocks load K^T in whole vectors, and one that straddles two lines
    # costs twice (NumPy aligns to 16 bytes only)
    kt, _ = aligned_empty((B * H * nt * D * width,), "fp32")
    with cube.dynamic_tasks(1):  # a layout="bshd" view: the same tiles read by 4-D index
        (_pack_keys_kernel if k.flags.c_contiguous else pack_keys_strided)(k, width, kt)
    return kt
