"""RMSNorm benchmarks: rmsnorm.plain / rmsnorm.fused_add at Qwen3 sizes, fp32 / bf16 / fp16, 2 threads.

Shapes: [16, 2048] (Qwen3-1.7B decode batch 16), [4096, 2048] (a 4K-token Qwen3-1.7B prefill),
[2048, 5120] (a 2K-token Qwen3-14B prefill). Weights in fp32 and, for fused_add, the residual in
fp32 (production keeps both in fp32, npu-facts 8.4).

- ``time_rmsnorm``: one call with ``out=`` (kernel warmed up in setup()).
- ``track_gm_bytes``: the plan's modelled GM traffic (read + write).
- ``track_vs_copy``: copy time / rmsnorm time (median of alternating runs, ``out=``), where the copy
  peer reads and writes the plan's GM bytes split in half; 1.0 = copy speed (issue 20's target:
  >= 0.9x for fused_add in fp32).
- ``track_vs_torch``: torch time / our time for ``torch.nn.functional.rms_norm`` (fused_add: the
  add, then rms_norm), same dtype and threads; NaN without torch (issue 20's target: >= 2x).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import rmsnorm

from ._common import (  # noqa: F401 (rounds: read by asv)
    copy_peer, median_ratio, to_torch, torch_or_none, rounds,
)

NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
STRATEGIES = ["plain", "fused_add"]
DTYPES = ["fp32", "bf16", "fp16"]
SHAPES = ["16x2048", "4096x2048", "2048x5120"]
EPS = 1e-6


def _shape(name):
    return tuple(int(d) for d in name.split("x"))


def _data(shape, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(NP[dtype])
    r = (4.0 * rng.standard_normal(shape, dtype=np.float32))
    w = (1.0 + 0.1 * rng.standard_normal(shape[-1], dtype=np.float32))
    return x, r, w


def _ours(strategy, x, r, w):
    out = np.empty_like(x)
    if strategy == "plain":
        return lambda: rmsnorm.plain(x, w, EPS, out=out)
    new = np.empty_like(r)
    return lambda: rmsnorm.fused_add(x, r, w, EPS, out=out, residual_out=new)


def _plan(strategy, shape, dtype):
    if strategy == "plain":
        return rmsnorm.plan_plain(shape, dtype, weight_dtype="fp32")
    return rmsnorm.plan_fused_add(shape, dtype, residual_dtype="fp32", weight_dtype="fp32")


class RmsnormTime:
    params = (STRATEGIES, DTYPES, SHAPES)
    param_names = ["strategy", "dtype", "shape"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, strategy, dtype, shape):
        self.run = _ours(strategy, *_data(_shape(shape), dtype))
        self.run()

    def time_rmsnorm(self, strategy, dtype, shape):
        self.run()


class RmsnormTrack:
    params = (STRATEGIES, DTYPES, SHAPES)
    param_names = ["strategy", "dtype", "shape"]
    timeout = 600
    repeat = 1
    number = 1

    def setup(self, strategy, dtype, shape):
        s = _shape(shape)
        self.x, self.r, self.w = _data(s, dtype)
        self.run = _ours(strategy, self.x, self.r, self.w)
        self.run()
        self.plan = _plan(strategy, s, dtype)

    def track_gm_bytes(self, strategy, dtype, shape):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_vs_copy(self, strategy, dtype, shape):
        copy = copy_peer(self.plan.cost.gm_bytes // 2)
        return median_ratio(self.run, copy, 7)

    track_vs_copy.unit = "x copy of the planned GM bytes"

    def track_vs_torch(self, strategy, dtype, shape):
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        x, r, w = (to_torch(torch, a) for a in (self.x, self.r, self.w))
        D = self.x.shape[-1]
        if strategy == "plain":
            def peer():
                torch.nn.functional.rms_norm(x, (D,), w.to(x.dtype), EPS)
        else:
            def peer():
                h = r + x
                torch.nn.functional.rms_norm(h, (D,), w, EPS).to(x.dtype)
        peer()
        return median_ratio(self.run, peer, 7)

    track_vs_torch.unit = "x torch F.rms_norm"
