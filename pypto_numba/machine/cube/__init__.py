"""The cube unit: tile matmul on storage-dtype operands with fp32 L0C accumulation.

Math (``a[M, K]``, ``b[N, K]``, optional ``bias[N]``; storage dtypes fp32 / bf16 / fp16)::

    c[M, N] = round_out( sum_k widen(a[m, k]) * widen(b[n, k])  (+ widen(bias[n])) )

``b`` is used transposed (``b_trans=True``, the ``weight[N, K]`` layout of a linear layer).
Products and sums are fp32 (the L0C accumulator, npu-facts 4.4); the optional bias is added to
the fp32 accumulator in the epilogue (the ``bias_tensor`` of ``pypto.matmul``, loaded into the
bias table BT) and the result is rounded **once** to the output dtype.

The tile walk (``tiles = ((mL0, mL1), (kL0, kL1), (nL0, nL1))``, checked by
:func:`pypto_numba.machine.plan.cube_tiles`, npu-facts 4.3)::

    for each output block [mL1, nL1]                       # one tile task (prange iteration)
        L0C tiles of the block = 0
        for kk in range(0, K, kL1):                         # GM -> L1: a[mL1, kL1], b[nL1, kL1]
            for each L0C tile [mL0, nL0] of the block:
                for k0 in range(kk, kk + kL1, kL0):         # L1 -> L0A [mL0, kL0], L0B [nL0, kL0]
                    L0C += L0A @ L0B^T                      # fp32 accumulate
        epilogue: (+ bias) -> round to out dtype -> GM      # L0C -> GM (fixpipe)

Every tile dim has a valid-shape tail. Exact counts of this walk (``b_x`` = itemsize)::

    tasks       = ceil(M/mL1) * ceil(N/nL1)
    GM read     = M*K*b_a*ceil(N/nL1) + N*K*b_b*ceil(M/mL1) (+ N*b_bias*ceil(M/mL1))
    GM write    = M*N*b_out
    cube FLOPs  = 2*M*N*K

:func:`plan_walk` returns these with the cube buffers (a :class:`CubeWalk`);
:func:`run_walk` runs :func:`matmul_nt_kernel` (a kernel returning the usual counters tuple).
This package knows nothing about operators: linear layers, attention etc. build on it.

The package, one concern per file:

    blas.py        sgemm bound as an external symbol; single_thread_blas, dynamic_tasks
    ir_blocks.py   LLVM IR builders of the register blocks (vector loads, FMAs, reductions)
    blocks.py      the register blocks (dot4x4, dot1x4, the bf16 pairs blocks, outer_rows)
    blocks_plain.py  plain numba versions of one block per family: the readable reference
    decode.py      the decode loops (few rows of a): weight rows streamed through the blocks
    amx.py         bf16 on a CPU's AMX tiles (where it has them): a packed once, W @ a^T on tiles
    walk.py        the walk kernel (matmul_nt_kernel, one tile task per output block)
    epilogue.py    L0C -> GM: the fused bias and the one rounding
    plan.py        plan_walk (tiles, counts) and run_walk (scratch, BLAS threads, the kernel)

The walk kernel's numba cache is keyed on ``walk.py`` alone: after editing any other file here,
clear ``NUMBA_CACHE_DIR`` (the cache pitfall of machine/jit.py).

CPU implementation (none of it changes the NPU semantics above; measurements behind each
choice: docs/performance.md)
-------------------------------------------------------------------------------------------
- ``L0C += L0A @ L0B^T`` is a single-precision GEMM call with ``beta = 1`` straight into the fp32
  L0C tiles (SciPy's ``cython_blas.sgemm``, :mod:`.blas`). By default (``merge_k``) the L0 steps
  are merged into larger BLAS calls: one call per kL1 chunk for the whole [mL1, nL1] block
  (bf16/fp16, from the widened L1 scratch), or one call for the whole block and the whole of K
  (fp32, read in place), since small calls spend much of their time packing operands. The
  counts are those of the walk either way and the sums stay fp32; only the order of the fp32
  additions is BLAS's. ``merge_k=False`` issues one call per L0 tile and kL0 step, as the walk
  reads.
- fp32 operands are read in place from GM (the GM -> L1 -> L0 moves are lossless for fp32, so
  they are counted, not copied); bf16/fp16 operands are widened into per-thread fp32 L1 scratch
  once per ``kL1`` step (exact), then go to the same fp32 GEMM.
- BLAS runs single-threaded inside ``prange`` (the tasks are the parallelism):
  :func:`run_walk` pins SciPy's OpenBLAS -- a library separate from NumPy's -- to one thread
  around the kernel (:func:`single_thread_blas`), so NumPy's own BLAS keeps its threads.
- Few rows of ``a`` (:func:`.decode.use_loops`: fp32 M < 96, fp16 M < 128, bf16 always):
  hand-written loops instead of BLAS or the widening walk (:mod:`.decode`; BLAS packs each weight
  panel first). Each group of ``SKINNY_ROWS`` weight rows is streamed once against
  all rows of ``a`` in register blocks of 4 rows x 4 weight rows, 1 x 4 for the rows of ``a``
  left over, prefetched ahead and the next group into L2; one fp32 partial sum per L0C value and
  kL1 step; same walk, same counts. bf16 operands are both read as stored and multiplied in
  pairs of elements (VDPBF16PS where the CPU has AVX512_BF16, else the same sums by FMAs).
  Where the CPU has AMX-BF16 (:func:`.amx.enabled`), bf16 walks with at least ``amx.MIN_ROWS``
  rows of ``a`` run each block's whole 16-row groups of weight rows on AMX tiles instead
  (``TDPBF16PS``: exact products, fp32 sums in the tile unit's order), ``a`` packed once per
  call; the rest of K and of the weight rows take the loops. ``PYPTO_NUMBA_AMX=0`` turns it off.
- fp32 prefill: the walk's blocks are grouped into BLAS calls of about ``GROUP_EDGE`` squared
  outputs (:func:`~.walk.group_task`; counts per block as in the walk).
- Hot loops index flat views with uint64 indices and take no array views (see machine/jit.py).
- Register blocks for callers outside the walk: :func:`dot4x4` and :func:`pv4x4` (attention
  decode QK^T and P @ V) and :func:`outer_rows` (outer-product form, attention prefill, where a
  64 x 128 x 128 tile is too small for BLAS to amortise its operand packing).

A block with several L0C tiles (``mL1 > mL0`` or ``nL1 > nL0``) keeps all of them live across its
kL1 steps; the plan's L0C rule (npu-facts 4.3) is per L0C tile, as in PyPTO. The default linear
tiles have ``mL1 == mL0`` and ``nL1 == nL0``: one L0C tile per task.
"""

