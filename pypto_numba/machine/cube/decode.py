"""The decode loops of the cube walk (few rows of ``a``, see :func:`use_loops`): weight rows
streamed once against all rows of ``a`` in the register blocks of :mod:`.blocks`.

:func:`gemv_rows` (fp32 ``a``, the weight widened on the fly) and :func:`gemv_rows_pairs` (bf16
``a`` and weight in pairs) share their 4-row part, :func:`_rows_by_4`; :func:`_skinny_rows` picks
one by ``a``'s dtype. Measurements behind the constants: docs/performance.md.
"""

from __future__ import annotations

import numpy as np
from numba.extending import overload

from .. import dtypes
from ..jit import device
from .blocks import (
    PAIR,
    dot1x4,
    dot1x4_pairs,
    dot1x4_pairs_stream,
    dot1x4_stream,
    dot4x2,
    dot4x4,
    dot4x4_pairs,
    dot4x4_pairs_stream,
    dot4x4_stream,
)
from ..ir import bf16_array
from .ir_blocks import V16

SKINNY_M = 16
"""One 16-row cube fractal: fewer rows of ``a`` than this are a decode step (the plans' decode
tiles, ``linear_decode_cube_tiles``)."""

# Rows of ``a`` (by its kernel dtype) below which the walk runs these loops instead of BLAS (fp32)
# or the widening walk (16-bit); bf16 (in pairs) always. Why these: docs/performance.md.
_LOOPS_BELOW = {np.dtype(np.float32): 96, np.dtype(np.int16): 128, np.dtype(np.uint16): 1 << 62}


def use_loops(m: int, kernel_dtype) -> bool:
    """Whether a walk with ``m`` rows of ``a`` of ``kernel_dtype`` (float32, uint16 = bf16, int16 =
    fp16) runs the decode loops by default; the counts are the walk's either way."""
    return m < _LOOPS_BELOW.get(np.dtype(kernel_dtype), SKINNY_M)


# Weight rows the decode path streams together over the whole of K (gemv_rows walks them as two
# 4-row register blocks per kL1 step): 8 line streams in flight instead of 4. Same bits.
SKINNY_ROWS = 8


def _block4x4(a, r0, ua, w, w0, uw, nv, res, far, first):
    """The 4 x 4 decode block for ``a``'s dtype: :data:`dot4x4` (fp32 ``a``) or
    :data:`dot4x4_pairs` (bf16 ``a``), the streaming form on the ``first`` pass."""
    raise NotImplementedError("numba-only")


def _block1x4(a, r0, ua, w, w0, uw, nv, res, far, first):
    """The 1 x 4 decode block for ``a``'s dtype (:data:`dot1x4` or :data:`dot1x4_pairs`)."""
    raise NotImplementedError("numba-only")


def _block_step(a):
    """Elements per step of the blocks for ``a``'s dtype: V16 (fp32) or PAIR (bf16)."""
    raise NotImplementedError("numba-only")


@overload(_block4x4, jit_options={"forceinline": True})
def _block4x4_impl(a, r0, ua, w, w0, uw, nv, res, far, first):
    stream, plain = (dot4x4_pairs_stream, dot4x4_pairs) if bf16_array(a) else (dot4x4_stream, dot4x4)

    def impl(a, r0, ua, w, w0, uw, nv, res, far, first):
        if first:
            stream(a, r0, ua, w, w0, uw, nv, res, far)
        else:
            plain(a, r0, ua, w, w0, uw, nv, res)
    return impl


@overload(_block1x4, jit_options={"forceinline": True})
def _block1x4_impl(a, r0, ua, w, w0, uw, nv, res, far, first):
    stream, plain = (dot1x4_pairs_stream, dot1x4_pairs) if bf16_array(a) else (dot1x4_stream, dot1x4)

    def impl(a, r0, ua, w, w0, uw, nv, res, far, first):
        if first:
            stream(a, r0, ua, w, w0, uw, nv, res, far)
        else:
            plain(a, r0, ua, w, w0, uw, nv, res)
    return impl


@overload(_block_step, jit_options={"forceinline": True})
def _block_step_impl(a):
    step = PAIR if bf16_array(a) else V16
    return lambda a: np.uint64(step)


