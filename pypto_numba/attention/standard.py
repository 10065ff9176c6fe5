"""attention.standard: whole-row ``matmul -> scale -> softmax -> matmul`` with scores in GM.

Three kernels (b = itemsize, rows = B*Hq*Sq, nq query tiles per (batch, KV head))::

    scores   cube,   tasks B*Hkv: S = Q K^T (fp32) -> GM workspace
             read Q rows*D*b + K nq*B*Hkv*Skv*D*b (re-read per query tile), write rows*Skv*4
    softmax  vector, tasks rows (one whole score row in UB): scale, [soft-cap,] mask, max, exp,
             sum [+ the sink column], divide, P in the storage dtype -> GM workspace
             read rows*Skv*4 [+ mask rows*Skv*mb, mb its itemsize] [+ sinks rows*4], write rows*Skv*b
    pv       cube,   tasks B*Hkv: O = P V (fp32 accumulation), one cast
             read P rows*Skv*b + V nq*B*Hkv*Skv*Dv*b, write rows*Dv*b
    workspace  rows*Skv*(4 + b)

The softmax kernel needs a whole score row (plus its exp and P rows) in UB, and a reduction over
it stays within the 64 KiB reduction tile: long sequences do not fit (``TileError`` pointing to
``attention.online`` / ``attention.flash``). This is the seed's "FAIL for long decode".
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import prange

from .. import inputs
from ..errors import ConstraintError, TileError
from ..machine import cube, dtypes, tile
from ..machine.jit import kernel
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan
from ..machine.profile import load_profile, resolve_cast_mode
from ..machine.scratch import Regions
from ..machine.vmath import exp as vexp
from ..machine.vmath import tanh as vtanh
from ..strategy import Launch, register
from .gqa_clone import expand_plans, run_expand
from .plans import cube_buffers, ub_tile
from .tiles import (
    GEMM_MIN_ROWS,
    NEG_INF,
    RES_SLOTS,
    SOFTCAP_OPS,
    key_range,
    load_q_block,
    mask_term,
    packed_keys,
    tile_pv,
    tile_scores,
)
from .validation import check_gqa, check_softcap, check_window, mask_itemsize, prepare, shapes_of

ROW_OPS = 7  # per score element: scale, max, sub, exp, sum, divide, cast (+1 with a mask)
SINK_OPS = 4  # per row with a sink: max, sub, exp, add to the sum
CHUNK = 128  # keys per cube step of the two matmul kernels
Q_ROWS = 128  # rows of the [G*qt, D] block per cube step (qt = Q_ROWS // G query positions)

# per-thread scratch regions of the scores and pv kernels, in slab order (*_layout: their bounds)
_SCORES_SCRATCH = Regions("q_block", "scores", "dot_results")
_Q_BLOCK, _SCORES, _DOT_RESULTS = _SCORES_SCRATCH.indices
_PV_SCRATCH = Regions("p_chunk", "o_chunk", "o_acc", "live")
_P_CHUNK, _O_CHUNK, _O_ACC, _LIVE = _PV_SCRATCH.indices


@functools.lru_cache(maxsize=256)
def scores_layout(Rmax, D):
    return _SCORES_SCRATCH.carve(q_block=Rmax * D, scores=Rmax * CHUNK, dot_results=RES_SLOTS)


@functools.lru_cache(maxsize=256)
def pv_layout(Rmax, Dv):
    return _PV_SCRATCH.carve(p_chunk=Rmax * CHUNK, o_chunk=Rmax * Dv, o_acc=Rmax * Dv, live=Rmax)


@kernel
def _scores_kernel(q, k, s_ws, qt, kt, scratch, scratch_at):
    """S = Q K^T into the GM workspace ``s_ws`` [B, Hq, Sq, Skv], one task per (batch, KV head),
    CHUNK keys per step (``kt``: K packed transposed; ``scratch_at``: :func:`scores_layout`)."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    Skv = k.shape[2]
    G = Hq // Hkv
    nq = (Sq + qt - 1) // qt
    Rmax = G * min(qt, Sq)
    b_sz = q.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    cube_flops = 0
    for task in prange(B * Hkv):
        b = task // Hkv
        kvh = task - b * Hkv
        sc = scratch[numba.get_thread_id()]
        at = scratch_at
        qf = sc[at[_Q_BLOCK]:at[_Q_BLOCK + 1]]
        s = sc[at[_SCORES]:at[_SCORES + 1]]
        res = sc[at[_DOT_RESULTS]:at[_DOT_RESULTS + 1]]
        for qi in range(nq):
            i0 = qi * qt
            qv = min(qt, Sq - i0)
            R = G * qv
            load_q_block(q, b, kvh, G, i0, qv, qf)
            gm_read += R * D * b_sz
            for j0 in range(0, Skv, CHUNK):
                n = min(CHUNK, Skv - j0)
                tile_scores(qf, R, k, b, kvh, j0, n, s, kt, CHUNK, R >= GEMM_MIN_ROWS, res)
                for r in range(R):
                    g = r // qv
                    ii = r - g * qv
                    for j in range(n):
                        s_ws[b, kvh * G + g, i0 + ii, j0 + j] = s[r * n + j]
                gm_read += n * D * b_sz
                gm_write += R * n * 4
                cube_flops += 2 * R * n * D
        tasks += 1
    return tasks, gm_read, gm_write, 0, cube_flops


