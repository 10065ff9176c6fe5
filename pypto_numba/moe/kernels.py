"""MoE kernels: one prange iteration = one tile of token_tile tokens x the whole expert axis."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..machine import dtypes, vmath
from ..machine.jit import kernel
from .topk import _max_of, _push_desc, _reset_desc, _scan_desc, _top2_of

_sigmoid = vmath.sigmoid  # fp32, vectorisable (the vector unit's sigmoid)
_exp = vmath.exp

SIGMOID_OPS = 4  # neg, exp, +1, reciprocal
SOFTMAX_OPS = 5  # max, sub, exp, sum, div
COMBINE_OPS = 2  # mul, add per expert term


@kernel
def _gating_kernel(
    logits,
    bias,
    use_bias,
    bias_itemsize,
    softmax,
    n_group,
    topk_group,
    top2,
    top_k,
    renormalize,
    eps,
    scale,
    tile,
    weights,
    ids,
    s_scr,
    sel_scr,
    gs_scr,
    gmax_scr,
    gv_scr,
    gi_scr,
    el_scr,
    v_scr,
    i_scr,
    cand_scr,
):
    """Sigmoid or softmax scores, the group filter, the top-k and the weights of each token.

    Parameters
    ----------
    logits : [T, E] kernel view
    bias, use_bias, bias_itemsize : fp32 correction bias[E] (a dummy without one), its storage itemsize
    softmax : softmax scores (else sigmoid)
    n_group, topk_group, top2 : the group filter (top2: group score = sum of the top two, else max)
    top_k, renormalize, eps, scale : the picks and how their weights are normalised and scaled
    tile : tokens per task
    weights, ids : the outputs, fp32[T, top_k] and int32[T, top_k]
    s_scr ... cand_scr : per-thread scratch rows: scores, selection scores, group scores, group
        max/second max, group top-k values/ids, eligible groups, top-k values/ids, candidates
    """
    T, E = logits.shape
    gsize = E // n_group
    n_tasks = (T + tile - 1) // tile
    itemsize = logits.itemsize
    cast_ops = E if itemsize == 2 else 0
    neg_inf = np.float32(-np.inf)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_tasks):
        tid = numba.get_thread_id()
        s = s_scr[tid]
        sel = sel_scr[tid]
        gscore = gs_scr[tid]
        gmax = gmax_scr[tid]  # [group max..., group second max...]
        cand = cand_scr[tid]
        gv = gv_scr[tid]
        gi = gi_scr[tid]
        eligible = el_scr[tid]
        vals = v_scr[tid]
        idx = i_scr[tid]
        r0 = task * tile
        r1 = min(T, r0 + tile)
        ops = 0
        for t in range(r0, r1):
            row = logits[t]
            # --- scores in fp32 (s keeps the unbiased scores, sel the selection scores)
            if softmax:
                for e in range(E):
                    s[e] = dtypes.widen(row[e])
                m = _max_of(s, 0, E)
                total = np.float32(0.0)
                for e in range(E):
                    p = _exp(s[e] - m)
                    s[e] = p
                    total += p
                for e in range(E):
                    s[e] = s[e] / total
                check = total
                ops += cast_ops + SOFTMAX_OPS * E
            else:
                check = np.float32(0.0)
                for e in range(E):
                    v = _sigmoid(dtypes.widen(row[e]))
                    s[e] = v
                    check += v
                ops += cast_ops + SIGMOID_OPS * E
            if use_bias:
                for e in range(E):
                    sel[e] = s[e] + bias[e]
                ops += E
                selection = sel
            else:
                selection = s
            if not (check == check) or check == np.inf:
                # NaN (or, for softmax, a +-inf logit): no ranking exists; the wrapper raises
                for j in range(top_k):
                    weights[t, j] = np.float32(np.nan)
                    ids[t, j] = -1
                continue
            # --- group filter: best topk_group groups by max or top-2 sum of sel
            if n_group > 1:
                for g in range(n_group):
                    m1, m2 = _top2_of(selection, g * gsize, (g + 1) * gsize)
                    gscore[g] = m1 + m2 if top2 else m1
                    gmax[g] = m1
                    gmax[n_group + g] = m2
                _reset_desc(gv, gi)
                for g in range(n_group):
                    if gscore[g] > gv[topk_group - 1]:
                        _push_desc(gv, gi, gscore[g], g)
                for g in range(n_group):
                    eligible[g] = False
                for j in range(topk_group):
                    eligible[gi[j]] = True
                ops += (2 * E + n_group if top2 else E) + n_group + E
            # --- top_k of the eligible experts by sel, in increasing expert order
            _reset_desc(vals, idx)
            floor = neg_inf
            if n_group > 1 and 2 * topk_group >= top_k:
                # the top two of each eligible group are 2*topk_group >= top_k distinct experts,
                # so the k-th pick is >= the smallest of their second maxima: experts below that
                # floor cannot be picked (about a tenth of DeepSeek-V3's 128 eligible remain)
                floor = np.float32(np.inf)
                for j in range(topk_group):
                    second = gmax[n_group + gi[j]]
                    floor = second if second < floor else floor
            if floor > neg_inf:
                # branch-free compaction of the candidates, in expert order (keeps the tie rule)
                n_cand = 0
                for g in range(n_group):
                    if eligible[g] and gmax[g] >= floor:
                        for e in range(g * gsize, (g + 1) * gsize):
                            cand[n_cand] = e
                            n_cand += selection[e] >= floor
                for c in range(n_cand):
                    e = cand[c]
                    v = selection[e]
                    if v > vals[top_k - 1]:
                        _push_desc(vals, idx, v, e)
            else:
                for g in range(n_group):
                    # a group outside the best topk_group, or whose best score cannot beat the
                    # current k-th pick, adds nothing
                    if n_group > 1 and (not eligible[g] or not gmax[g] > vals[top_k - 1]):
                        continue
                    _scan_desc(selection, g * gsize, (g + 1) * gsize, vals, idx)
            ops += E
            # --- weights: unbiased scores of the picks, renormalised, scaled
            if renormalize:
                total = np.float32(0.0)
                for j in range(top_k):
                    total += s[idx[j]]
                denom = total + eps
                for j in range(top_k):
                    weights[t, j] = s[idx[j]] / denom * scale
                ops += 2 * top_k + 1
            else:
                for j in range(top_k):
                    weights[t, j] = s[idx[j]] * scale
            for j in range(top_k):
                ids[t, j] = idx[j]
            ops += 2 * top_k  # gather + scale
        rows = r1 - r0
        tasks += 1
        gm_read += rows * E * itemsize + (E * bias_itemsize if use_bias else 0)
        gm_write += rows * top_k * 8
        vector_ops += ops
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _combine_kernel(
    x,
    w,
    w_itemsize,
    out,
    tile,
    h_tile,
    acc_scr,
    cm,
):
    """``out[t, :] = sum_j w[t, j] * x[t, j, :]`` in fp32, one cast; a task = token tile x h tile.

    Parameters
    ----------
    x : [T, k, H] kernel view of the expert outputs
    w, w_itemsize : fp32 weights[T, k] and their storage itemsize (counted GM bytes)
    out : [T, H] kernel view
    tile, h_tile : tokens and hidden elements per task
    acc_scr : [threads, h_tile] fp32 accumulator rows
    cm : the cast mode of the narrowing to out (a ``dtypes.CastMode``)
    """
    T, K, H = x.shape
    n_tt = (T + tile - 1) // tile
    n_ht = (H + h_tile - 1) // h_tile
    itemsize = x.itemsize
    cast_in = 1 if itemsize == 2 else 0
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_tt * n_ht):
        r0 = (task // n_ht) * tile
        r1 = min(T, r0 + tile)
        c0 = (task % n_ht) * h_tile
        cols = min(H, c0 + h_tile) - c0
        # slices of exactly the tile's valid width: with them LLVM vectorises the h loops
        acc = acc_scr[numba.get_thread_id()][:cols]
        for t in range(r0, r1):
            acc[:] = np.float32(0.0)
            for j in range(K):
                wj = w[t, j]
                src = x[t, j, c0:c0 + cols]
                for h in range(cols):
                    acc[h] += wj * dtypes.widen(src[h])
            dst = out[t, c0:c0 + cols]
            for h in range(cols):
                dst[h] = dtypes.narrow(out, acc[h], cm)
        rows = r1 - r0
        tasks += 1
        gm_read += rows * K * cols * itemsize + rows * K * w_itemsize
        gm_write += rows * cols * itemsize
        vector_ops += rows * cols * (K * (COMBINE_OPS + cast_in) + cast_in)
    return tasks, gm_read, gm_write, vector_ops, 0
