"""Can this host's bf16 GEMMs use AMX from numba, and how fast are the cube's blocks beside it?

The hosts change between sessions (2-core Xeons with AVX512-BF16 and AMX-BF16, AMD EPYCs with
AVX512-BF16 only). torch's bf16 ``F.linear`` uses AMX where the CPU has it (oneDNN), so on such
a host it outruns any VDPBF16PS loop; this tool measures, on one core with the operands in cache:

- ``dot4x4_pairs`` (the decode loops' bf16 block, VDPBF16PS) and ``dot4x4_v16`` (fp32 FMAs on a
  widened bf16 weight), the cube's register blocks (``machine/cube/blocks.py``);
- a minimal AMX kernel written here: ``C^T[64, 16] = W[64, K] @ x[16, K]^T``, four 16 x 16 fp32
  C tiles, W's rows loaded as A tiles straight from the row-major weight, x packed once in
  the VNNI pair layout as the B tile (TDPBF16PS, 16 x 16 x 32 MACs per instruction), after the
  Linux permission request for the tile data state (``arch_prctl(ARCH_REQ_XCOMP_PERM)``);
- torch's bf16 linear at M = 2048 (2 threads), when torch is installed.

A probe, not a kernel of the library: nothing in ``pypto_numba`` uses AMX yet. Usage::

    python tools/amx_probe.py
"""

from __future__ import annotations

import ctypes
import sys
import time

import ml_dtypes
import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from pypto_numba.machine.cube import blocks

U = np.uint64
K = 4096
ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA, SYS_ARCH_PRCTL = 0x1023, 18, 158
I8, I64 = ir.IntType(8), ir.IntType(64)


def _amx_ready() -> str | None:
    """None when AMX-BF16 can run here, else why not."""
    feats = numba.core.codegen.JITCPUCodegen("probe")._get_host_cpu_features()
    if "+amx-bf16" not in feats or "+amx-tile" not in feats:
        return "the CPU numba compiles for has no amx-tile/amx-bf16"
    if sys.platform != "linux" or ctypes.CDLL(None).syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA):
        return "the kernel refused the AMX tile data permission"
    return None


@intrinsic
def _amx_w_xt(typingctx, cfg, w, xv, c, ksteps, reps):
    """``reps`` times: C tiles 0-3 (16 x 16 fp32 each) = W rows 16t..16t+15 (bf16, row stride
    ``64 * ksteps`` bytes) times the VNNI-packed x (``[ksteps, 16 pair rows, 16, 2]`` bf16), then
    the tiles stored to ``c[64, 16]``."""

    def codegen(context, builder, sig, args):
        cfg_, w_, x_, c_ = (context.make_array(sig.args[i])(context, builder, args[i]) for i in range(4))
        ks, reps_ = args[4], args[5]
        i8p = I8.as_pointer()
        decl = lambda name, *a: builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ir.VoidType(), list(a)))  # noqa: E731
        t = lambda n: ir.Constant(I8, n)  # noqa: E731
        k64 = lambda n: ir.Constant(I64, n)  # noqa: E731
        load, dp = decl("llvm.x86.tileloadd64", I8, i8p, I64), decl("llvm.x86.tdpbf16ps", I8, I8, I8)
        builder.call(decl("llvm.x86.ldtilecfg", i8p), [builder.bitcast(cfg_.data, i8p)])
        stride = builder.mul(ks, k64(64))  # bytes per W row
        with cgutils.for_range(builder, reps_):
            for n in range(4):
                builder.call(decl("llvm.x86.tilezero", I8), [t(n)])
            with cgutils.for_range(builder, ks) as loop:
                k = loop.index
                builder.call(load, [t(4), builder.gep(builder.bitcast(x_.data, i8p), [builder.mul(k, k64(1024))]), k64(64)])
                wk = builder.gep(builder.bitcast(w_.data, i8p), [builder.mul(k, k64(64))])
                for n in range(4):
                    builder.call(load, [t(5 + n % 2), builder.gep(wk, [builder.mul(stride, k64(16 * n))]), stride])
                    builder.call(dp, [t(n), t(5 + n % 2), t(4)])
        store = decl("llvm.x86.tilestored64", I8, i8p, I64)
        for n in range(4):
            builder.call(store, [t(n), builder.gep(builder.bitcast(c_.data, i8p), [k64(n * 1024)]), k64(64)])
        builder.call(decl("llvm.x86.tilerelease"), [])
        return context.get_dummy_value()

    return types.void(cfg, w, xv, c, types.uint64, types.uint64), codegen


@numba.njit
def _run_amx(cfg, w, xv, c, ks, reps):
    _amx_w_xt(cfg, w, xv, c, ks, reps)


@numba.njit
def _run_pairs(a, w, res, reps):
    for _ in range(reps):
        blocks.dot4x4_pairs(a, U(0), U(K), w, U(0), U(K), U(K // 32), res)


@numba.njit
def _run_fma(a, w, res, reps):
    for _ in range(reps):
        blocks.dot4x4_v16(a, U(0), U(K), w, U(0), U(K), U(K // 16), res)


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
    print(f"dot4x4_v16 (fp32 FMA), one core:     {_gflops(lambda r: _run_fma(a4f, w4, res, r), 32 * K, 20000):7.0f} GFLOP/s")
    why = _amx_ready()
    if why:
        print(f"AMX: not available ({why})")
    else:
        cfg = np.zeros(64, np.uint8)
        cfg[0] = 1  # palette 1; tiles 0-6: 16 rows of 64 bytes
        cfg[16:48].view(np.uint16)[:7] = 64
        cfg[48:55] = 16
        w = rng.standard_normal((64, K)).astype(ml_dtypes.bfloat16)
        x = rng.standard_normal((16, K)).astype(ml_dtypes.bfloat16)
        xv = x.view(np.uint16).reshape(16, K // 32, 16, 2).transpose(1, 2, 0, 3).copy()  # [step, pair row, m, 2]
        c = np.zeros((64, 16), np.float32)
        _run_amx(cfg, w.view(np.uint16), xv, c, U(K // 32), U(1))
        ref = w.astype(np.float64) @ x.astype(np.float64).T
        err = float(np.abs(c - ref).max() / np.abs(ref).max())
        rate = _gflops(lambda r: _run_amx(cfg, w.view(np.uint16), xv, c, U(K // 32), U(r)), 2 * 64 * 16 * K, 2000)
        print(f"AMX TDPBF16PS W @ x^T, one core:     {rate:7.0f} GFLOP/s (max error / max |ref| {err:.1e})")
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