@kernel
def _softmax_kernel(s_ws, p_ws, kv_len, causal, left, right, scale, softcap, has_mask, mask, msb, msh, msi,
                    msj, has_sinks, sinks, cm):
    """P = softmax(S*scale + mask) per whole score row, rounded to ``p_ws``'s storage dtype by cast mode ``cm``
    (``mask``: flat, as stored (tiles.mask_term), element strides msb, msh, msi, msj) over the row's allowed keys
    (tiles.key_range; ``left``/``right``: the window); ``softcap`` > 0 caps ``S*scale`` first,
    ``sinks[h]`` joins the max and the sum as a column with no value."""
    B, Hq, Sq, Skv = s_ws.shape
    b_sz = p_ws.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for row in prange(B * Hq * Sq):
        b = row // (Hq * Sq)
        rem = row - b * (Hq * Sq)
        h = rem // Sq
        i = rem - h * Sq
        lo, c = key_range(b, i, Sq, Skv, kv_len, causal, left, right)
        ul = np.uint64(lo)
        uc = np.uint64(c)
        srow = s_ws[b, h, i]
        prow = p_ws[b, h, i]
        m = NEG_INF
        mbase = b * msb + h * msh + i * msi
        if softcap > 0:  # Gemma 2's order: scale, cap, then the mask
            for j in range(lo, c):
                x = srow[j] * scale
                x = softcap * vtanh(x / softcap)
                if has_mask:
                    x += mask_term(mask[mbase + j * msj])
                srow[j] = x
                m = max(m, x)
        else:
            for j in range(lo, c):
                x = srow[j] * scale
                if has_mask:
                    x += mask_term(mask[mbase + j * msj])
                srow[j] = x
                m = max(m, x)
        if m == NEG_INF:  # all allowed scores -inf, or NaN (max skips NaN): NaN propagates
            for j in range(ul, uc):
                if srow[j] != srow[j]:
                    m = np.float32(np.nan)
                    break
        if has_sinks and m == m:  # the sink column (no value) is in the row max
            m = max(m, sinks[h])
        if m == NEG_INF:
            for j in range(Skv):
                prow[j] = dtypes.narrow(prow, np.float32(0.0))
        else:
            total = np.float32(0.0)
            for j in range(ul, uc):
                e = vexp(srow[j] - m)
                srow[j] = e
                total += e
            if has_sinks:
                total += vexp(sinks[h] - m)
            inv = np.float32(1.0) / total
            for j in range(ul):  # keys before the window's left edge
                prow[j] = dtypes.narrow(prow, np.float32(0.0))
            for j in range(ul, uc):
                prow[j] = dtypes.narrow(prow, srow[j] * inv, cm)
            for j in range(c, Skv):
                prow[j] = dtypes.narrow(prow, np.float32(0.0))
        gm_read += Skv * 4
        if has_mask:
            gm_read += Skv * mask.itemsize
        gm_write += Skv * b_sz
        vector_ops += Skv * (ROW_OPS + (1 if has_mask else 0) + (SOFTCAP_OPS if softcap > 0 else 0))
        if has_sinks:
            gm_read += 4
            vector_ops += SINK_OPS
        tasks += 1
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _pv_kernel(p_ws, v, out, kv_len, causal, left, right, qt, scratch, scratch_at):
    """out = P V (fp32 accumulation over CHUNK-key steps, one cast: the cube FIXPIPE's, rint
    whatever the cast mode, npu-facts 8.3), one task per (batch, KV head) (``scratch_at``:
    :func:`pv_layout`)."""
    B, Hq, Sq, Skv = p_ws.shape
    Hkv = v.shape[1]
    Dv = v.shape[3]
    G = Hq // Hkv
    nq = (Sq + qt - 1) // qt
    Rmax = G * min(qt, Sq)
    b_sz = v.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    cube_flops = 0
    for task in prange(B * Hkv):
        b = task // Hkv
        kvh = task - b * Hkv
        sc = scratch[numba.get_thread_id()]
        at = scratch_at
        pf = sc[at[_P_CHUNK]:at[_P_CHUNK + 1]]
        ot = sc[at[_O_CHUNK]:at[_O_CHUNK + 1]]
        acc = sc[at[_O_ACC]:at[_O_ACC + 1]]
        live = sc[at[_LIVE]:at[_LIVE + 1]]  # 1 where the row's P has a nonzero
        for qi in range(nq):
            i0 = qi * qt
            qv = min(qt, Sq - i0)
            R = G * qv
            for i in range(R * Dv):
                acc[i] = np.float32(0.0)
            for r in range(R):
                live[r] = np.float32(0.0)
            # keys past the block's allowed prefix have P = 0 and V there may be anything (a
            # cache slot past kv_len): the matmul stops at the prefix (the traffic is counted
            # as the whole-row kernel's)
            lim = key_range(b, i0 + qv - 1, Sq, Skv, kv_len, causal, left, right)[1]
            for j0 in range(0, Skv, CHUNK):
                n = min(CHUNK, Skv - j0)
                for r in range(R):
                    g = r // qv
                    ii = r - g * qv
                    for j in range(n):
                        pf[r * n + j] = dtypes.widen(p_ws[b, kvh * G + g, i0 + ii, j0 + j])
                        if pf[r * n + j] != 0:
                            live[r] = np.float32(1.0)
                tile_pv(pf, R, n, v, b, kvh, j0, ot, R >= GEMM_MIN_ROWS, max(0, min(n, lim - j0)))
                for i in range(R * Dv):
                    acc[i] += ot[i]  # L0C accumulation across K steps (fp32)
                gm_read += R * n * b_sz + n * Dv * b_sz
                cube_flops += 2 * R * n * Dv
            for r in range(R):
                g = r // qv
                ii = r - g * qv
                if live[r] == 0:  # a fully masked row: zeros, also where 0 * a non-finite V gave NaN
                    for d in range(Dv):
                        out[b, kvh * G + g, i0 + ii, d] = dtypes.narrow(out, np.float32(0.0))
                    continue
                for d in range(Dv):
                    out[b, kvh * G + g, i0 + ii, d] = dtypes.narrow(out, acc[r * Dv + d])
            gm_write += R * Dv * b_sz
            vector_ops += R * Dv  # the one cast
        tasks += 1
    return tasks, gm_read, gm_write, vector_ops, cube_flops


