"""MoE routing: sigmoid gating (grouped top-k, correction bias), softmax gating, and combine.

Math (``logits[T, E]`` router logits in fp32, bf16 or fp16; everything computed in fp32, as the
NPU's sigmoid/exp are fp32-only, npu-facts 1.6)::

    sigmoid_gating:  s = sigmoid(logits)                    unbiased scores (give the weights)
                     sel = s + bias                         selection scores (bias[E], optional)
                     n_group > 1: group score = max(sel over the group)  ("max")
                                         or sum of its top two sel      ("top2_sum");
                                  experts outside the best topk_group groups are not eligible
                     ids = top_k eligible experts by sel, descending, ties -> lower expert index
                     w = s[ids];  renormalize: w / (sum(w) + eps);  w *= routed_scaling_factor
    softmax_gating:  p = softmax(logits);  ids = top_k of p;  w = p[ids]
                     renormalize: w / sum(w);  w *= routed_scaling_factor
                     (extra options n_group / topk_group / group_score: the same group filter on
                     p, which is PyPTO's moe_gating_topk with norm_type softmax, npu-facts 1.3)
    combine:         out[t, :] = sum_j weights[t, j] * expert_out[t, j, :] in fp32, one cast

Gating returns ``(weights float32[T, k], ids int32[T, k])``, ordered by descending selection
score. The selection is done on the fp32 scores the kernel computed (like the NPU's fp32 topk), so
two experts whose scores differ by less than fp32 rounding may come out in either order compared
to a float64 oracle; exactly equal fp32 scores always go to the lower expert index.

Strategies (T tokens, E experts, k = top_k, b = logits itemsize, bb = bias itemsize, H hidden,
n_tt = ceil(T / token_tile), n_ht = ceil(H / h_tile))::

    moe.sigmoid_gating  1 vector kernel, n_tt tasks, GM read T*E*b (+ n_tt*E*bb with a bias),
                        GM write T*k*8 (fp32 weights + int32 ids)
    moe.softmax_gating  1 vector kernel, n_tt tasks, GM read T*E*b, GM write T*k*8
    moe.combine         1 vector kernel, n_tt*n_ht tasks, GM read T*k*H*b + n_ht*T*k*wb,
                        GM write T*H*b

Tiling (npu-facts 1.3: PyPTO's moe_gating_topk loops over blocks of 32 rows with the tile
``(bs_block, E)``): one tile task = ``token_tile`` tokens with the whole expert axis in UB
(logits tile, fp32 scores, masked selection scores, group scores, top-k values/ids). Two rules
bound E: the UB capacity (and the 64 KiB reduction tile for the softmax max/sum and the group
scores), and the MERGE_SORT top-k tile rule ``align(E)*4 < 22 KiB`` (npu-facts 4.2; strict),
which no token tile can fix: E <= 5624 on A2/A3.

CPU execution of a task: row by row in per-thread scratch; the top-k is a sorted list of k
filled in expert order by a branch-free insertion (ties stay with the lower index); with groups,
a floor (the smallest second-best score of the chosen groups, valid when 2*topk_group >= top_k)
discards most experts before any insertion. The counted Cost models the NPU's tile ops, not these
CPU shortcuts.

Per-row vector element-ops counted (E experts, G groups, k picks): cast in E (16-bit logits only);
sigmoid 4E (neg, exp, +1, reciprocal) + bias add E, or softmax 5E (max, sub, exp, sum, div);
groups: score E ("max") or 2E + G ("top2_sum"), group top-k G, mask E; expert top-k E; gather k;
renormalize 2k + 1 (sum, + eps, div); routed scaling k.
"""

from __future__ import annotations

import math as _math
import numbers

import numba
import numpy as np
from numba import prange

from . import inputs
from .errors import ConstraintError, DTypeError, ShapeError, TileError
from .machine import dtypes, vmath
from .machine.jit import device, kernel
from .machine.memo import memo_plan
from .machine.plan import KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from .machine.profile import load_profile
from .strategy import Launch, register

_sigmoid = vmath.sigmoid  # fp32, vectorisable (the vector unit's sigmoid)
_exp = vmath.exp

