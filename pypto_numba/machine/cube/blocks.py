"""The cube's register blocks: dot-product blocks (decode) and outer-product blocks (prefill).

Built by :mod:`.ir_blocks`; :func:`outer_rows` runs the outer-product blocks over any shape.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..jit import device
from .ir_blocks import V16, _dot4x4, _dot_intrinsic, _outer, _tree_sums_codegen

dot4x2 = _dot_intrinsic("dot4x2", _tree_sums_codegen(2))
dot4x2.__doc__ = """``res[2*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])`` for i < 4, j < 2 and
``q < 16*nvec``: the linear decode register block (4 rows of x, 2 weight rows).

With 256-bit vectors a decode step with 8 rows of ``a`` needs 8 FMA lanes per weight element,
near the FMA issue limit for 16-bit weights (estimate: ~22 GB/s of bf16 weights on 2 cores);
512-bit vectors halve that. 8 vector accumulators, each reduced once at the end.
"""

dot1x4 = _dot_intrinsic("dot1x4", _tree_sums_codegen(4, rows=1))
dot1x4.__doc__ = """``res[j] = sum_q a[r0 + q] * widen(w[w0 + j*ldw + q])`` for j < 4 and ``q < 16*nvec``: one
row of ``a`` against four weight rows (decode with fewer than 4 rows of x left): one load of
``a`` per four FMAs, and four weight rows streamed side by side. Sums as :func:`dot4x2`."""
dot1x4_stream = _dot_intrinsic("dot1x4_stream", _tree_sums_codegen(4, rows=1), stream=True)
"""``dot1x4`` that also prefetches the weight rows ``far`` elements on (see :func:`_dot_block`)."""



# fp32 lanes of dot4x4's vectors. 256-bit: in cache as fast as 512-bit (19 ns per key at G=4,
# D=128, against 40 for numba's 4x2 loop), and unlike 512-bit (0.92-0.95x) no slower than that
# loop when K streams from DRAM (presumably AVX-512's lower core clock; measured on the 2-core Xeon)
DOT4X4_LANES = 8

dot4x4 = _dot4x4(DOT4X4_LANES)
dot4x4.__doc__ = """``res[4*i + j] = sum_q a[r0 + i*lda + q] * widen(w[w0 + j*ldw + q])`` for i, j < 4
and ``q < DOT4X4_LANES*nvec``: the QK^T register block of decode attention (4 query rows x 4 keys).