@memo_plan
def plan_standard(q_shape, k_shape, v_shape=None, dtype="fp32", *, profile=None, causal=False,
                  kv_len=None, has_mask=False, gqa="head_loop", window=None, softcap=None,
                  has_sinks=False, mask_dtype="fp32") -> Plan:
    """Plan of :func:`standard`; TileError when a whole score row does not fit UB. Whole rows:
    a ``window`` masks keys but reads and writes every score; ``softcap`` (a value or None) and
    ``has_sinks`` add their vector work; ``mask_dtype``: the mask as stored ("fp32", "bf16",
    "fp16" or "bool"), read at its itemsize."""
    where = "attention.standard"
    prof = load_profile(profile)
    B, Hq, Sq, D, Hkv, Skv, Dv = shapes_of(q_shape, k_shape, v_shape, where)
    check_gqa(gqa, where)
    causal, window, _, _ = check_window(window, causal, Sq, Skv, where)
    cap = check_softcap(softcap, where)
    mb = mask_itemsize(mask_dtype, where)
    expand = expand_plans(B, Hq, Hkv, Skv, D, Dv, dtype, prof, gqa)
    if expand:
        Hkv = Hq
    G = Hq // Hkv
    qt = min(max(1, Q_ROWS // G), Sq)
    nq = -(-Sq // qt)
    Rmax = G * qt
    b = dtypes.itemsize(dtype)
    rows = B * Hq * Sq
    hint = "use attention.online or attention.flash (they tile the KV axis)"
    try:  # the scores and P live in GM workspace: one PyPTO tensor [B, Hq, Sq, Skv]
        inputs.check_size((B, Hq, Sq, Skv), "the score workspace [B, Hq, Sq, Skv]", where)
    except ConstraintError as exc:
        raise ConstraintError(f"{exc}; or {hint}") from None
    row_ub = [
        ub_tile("score_row_ub", 1, Skv, "fp32", prof),
        ub_tile("exp_row_ub", 1, Skv, "fp32", prof),
        ub_tile("p_row_ub", 1, Skv, dtype, prof),
    ]
    if has_mask:
        row_ub.append(ub_tile("mask_row_ub", 1, Skv, mask_dtype, prof))
    need = sum(x.nbytes for x in row_ub)
    if need > prof.ub_bytes:
        raise TileError(
            f"{where}: a score row of Skv={Skv} needs {need} B of UB "
            f"({' + '.join(str(x) for x in row_ub)}) but {prof.name} has {prof.ub_bytes} B; {hint}"
        )
    if row_ub[0].nbytes > prof.reduce_tile_max_bytes:
        raise TileError(
            f"{where}: the row max/sum over Skv={Skv} fp32 scores is a {row_ub[0].nbytes} B "
            f"reduction tile, above the {prof.reduce_tile_max_bytes} B limit of {prof.name}; {hint}"
        )
    qk = cube_buffers(where, Rmax, D, CHUNK, dtype, dtype, prof, hint)
    pv = cube_buffers(where, Rmax, CHUNK, Dv, dtype, dtype, prof, hint)
    k1 = KernelPlan(name="scores", unit="cube", tasks=B * Hkv,
                    buffers=qk + (ub_tile("s_out_ub", Rmax, CHUNK, "fp32", prof),),
                    gm_read_bytes=rows * D * b + nq * B * Hkv * Skv * D * b,
                    gm_write_bytes=rows * Skv * 4, workspace_bytes=rows * Skv * 4,
                    cube_flops=2 * rows * Skv * D)
    k2 = KernelPlan(name="softmax", unit="vector", tasks=rows, buffers=tuple(row_ub),
                    gm_read_bytes=rows * Skv * (4 + (mb if has_mask else 0)) + (rows * 4 if has_sinks else 0),
                    gm_write_bytes=rows * Skv * b, workspace_bytes=rows * Skv * b,
                    vector_ops=rows * Skv * (ROW_OPS + (1 if has_mask else 0) + (SOFTCAP_OPS if cap > 0 else 0))
                    + (rows * SINK_OPS if has_sinks else 0))
    k3 = KernelPlan(name="pv", unit="cube", tasks=B * Hkv,
                    buffers=pv + (ub_tile("o_ub", Rmax, Dv, "fp32", prof),),
                    gm_read_bytes=rows * Skv * b + nq * B * Hkv * Skv * Dv * b,
                    gm_write_bytes=rows * Dv * b, cube_flops=2 * rows * Skv * Dv,
                    vector_ops=rows * Dv)
    return Plan(op="attention", strategy="standard", dtype=dtype, profile=prof,
                kernels=expand + (k1, k2, k3),
                params={"q_tile": qt, "gqa": gqa, "window": window, "softcap": softcap, "sinks": bool(has_sinks)},
                hint=hint)


@register("attention", "standard", plan=plan_standard,
          summary="whole-row softmax, scores and P in GM workspace (3 kernels)")
def standard(q, k, v, *, scale=None, causal=False, kv_len=None, mask=None, gqa="head_loop", window=None,
             softcap=None, sinks=None, block_table=None, profile=None, layout="bhsd", cast_mode=None):
    """Whole-row attention: S = QK^T (GM) -> softmax row in UB -> P (storage dtype, GM) -> P@V.

    ``window``, ``softcap``, ``sinks``: see :func:`validation.validate`. ``block_table``: refused
    (a paged cache runs on online or flash).
    ``mask``: additive fp32/bf16/fp16 or bool (True = keep), broadcastable to [B, Hq, Sq, Skv];
    ``layout``: "bhsd" or "bshd" ([B, S, H, D] q/k/v and result); see the package docstring.
    ``cast_mode``: the rounding of P, the softmax kernel's cast (``machine/dtypes.py``; default from
    ``use_cast_mode`` / the profile: rint); the output is the pv kernel's FIXPIPE cast, always rint.
    """
    where = "attention.standard"
    if block_table is not None:
        raise ConstraintError(f"{where}: a paged KV cache (block_table=) is not supported by standard; use "
                              f"attention.flash or attention.online with the same arguments")
    a, p = prepare(where, q, k, v, profile, lambda a: plan_standard(
        a.q.shape, a.k.shape, a.v.shape, a.dtype, profile=profile, causal=a.causal, kv_len=a.kv_len,
        has_mask=a.has_mask, gqa=a.gqa, **a.plan_options()),
        scale=scale, causal=causal, kv_len=kv_len, mask=mask, gqa=gqa, window=window, softcap=softcap,
        sinks=sinks, layout=layout)
    qt = p.params["q_tile"]
    cm = resolve_cast_mode(cast_mode, profile, where)  # a bad name is refused for fp32 too
    cm = cm if a.dtype != "fp32" else dtypes.RINT  # fp32 never narrows: one kernel for every mode
    out, out_k = a.empty_out()
    with Launch(p, a.shapes) as run:
        kk, vk = run_expand(a, run)
        G = a.Hq // kk.shape[1]
        Rmax = G * qt
        s_ws = np.empty((a.B, a.Hq, a.Sq, a.Skv), np.float32)
        _, p_ws = dtypes.empty((a.B, a.Hq, a.Sq, a.Skv), a.dtype)
        scores_at = scores_layout(Rmax, a.D)
        sc1 = tile.scratch(scores_at.total, np.float32)
        kt = packed_keys(kk, CHUNK, Rmax)
        with cube.dynamic_tasks(1):
            run.count(_scores_kernel(a.q.kview, kk, s_ws, qt, kt, sc1, scores_at.bounds),
                      workspace_bytes=s_ws.nbytes)
        msb, msh, msi, msj = a.mask_strides
        run.count(_softmax_kernel(s_ws, p_ws, a.kv_len, a.causal, a.left, a.right, a.scale, a.softcap,
                                  a.has_mask, a.mask_flat, msb, msh, msi, msj, a.has_sinks, a.sinks, cm),
                  workspace_bytes=p_ws.nbytes)
        pv_at = pv_layout(Rmax, a.Dv)
        sc3 = tile.scratch(pv_at.total, np.float32)
        with cube.dynamic_tasks(1):
            run.count(_pv_kernel(p_ws, vk, out_k, a.kv_len, a.causal, a.left, a.right, qt, sc3, pv_at.bounds))
        run.workspace(a.copied_bytes)
    return out
