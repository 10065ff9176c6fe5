"""RoPE kernels: one prange iteration = T tokens x H heads x D (a pypto.loop iteration on a vector core).

x and out come in as [tokens, H*D] kernel views (one token of all heads is contiguous), cos
and sin as [table rows, R]; cbase[l] is the first table row of leading index l (broadcasting
over the leading dims of x). Each token's H*D results are computed into a per-thread staging
row (the out tile in UB) and then written out to GM (``lines``: whole lines with streaming
stores when ``stream``, large outputs). Per-thread scratch comes in as arguments (see
machine/jit.py).
"""

from __future__ import annotations

import math as _math

import numba
import numpy as np
from numba import prange

from ..machine import dtypes
from ..machine.jit import device, kernel
from ..machine.tile import LINE, stream_lines
from ..machine.tile import copy as _copy
from .lines import end_task, first_partial, put_row
from .rotate_ir import _rotate, _rotate_direct

ROPE_OPS = 3  # per rotated element: 2 mul + 1 add/sub
SPLIT_OPS = 2  # interleaved, per rotated element: gathermask split + assemble back
NORM_OPS = 4  # per element: x*x, sum, *rstd, *w
ROW_OPS = 3  # per row: *1/D, +eps, rsqrt


@device
def _rotate_tokens(
    of,
    xf,
    cflat,
    sflat,
    x0,
    c0,
    valid,
    H,
    uD,
    uR,
    uHD,
):
    """fp32 rope of ``valid`` consecutive tokens straight from x to out (``rotate_ir._rotate_stream``),
    head row by head row *across* the tokens: head h of token 0, 1, ... then head h+1. Each
    token's ``H*D`` run is its own stream of lines, so the task keeps ``valid`` streams of DRAM
    reads and writes in flight instead of one. Every head row takes the same operations either
    way (same bits).

    Parameters
    ----------
    of, xf : flat fp32 out and x; the task's tokens start at element ``x0``
    cflat, sflat, c0 : flat fp32 cos/sin tables; the first token's row starts at element ``c0``
    valid, H : tokens of the task, heads per token
    uD, uR, uHD : D, R and H*D as uint64
    """
    size = np.uint64(of.itemsize)
    uhalf = uR // np.uint64(2)
    for h in range(H):
        hoff = x0 + np.uint64(h) * uD
        for t in range(valid):
            off = hoff + np.uint64(t) * uHD
            _rotate_direct(of, off, xf, cflat, sflat, c0 + np.uint64(t) * uR, uhalf)
            stream_lines(of, off + uR, xf, off + uR, (uD - uR) * size)  # pass-through dims