16 vector accumulators (8 loads per 16 FMAs), reduced *together*: each step adds the low and high
halves of two vectors' partial sums into one vector, so the 16 sums take a few shuffles each
instead of a tree per accumulator, and the last vectors hold the results in order.
"""

# the same block in 512-bit vectors (V16 lanes) for the linear decode step (gemv_rows), which
# already runs 512-bit (dot4x2)
dot4x4_v16 = _dot4x4(V16)

# Weight elements the decode block prefetches ahead on its first pass over four weight rows (1 KiB
# of fp32, 512 B of bf16 per row). At M = 8 the block does 128 MACs per weight line, so the
# out-of-order window holds few line fills and the hardware prefetcher alone lets the weight
# stream stall. Measured on the 2-core Xeon: 128 ahead 1.03-1.07x at M = 8 (fp32 and bf16 weights,
# K = 4096, N = 1024 and 4096, 2 threads), 512 no gain. On the 2-core EPYC (Zen 4), with the far
# prefetch below: 256 ahead 1.01-1.07x faster than 128 at M in {1, 4, 8}, fp32/bf16/fp16, in 4 of 4
# paired runs. Hints only: same bits.
SKINNY_AHEAD = 256

# The first pass also prefetches, into L2, the same elements of the weight rows SKINNY_ROWS rows on
# (the next group, which walk_task streams next; ``far`` = its distance in elements, 0 for the
# task's last group), so a group is on its way from DRAM while the one before it is computed: the
# near prefetch is some 80 ns ahead, short of a DRAM fill under load. Measured on the 2-core EPYC,
# K = N = 4096, 2 threads, paired runs in one process: fp32 M = 8 1.17-1.23x faster
# (2.4-2.7 -> 1.9-2.2 ms), M = 4 1.25x, bf16 M = 1 1.48x, bf16 M = 8 1.17x, fp16 M = 8 1.10x;
# a group further (16 rows) no better; a weight in L3 (N = 1024) unchanged. Same bits.
dot4x4_v16_stream = _dot4x4(V16, SKINNY_AHEAD, stream=True)

# bf16 decode in pairs (both operands bf16: the raw bits of x and of the weight, no widened copy):
# each step takes 32 elements of a row, and lane l adds the products of elements 2l+1 and 2l
# (:func:`_pairs_step`): one VDPBF16PS per 32 MACs where the CPU has AVX512_BF16, else two FMAs on
# halves split off by a mask and a shift (same bits; no widening loads). Measured on the 2-core
# EPYC, bf16 M = 8, K = N = 4096: VDPBF16PS 1.71x, the FMA form 1.10x faster than the widened
# fp32 block.
dot4x4_pairs = _dot4x4(V16, pairs="auto")
dot4x4_pairs_stream = _dot4x4(V16, SKINNY_AHEAD, stream=True, pairs="auto")
dot1x4_pairs = _dot_intrinsic("dot1x4_pairs", _tree_sums_codegen(4, rows=1, pairs="auto"), pairs=True)
dot1x4_pairs_stream = _dot_intrinsic("dot1x4_pairs_stream", _tree_sums_codegen(4, rows=1, pairs="auto"),
                                     stream=True, pairs=True)
PAIR = 2 * V16
"""bf16 elements per step of the pairs blocks."""


OUTER_COLS = 4 * V16
"""Columns of the widest outer-product block (:func:`outer4x64`)."""
OUTER_K = 64
"""Terms per pass of :func:`outer_rows` over a column panel (see there)."""

outer4x64 = _outer(4, 4)
outer4x64.__doc__ = """``c[c0 + i*ldc + col] = sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
``i < 4`` and ``col < 64``, the sum in ascending p (one fp32 FMA per term), started from 0 or,
with ``acc != 0``, from the values in ``c`` (continuing an earlier chunk of p): a register block of
the GEMM ``C = A B`` in outer-product form, with B's rows contiguous (prefill attention: P @ V
with V as stored, and Q K^T against K packed transposed).

16 vector accumulators (512-bit) stay in registers for the whole of k; per p, 4 loads of B and
4 broadcasts of A feed 16 FMAs. :func:`outer_rows` runs mostly ``outer6x64`` (24 accumulators,
29 of the 32 vector registers of AVX-512; 1.17x the 4-row block on 64 x 128 x 128 in cache),
then this block, ``outer1x64`` for the last rows and ``outer4x16`` / ``outer1x16`` for 16-column
tails; the < 16 last columns are the caller's.
"""
outer6x64 = _outer(6, 4)
outer1x64 = _outer(1, 4)
outer4x16 = _outer(4, 1)
outer1x16 = _outer(1, 1)


@device(boundscheck=False)
def outer_rows(c, c0, ldc, a, a0, lda, w, w0, ldw, m, ncols, k):
    """``c[c0 + i*ldc + col] = sum_{p < k} a[a0 + i*lda + p] * widen(w[w0 + p*ldw + col])`` for
    i < m, col < ncols: the outer-product blocks above over any m, ncols and k (flat offsets into
    C-contiguous arrays; ``c`` and ``a`` 1-D fp32, ``w`` any rank in a storage dtype), the columns
    past the last whole 16 in plain loops; every element is one FMA chain in ascending p."""
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
    # (A whole 128-row panel with a 512-byte row stride -- K^T tiles of 128 keys, V rows at
    # D = 128 -- maps to half of L1's sets and was evicted between row blocks: 62 vs 115
    # GFLOP/s for 64 x 128 x 128 in cache, one core.)
    for kk in range(0, max(k, 1), OUTER_K):
        kc = np.uint64(min(OUTER_K, k - kk))
        more = np.uint64(1 if kk > 0 else 0)
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
