"""The rmsnorm kernel (one for plain, fused_add and deferred) and the vector-op counts."""

from __future__ import annotations

import numba
import numpy as np
from numba import prange

from ..machine import dtypes, tile, vmath
from ..machine.jit import device, kernel

NORM_OPS = 4  # per element: x*x, sum, *inv, *w
SUMSQ_OPS = 2  # deferred, per element: x*x, sum
ROW_OPS = {"rsqrt": 3, "recip_sqrt": 4}  # per row: *1/D, +eps, then rsqrt | sqrt + reciprocal
ADD_OPS = 1  # fused_add, per element: residual + x
CAST_OPS = 2  # per element of a 16-bit tensor: widen in, narrow out
WIDEN_OPS = 1  # deferred, per element of a 16-bit x: widen in (the output is fp32)
INVS = tuple(ROW_OPS)


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = T rows (a pypto.loop iteration on an AI vector core)


@device(forceinline=True)
def _widen_weight(weight, wf, uD, offset):
    """``wf[:D] = weight + offset`` in fp32 (the offset only when nonzero: ``w + 0`` would turn -0 to +0)."""
    for j in range(uD):
        wf[j] = dtypes.widen(weight[j])
    if offset != 0.0:
        off32 = np.float32(offset)
        for j in range(uD):
            wf[j] = wf[j] + off32


@device(forceinline=True)
def row_rstd(ss, inv_d, eps32):
    """``1/sqrt(ss/D + eps)`` in fp32 from a row's sum of squares: the scale plain applies and
    deferred returns. IEEE sqrt and division (``vmath.rsqrt``), whatever the kernel's fast-math
    flags: their estimate-and-refine form gives NaN for ``inf`` and ``0`` (``0 * inf``), the
    IEEE one ``0`` and ``inf``, as the math."""
    return vmath.rsqrt(ss * inv_d + eps32)


@kernel
def _rmsnorm_kernel(
    x,
    residual,
    weight,
    out,
    new_res,
    T,
    eps,
    offset,
    add,
    scale_only,
    scale,
    row_ops,
    fscratch,
    cm,
    stream_out,
    stream_res,
):
    """plain (``add`` False), fused_add or deferred (``scale_only``) RMSNorm of ``[N, D]`` rows
    -> the cost counters. One kernel for the three, so deferred's scale comes from the loop and
    expression plain normalises with (a separate kernel's sum would be vectorised on its own).

    Parameters
    ----------
    x, out : [N, D] kernel views (x's dtype)
    residual, new_res : [N, D] kernel views (the residual's dtype); x and out when not ``add``
    weight : [D] kernel view (fp32 or x's dtype)
    T : rows per task
    eps, offset : the norm's epsilon; added to the widened weight
    add : fused_add: ``new_res = residual + x`` (rounded), normalised in place of x
    scale_only, scale : deferred: ``scale[:N] = 1/sqrt(mean(x**2) + eps)`` (fp32) and nothing
        else is written (weight, out, offset unused); plain / fused_add: any fp32 array, unused
    row_ops : vector ops counted per row (3 rsqrt, 4 recip_sqrt)
    fscratch : [threads, 2, D] fp32 rows (the widened row, the weight)
    cm : the cast mode of both narrowings (normed, new residual; a ``dtypes.CastMode``)
    stream_out, stream_res : write ``out`` / ``new_res`` with streaming stores (large outputs apart
        from the inputs: ``tile.streamable``, ``tile.streams_apart``)
    """
    N, D = x.shape
    uD = np.uint64(D)
    n_tiles = (N + T - 1) // T
    bx = x.itemsize
    br = residual.itemsize
    bw = weight.itemsize
    cx = int(bx != 4)
    cr = int(br != 4)
    cw = int(bw != 4)
    co = int(offset != 0.0)
    inv_d = np.float32(1.0 / D)
    eps32 = np.float32(eps)
    xf = x.reshape(-1)
    rf = residual.reshape(-1)
    of = out.reshape(-1)
    nf = new_res.reshape(-1)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_tiles):
        r0 = task * T
        valid = min(T, N - r0)  # valid shape of the tail tile
        tid = numba.get_thread_id()
        y = fscratch[tid, 0]
        wf = fscratch[tid, 1]
        if not scale_only:
            _widen_weight(weight, wf, uD, offset)
        for t in range(valid):
            off = np.uint64(r0 + t) * uD
            ss = np.float32(0.0)
            if add:
                # the rounded sum into y first, then stored: the loop that sums writes no GM row, so
                # it vectorises alike when new_res is the residual itself (in place)
                for j in range(uD):
                    v = dtypes.widen(dtypes.narrow(nf, dtypes.widen(rf[off + j]) + dtypes.widen(xf[off + j]), cm))
                    y[j] = v
                    ss += v * v
                tile.store_cast(y, np.uint64(0), nf, off, uD, stream_res, cm)  # exact: y[j] is representable
            else:
                for j in range(uD):
                    v = dtypes.widen(xf[off + j])
                    y[j] = v
                    ss += v * v
            if scale_only:
                scale[r0 + t] = row_rstd(ss, inv_d, eps32)
            else:
                tile.store_scale_mul(y, np.uint64(0), row_rstd(ss, inv_d, eps32), wf, of, off, uD, stream_out, cm)
        if stream_out or stream_res:
            tile.store_fence()
        elems = valid * D
        tasks += 1
        if scale_only:
            gm_read += elems * bx
            gm_write += valid * 4
            vector_ops += elems * SUMSQ_OPS + valid * row_ops + cx * elems * WIDEN_OPS
        else:
            gm_read += elems * bx + D * bw
            gm_write += elems * bx
            ops = elems * NORM_OPS + valid * row_ops + cx * elems * CAST_OPS + (cw + co) * D
            if add:
                gm_read += elems * br
                gm_write += elems * br
                ops += elems * ADD_OPS + cr * elems * CAST_OPS
            vector_ops += ops
    return tasks, gm_read, gm_write, vector_ops, 0