GROUP_SCORES = ("max", "top2_sum")
SIGMOID_OPS = 4  # neg, exp, +1, reciprocal
SOFTMAX_OPS = 5  # max, sub, exp, sum, div
COMBINE_OPS = 2  # mul, add per expert term


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = one tile of token_tile tokens x the whole expert axis


@device
def _push_desc(vals, idx, v, i):
    """Insert (v, i) into the full descending list ``vals`` when ``v > vals[-1]``.

    Branch-free: every position takes the carried entry where ``v > vals[j]`` (from the insertion
    point on, as the list is sorted) and passes its own entry on. A data-dependent shift loop
    mispredicted its exit on most of the ~30 insertions per row (k = 8 of 128 eligible scores)
    and measured ~1.5x slower. Candidates arrive in increasing index order and an entry equal to ``v``
    stays ahead of it (strict ``>``), so ties go to the lower index.
    """
    carry_v = v
    carry_i = np.int32(i)
    for j in range(vals.size):
        a = vals[j]
        ai = idx[j]
        shift = v > a
        vals[j] = carry_v if shift else a
        idx[j] = carry_i if shift else ai
        carry_v = a if shift else carry_v
        carry_i = ai if shift else carry_i


@device
def _scan_desc(scores, lo, hi, vals, idx):
    """Offer ``scores[lo:hi]`` (in index order) to the full descending list ``vals``.

    A separate function with the k-th value in a register: inlined into the kernel body the
    compiler reloaded it on every element (the stores of _push_desc may alias), 3x slower.
    """
    last = vals.size - 1
    kth = vals[last]
    for e in range(lo, hi):
        v = scores[e]
        if v > kth:
            _push_desc(vals, idx, v, e)
            kth = vals[last]


@device
def _max_of(x, lo, hi):
    """max(x[lo:hi]) with four independent chains: a single compare-select chain is
    latency-bound (and without the nnan flag LLVM does not vectorise a float max reduction)."""
    m0 = x[lo]
    m1 = m0
    m2 = m0
    m3 = m0
    e = lo
    while e + 4 <= hi:
        a = x[e]
        b = x[e + 1]
        c = x[e + 2]
        d = x[e + 3]
        m0 = a if a > m0 else m0
        m1 = b if b > m1 else m1
        m2 = c if c > m2 else m2
        m3 = d if d > m3 else m3
        e += 4
    while e < hi:
        a = x[e]
        m0 = a if a > m0 else m0
        e += 1
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    return m2 if m2 > m0 else m0


@device
def _top2_of(x, lo, hi):
    """(largest, second largest) of x[lo:hi] (the second is -inf for one element), branch-free,
    two interleaved chains merged at the end. Equal values count twice: top-2 of [a, a] is a, a."""
    a1 = np.float32(-np.inf)
    a2 = a1
    b1 = a1
    b2 = a1
    e = lo
    while e + 2 <= hi:
        u = x[e]
        v = x[e + 1]
        lo_u = u if u < a1 else a1
        lo_v = v if v < b1 else b1
        a2 = lo_u if lo_u > a2 else a2
        b2 = lo_v if lo_v > b2 else b2
        a1 = u if u > a1 else a1
        b1 = v if v > b1 else b1
        e += 2
    if e < hi:
        u = x[e]
        lo_u = u if u < a1 else a1
        a2 = lo_u if lo_u > a2 else a2
        a1 = u if u > a1 else a1
    m1 = a1 if a1 > b1 else b1
    cross = b1 if a1 > b1 else a1
    m2 = a2 if a2 > b2 else b2
    m2 = cross if cross > m2 else m2
    return m1, m2


@device
def _reset_desc(vals, idx):
    for j in range(vals.size):
        vals[j] = -np.inf
        idx[j] = -1


