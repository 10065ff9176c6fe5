"""The cube's register blocks: dot-product blocks (decode) and outer-product blocks (prefill).

Built from the LLVM IR of :mod:`.ir_blocks`; their plain numba versions, the readable reference
of each family, are in :mod:`.blocks_plain`. Families:

- dot blocks, fp32 ``a`` against a storage-dtype ``w`` widened on load, 512-bit: ``dot4x4``
  (attention QK^T and linear decode), ``dot4x2`` / ``dot1x4`` (linear decode), the ``_stream``
  forms that also prefetch;
- bf16 pairs blocks, both operands bf16 as stored: ``dot4x4_pairs``, ``dot1x4_pairs``;
- outer-product blocks ``outer{rows}x{cols}``, run over any shape by :func:`outer_rows`;
- ``pv4x4`` / ``pv4x1``: decode attention's P @ V, the outer-product arithmetic continuing the
  sums in the output rows, over a whole row of any length.

Measurements behind the widths and prefetch distances: docs/performance.md.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..jit import device
from .ir_blocks import PAIRS_AUTO, V16, _dot4x4, _dot_intrinsic, _outer, _pv4, _tree_sums_codegen

dot4x2 = _dot_intrinsic("dot4x2", _tree_sums_codegen(2))
dot4x2.__doc__ = """``res[2*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])`` for i < 4, j < 2 and
``q < 16*nvec``: the linear decode register block (4 rows of x, 2 weight rows).

512-bit vectors: with 256-bit, a decode step with 8 rows of ``a`` needs 8 FMA lanes per weight
element, near the FMA issue limit for 16-bit weights. 8 vector accumulators, each reduced once
at the end.
"""

dot1x4 = _dot_intrinsic("dot1x4", _tree_sums_codegen(4, rows=1))
dot1x4.__doc__ = """``res[j] = sum_q a[r0 + q] * widen(w[w0 + j*ldw + q])`` for j < 4 and ``q < 16*nvec``: one
row of ``a`` against four weight rows (decode with fewer than 4 rows of x left): one load of
``a`` per four FMAs, and four weight rows streamed side by side. Sums as :func:`dot4x2`."""
dot1x4_stream = _dot_intrinsic("dot1x4_stream", _tree_sums_codegen(4, rows=1), stream=True)
"""``dot1x4`` that also prefetches the weight rows ``far`` elements on (see ``ir_blocks._dot_block``)."""

dot4x4 = _dot4x4(V16)
dot4x4.__doc__ = """``res[4*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])`` for i, j < 4
and ``q < 16*nvec``: 4 rows of ``a`` x 4 rows of ``w``, the QK^T block of decode attention (4 query
rows x 4 keys) and the linear decode step's block (gemv_rows). 512-bit vectors.

