"""Plain numba versions of the cube's register blocks: the readable reference of each family.

One function per family of :mod:`.blocks`, written as loops over lanes, with the same fp32
operations in the same order as the LLVM IR of :mod:`.ir_blocks`, so they give the same bits
(``tests/machine/test_cube_plain.py``). They are not used by any kernel: the IR blocks keep
every accumulator in a vector register, which numba's loops do not.

- :func:`dot_block_plain`: the dot blocks with fp32 ``a`` (``dot4x4``, ``dot4x2``, ``dot1x4``
  and their ``_stream`` forms; prefetch hints have no plain form);
- :func:`pairs_block_plain`: the bf16 pairs blocks (``dot4x4_pairs``, ``dot1x4_pairs``), in the
  FMA form; VDPBF16PS gives the same bits except that it flushes subnormal inputs and sums;
- :func:`outer_block_plain`: the outer-product blocks (``outer{rows}x{cols}``), and with
  ``OUTER_CONTINUE`` decode attention's ``pv4x4`` / ``pv4x1``.

Compiled with ``contract`` only (no ``reassoc``): every fp32 multiply-add is one FMA, as in the
IR, and LLVM may not reorder the sums.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..jit import device

_PLAIN = dict(boundscheck=False, fastmath={"contract"})


@device(**_PLAIN)
def _lane_sum(acc, lanes):
    """The sum of ``acc[:lanes]`` by halves (16 -> 8 -> 4 -> 2 -> 1), as the IR blocks reduce."""
    width = lanes
    while width > 1:
        width //= 2
        for lane in range(width):
            acc[lane] = acc[lane] + acc[lane + width]
    return acc[0]


@device(**_PLAIN)
def dot_block_plain(
    a,
    r0,
    lda,
    w,
    w0,
    ldw,
    nvec,
    res,
    rows,
    cols,
    lanes,
):
    """``res[cols*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])``, ``q < lanes*nvec``.

    Each of the rows x cols sums is kept in ``lanes`` partial sums (lane ``l`` adds the elements
    ``q = lanes*s + l`` in ascending step ``s``, one FMA each), then summed by halves.

    Parameters
    ----------
    a, r0, lda : flat fp32 ``a``, offset of its first row, row stride
    w, w0, ldw : flat storage-dtype ``w`` (fp32, bf16 or fp16 bits), offset, row stride
    nvec : steps of ``lanes`` elements
    res : fp32 results, ``rows * cols`` of them in row-major order
    rows, cols : rows of ``a`` and of ``w`` in the block (4 x 4, 4 x 2, 1 x 4)
    lanes : fp32 lanes of one vector (16: 512-bit, 8: 256-bit)
    """
    acc = np.empty(lanes, np.float32)
    for i in range(rows):
        ra = np.uint64(r0) + np.uint64(i) * np.uint64(lda)
        for j in range(cols):
            rw = np.uint64(w0) + np.uint64(j) * np.uint64(ldw)
            for lane in range(lanes):
                acc[lane] = np.float32(0.0)
            for s in range(nvec):
                q = np.uint64(s) * np.uint64(lanes)
                for lane in range(lanes):
                    acc[lane] += a[ra + q + np.uint64(lane)] * dtypes.widen(w[rw + q + np.uint64(lane)])
            res[cols * i + j] = _lane_sum(acc, lanes)


@device(**_PLAIN)
def pairs_block_plain(
    a,
    r0,
    lda,
    w,
    w0,
    ldw,
    nvec,
    res,
    rows,
    cols,
):
    """The bf16 pairs blocks: ``res[cols*i + j]`` = the dot product of ``2*16*nvec`` elements
    of row ``i`` of ``a`` and row ``j`` of ``w``, both bf16 bits as stored.

    Lane ``l`` of a sum's 16 partial sums adds, per step of 32 elements, the product of elements
    ``2l+1`` and then that of elements ``2l`` (each product exact in fp32, each sum rounded):
    the order of VDPBF16PS. Then the lanes are summed by halves. Parameters as
    :func:`dot_block_plain` (``a`` bf16 bits here, 16 lanes).
    """
    lanes = 16
    acc = np.empty(lanes, np.float32)
    for i in range(rows):
        ra = np.uint64(r0) + np.uint64(i) * np.uint64(lda)
        for j in range(cols):
            rw = np.uint64(w0) + np.uint64(j) * np.uint64(ldw)
            for lane in range(lanes):
                acc[lane] = np.float32(0.0)
            for s in range(nvec):
                q = np.uint64(s) * np.uint64(2 * lanes)
                for lane in range(lanes):
                    odd = q + np.uint64(2 * lane + 1)
                    even = q + np.uint64(2 * lane)
                    acc[lane] += dtypes.widen(a[ra + odd]) * dtypes.widen(w[rw + odd])
                    acc[lane] += dtypes.widen(a[ra + even]) * dtypes.widen(w[rw + even])
            res[cols * i + j] = _lane_sum(acc, lanes)


@device(**_PLAIN)
def outer_block_plain(
    c,
    c0,
    ldc,
    a,
    a0,
    lda,
    w,
    w0,
    ldw,
    k,
    acc,
    rows,
    cols,
):
    """``c[c0 + i*ldc + col] (+)= sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
    ``i < rows``, ``col < cols``: one FMA chain per element in ascending p, started from 0 or,
    with ``acc = OUTER_CONTINUE``, from the value in ``c``.

    Parameters
    ----------
    c, c0, ldc : flat fp32 output, offset, row stride
    a, a0, lda : flat fp32 A, offset, row stride
    w, w0, ldw : flat storage-dtype B ``[k, cols]``, offset, row stride
    k : terms of each sum
    acc : ``OUTER_START`` (0) or ``OUTER_CONTINUE`` (not 0)
    rows, cols : the block (4 x 64, 6 x 64, 1 x 64, 4 x 16, 1 x 16)
    """
    for i in range(rows):
        ci = np.uint64(c0) + np.uint64(i) * np.uint64(ldc)
        ai = np.uint64(a0) + np.uint64(i) * np.uint64(lda)
        for col in range(cols):
            s = c[ci + np.uint64(col)] if acc != 0 else np.float32(0.0)
            for p in range(k):
                wp = np.uint64(w0) + np.uint64(p) * np.uint64(ldw)
                s += a[ai + np.uint64(p)] * dtypes.widen(w[wp + np.uint64(col)])
            c[ci + np.uint64(col)] = s