@device(boundscheck=False)
def _rows_by_4(
    c,
    j0,
    m,
    n,
    a,
    ab,
    ua,
    w,
    wbase,
    uw,
    ku,
    res,
    far,
):
    """The part of :func:`gemv_rows` / :func:`gemv_rows_pairs` shared by both: every group of 4
    weight rows against all rows of ``a``, in 4 x 4 blocks, then 1 x 4 blocks for the rows of
    ``a`` left over (the first pass over the weight rows streams them: ``far``), each result plus
    the rest of its row past the blocks' last whole step (plain code) added to ``c``. Returns the
    first weight row not done (``n`` rounded down to 4). Parameters as :func:`gemv_rows`, with
    ``ab``, ``ua``, ``uw``, ``ku`` the uint64 forms of ``abase``, ``lda``, ``ldw``, ``k``."""
    nv = ku // _block_step(a)
    kv = nv * _block_step(a)
    ufar = np.uint64(far)
    j = 0
    while j + 4 <= n:
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        i = 0
        while i + 4 <= m:
            r0 = ab + np.uint64(i) * ua
            _block4x4(a, r0, ua, w, w0, uw, nv, res, ufar, i == 0)
            for ii in range(np.uint64(4)):
                ri = r0 + ii * ua
                for jj in range(np.uint64(4)):
                    wj = w0 + jj * uw
                    s = res[ii * np.uint64(4) + jj]
                    for q in range(kv, ku):  # the rest of the row (less than one step)
                        s += dtypes.widen(a[ri + q]) * dtypes.widen(w[wj + q])
                    c[i + ii, j0 + j + jj] += s
            i += 4
        while i < m:
            ri = ab + np.uint64(i) * ua
            _block1x4(a, ri, ua, w, w0, uw, nv, res, ufar, i == 0)  # i == 0: fewer than 4 rows
            for jj in range(np.uint64(4)):
                wj = w0 + jj * uw
                s = res[jj]
                for q in range(kv, ku):  # the rest of the row (less than one step)
                    s += dtypes.widen(a[ri + q]) * dtypes.widen(w[wj + q])
                c[i, j0 + j + jj] += s
            i += 1
        j += 4
    return j


@device(boundscheck=False)
def gemv_rows(
    c,
    j0,
    m,
    n,
    a,
    abase,
    lda,
    w,
    wbase,
    ldw,
    k,
    res,
    far,
):
    """``c[i, j0+j] += sum_q a[abase + i*lda + q] * widen(w[wbase + j*ldw + q])``, i < m, j < n, q < k.

    The decode (skinny) step on flat views: ``a`` fp32 (rows of x), ``w`` the weight in its
    storage dtype, widened on the fly (exact). Register blocks of 4 rows of ``a`` x 4 weight rows
    (:func:`dot4x4`: 8 loads per 16 FMAs), then 4 x 2 (:func:`dot4x2`) for a last pair,
    512-bit vectors, then the < 16-element rest in plain code. Rows of ``a`` left over take 1 x 4
    blocks (:func:`dot1x4`); weight rows left over use plain loops (the 4-row part is
    :func:`_rows_by_4`, shared with :func:`gemv_rows_pairs`). The first pass over each four
    weight rows prefetches them ``SKINNY_AHEAD`` elements ahead (a hint past a row's end reads
    nothing). Every sum is serial within the task; uint64 indices (see machine/jit.py).

    Parameters
    ----------
    c, j0 : fp32 ``c[m, *]`` (L0C), first column to add to
    m, n : rows of ``a``, weight rows
    a, abase, lda : flat fp32 ``a``, offset of its first row, row stride
    w, wbase, ldw : flat weight (storage dtype), offset of its first row, row stride
    k : elements per dot product
    res : 16 fp32 scratch slots (the blocks' results)
    far : when not 0, the first pass also prefetches into L2 the same elements of the rows
        ``far`` elements on (the rows the caller streams next; they must exist)
    """
    ku = np.uint64(k)
    nv = ku // np.uint64(V16)
    kv = nv * np.uint64(V16)
    ua = np.uint64(lda)
    uw = np.uint64(ldw)
    ab = np.uint64(abase)
    j = _rows_by_4(c, j0, m, n, a, ab, ua, w, wbase, uw, ku, res, far)
    while j + 2 <= n:
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        w1 = w0 + uw
        i = 0
        while i + 4 <= m:
            r0 = ab + np.uint64(i) * ua
            r1 = r0 + ua
            r2 = r1 + ua
            r3 = r2 + ua
            dot4x2(a, r0, ua, w, w0, uw, nv, res)  # the 16-lane vectors (512-bit)
            s00 = res[0]
            s01 = res[1]
            s10 = res[2]
            s11 = res[3]
            s20 = res[4]
            s21 = res[5]
            s30 = res[6]
            s31 = res[7]
            for q in range(kv, ku):  # the rest of the row (< 16 elements)
                v0 = dtypes.widen(w[w0 + q])
                v1 = dtypes.widen(w[w1 + q])
                x0 = a[r0 + q]
                x1 = a[r1 + q]
                x2 = a[r2 + q]
                x3 = a[r3 + q]
                s00 += x0 * v0
                s01 += x0 * v1
                s10 += x1 * v0
                s11 += x1 * v1
                s20 += x2 * v0
                s21 += x2 * v1
                s30 += x3 * v0
                s31 += x3 * v1
            c[i, j0 + j] += s00
            c[i, j0 + j + 1] += s01
            c[i + 1, j0 + j] += s10
            c[i + 1, j0 + j + 1] += s11
            c[i + 2, j0 + j] += s20
            c[i + 2, j0 + j + 1] += s21
            c[i + 3, j0 + j] += s30
            c[i + 3, j0 + j + 1] += s31
            i += 4
        while i < m:
            r0 = ab + np.uint64(i) * ua
            s00 = np.float32(0.0)
            s01 = np.float32(0.0)
            for q in range(ku):
                x0 = a[r0 + q]
                s00 += x0 * dtypes.widen(w[w0 + q])
                s01 += x0 * dtypes.widen(w[w1 + q])
            c[i, j0 + j] += s00
            c[i, j0 + j + 1] += s01
            i += 1
        j += 2
    if j < n:  # the last weight row of an odd count
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        for i in range(m):
            r0 = ab + np.uint64(i) * ua
            s00 = np.float32(0.0)
            for q in range(ku):
                s00 += a[r0 + q] * dtypes.widen(w[w0 + q])
            c[i, j0 + j] += s00