@kernel
def _gating_kernel(logits, bias, use_bias, bias_itemsize, softmax, n_group, topk_group, top2,
                   top_k, renormalize, eps, scale, tile, weights, ids,
                   s_scr, sel_scr, gs_scr, gmax_scr, gv_scr, gi_scr, el_scr, v_scr, i_scr, cand_scr):
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
def _combine_kernel(x, w, w_itemsize, out, tile, h_tile, acc_scr):
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
        # (indexing x[t, j][c0 + h] measured 2.5x slower)
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
                dst[h] = dtypes.narrow(out, acc[h])
        rows = r1 - r0
        tasks += 1
        gm_read += rows * K * cols * itemsize + rows * K * w_itemsize
        gm_write += rows * cols * itemsize
        vector_ops += rows * cols * (K * (COMBINE_OPS + cast_in) + cast_in)
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# option checks (Python, before any kernel)


def _int_option(value, name, where, low, high=None, why=""):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ConstraintError(f"{where}: {name} must be an int, got {value!r}")
    value = int(value)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConstraintError(f"{where}: {name}={value} must be {limit}{why}")
    return value


def _real_option(value, name, where, *, non_negative=False):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise ConstraintError(f"{where}: {name} must be a real number, got {value!r}")
    value = float(value)
    if not _math.isfinite(value) or (non_negative and value < 0):
        want = "a finite number >= 0" if non_negative else "a finite number"
        raise ConstraintError(f"{where}: {name}={value!r} must be {want}")
    return value


def _bool_option(value, name, where):
    if not isinstance(value, (bool, np.bool_)):
        raise ConstraintError(f"{where}: {name} must be True or False, got {value!r}")
    return bool(value)