@kernel
def _norm_rope_kernel(
    x,
    weight,
    cos,
    sin,
    cbase,
    out,
    S,
    H,
    T,
    eps,
    do_norm,
    do_rope,
    cast,
    stream,
    direct,
    fscratch,
    oscratch,
    cm,
):
    """rmsnorm (do_norm), standard rope (do_rope), or both fused with fp32 in between.

    Each head row is computed into a small staging row (the out tile in UB) and written out at
    once (``lines``). ``direct`` (fp32 rope without norm, every head row and its rotary halves
    line-aligned): no staging, the task's tokens rotated head row by head row across the tokens
    (:func:`_rotate_tokens`).

    Parameters
    ----------
    x, out : [tokens, H*D] kernel views
    weight : [D] kernel view (norm)
    cos, sin : [table rows, R] kernel views (rope)
    cbase : int64[n_lead], the first table row of each leading index
    S, H, T : positions, heads, tokens per task
    eps : the norm's epsilon
    do_norm, do_rope : which of the two the kernel does
    cast : 1 for a 16-bit storage dtype, else 0 (counted casts)
    stream, direct : streaming stores; the fp32 registers-to-GM path
    fscratch : [threads, 4, max(D, R)] fp32 rows (normed row, weight, cos, sin)
    oscratch : [threads, D + one line] staging rows in out's kernel dtype
    cm : the cast mode of the narrowing to out (a ``dtypes.CastMode``: one kernel per mode)
    """
    HD = x.shape[1]
    D = HD // H
    R = cos.shape[1] if do_rope else 0
    uD = np.uint64(D)
    uR = np.uint64(R)
    uHD = np.uint64(HD)
    uhalf = np.uint64(R // 2)
    n_lead = cbase.size
    s_tiles = (S + T - 1) // T
    b = x.itemsize
    inv_d = np.float32(1.0 / D)
    eps32 = np.float32(eps)
    one = np.float32(1.0)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    cflat = cos.reshape(-1)
    sflat = sin.reshape(-1)
    size = np.uint64(out.itemsize)
    L = np.uint64(LINE) // size  # elements per cache line
    addr0 = np.uint64(of.ctypes.data)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_lead * s_tiles):
        lead = task // s_tiles
        s0 = (task % s_tiles) * T
        valid = min(T, S - s0)  # valid shape of the tail tile
        tid = numba.get_thread_id()
        y = fscratch[tid, 0]  # the fp32 row (norm)
        wf = fscratch[tid, 1]
        cf = fscratch[tid, 2]
        sf = fscratch[tid, 3]
        staged = oscratch[tid]  # one head row + the carried partial line
        if do_norm:
            for j in range(D):
                wf[j] = dtypes.widen(weight[j])
        row0 = lead * S + s0
        e = np.uint64(row0) * uHD  # next element of out to write
        k = np.uint64(0)  # elements waiting in staged
        pre = first_partial(e, addr0, size, L, stream)
        if direct:  # fp32 rope alone, line-aligned head rows: from registers to GM, no staging
            _rotate_tokens(of, xf, cflat, sflat, e, np.uint64(cbase[lead] + s0) * uR, valid, H, uD, uR, uHD)
        for t in range(0 if direct else valid):
            if do_rope:  # this token's cos/sin rows, widened (flat, uint64 indices: see machine/jit.py)
                cb = np.uint64(cbase[lead] + s0 + t) * uR
                for i in range(uR):
                    cf[i] = dtypes.widen(cflat[cb + i])
                for i in range(uR):
                    sf[i] = dtypes.widen(sflat[cb + i])
            xb = np.uint64(row0 + t) * uHD
            for h in range(H):
                off = xb + np.uint64(h) * uD
                if do_norm:
                    ss = np.float32(0.0)
                    for j in range(uD):
                        v = dtypes.widen(xf[off + j])
                        y[j] = v
                        ss += v * v
                    rstd = one / np.sqrt(ss * inv_d + eps32)
                    for j in range(uD):
                        y[j] = y[j] * rstd * wf[j]
                    _rotate(y, np.uint64(0), staged, k, cf, sf, uhalf, cm)  # fp32 in, one cast
                    for j in range(uR, uD):
                        staged[k + j] = dtypes.narrow(staged, y[j], cm)
                else:
                    _rotate(xf, off, staged, k, cf, sf, uhalf, cm)
                    _copy(xf, off + uR, staged, k + uR, uD - uR)  # pass-through: bit copy
                k += uD
                e, k, pre = put_row(staged, k, of, e, pre, L, stream)
        end_task(staged, k, of, e, stream)
        rows = valid * H
        tasks += 1
        gm_read += rows * D * b
        gm_write += rows * D * b
        ops = 0
        if do_norm:
            gm_read += D * b
            ops += rows * D * NORM_OPS + rows * ROW_OPS + cast * (rows * D * 2 + D)
        if do_rope:
            gm_read += 2 * valid * R * b
            ops += rows * R * ROPE_OPS + cast * valid * R * 2
            if not do_norm:
                ops += cast * rows * R * 2
        vector_ops += ops
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _interleaved_kernel(
    x,
    cos,
    sin,
    cbase,
    out,
    S,
    H,
    T,
    cast,
    stream,
    fscratch,
    oscratch,
    cm,
):
    """GPT-J RoPE: gathermask even/odd split (modes 1/2) to fp32, rotate, assemble interleaved.

    Parameters
    ----------
    x, out, cos, sin, cbase, S, H, T, cast, stream : as :func:`_norm_rope_kernel`
    fscratch : [threads, 8, R/2] fp32 rows (x, cos, sin even/odd halves, rotated halves)
    oscratch : [threads, D + one line] staging rows in out's kernel dtype
    cm : the cast mode, as :func:`_norm_rope_kernel`
    """
    HD = x.shape[1]
    D = HD // H
    R = cos.shape[1]
    uD = np.uint64(D)
    uR = np.uint64(R)
    uhalf = np.uint64(R // 2)
    uHD = np.uint64(HD)
    two = np.uint64(2)
    n_lead = cbase.size
    s_tiles = (S + T - 1) // T
    b = x.itemsize
    xf = x.reshape(-1)
    of = out.reshape(-1)
    size = np.uint64(out.itemsize)
    L = np.uint64(LINE) // size
    addr0 = np.uint64(of.ctypes.data)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_lead * s_tiles):
        lead = task // s_tiles
        s0 = (task % s_tiles) * T
        valid = min(T, S - s0)
        tid = numba.get_thread_id()
        # x_even, x_odd, cos_even, cos_odd, sin_even, sin_odd, y_even, y_odd (fp32, R/2 each)
        xe = fscratch[tid, 0]
        xo = fscratch[tid, 1]
        ce = fscratch[tid, 2]
        co = fscratch[tid, 3]
        se = fscratch[tid, 4]
        so = fscratch[tid, 5]
        ye = fscratch[tid, 6]
        yo = fscratch[tid, 7]
        staged = oscratch[tid]  # one head row + the carried partial line (see _norm_rope_kernel)
        row0 = lead * S + s0
        e = np.uint64(row0) * uHD
        kk = np.uint64(0)
        pre = first_partial(e, addr0, size, L, stream)
        for t in range(valid):
            crow = cbase[lead] + s0 + t
            for k in range(uhalf):  # gathermask mode 1 (even) and mode 2 (odd) of cos and sin
                ce[k] = dtypes.widen(cos[crow, two * k])
                co[k] = dtypes.widen(cos[crow, two * k + 1])
                se[k] = dtypes.widen(sin[crow, two * k])
                so[k] = dtypes.widen(sin[crow, two * k + 1])
            xb = np.uint64(row0 + t) * uHD
            for h in range(H):
                off = xb + np.uint64(h) * uD
                for k in range(uhalf):
                    xe[k] = dtypes.widen(xf[off + two * k])
                for k in range(uhalf):
                    xo[k] = dtypes.widen(xf[off + two * k + 1])
                for k in range(uhalf):  # rotate the halves
                    ye[k] = xe[k] * ce[k] - xo[k] * se[k]
                for k in range(uhalf):
                    yo[k] = xo[k] * co[k] + xe[k] * so[k]
                for k in range(uhalf):  # assemble back into pairs, one cast
                    staged[kk + two * k] = dtypes.narrow(staged, ye[k], cm)
                    staged[kk + two * k + 1] = dtypes.narrow(staged, yo[k], cm)
                _copy(xf, off + uR, staged, kk + uR, uD - uR)
                kk += uD
                e, kk, pre = put_row(staged, kk, of, e, pre, L, stream)
        end_task(staged, kk, of, e, stream)
        rows = valid * H
        tasks += 1
        gm_read += rows * D * b + 2 * valid * R * b
        gm_write += rows * D * b
        vector_ops += rows * R * (ROPE_OPS + SPLIT_OPS) + valid * 2 * R + cast * (rows * R * 2 + valid * R * 2)
    return tasks, gm_read, gm_write, vector_ops, 0