@device(boundscheck=False)
def gemv_rows_pairs(
    c,
    j0,
    m,
    n,
    a,
    abase,
    lda,
    w,
    wbase,
    ldw,
    k,
    res,
    far,
):
    """:func:`gemv_rows` for bf16 ``a`` and ``w`` (both raw bf16 bits, flat; same parameters):
    the same blocks in pairs (:data:`dot4x4_pairs`, :data:`dot1x4_pairs`; the first pass over
    four weight rows streams them as in gemv_rows), then the < 32-element rest of each row in
    plain code, and plain loops for the weight rows left over (fewer than 4). Every product is
    exact in fp32."""
    ku = np.uint64(k)
    ua = np.uint64(lda)
    uw = np.uint64(ldw)
    ab = np.uint64(abase)
    j = _rows_by_4(c, j0, m, n, a, ab, ua, w, wbase, uw, ku, res, far)
    while j < n:  # weight rows left over
        w0 = np.uint64(wbase) + np.uint64(j) * uw
        for i in range(m):
            r0 = ab + np.uint64(i) * ua
            s00 = np.float32(0.0)
            for q in range(ku):
                s00 += dtypes.widen(a[r0 + q]) * dtypes.widen(w[w0 + q])
            c[i, j0 + j] += s00
        j += 1


def _pairs(a):
    """True when the decode loops run in bf16 pairs for operand ``a`` (bf16, i.e. uint16 views)."""
    return np.asarray(a).dtype == np.uint16


@overload(_pairs)
def _pairs_impl(a):
    if bf16_array(a):
        return lambda a: True
    return lambda a: False


def _skinny_rows(
    c,
    j0,
    m,
    n,
    a,
    af,
    a0,
    lda,
    w,
    wbase,
    ldw,
    k,
    res,
    far,
):
    """The decode step for one group of weight rows: :func:`gemv_rows_pairs` on ``a`` (flat raw
    bf16) when the operands are bf16, else :func:`gemv_rows` on ``af`` (flat fp32); ``a0`` and
    ``lda`` index the array used; the rest as :func:`gemv_rows`."""
    raise NotImplementedError("numba-only")


@overload(_skinny_rows)
def _skinny_rows_impl(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
    if bf16_array(a):
        def impl(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
            gemv_rows_pairs(c, j0, m, n, a, a0, lda, w, wbase, ldw, k, res, far)
    else:
        def impl(c, j0, m, n, a, af, a0, lda, w, wbase, ldw, k, res, far):
            gemv_rows(c, j0, m, n, af, a0, lda, w, wbase, ldw, k, res, far)
    return impl
