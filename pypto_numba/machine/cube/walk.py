"""The cube walk on the CPU: :func:`matmul_nt_kernel`, one tile task per output block.

Each task (:func:`walk_task`) zeroes its L0C tiles, runs the kL1 steps by one of three paths
(the decode loops of :mod:`.decode` for few rows of ``a``, one BLAS call per block for fp32, or
16-bit operands widened into L1 scratch then BLAS per kL1 chunk or per L0 step), and ends with
the :func:`~.epilogue.epilogue` (row scale, bias, one rounding). fp32 prefill may instead run groups of
blocks as one BLAS call (:func:`group_task`). Counts are the walk's in every path.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import prange, types
from numba.extending import overload

from .. import dtypes
from ..jit import device, kernel
from .amx import amx_rows
from .blas import ARG_SLOTS, mma_blas
from .decode import SKINNY_ROWS, _pairs, _skinny_rows
from .epilogue import epilogue


def _is_f32(a):
    """True for a float32 array (its data can be used in place as an fp32 tile)."""
    return np.asarray(a).dtype == np.float32


@overload(_is_f32)
def _is_f32_impl(a):
    if isinstance(a, types.Array) and a.dtype == types.float32:
        return lambda a: True
    return lambda a: False


def _f32_source(a, scratch):
    """``a`` itself when it is float32 (read in place), else the fp32 scratch it is widened into."""
    return a if np.asarray(a).dtype == np.float32 else scratch


@overload(_f32_source)
def _f32_source_impl(a, scratch):
    if isinstance(a, types.Array) and a.dtype == types.float32:
        return lambda a, scratch: a
    return lambda a, scratch: scratch


@device(boundscheck=False)
def load_l1(src, r0, c0, rows, cols, dst):
    """GM -> L1: widen ``src[r0:r0+rows, c0:c0+cols]`` (storage kernel view) into fp32 ``dst``."""
    oc = np.uint64(c0)  # unsigned indices: see machine/jit.py
    for i in range(rows):
        ri = np.uint64(r0 + i)
        di = np.uint64(i)
        for j in range(np.uint64(cols)):
            dst[di, j] = dtypes.widen(src[ri, oc + j])


@device(boundscheck=False)
def walk_task(
    t,
    tn,
    a,
    b,
    bias,
    out,
    has_bias,
    scale,
    has_scale,
    m1,
    k1,
    n1,
    m0,
    k0,
    n0,
    skinny,
    merge_k,
    amx,
    xv,
    c,
    a_l1,
    b_l1,
    w_l0,
    slots,
):
    """One tile task of the walk: output block ``t`` (row-major over ``tn`` column blocks).
    Returns (gm_read, gm_write, vector_ops, flops).

    Parameters
    ----------
    t, tn : the block's index, column blocks per row of blocks
    a, b, bias, out, has_bias, scale, has_scale : as :func:`matmul_nt_kernel`
    m1, k1, n1, m0, k0, n0 : the tiles (L1 and L0 sizes)
    skinny, merge_k : the decode loops; one BLAS call per kL1 chunk (else per L0 step)
    amx, xv : with the decode loops and bf16 operands, the block's whole 16-row groups of weight rows
        on AMX tiles (:func:`.amx.amx_rows`; the caller checked :func:`.amx.enabled`), ``a``
        packed once by :func:`.amx.pack_pairs` (mL1 a multiple of 16)
    c : [mL1, nL1] fp32, the block's L0C tiles
    a_l1, b_l1 : fp32 L1 scratch for 16-bit operands (fp32 operands are read in place)
    w_l0 : the decode loops' result slots (of :func:`~.blocks.dot4x4`), or AMX's C tiles
    slots : address of this thread's BLAS argument slots
    """
    M, K = a.shape
    N = b.shape[0]
    f32 = _is_f32(a)
    gm_read = 0
    flops = 0
    mb = (t // tn) * m1
    nb = (t % tn) * n1
    vm = min(m1, M - mb)
    vn = min(n1, N - nb)
    for i in range(vm):
        for j in range(vn):
            c[i, j] = 0.0
    src_a = _f32_source(a, a_l1)
    src_b = _f32_source(b, b_l1)
    lda = src_a.shape[1]
    ldb = src_b.shape[1]
    ldc = c.shape[1]
    pa = src_a.ctypes.data  # addresses for BLAS, taken once per task
    pb = src_b.ctypes.data
    pc = c.ctypes.data
    af = src_a.reshape(-1)  # flat view for the decode loops (see gemv_rows)
    wf = w_l0.reshape(-1)
    if skinny:
        # Decode: same walk and counts, loops reordered for a CPU. The GM -> L1 moves of a are
        # counted per kL1 step as in the walk (fp16: widened into an fp32 [mL1, K] scratch; fp32
        # and bf16 are read in place); then each group of SKINNY_ROWS weight rows is streamed once
        # over the whole of K (sequential streams the prefetchers follow) against all rows of a
        # (see gemv_rows), each L0C value accumulating one fp32 partial sum per kL1 step, in
        # ascending k as in the walk. a stays in L2.
        pairs = _pairs(a)  # bf16: a is read in place, in pairs (gemv_rows_pairs)
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            if not (f32 or pairs):
                for i in range(vm):
                    ri = np.uint64(mb + i)
                    di = np.uint64(i)
                    ok = np.uint64(kk)
                    for q in range(np.uint64(vk1)):
                        src_a[di, ok + q] = dtypes.widen(a[ri, ok + q])
        in_place = f32 or pairs
        lda_s = K if in_place else lda  # rows of a in place, or of the widened scratch
        a0 = mb * K if in_place else 0
        araw = a.reshape(-1)
        bw = b.reshape(-1)  # the weight in its storage dtype, widened on the fly
        j_amx = 0
        if amx and pairs:  # whole 16-row groups of weight rows on AMX tiles
            j_amx = amx_rows(c, 0, vm, vn, araw, a0, lda_s, xv, mb, bw, nb * K, K, K, wf)
        for jb in range(j_amx, vn, SKINNY_ROWS):  # weight rows streamed together over the whole of K
            vj = min(SKINNY_ROWS, vn - jb)
            far = SKINNY_ROWS * K if jb + 2 * SKINNY_ROWS <= vn else 0  # the next group, if whole
            for kk in range(0, K, k1):
                vk1 = min(k1, K - kk)
                _skinny_rows(c, jb, vm, vj, araw, af, a0 + kk, lda_s, bw, (nb + jb) * K + kk, K, vk1, wf, far)
        flops += 2 * vm * vn * K
    elif f32 and merge_k:
        # fp32 operands are used in place, so the kL1 chunks need no staging on the CPU: the
        # whole block (all its L0C tiles, the whole of K) is one BLAS call, which packs each
        # operand panel once. Counts per kL1 step and L0 tile as in the walk; the sums stay
        # fp32 (in BLAS's order).
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
        mma_blas(pc, ldc, pa + 4 * mb * lda, lda, pb + 4 * nb * ldb, ldb, vm, vn, K, slots)
        flops += 2 * vm * vn * K
    else:
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            # where the L1 tile lives: in place in GM (fp32) or in the widened scratch
            ar0 = mb
            ac0 = kk
            br0 = nb
            bc0 = kk
            if not f32:
                load_l1(a, mb, kk, vm, vk1, src_a)
                load_l1(b, nb, kk, vn, vk1, src_b)
                ar0 = 0
                ac0 = 0
                br0 = 0
                bc0 = 0
            if merge_k:  # the whole L1 block (all its L0 tiles and kL0 steps): one BLAS call
                mma_blas(pc, ldc, pa + 4 * (ar0 * lda + ac0), lda, pb + 4 * (br0 * ldb + bc0), ldb,
                         vm, vn, vk1, slots)
                flops += 2 * vm * vn * vk1
            else:  # one BLAS call per L0 tile and kL0 step, as the walk reads
                for mi in range(0, vm, m0):
                    vm0 = min(m0, vm - mi)
                    for ni in range(0, vn, n0):
                        vn0 = min(n0, vn - ni)
                        for ki in range(0, vk1, k0):
                            vk0 = min(k0, vk1 - ki)
                            mma_blas(pc + 4 * (mi * ldc + ni), ldc,
                                     pa + 4 * ((ar0 + mi) * lda + ac0 + ki), lda,
                                     pb + 4 * ((br0 + ni) * ldb + bc0 + ki), ldb, vm0, vn0, vk0, slots)
                            flops += 2 * vm0 * vn0 * vk0
    epilogue(c, vm, vn, bias, has_bias, scale, has_scale, out, mb, nb)
    vector_ops = 0
    if has_bias:
        gm_read += vn * bias.itemsize  # GM -> BT
    if has_scale:
        gm_read += vm * scale.itemsize  # the block's row scales
        vector_ops = vm * vn  # one multiply per output
    return gm_read, vm * vn * out.itemsize, vector_ops, flops


@device(boundscheck=False)
def group_task(
    bi0,
    bi1,
    bj0,
    bj1,
    a,
    b,
    bias,
    out,
    has_bias,
    scale,
    has_scale,
    m1,
    k1,
    n1,
    c,
    slots,
):
    """Blocks ``[bi0, bi1) x [bj0, bj1)`` of the walk (fp32 operands, merged K) by one BLAS call.

    Counts every block of the group exactly as :func:`walk_task` does (GM -> L1 per kL1 step,
    the bias and the row scales per block, one write per block); ``c`` holds the group's fp32
    accumulators; the other parameters as :func:`walk_task`. Returns (tasks, gm_read, gm_write,
    vector_ops, flops).
    """
    M, K = a.shape
    N = b.shape[0]
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    flops = 0
    tasks = 0
    for bi in range(bi0, bi1):
        vm = min(m1, M - bi * m1)
        for bj in range(bj0, bj1):
            vn = min(n1, N - bj * n1)
            for kk in range(0, K, k1):
                vk1 = min(k1, K - kk)
                gm_read += vm * vk1 * a.itemsize + vn * vk1 * b.itemsize  # GM -> L1
            if has_bias:
                gm_read += vn * bias.itemsize  # GM -> BT
            if has_scale:
                gm_read += vm * scale.itemsize  # the block's row scales
                vector_ops += vm * vn
            gm_write += vm * vn * out.itemsize
            flops += 2 * vm * vn * K
            tasks += 1
    r0 = bi0 * m1
    c0 = bj0 * n1
    rows = min(M, bi1 * m1) - r0
    cols = min(N, bj1 * n1) - c0
    for i in range(rows):
        for j in range(cols):
            c[i, j] = 0.0
    lda = a.shape[1]
    ldb = b.shape[1]
    mma_blas(c.ctypes.data, c.shape[1], a.ctypes.data + 4 * r0 * lda, lda, b.ctypes.data + 4 * c0 * ldb, ldb,
             rows, cols, K, slots)
    epilogue(c, rows, cols, bias, has_bias, scale, has_scale, out, r0, c0)
    return tasks, gm_read, gm_write, vector_ops, flops


@kernel
def matmul_nt_kernel(
    a,
    b,
    bias,
    out,
    has_bias,
    scale,
    has_scale,
    m1,
    k1,
    n1,
    m0,
    k0,
    n0,
    skinny,
    merge_k,
    amx,
    xv,
    gm,
    gn,
    acc,
    a_l1,
    b_l1,
    w_l0,
    slots,
):
    """``out = round((scale[:, None] *) a @ b^T (+ bias))`` by the cube walk; returns the counters tuple.

    Parameters
    ----------
    a, b, bias, out : ``a[M, K]``, ``b[N, K]``, ``bias[N]``, ``out[M, N]``: storage kernel
        views (a, b, bias share one dtype; out may differ)
    has_bias : False: ``bias`` is any 1-element array, not read
    scale, has_scale : an fp32 ``[M]`` scale per output row, applied to the fp32 accumulator in
        the epilogue (one multiply per output, counted as a vector op); False: any 1-element
        fp32 array, not read
    m1, k1, n1, m0, k0, n0 : the tiles (L1 and L0 sizes)
    skinny, merge_k, amx, xv : see :func:`walk_task`
    gm, gn : > 1 (fp32, merged K only): each prange iteration runs a group of gm x gn walk
        blocks as one BLAS call (:func:`group_task`); the counts stay per block
    acc, a_l1, b_l1, w_l0, slots : per-thread scratch indexed by ``numba.get_thread_id()``
        (:func:`~.plan.scratch`)
    """
    M = a.shape[0]
    N = b.shape[0]
    tm = (M + m1 - 1) // m1
    tn = (N + n1 - 1) // n1
    gtm = (tm + gm - 1) // gm
    gtn = (tn + gn - 1) // gn
    grouped = gm * gn > 1
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    flops = 0
    slots0 = slots.ctypes.data
    for g in prange(gtm * gtn):
        tid = numba.get_thread_id()
        bi0 = (g // gtn) * gm
        bj0 = (g % gtn) * gn
        bi1 = min(tm, bi0 + gm)
        bj1 = min(tn, bj0 + gn)
        if grouped:
            t, r, w, v, f = group_task(bi0, bi1, bj0, bj1, a, b, bias, out, has_bias, scale, has_scale, m1, k1,
                                       n1, acc[tid], slots0 + tid * 4 * ARG_SLOTS)
            tasks += t
            gm_read += r
            gm_write += w
            vector_ops += v
            flops += f
        else:
            for bi in range(bi0, bi1):
                for bj in range(bj0, bj1):
                    r, w, v, f = walk_task(bi * tn + bj, tn, a, b, bias, out, has_bias, scale, has_scale, m1, k1,
                                           n1, m0, k0, n0, skinny, merge_k, amx, xv, acc[tid], a_l1[tid], b_l1[tid],
                                           w_l0[tid], slots0 + tid * 4 * ARG_SLOTS)
                    gm_read += r
                    gm_write += w
                    vector_ops += v
                    flops += f
                    tasks += 1
    return tasks, gm_read, gm_write, vector_ops, flops