from __future__ import annotations

from .blas import ARG_SLOTS, blas_available, dynamic_tasks, mma_blas, single_thread_blas
from .blocks import (
    OUTER_COLS,
    OUTER_K,
    PAIR,
    SKINNY_AHEAD,
    dot1x4,
    dot1x4_pairs,
    dot1x4_pairs_stream,
    dot1x4_stream,
    dot4x2,
    dot4x4,
    dot4x4_pairs,
    dot4x4_pairs_stream,
    dot4x4_stream,
    outer_rows,
    pv4x1,
    pv4x4,
)
from .decode import SKINNY_M, SKINNY_ROWS, gemv_rows, gemv_rows_pairs, use_loops
from .epilogue import epilogue
from .ir_blocks import V16
from .plan import GROUP_EDGE, CubeWalk, plan_walk, run_walk, scratch
from .walk import group_task, load_l1, matmul_nt_kernel, walk_task

__all__ = [
    "SKINNY_M",
    "use_loops",
    "blas_available",
    "CubeWalk",
    "plan_walk",
    "run_walk",
    "matmul_nt_kernel",
    "walk_task",
    "scratch",
    "single_thread_blas",
    "dynamic_tasks",
    "load_l1",
    "mma_blas",
    "epilogue",
    "outer_rows",
]