16 vector accumulators (8 loads per 16 FMAs), reduced *together*: each step adds the low and high
halves of two vectors' partial sums into one vector, so the 16 sums take a few shuffles each
instead of a tree per accumulator, and the last vectors hold the results in order.
"""

# Weight elements the decode block prefetches ahead on its first pass over four weight rows: at
# M = 8 the block does 128 MACs per weight line, too few line fills in flight for the hardware
# prefetcher alone. Hints only: same bits.
SKINNY_AHEAD = 256

# The first pass also prefetches, into L2, the same elements of the weight rows SKINNY_ROWS rows on
# (the next group, which walk_task streams next; ``far`` = its distance in elements, 0 for the
# task's last group), so a group is on its way from DRAM while the one before it is computed.
dot4x4_stream = _dot4x4(V16, SKINNY_AHEAD, stream=True)

# bf16 decode in pairs (both operands bf16: the raw bits of x and of the weight, no widened copy):
# each step takes 32 elements of a row, and lane l adds the products of elements 2l+1 and 2l
# (``ir_blocks._pairs_step``): one VDPBF16PS per 32 MACs where the CPU has AVX512_BF16, else two
# FMAs on halves split off by a mask and a shift (same bits; no widening loads).
dot4x4_pairs = _dot4x4(V16, pairs=PAIRS_AUTO)
dot4x4_pairs_stream = _dot4x4(V16, SKINNY_AHEAD, stream=True, pairs=PAIRS_AUTO)
dot1x4_pairs = _dot_intrinsic("dot1x4_pairs", _tree_sums_codegen(4, rows=1, pairs=PAIRS_AUTO), pairs=True)
dot1x4_pairs_stream = _dot_intrinsic("dot1x4_pairs_stream", _tree_sums_codegen(4, rows=1, pairs=PAIRS_AUTO),
                                     stream=True, pairs=True)
PAIR = 2 * V16
"""bf16 elements per step of the pairs blocks."""


pv4x4 = _pv4(4)
pv4x4.__doc__ = """``o[oo + i*ldo + c] += sum_e p[po + i*ldp + e] * widen(v[va + e*ldv + c])`` for the rows
i < 4, the keys e < 4 and ``c < 16*nvec``: decode attention's P @ V over a block of 4 keys. Each
output is ``o + p0 v0 + p1 v1 + p2 v2 + p3 v3``, one FMA each in key order (the arithmetic of
``outer4x*`` continuing its sums). Per 16 columns: 4 V loads, 4 O loads and stores, 16 FMAs."""
pv4x1 = _pv4(1)
"""``pv4x4`` for one key (a tile's keys past its last multiple of 4)."""

OUTER_COLS = 4 * V16
"""Columns of the widest outer-product block (:func:`outer4x64`)."""
OUTER_K = 64
"""Terms per pass of :func:`outer_rows` over a column panel (see there)."""
OUTER_START = 0
"""``acc`` of an outer block: start the sums from 0."""
OUTER_CONTINUE = 1
"""``acc`` of an outer block: continue the sums already in ``c`` (a later chunk of p)."""

outer4x64 = _outer(4, 4)
outer4x64.__doc__ = """``c[c0 + i*ldc + col] = sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
``i < 4`` and ``col < 64``, the sum in ascending p (one fp32 FMA per term), started from 0
(``acc = OUTER_START``) or from the values in ``c`` (``OUTER_CONTINUE``: an earlier chunk of p):
a register block of the GEMM ``C = A B`` in outer-product form, with B's rows contiguous
(prefill attention: P @ V with V as stored, and Q K^T against K packed transposed).

16 vector accumulators (512-bit) stay in registers for the whole of k; per p, 4 loads of B and
4 broadcasts of A feed 16 FMAs. :func:`outer_rows` runs mostly ``outer6x64`` (24 accumulators,
29 of the 32 vector registers of AVX-512), then this block, ``outer1x64`` for the last rows and
``outer4x16`` / ``outer1x16`` for 16-column tails; the < 16 last columns are the caller's.
"""
outer6x64 = _outer(6, 4)
outer1x64 = _outer(1, 4)
outer4x16 = _outer(4, 1)
outer1x16 = _outer(1, 1)


@device(boundscheck=False)
def outer_rows(
    c,
    c0,
    ldc,
    a,
    a0,
    lda,
    w,
    w0,
    ldw,
    m,
    ncols,
    k,
):
    """``c[c0 + i*ldc + col] = sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
    i < m, col < ncols: the outer-product blocks above over any m, ncols and k, the columns past
    the last whole 16 in plain loops; every element is one FMA chain in ascending p.

    Parameters
    ----------
    c, c0, ldc : 1-D fp32 output, offset of C[0, 0], row stride
    a, a0, lda : 1-D fp32 A, offset of A[0, 0], row stride
    w, w0, ldw : B in a storage dtype (C-contiguous, any rank, flat offsets), offset, row stride
    m, ncols, k : C is [m, ncols], the sum runs over k
    """
    uc = np.uint64(ldc)
    ua = np.uint64(lda)
    uw = np.uint64(ldw)
    uk = np.uint64(k)
    n64 = np.uint64(ncols - ncols % OUTER_COLS)
    n16 = np.uint64(ncols - ncols % V16)
    un = np.uint64(ncols)
    # Column panels outside, rows inside, and k in chunks of OUTER_K: the panel of B (OUTER_K x 64
    # fp32, 16 KiB) stays in L1 while every row block of A passes over it. A chunk after the
    # first continues the sums stored in c, so each is still one FMA chain in ascending p.
    # (A whole 128-row panel with a 512-byte row stride maps to half of L1's sets.)
    for kk in range(0, max(k, 1), OUTER_K):
        kc = np.uint64(min(OUTER_K, k - kk))
        more = np.uint64(OUTER_CONTINUE if kk > 0 else OUTER_START)
        ak = np.uint64(a0) + np.uint64(kk)
        wk = np.uint64(w0) + np.uint64(kk) * uw
        for col in range(np.uint64(0), n64, np.uint64(OUTER_COLS)):
            i = 0
            while i + 6 <= m:
                outer6x64(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 6
            if i + 4 <= m:
                outer4x64(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 4
            while i < m:
                outer1x64(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 1
        for col in range(n64, n16, np.uint64(V16)):
            i = 0
            while i + 4 <= m:
                outer4x16(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 4
            while i < m:
                outer1x16(c, np.uint64(c0) + np.uint64(i) * uc + col, uc, a, ak + np.uint64(i) * ua, ua,
                          w, wk + col, uw, kc, more)
                i += 1
    if n16 < un:
        wf = w.reshape(-1)  # w may be an array of any rank (flat offsets)
        for i in range(np.uint64(m)):
            ci = np.uint64(c0) + i * uc
            ai = np.uint64(a0) + i * ua
            for col in range(n16, un):
                c[ci + col] = np.float32(0.0)
            for p in range(uk):
                x = a[ai + p]
                wp = np.uint64(w0) + p * uw
                for col in range(n16, un):
                    c[ci + col] += x * dtypes.widen(wf[wp + col])
