"""RoPE benchmarks: rope.standard / interleaved / rmsnorm / fused_rmsnorm on x[4096, 32, 128].

The issue's targets (2 threads): ``rope.standard`` fp32 on x[4096, 32, 128] moves its bytes at
>= 0.8x the bandwidth of a numba prange copy of the same bytes and runs >= 3x faster than an
HF-style PyTorch RoPE (``x*cos + rotate_half(x)*sin``); ``fused_rmsnorm`` >= 1.3x faster than
``rmsnorm`` followed by ``standard``.

- ``RopeTime.time_*``: one call per strategy and dtype (kernels warmed up in setup()); the
  output is allocated per call, as users call it.
- ``RopeTrack.track_gm_bytes_*``: the plans' modelled GM traffic (read + write, deterministic);
  ``track_gm_bytes_rmsnorm_then_standard`` is the sum of the two plans.
- ``track_gbps_standard``: modelled GM bytes / median seconds (``out=`` preallocated).
- ``track_vs_copy_standard``: copy time / rope time, median of alternating runs; the copy reads
  and writes half the rope's modelled GM bytes each (x plus the cos/sin tables), so 1.0 = copy
  bandwidth. ``_out``: rope writes into a preallocated ``out=`` (the copy peer's destination is
  preallocated too) that starts on a 64-byte line, as rope's own outputs do: fp32 head rows of
  128 are then streamed from registers; ``_out_misaligned``: an ``out=`` 16 bytes past a line
  (what ``numpy.empty`` returns for large arrays): the staged path; ``_alloc``: the default call,
  whose fresh output pages are faulted in (the kernel zeroes them first: ~half the speed).
- ``track_vs_torch_standard``: torch HF-style time / rope time (> 1: we are faster), same
  threads, same dtype, tables ``[S, 1, D]`` broadcast over heads. NaN without torch.
- ``track_fused_vs_rmsnorm_then_standard``: (rmsnorm then standard) time / fused time, both
  allocating their outputs. ``_out``: both with preallocated outputs.
- ``RopeDecodeTime``: one decode step, x[1, 32, 128] bf16: what a call costs in Python.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import rope
from pypto_numba.machine.tile import aligned_empty

from ._common import (  # noqa: F401 (rounds: read by asv)
    copy_peer, median_ratio, median_seconds, to_torch, torch_or_none, rounds,
)

S, H, D = 4096, 32, 128  # 16M elements: 64 MiB fp32 per tensor; setup ~1-3 s (warm cache)
NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
DTYPES = ["fp32", "bf16", "fp16"]
STRATEGIES = ["standard", "interleaved", "rmsnorm", "fused_rmsnorm"]


def _data(dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((S, H, D), dtype=np.float32).astype(NP[dtype])
    w = (1.0 + 0.1 * rng.standard_normal(D, dtype=np.float32)).astype(NP[dtype])
    cos, sin = rope.cos_sin(np.arange(S), D, theta=1e6, dtype=NP[dtype])
    return x, w, cos, sin


def _calls(x, w, cos, sin, out=None, tmp=None):
    # interleaved takes GPT-J pair tables (it refuses the split-half ones standard takes)
    ci, si = rope.cos_sin(np.arange(x.shape[0]), x.shape[-1], theta=1e6, dtype=cos.dtype, layout="interleaved")
    return {
        "standard": lambda: rope.standard(x, cos, sin, out=out),
        "interleaved": lambda: rope.interleaved(x, ci, si, out=out),
        "rmsnorm": lambda: rope.rmsnorm(x, w, out=out),
        "fused_rmsnorm": lambda: rope.fused_rmsnorm(x, w, cos, sin, out=out),
        "rmsnorm_then_standard": lambda: rope.standard(rope.rmsnorm(x, w, out=tmp), cos, sin, out=out),
    }


def _torch_hf(torch, x, cos, sin):
    """HF-style RoPE in torch (transformers' apply_rotary_pos_emb on x[S, H, D])."""
    xt = to_torch(torch, x)
    ct = to_torch(torch, cos)[:, None, :]
    st = to_torch(torch, sin)[:, None, :]

    def rotate_half(v):
        v1 = v[..., : v.shape[-1] // 2]
        v2 = v[..., v.shape[-1] // 2 :]
        return torch.cat((-v2, v1), dim=-1)

    return lambda: xt * ct + rotate_half(xt) * st


class RopeTime:
    params = (STRATEGIES + ["rmsnorm_then_standard"], DTYPES)
    param_names = ["strategy", "dtype"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, strategy, dtype):
        self.run = _calls(*_data(dtype))[strategy]
        self.run()  # compile / load from cache outside the timing

    def time_rope(self, strategy, dtype):
        self.run()


class RopeTrack:
    params = (DTYPES,)
    param_names = ["dtype"]
    timeout = 900
    repeat = 1
    number = 1

    def setup(self, dtype):
        self.x, self.w, self.cos, self.sin = _data(dtype)
        self.out = aligned_empty(self.x.shape, dtype)[0]  # 64-byte aligned, like rope's outputs
        self.tmp = aligned_empty(self.x.shape, dtype)[0]
        buf = np.empty(self.x.size + 64, self.x.dtype)
        start = (-buf.ctypes.data % 64 + 16) // self.x.itemsize  # 16 bytes past a line
        self.out_mis = buf[start : start + self.x.size].reshape(self.x.shape)
        self.alloc = _calls(self.x, self.w, self.cos, self.sin)
        self.pre = _calls(self.x, self.w, self.cos, self.sin, out=self.out, tmp=self.tmp)
        for f in list(self.alloc.values()) + list(self.pre.values()):
            f()
        shapes = (self.x.shape, self.cos.shape)
        self.plans = {
            "standard": rope.plan_standard(*shapes, dtype),
            "interleaved": rope.plan_interleaved(*shapes, dtype),
            "rmsnorm": rope.plan_rmsnorm(self.x.shape, dtype),
            "fused_rmsnorm": rope.plan_fused_rmsnorm(*shapes, dtype),
        }

    def track_gm_bytes_standard(self, dtype):
        return self.plans["standard"].cost.gm_bytes

    def track_gm_bytes_interleaved(self, dtype):
        return self.plans["interleaved"].cost.gm_bytes

    def track_gm_bytes_fused_rmsnorm(self, dtype):
        return self.plans["fused_rmsnorm"].cost.gm_bytes

    def track_gm_bytes_rmsnorm_then_standard(self, dtype):
        return self.plans["rmsnorm"].cost.gm_bytes + self.plans["standard"].cost.gm_bytes

    for _f in (track_gm_bytes_standard, track_gm_bytes_interleaved, track_gm_bytes_fused_rmsnorm,
               track_gm_bytes_rmsnorm_then_standard):
        _f.unit = "bytes"

    def track_gbps_standard(self, dtype):
        return self.plans["standard"].cost.gm_bytes / median_seconds(self.pre["standard"], 7) / 1e9

    track_gbps_standard.unit = "GB/s"

    def track_vs_copy_standard_out(self, dtype):
        return median_ratio(self.pre["standard"], copy_peer(self.plans["standard"].cost.gm_bytes // 2), 7)

    def track_vs_copy_standard_out_misaligned(self, dtype):
        run = lambda: rope.standard(self.x, self.cos, self.sin, out=self.out_mis)
        return median_ratio(run, copy_peer(self.plans["standard"].cost.gm_bytes // 2), 7)

    def track_vs_copy_standard_alloc(self, dtype):
        return median_ratio(self.alloc["standard"], copy_peer(self.plans["standard"].cost.gm_bytes // 2), 7)

    def track_vs_torch_standard(self, dtype):
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        return median_ratio(self.alloc["standard"], _torch_hf(torch, self.x, self.cos, self.sin), 5)

    def track_fused_vs_rmsnorm_then_standard(self, dtype):
        return median_ratio(self.alloc["fused_rmsnorm"], self.alloc["rmsnorm_then_standard"], 7)

    def track_fused_vs_rmsnorm_then_standard_out(self, dtype):
        return median_ratio(self.pre["fused_rmsnorm"], self.pre["rmsnorm_then_standard"], 7)

    for _f in (track_vs_copy_standard_out, track_vs_copy_standard_out_misaligned,
               track_vs_copy_standard_alloc):
        _f.unit = "x copy of the planned GM bytes"
    track_vs_torch_standard.unit = "x torch (HF rotate_half formula)"
    for _f in (track_fused_vs_rmsnorm_then_standard, track_fused_vs_rmsnorm_then_standard_out):
        _f.unit = "x rmsnorm then standard (ours, two kernels)"
    del _f


class RopeDecodeTime:
    """One decode step (x[1, 32, 128] bf16, Qwen3-sized q): the per-call cost of the Python
    path (validation, plan, launch) more than the kernel's. A repeated signature skips what the
    shapes decide (``machine.memo.CallMemo``): 67-87 us per call before, 30-37 us after."""
    timeout = 600  # a first call compiles its kernels (fresh numba cache, loaded host)

    params = (["standard", "fused_rmsnorm"],)
    param_names = ["strategy"]
    number = 100
    repeat = (3, 10, 10.0)

    def setup(self, strategy):
        x, w, cos, sin = _data_small()
        self.run = _calls(x, w, cos, sin)[strategy]
        self.run()

    def time_decode_call(self, strategy):
        self.run()


def _data_small():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, H, D), dtype=np.float32).astype(NP["bf16"])
    w = (1.0 + 0.1 * rng.standard_normal(D, dtype=np.float32)).astype(NP["bf16"])
    cos, sin = rope.cos_sin(np.arange(1), D, theta=1e6, dtype=NP["bf16"])
    return x, w, cos, sin
