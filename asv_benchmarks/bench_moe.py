"""MoE routing benchmarks: sigmoid gating (DeepSeek-V3 shape), softmax gating, combine.

Shapes: gating T=4096 tokens, E=256 experts, top_k=8, n_group=8, topk_group=4 (DeepSeek-V3's
router, the issue's target: >= 5x faster than the straightforward PyTorch routing on 2 threads);
softmax gating T=4096, E=128, top_k=8 (Qwen3-MoE); combine T=1024, k=8, H=2048.

- ``time_*``: one call per strategy and dtype (kernels warmed up in setup()).
- ``track_gm_bytes_*``: the plan's modelled GM traffic (deterministic).
- ``track_gbps_*``: modelled GM bytes / measured seconds.
- ``track_speedup_vs_torch_*``: median of alternating runs, torch time / our time, same process,
  torch on the same number of threads (> 1: we are faster). The torch peer is the routing as
  model code writes it: sigmoid, view by group, topk (or max) of groups, scatter mask,
  masked_fill, topk, gather, normalise (DeepSeek-V3's HF MoEGate), or softmax + topk + normalise.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import moe

from ._common import median_ratio, median_seconds, torch_or_none, rounds  # noqa: F401 (rounds: read by asv)

NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
T, E, TOP_K, N_GROUP, TOPK_GROUP, SCALE = 4096, 256, 8, 8, 4, 2.5


def _torch_sigmoid_route(torch, logits, bias, top2):
    t, e = logits.shape
    s = logits.float().sigmoid()
    sel = s + bias
    grouped = sel.view(t, N_GROUP, -1)
    gs = grouped.topk(2, dim=-1)[0].sum(-1) if top2 else grouped.max(dim=-1).values
    gidx = gs.topk(TOPK_GROUP, dim=-1, sorted=False)[1]
    gmask = torch.zeros_like(gs).scatter_(1, gidx, 1.0)
    emask = gmask.unsqueeze(-1).expand(t, N_GROUP, e // N_GROUP).reshape(t, e)
    masked = sel.masked_fill(~emask.bool(), float("-inf"))
    ids = masked.topk(TOP_K, dim=-1, sorted=False)[1]
    w = s.gather(1, ids)
    return w / (w.sum(dim=-1, keepdim=True) + 1e-20) * SCALE, ids


def _torch_softmax_route(torch, logits, top_k):
    p = logits.float().softmax(dim=-1)
    w, ids = p.topk(top_k, dim=-1)
    return w / w.sum(dim=-1, keepdim=True), ids


class SigmoidGating:
    """DeepSeek-V3 router: sigmoid, bias, 8 groups (best 4), top-8, scale 2.5."""

    params = (["fp32", "bf16"], ["max", "top2_sum"])
    param_names = ["dtype", "group_score"]
    timeout = 300

    def setup(self, dtype, group_score):
        rng = np.random.default_rng(0)
        self.logits = rng.standard_normal((T, E)).astype(np.float32).astype(NP[dtype])
        self.bias = (rng.standard_normal(E) * 0.05).astype(np.float32)
        self.opts = dict(bias=self.bias, n_group=N_GROUP, topk_group=TOPK_GROUP, group_score=group_score,
                         routed_scaling_factor=SCALE)
        self.run()  # compile / load from cache outside the timings
        self.plan = moe.plan_sigmoid_gating((T, E), dtype, top_k=TOP_K, bias_dtype="fp32", n_group=N_GROUP,
                                            topk_group=TOPK_GROUP, group_score=group_score)
        self.torch = torch_or_none()
        if self.torch is not None:
            torch = self.torch
            xt = torch.from_numpy(self.logits.astype(np.float32))
            if dtype == "bf16":
                xt = xt.to(torch.bfloat16)
            bt = torch.from_numpy(self.bias)
            top2 = group_score == "top2_sum"
            self.peer = lambda: _torch_sigmoid_route(torch, xt, bt, top2)
            self.peer()

    def run(self):
        return moe.sigmoid_gating(self.logits, TOP_K, **self.opts)

    def time_sigmoid_gating(self, dtype, group_score):
        self.run()

    def track_gm_bytes(self, dtype, group_score):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_gbps(self, dtype, group_score):
        return self.plan.cost.gm_bytes / median_seconds(self.run) / 1e9

    track_gbps.unit = "GB/s"

    def track_speedup_vs_torch(self, dtype, group_score):
        if self.torch is None:
            raise NotImplementedError("torch is not installed")
        return median_ratio(self.run, self.peer, repeats=9)

    track_speedup_vs_torch.unit = "x torch (same math)"


class SoftmaxGating:
    """Qwen3-MoE router: softmax over 128 experts, top-8, renormalise."""

    params = (["fp32", "bf16"],)
    param_names = ["dtype"]
    timeout = 300
    shape = (T, 128)

    def setup(self, dtype):
        rng = np.random.default_rng(1)
        self.logits = (rng.standard_normal(self.shape) * 2).astype(np.float32).astype(NP[dtype])
        self.run()
        self.plan = moe.plan_softmax_gating(self.shape, dtype, top_k=TOP_K, renormalize=True)
        self.torch = torch_or_none()
        if self.torch is not None:
            torch = self.torch
            xt = torch.from_numpy(self.logits.astype(np.float32))
            if dtype == "bf16":
                xt = xt.to(torch.bfloat16)
            self.peer = lambda: _torch_softmax_route(torch, xt, TOP_K)
            self.peer()

    def run(self):
        return moe.softmax_gating(self.logits, TOP_K, renormalize=True)

    def time_softmax_gating(self, dtype):
        self.run()

    def track_gm_bytes(self, dtype):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_speedup_vs_torch(self, dtype):
        if self.torch is None:
            raise NotImplementedError("torch is not installed")
        return median_ratio(self.run, self.peer, repeats=9)

    track_speedup_vs_torch.unit = "x torch (same math)"


class Combine:
    """out[t] = sum_j w[t, j] * expert_out[t, j] for T=1024, k=8, H=2048."""

    params = (["fp32", "bf16"],)
    param_names = ["dtype"]
    timeout = 300
    shape = (1024, TOP_K, 2048)

    def setup(self, dtype):
        rng = np.random.default_rng(2)
        self.x = rng.standard_normal(self.shape, dtype=np.float32).astype(NP[dtype])
        self.w = rng.uniform(0, 1, self.shape[:2]).astype(np.float32)
        self.run()
        self.plan = moe.plan_combine(self.shape, dtype)
        self.torch = torch_or_none()
        if self.torch is not None:
            torch = self.torch
            xt = torch.from_numpy(self.x.astype(np.float32))
            if dtype == "bf16":
                xt = xt.to(torch.bfloat16)
            wt = torch.from_numpy(self.w)
            out_dtype = xt.dtype
            self.peer = lambda: torch.bmm(wt.unsqueeze(1), xt.float()).squeeze(1).to(out_dtype)
            self.peer()

    def run(self):
        return moe.combine(self.x, self.w)

    def time_combine(self, dtype):
        self.run()

    def track_gm_bytes(self, dtype):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_gbps(self, dtype):
        return self.plan.cost.gm_bytes / median_seconds(self.run) / 1e9

    track_gbps.unit = "GB/s"

    def track_speedup_vs_torch(self, dtype):
        if self.torch is None:
            raise NotImplementedError("torch is not installed")
        return median_ratio(self.run, self.peer, repeats=9)

    track_speedup_vs_torch.unit = "x torch (same math)"
