"""Can this host's bf16 GEMMs use AMX from numba, and how fast are the cube's blocks beside it?

The hosts change between sessions (2-core Xeons with AVX512-BF16 and AMX-BF16, AMD EPYCs with
AVX512-BF16 only). torch's bf16 ``F.linear`` uses AMX where the CPU has it (oneDNN), so on such
a host it outruns any VDPBF16PS loop; this tool measures, on one core with the operands in cache:

- ``dot4x4_pairs`` (the decode loops' bf16 block, VDPBF16PS) and ``dot4x4`` (fp32 FMAs on a
  widened bf16 weight), the cube's register blocks (``machine/cube/blocks.py``);
- the walk's AMX block (``machine/cube/amx.py``): ``C^T[64, 16] = W[64, K] @ x[16, K]^T``, four
  16 x 16 fp32 C tiles, W's rows as A tiles straight from the row-major weight, x packed once in
  the VNNI pair layout as the B tile (TDPBF16PS, 16 x 16 x 32 MACs per instruction), where
  ``amx.enabled()`` (the target's features and Linux's permission for the tile data);
- torch's bf16 linear at M = 2048 (2 threads), when torch is installed.

Usage::

    python tools/amx_probe.py
"""

from __future__ import annotations

import time

import ml_dtypes
import numba
import numpy as np

from pypto_numba.machine.cube import amx, blocks

U = np.uint64
K = 4096


@numba.njit
def _run_amx(w, xv, ct, reps):
    for _ in range(reps):
        amx.amx_w_at(ct, w, U(0), U(K), xv, U(0), U(K // amx.STEP), U(amx.GROUP))


@numba.njit
def _run_pairs(a, w, res, reps):
    for _ in range(reps):
        blocks.dot4x4_pairs(a, U(0), U(K), w, U(0), U(K), U(K // 32), res)


@numba.njit
def _run_fma(a, w, res, reps):
    for _ in range(reps):
        blocks.dot4x4(a, U(0), U(K), w, U(0), U(K), U(K // 16), res)


def _gflops(fn, flops_per_rep, reps):
    fn(1)
    t0 = time.perf_counter()
    fn(reps)
    return flops_per_rep * reps / (time.perf_counter() - t0) / 1e9


def main():
    numba.set_num_threads(1)
    rng = np.random.default_rng(0)
    w4 = rng.standard_normal((4, K)).astype(ml_dtypes.bfloat16).view(np.uint16)
    a4 = rng.standard_normal((4, K)).astype(ml_dtypes.bfloat16).view(np.uint16)
    res = np.zeros(16, np.float32)
    a4f = a4.view(ml_dtypes.bfloat16).astype(np.float32)
    print(f"dot4x4_pairs (VDPBF16PS), one core:  {_gflops(lambda r: _run_pairs(a4, w4, res, r), 32 * K, 20000):7.0f} GFLOP/s")
    print(f"dot4x4 (fp32 FMA), one core:        {_gflops(lambda r: _run_fma(a4f, w4, res, r), 32 * K, 20000):7.0f} GFLOP/s")
    if not amx.enabled():
        print("AMX: not available here (no amx-tile/amx-bf16 for numba's target, or the OS refused its tiles)")
    else:
        rows = amx.GROUP * amx.TILE
        w = rng.standard_normal((rows, K)).astype(ml_dtypes.bfloat16)
        x = rng.standard_normal((amx.TILE, K)).astype(ml_dtypes.bfloat16)
        xv, ct = amx.pack_pairs(x.view(np.uint16)), np.zeros(rows * amx.TILE, np.float32)
        _run_amx(w.view(np.uint16), xv, ct, 1)
        ref = w.astype(np.float64) @ x.astype(np.float64).T
        err = float(np.abs(ct.reshape(rows, amx.TILE) - ref).max() / np.abs(ref).max())
        rate = _gflops(lambda r: _run_amx(w.view(np.uint16), xv, ct, r), 2 * rows * amx.TILE * K, 2000)
        print(f"AMX amx_w_at (W @ x^T), one core:     {rate:7.0f} GFLOP/s (max error / max |ref| {err:.1e})")
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(2)
    tx, tw = torch.randn(2048, K).to(torch.bfloat16), torch.randn(K, K).to(torch.bfloat16)
    rate = _gflops(lambda r: [torch.nn.functional.linear(tx, tw) for _ in range(r)], 2 * 2048 * K * K, 5)
    print(f"torch bf16 linear M=2048, 2 threads: {rate:7.0f} GFLOP/s")


if __name__ == "__main__":
    main()