@kernel
def _cos_sin_kernel(positions, inv_freq, cos, sin, T, scale, interleaved):
    """Tables cos/sin of f = position * inverse frequency, times ``scale`` (yarn's attention
    factor; 1 otherwise), in float64, one cast. Layout: HF ``cat(f, f)``, or GPT-J pairs
    ``(f0, f0, f1, f1, ...)`` when ``interleaved``."""
    P = positions.size
    half = inv_freq.size
    R = 2 * half
    b = cos.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange((P + T - 1) // T):
        p0 = task * T
        valid = min(T, P - p0)
        for p in range(p0, p0 + valid):
            for i in range(half):
                angle = positions[p] * inv_freq[i]
                c = dtypes.narrow(cos, np.float32(scale * _math.cos(angle)))
                s = dtypes.narrow(sin, np.float32(scale * _math.sin(angle)))
                j0 = 2 * i if interleaved else i
                j1 = j0 + 1 if interleaved else half + i
                cos[p, j0] = c
                cos[p, j1] = c
                sin[p, j0] = s
                sin[p, j1] = s
        tasks += 1
        gm_read += valid * 8 + half * 8
        gm_write += 2 * valid * R * b
        vector_ops += valid * half * 3 + valid * 2 * R  # angle, cos, sin; casts of both tables
    return tasks, gm_read, gm_write, vector_ops, 0
