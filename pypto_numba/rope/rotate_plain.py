"""The readable reference of rope's rotation rows: plain numba loops, no IR, no staging.

:func:`rotate_half_row` is what :func:`~pypto_numba.rope.rotate_ir._rotate` (and the fp32
streaming :func:`~pypto_numba.rope.rotate_ir._rotate_stream`) compute for one head row;
:func:`rotate_pairs_row` is what ``_interleaved_kernel``'s gathermask split, rotation and
assembly compute for one head row. Same formulas in the same order, so with the kernels'
fastmath flags (see machine/jit.py) LLVM contracts them to the same FMAs and the results have the
same bits (``tests/test_rope_plain.py``). The kernels differ only in how they move data: 16-lane
steps, per-thread staging rows, streaming stores (which change no bits).
"""

from __future__ import annotations

import numpy as np

from ..machine import dtypes
from ..machine.jit import device


@device
def rotate_half_row(src, s_off, dst, d_off, cf, sf, c_off, half):
    """Split-half (NeoX/HF) rotation of one head row, fp32 math, one rounding to ``dst``'s dtype.

    Parameters
    ----------
    src, s_off : the head row ``src[s_off:s_off + 2*half]`` (kernel view of x, or fp32)
    dst, d_off : where the rotated row goes (kernel view of out, or fp32)
    cf, sf, c_off : the token's cos/sin rows from element ``c_off`` (kernel views, widened here)
    half : R/2 (all offsets uint64, see machine/jit.py)
    """
    for i in range(half):
        a = dtypes.widen(src[s_off + i])  # first half
        b = dtypes.widen(src[s_off + half + i])  # second half
        c1 = dtypes.widen(cf[c_off + i])
        s1 = dtypes.widen(sf[c_off + i])
        c2 = dtypes.widen(cf[c_off + half + i])
        s2 = dtypes.widen(sf[c_off + half + i])
        dst[d_off + i] = dtypes.narrow(dst, a * c1 - b * s1)
        dst[d_off + half + i] = dtypes.narrow(dst, a * s2 + b * c2)


@device
def rotate_pairs_row(src, s_off, dst, d_off, cf, sf, c_off, half):
    """GPT-J (interleaved) rotation of one head row: pair ``(2k, 2k+1)`` rotated in place of
    itself, fp32 math, one rounding. Parameters as :func:`rotate_half_row` (``half`` = R/2 pairs)."""
    two = np.uint64(2)
    one = np.uint64(1)
    for k in range(half):
        a = dtypes.widen(src[s_off + two * k])  # even element
        b = dtypes.widen(src[s_off + two * k + one])  # odd element
        c_even = dtypes.widen(cf[c_off + two * k])
        s_even = dtypes.widen(sf[c_off + two * k])
        c_odd = dtypes.widen(cf[c_off + two * k + one])
        s_odd = dtypes.widen(sf[c_off + two * k + one])
        dst[d_off + two * k] = dtypes.narrow(dst, a * c_even - b * s_even)
        dst[d_off + two * k + one] = dtypes.narrow(dst, b * c_odd + a * s_odd)


@device
def rope_rows(x, cos, sin, crow, out, H, interleaved):
    """Rope of every head row of ``x[tokens, H*D]`` into ``out`` (kernel views), one token at a
    time, the tables' row ``crow[t]`` for token t; dims R..D are copied.

    Parameters
    ----------
    x, out : [tokens, H*D] kernel views (out may be x)
    cos, sin : [table rows, R] kernel views
    crow : int64[tokens], the table row of each token
    H : heads per token
    interleaved : GPT-J pairs (True) or split halves (False)
    """
    HD = x.shape[1]
    D = HD // H
    R = cos.shape[1]
    uD = np.uint64(D)
    uR = np.uint64(R)
    uhalf = np.uint64(R // 2)
    xf = x.reshape(-1)
    of = out.reshape(-1)
    cflat = cos.reshape(-1)
    sflat = sin.reshape(-1)
    for t in range(x.shape[0]):
        c0 = np.uint64(crow[t]) * uR
        for h in range(H):
            off = np.uint64(t) * np.uint64(HD) + np.uint64(h) * uD
            if interleaved:
                rotate_pairs_row(xf, off, of, off, cflat, sflat, c0, uhalf)
            else:
                rotate_half_row(xf, off, of, off, cflat, sflat, c0, uhalf)
            for j in range(uR, uD):  # pass-through dims
                of[off + j] = xf[off + j]