def _routing_options(where, E, top_k, n_group, topk_group, group_score):
    """Validate the selection options for E experts; returns (top_k, n_group, topk_group, top2)."""
    n_group = _int_option(n_group, "n_group", where, 1, E, f" (E={E} experts)")
    if E % n_group:
        raise ConstraintError(
            f"{where}: n_group={n_group} does not divide E={E}; the experts form n_group equal "
            f"groups (use a divisor of {E})"
        )
    topk_group = _int_option(topk_group, "topk_group", where, 1, n_group, f" (n_group={n_group})")
    if group_score not in GROUP_SCORES:
        raise ConstraintError(f"{where}: group_score must be one of {GROUP_SCORES}, got {group_score!r}")
    top2 = group_score == "top2_sum"
    if n_group > 1 and top2 and E // n_group < 2:
        raise ConstraintError(
            f"{where}: group_score='top2_sum' needs at least 2 experts per group, got "
            f"E/n_group = {E // n_group}; use group_score='max' or fewer groups"
        )
    eligible = E if n_group == 1 else topk_group * (E // n_group)
    why = (f" (the {topk_group} best of {n_group} groups hold {eligible} eligible experts)"
           if n_group > 1 else f" (E={E} experts)")
    top_k = _int_option(top_k, "top_k", where, 1, eligible, why)
    return top_k, n_group, topk_group, top2


def _dtype_name(dtype, where, name="dtype"):
    kind = dtypes.storage_name(dtype)
    if kind is None:
        raise DTypeError(f"{where}: {name} {dtype!r} is not fp32, bf16 or fp16")
    return kind


# ---------------------------------------------------------------------------------------------
# plans


def _gating_ops_per_row(softmax, E, dtype, use_bias, n_group, top2, top_k, renormalize):
    ops = (E if dtypes.itemsize(dtype) == 2 else 0) + (SOFTMAX_OPS if softmax else SIGMOID_OPS) * E
    ops += E if use_bias else 0
    if n_group > 1:
        ops += (2 * E + n_group if top2 else E) + n_group + E  # group score, group top-k, mask
    ops += E + 2 * top_k + (2 * top_k + 1 if renormalize else 0)  # top-k, gather, scale, renorm
    return ops


@memo_plan
def _plan_gating(variant, shape, dtype, *, top_k, n_group, topk_group, group_score, renormalize,
                 bias_dtype, profile, token_tile) -> Plan:
    prof = load_profile(profile)
    where = f"moe.{variant}_gating"
    softmax = variant == "softmax"
    dtype = _dtype_name(dtype, where)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "logits", where, min_rank=2, max_rank=2)
    inputs.check_size(shape, "logits", where)
    T, E = shape
    top_k, n_group, topk_group, top2 = _routing_options(where, E, top_k, n_group, topk_group, group_score)
    renormalize = _bool_option(renormalize, "renormalize", where)
    use_bias = bias_dtype is not None
    if use_bias:
        bias_dtype = _dtype_name(bias_dtype, where, "bias dtype")
    tile = prof.tile("moe_token_tile") if token_tile is None else inputs.positive_int(token_tile, "token_tile", where)

    e32 = align_elems(E, "fp32", prof)  # fp32 work rows of the expert axis
    # MERGE_SORT top-k (npu-facts 4.2): the sorted row is the whole (aligned) expert axis in fp32;
    # no token tile changes that, so this is checked first
    if not e32 * 4 < prof.topk_tile_max_bytes:
        raise TileError(
            f"{where}: the top-k tile row of E={E} experts is {e32} x 4 B = {e32 * 4} B, which breaks "
            f"the MERGE_SORT limit tile[-1]*4 < {prof.topk_tile_max_bytes} B of {prof.name}; "
            f"E must be <= {(prof.topk_tile_max_bytes - 1) // 4 // 8 * 8} experts"
        )
    grouped = n_group > 1
    select = use_bias or grouped  # selection scores need their own tile (s stays for the weights)
    reduces = softmax or grouped  # row max/sum or group scores reduce a [tile, E] fp32 tile
    g32 = align_elems(n_group, "fp32", prof)
    k32 = align_elems(top_k, "fp32", prof)
    per_row = (align_elems(E, dtype, prof) * dtypes.itemsize(dtype) + e32 * 4 * (2 if select else 1)
               + (2 * g32 * 4 if grouped else 0) + 3 * k32 * 4)
    fixed = e32 * 4 if use_bias else 0
    max_tile = (prof.ub_bytes - fixed) // per_row
    if reduces:
        max_tile = min(max_tile, prof.reduce_tile_max_bytes // (e32 * 4))
    if max_tile < 1:
        raise TileError(
            f"{where}: E={E} experts do not fit {prof.name}'s UB ({prof.ub_bytes} B) even with "
            f"token_tile=1 ({per_row + fixed} B per token)"
        )
    hint = f"use token_tile <= {max_tile}"
    buffers = [
        vector_tile("logits_ub", (tile, align_elems(E, dtype, prof)), dtype, prof, where, hint),
        vector_tile("scores_ub", (tile, e32), "fp32", prof, where, hint),
    ]
    if select:
        buffers.append(vector_tile("select_ub", (tile, e32), "fp32", prof, where, hint))
    if reduces:
        reduce_tile(buffers[-1], prof, where, hint)
    if use_bias:
        buffers.append(vector_tile("bias_ub", (1, e32), "fp32", prof, where, hint))
    if grouped:
        buffers.append(vector_tile("group_score_ub", (tile, g32), "fp32", prof, where, hint))
        buffers.append(vector_tile("group_mask_ub", (tile, g32), "fp32", prof, where, hint))
    buffers += [
        vector_tile("topk_val_ub", (tile, k32), "fp32", prof, where, hint),
        vector_tile("topk_idx_ub", (tile, k32), "int32", prof, where, hint),
        vector_tile("weights_ub", (tile, k32), "fp32", prof, where, hint),
    ]
    tasks = -(-T // tile)
    bias_bytes = E * dtypes.itemsize(bias_dtype) if use_bias else 0
    k = KernelPlan(
        name=f"moe_{variant}_gating",
        unit="vector",
        tasks=tasks,
        buffers=tuple(buffers),
        gm_read_bytes=T * E * dtypes.itemsize(dtype) + tasks * bias_bytes,
        gm_write_bytes=T * top_k * 8,
        vector_ops=T * _gating_ops_per_row(softmax, E, dtype, use_bias, n_group, top2, top_k, renormalize),
    )
    params = {"token_tile": tile, "top_k": top_k, "n_group": n_group, "topk_group": topk_group,
              "group_score": group_score, "renormalize": renormalize, "bias_dtype": bias_dtype}
    return Plan(op="moe", strategy=f"{variant}_gating", dtype=dtype, profile=prof, kernels=(k,),
                params=params, hint=hint)


def plan_sigmoid_gating(shape, dtype="fp32", *, top_k=8, bias_dtype=None, n_group=1, topk_group=1,
                        group_score="max", renormalize=True, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`sigmoid_gating` for logits of ``shape`` = (T, E) (no data needed).

    ``bias_dtype``: storage dtype of the correction bias, or None without one.
    """
    return _plan_gating("sigmoid", shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group,
                        group_score=group_score, renormalize=renormalize, bias_dtype=bias_dtype,
                        profile=profile, token_tile=token_tile)


def plan_softmax_gating(shape, dtype="fp32", *, top_k=8, n_group=1, topk_group=1, group_score="max",
                        renormalize=False, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`softmax_gating` for logits of ``shape`` = (T, E) (no data needed)."""
    return _plan_gating("softmax", shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group,
                        group_score=group_score, renormalize=renormalize, bias_dtype=None,
                        profile=profile, token_tile=token_tile)


@memo_plan
def plan_combine(shape, dtype="fp32", *, weights_dtype="fp32", profile=None, token_tile=None,
                 h_tile=None) -> Plan:
    """Plan of :func:`combine` for ``expert_out`` of ``shape`` = (T, k, H) (no data needed)."""
    prof = load_profile(profile)
    where = "moe.combine"
    dtype = _dtype_name(dtype, where)
    weights_dtype = _dtype_name(weights_dtype, where, "weights dtype")
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "expert_out", where, min_rank=3, max_rank=3)
    inputs.check_size(shape, "expert_out", where)
    T, K, H = shape
    tile = prof.tile("moe_token_tile") if token_tile is None else inputs.positive_int(token_tile, "token_tile", where)
    h_tile = prof.tile("moe_combine_h_tile") if h_tile is None else inputs.positive_int(h_tile, "h_tile", where)
    b = dtypes.itemsize(dtype)
    h_ub = min(h_tile, align_elems(H, dtype, prof))  # a short H needs only its aligned length
    h_tile = h_ub  # a larger h_tile is the whole (aligned) H: one task per token tile, scratch of H
    k32 = align_elems(K, "fp32", prof)
    per_h = tile * (K * b + 4 + b)  # expert tile + fp32 accumulator + output, per H element
    block = prof.align_bytes // b
    room = (prof.ub_bytes - tile * k32 * 4) // per_h // block * block
    hint = (f"use h_tile <= {room} (multiple of {block})" if room >= block
            else "use a smaller token_tile")
    buffers = (
        vector_tile("expert_ub", (tile, K, h_ub), dtype, prof, where, hint),
        vector_tile("weights_ub", (tile, k32), "fp32", prof, where, hint),
        vector_tile("acc_ub", (tile, h_ub), "fp32", prof, where, hint),
        vector_tile("out_ub", (tile, h_ub), dtype, prof, where, hint),
    )
    n_tt = -(-T // tile)
    n_ht = -(-H // h_tile)
    cast_in = 1 if b == 2 else 0
    k = KernelPlan(
        name="moe_combine",
        unit="vector",
        tasks=n_tt * n_ht,
        buffers=buffers,
        gm_read_bytes=T * K * H * b + n_ht * T * K * dtypes.itemsize(weights_dtype),
        gm_write_bytes=T * H * b,
        vector_ops=T * H * (K * (COMBINE_OPS + cast_in) + cast_in),
    )
    return Plan(op="moe", strategy="combine", dtype=dtype, profile=prof, kernels=(k,),
                params={"token_tile": tile, "h_tile": h_tile, "weights_dtype": weights_dtype}, hint=hint)


# ---------------------------------------------------------------------------------------------
# public strategies


def _scratch(*shape, dtype=np.float32):
    """Per-thread scratch: one slab per numba thread (indexed by numba.get_thread_id())."""
    return np.empty((numba.config.NUMBA_NUM_THREADS,) + shape, dtype)


def _run_gating(variant, logits, top_k, bias, n_group, topk_group, group_score, renormalize,
                routed_scaling_factor, eps, profile, token_tile):
    where = f"moe.{variant}_gating"
    lt = inputs.tensor(logits, "logits", where, min_rank=2, max_rank=2)
    T, E = lt.shape
    bt = None
    if bias is not None:
        bt = inputs.tensor(bias, "bias", where, min_rank=1, max_rank=1)
        if bt.shape != (E,):
            raise ShapeError(f"{where}: bias must have shape ({E},) (one value per expert), got {bt.shape}")
        if not np.all(np.isfinite(dtypes.to_float32(bt.array))):
            raise ConstraintError(f"{where}: bias has non-finite values; the correction bias must be finite")
    scale = _real_option(routed_scaling_factor, "routed_scaling_factor", where)
    eps = _real_option(eps, "eps", where, non_negative=True)
    p = _plan_gating(variant, lt.shape, lt.dtype, top_k=top_k, n_group=n_group, topk_group=topk_group,
                     group_score=group_score, renormalize=renormalize,
                     bias_dtype=None if bt is None else bt.dtype, profile=profile, token_tile=token_tile)
    prm = p.params
    k, g, kg = prm["top_k"], prm["n_group"], prm["topk_group"]
    bias32 = np.zeros(1, np.float32) if bt is None else dtypes.to_float32(bt.array)
    weights = np.empty((T, k), np.float32)
    ids = np.empty((T, k), np.int32)
    with Launch(p, [lt.shape] + ([bt.shape] if bt is not None else [])) as run:
        run.count(
            _gating_kernel(
                lt.kview, bias32, bt is not None, 0 if bt is None else dtypes.itemsize(bt.dtype),
                variant == "softmax", g, kg, group_score == "top2_sum", k, prm["renormalize"],
                np.float32(eps), np.float32(scale), prm["token_tile"], weights, ids,
                _scratch(E), _scratch(E), _scratch(g), _scratch(2 * g), _scratch(kg),
                _scratch(kg, dtype=np.int32), _scratch(g, dtype=np.bool_), _scratch(k),
                _scratch(k, dtype=np.int32), _scratch(E, dtype=np.int32),
            )
        )
        run.workspace(lt.copied_bytes + (bt.copied_bytes if bt is not None else 0))
        bad = np.flatnonzero(ids[:, 0] < 0)
        if bad.size:
            what = "NaN or infinite" if variant == "softmax" else "NaN"
            raise ConstraintError(
                f"{where}: logits row {bad[0]} (of {bad.size} such rows) has {what} values, so its "
                f"experts cannot be ranked; clean the router logits first"
            )
    return weights, ids


@register("moe", "sigmoid_gating", plan=plan_sigmoid_gating,
          summary="sigmoid scores, bias for selection only, grouped top-k (DeepSeek-V3, GLM-4.5)")
def sigmoid_gating(logits, top_k, *, bias=None, n_group=1, topk_group=1, group_score="max",
                   renormalize=True, routed_scaling_factor=1.0, eps=1e-20, profile=None, token_tile=None):
    """Sigmoid routing: ``(weights float32[T, top_k], ids int32[T, top_k])``.

    ``s = sigmoid(logits)`` in fp32; experts are picked by ``s + bias`` (``bias[E]`` only steers
    the selection); with ``n_group > 1`` only the experts of the ``topk_group`` best groups (group
    score: ``"max"`` or ``"top2_sum"`` of the selection scores) are eligible. Weights are the
    unbiased ``s`` of the picks, divided by ``sum + eps`` when ``renormalize``, times
    ``routed_scaling_factor``. Ordered by descending selection score, ties to the lower index.
    ``token_tile``: tokens per tile task (default: the profile's ``moe_token_tile``).
    """
    return _run_gating("sigmoid", logits, top_k, bias, n_group, topk_group, group_score, renormalize,
                       routed_scaling_factor, eps, profile, token_tile)


@register("moe", "softmax_gating", plan=plan_softmax_gating,
          summary="softmax scores, top-k, optional renormalise (Mixtral, Qwen-MoE)")
def softmax_gating(logits, top_k, *, renormalize=False, routed_scaling_factor=1.0, n_group=1,
                   topk_group=1, group_score="max", profile=None, token_tile=None):
    """Softmax routing: ``(weights float32[T, top_k], ids int32[T, top_k])``.

    ``p = softmax(logits)`` in fp32; the top_k experts by ``p`` (descending, ties to the lower
    index); weights ``p`` of the picks, renormalised to sum 1 when ``renormalize``, times
    ``routed_scaling_factor``. Extra options ``n_group``/``topk_group``/``group_score`` apply the
    group filter of :func:`sigmoid_gating` to ``p`` (PyPTO's moe_gating_topk with softmax).
    """
    return _run_gating("softmax", logits, top_k, None, n_group, topk_group, group_score, renormalize,
                       routed_scaling_factor, 0.0, profile, token_tile)


@register("moe", "combine", plan=plan_combine, summary="weighted sum of the top-k expert outputs in fp32")
def combine(expert_out, weights, *, profile=None, token_tile=None, h_tile=None):
    """``out[t, :] = sum_j weights[t, j] * expert_out[t, j, :]`` in fp32, cast to expert_out's dtype.

    ``expert_out[T, k, H]``, ``weights[T, k]`` (any storage dtype, widened to fp32).
    ``token_tile`` / ``h_tile``: tokens and hidden elements per tile task (profile defaults
    ``moe_token_tile`` / ``moe_combine_h_tile``).
    """
    where = "moe.combine"
    xt = inputs.tensor(expert_out, "expert_out", where, min_rank=3, max_rank=3)
    wt = inputs.tensor(weights, "weights", where, min_rank=2, max_rank=2)
    if wt.shape != xt.shape[:2]:
        raise ShapeError(
            f"{where}: weights must have shape {xt.shape[:2]} (expert_out[T, k, H] -> weights[T, k]), "
            f"got {wt.shape}"
        )
    p = plan_combine(xt.shape, xt.dtype, weights_dtype=wt.dtype, profile=profile, token_tile=token_tile,
                     h_tile=h_tile)
    w32 = wt.array if wt.dtype == "fp32" else dtypes.to_float32(wt.array)
    out, out_k = dtypes.empty((xt.shape[0], xt.shape[2]), xt.dtype)
    with Launch(p, [xt.shape, wt.shape]) as run:
        run.count(
            _combine_kernel(xt.kview, w32, dtypes.itemsize(wt.dtype), out_k, p.params["token_tile"],
                            p.params["h_tile"], _scratch(p.params["h_tile"]))
        )
        run.workspace(xt.copied_bytes + wt.copied_bytes)
    return out


# --- lab spec ---
# What compare, advise and report need to know about moe (pypto_numba/lab/spec.py).

def _reference_topk_desc(scores, k: int):
    """Indices of the k largest per row, descending, ties toward the lower index."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


def _reference_group_filter(sel, n_group, topk_group, group_score):
    """Selection scores with the experts outside the best ``topk_group`` groups set to -inf."""
    if n_group <= 1:
        return sel
    T, E = sel.shape
    g = sel.reshape(T, n_group, E // n_group)
    if group_score == "max":
        gs = g.max(axis=-1)
    else:
        gs = np.sort(g, axis=-1)[..., -2:].sum(axis=-1)
    keep = _reference_topk_desc(gs, topk_group)
    eligible = np.zeros((T, n_group), dtype=bool)
    np.put_along_axis(eligible, keep, True, axis=-1)
    eligible = np.repeat(eligible, E // n_group, axis=-1)
    return np.where(eligible, sel, -np.inf)


def _reference_sigmoid_gating(
    logits,
    top_k,
    bias=None,
    n_group=1,
    topk_group=1,
    group_score="max",
    renormalize=True,
    routed_scaling_factor=1.0,
    eps=1e-20,
):
    """DeepSeek-V3 / GLM-4.5 routing. Returns (weights float64[T, k], ids int64[T, k])."""
    from .reference import f64

    s = 1.0 / (1.0 + np.exp(-f64(logits)))
    sel = s + (f64(bias)[None, :] if bias is not None else 0.0)
    sel = _reference_group_filter(sel, n_group, topk_group, group_score)
    ids = _reference_topk_desc(sel, top_k)
    w = np.take_along_axis(s, ids, axis=-1)
    if renormalize:
        w = w / (w.sum(axis=-1, keepdims=True) + eps)
    return w * routed_scaling_factor, ids


def _reference_softmax_gating(
    logits,
    top_k,
    renormalize=False,
    routed_scaling_factor=1.0,
    n_group=1,
    topk_group=1,
    group_score="max",
):
    """Mixtral / Qwen-MoE routing. Returns (weights float64[T, k], ids int64[T, k]).

    ``n_group``/``topk_group``/``group_score``: the group filter of the sigmoid gating applied to
    the probabilities (PyPTO's moe_gating_topk with norm_type softmax).
    """
    from .reference import f64

    x = f64(logits)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ids = _reference_topk_desc(_reference_group_filter(p, n_group, topk_group, group_score), top_k)
    w = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return w * routed_scaling_factor, ids


def _reference_combine(expert_out, weights):
    """``out[t, :] = sum_k weights[t, k] * expert_out[t, k, :]``."""
    from .reference import f64

    return np.einsum("tkh,tk->th", f64(expert_out), f64(weights))


# compare: DeepSeek-V3 routing and a Qwen3-MoE style softmax router on the same logits
_LAB_DSV3 = dict(top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
_LAB_SOFTMAX = dict(top_k=8, renormalize=True)


def _lab_inputs(shape, dtype, rng):
    from .lab import need, normal

    T, E = need(shape, 2, "T,E")
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    return normal((T, E), dtype, rng), bias


def _lab_variants():
    from .lab import Variant

    groups = lambda E: dict(_LAB_DSV3) if E % 8 == 0 and E // 8 * 4 >= 8 else dict(top_k=min(8, E))  # noqa: E731
    softmax = lambda E: dict(_LAB_SOFTMAX, top_k=min(8, E))  # noqa: E731
    return [
        Variant("sigmoid_gating", lambda x, b, **o: sigmoid_gating(x, bias=b, **groups(x.shape[1]), **o),
                lambda x, b, **o: _reference_sigmoid_gating(x, bias=b, **groups(x.shape[1])), True),
        Variant("softmax_gating", lambda x, b, **o: softmax_gating(x, **softmax(x.shape[1]), **o),
                lambda x, b, **o: _reference_softmax_gating(x, **softmax(x.shape[1]))),
    ]


def _moe(
    profile,
    tokens=4096,
    experts=256,
    top_k=8,
    n_group=8,
    topk_group=4,
    dtype="fp32",
    router="sigmoid",
):
    from .advise import price
    from .lab import Candidate

    shape = (tokens, experts)
    sig = Candidate("sigmoid_gating", lambda: (plan_sigmoid_gating(
        shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group, bias_dtype="fp32", profile=profile),))
    soft = Candidate("softmax_gating", lambda: (plan_softmax_gating(shape, dtype, top_k=top_k, profile=profile),))
    if router == "softmax":
        return [soft], "softmax_gating", ("the model's router is softmax (router='softmax')",)
    note = ("the router is the model's choice (router='sigmoid'); softmax gating is priced for reference: "
            + price(soft))
    return [sig], "sigmoid_gating", (note,)


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed, Tolerance

    return OpSpec(
        name="moe",
        seed=Seed("sigmoid_gating", "softmax_gating",
                  "sigmoid gating (GLM, DeepSeek); softmax when the model's router requires it"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(512, 256),
                      help="T,E, e.g. 512,256 (DeepSeek-V3 grouped routing vs a softmax router)"),
        variants=_lab_variants,
        outputs=lambda result: result,
        tolerance=Tolerance(fp32=(5e-3, 5e-3), half=(5e-3, 5e-3)),  # npu-facts 1.3
        advise=_moe,  # named as advise's old rule: its TypeError names it
        oracles={
            "moe_sigmoid_gating": _reference_sigmoid_gating,
            "moe_softmax_gating": _reference_softmax_gating,
            "moe_combine": _reference_combine,
        },
    )


OP = _lab_spec()
