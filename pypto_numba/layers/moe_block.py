"""DeepSeek-V3's MoE block composed of op calls (no kernel of its own).

    logits = x @ Wgate^T                          router     linear          [T, E]
    w, ids = sigmoid_gating(logits, k, bias, n_group, topk_group, group_score="top2_sum")
                                                  gating     moe.sigmoid_gating (softmax_gating when
                                                             scoring_func="softmax")
    xs = x[token of each (t, j), sorted by expert]  dispatch embedding.gather  [T*k, H]
    ys[e] = mlp_e(xs[rows of e])                  experts    linear + swiglu + linear per expert with tokens
    y_sh = mlp_shared(x)                          shared     the same on all T tokens
    out[t] = sum_j w[t, j] * ys[(t, j)] + y_sh[t] collect + combine: embedding.gather to [T, k+1, H],
                                                  then moe.combine with weight 1 for the shared expert

The router runs in its weight's dtype: the storage dtype, or fp32 when ``mlp.gate.weight`` is given
in fp32 (as production and HF's DeepSeek-V3 keep it): x is then widened to fp32 on the host (exact)
and the router linear and the gating run in fp32. Host steps: the argsort of the expert ids and
the concatenation of the expert outputs (count no kernel). A plan needs the tokens per expert: by
default the balanced routing (``T*k`` picks spread evenly over the experts); ``expert_tokens=``
gives a run's counts.

torch: ``x`` may be a CPU torch tensor; the result is then a tensor sharing our output's memory
(:func:`pypto_numba.interop.torch_aware`'s rules). A ``torch.dtype`` works as ``dtype``.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import embedding, linear, moe, swiglu
from ..errors import ConfigError, ShapeError
from ..interop import torch_aware
from ..machine import dtypes
from . import reference as ref
from .config import resolve
from .plan import LayerPlan, Step
from .qwen3 import CHOICES, SEED_PICKS, _exact, choose
from .weights import layer_weights, moe_shapes

MOE_CHOICES = {k: CHOICES[k] for k in ("linear", "swiglu")}
MOE_PICKS = {k: SEED_PICKS[k] for k in MOE_CHOICES}


def balanced_tokens(T, k, E):
    """Tokens per expert when ``T*k`` picks spread evenly over ``E`` experts."""
    n = T * k
    return np.array([n // E + (e < n % E) for e in range(E)], np.int64)


class MoeBlock:
    """``MoeBlock(config, weights=None, seed=0, dtype="bf16", layer=0)``; ``block(x[..., H])`` ->
    the routed + shared experts' combined output in the storage dtype (x: the normed hidden).

    Generated expert weights are kept while all experts take at most ``keep_bytes`` (1 GiB);
    above it each expert is generated when its tokens arrive and dropped after its MLP (full-width
    DeepSeek-V3 experts are 88 MB each in bf16)."""

    kind = "moe"

    @functools.partial(torch_aware, where="MoeBlock")  # a torch.dtype as dtype
    def __init__(self, config, weights=None, seed=0, dtype="bf16", layer=0, keep_bytes=1 << 30):
        self.config = resolve(config)
        if not self.config.is_moe:
            raise ConfigError(f"MoeBlock: config {self.config.name!r} has n_routed_experts=0 (a dense MLP)")
        self.dtype = dtypes.storage_name(dtype)
        if self.dtype is None:
            raise ConfigError(f"MoeBlock: dtype {dtype!r} is not a storage dtype (fp32, bf16, fp16)")
        self.weights = layer_weights(self.config, moe_shapes(self.config), self.dtype, weights, seed, layer)
        self._gate_up = {}
        self.last_tokens = None
        c = self.config
        expert_bytes = 3 * c.hidden_size * c.moe_intermediate_size * dtypes.itemsize(self.dtype)
        self.keep = c.n_routed_experts * expert_bytes <= keep_bytes
        self.router_dtype = dtypes.storage_name(self.weights["mlp.gate.weight"].dtype)  # dtype or fp32

    def gate_up(self, prefix):
        """``[Wg; Wu]`` of one expert (kept when the block keeps its experts)."""
        if prefix in self._gate_up:
            return self._gate_up[prefix]
        w = self.weights
        gu = np.concatenate([w[prefix + "gate_proj.weight"], w[prefix + "up_proj.weight"]])
        if self.keep or not prefix.startswith("mlp.experts."):
            self._gate_up[prefix] = gu
        return gu

    def _mlp(self, x, prefix, s, profile):
        w = self.weights
        lin = getattr(linear, s["linear"])
        if s["swiglu"] == "epilogue":
            h = swiglu.epilogue(x, w[prefix + "gate_proj.weight"], w[prefix + "up_proj.weight"], profile=profile)
        else:
            h = getattr(swiglu, s["swiglu"])(lin(x, self.gate_up(prefix), profile=profile), profile=profile)
        return lin(h, w[prefix + "down_proj.weight"], profile=profile)

    @functools.partial(torch_aware, where="MoeBlock", main="x")
    def __call__(self, x, strategies=None, profile=None, exact=()):
        c, w, dt = self.config, self.weights, self.dtype
        s = choose(strategies, MOE_CHOICES, MOE_PICKS)
        x = np.asarray(x)
        if x.shape[-1] != c.hidden_size or dtypes.storage_name(x.dtype) != dt:
            raise ShapeError(f"MoeBlock: x must be [..., hidden_size={c.hidden_size}] in {dt}, got {x.shape} {x.dtype}")
        lead = x.shape[:-1]
        x2 = np.ascontiguousarray(x.reshape(-1, c.hidden_size))
        T, E, k = x2.shape[0], c.n_routed_experts, c.num_experts_per_tok
        rt = self.router_dtype
        x_router = x2 if rt == dt else x2.astype(np.float32)  # an fp32 router: x widened (exact)
        if "router" in exact:
            logits = _exact(ref.linear(x_router, w["mlp.gate.weight"]), rt)
        else:
            logits = getattr(linear, s["linear"])(x_router, w["mlp.gate.weight"], profile=profile)
        if c.scoring_func == "sigmoid":
            gw, ids = moe.sigmoid_gating(logits, k, bias=w["mlp.gate.e_score_correction_bias"], n_group=c.n_group,
                                         topk_group=c.topk_group, group_score="top2_sum",
                                         renormalize=c.norm_topk_prob, routed_scaling_factor=c.routed_scaling_factor,
                                         profile=profile)
        else:
            gw, ids = moe.softmax_gating(logits, k, renormalize=c.norm_topk_prob,
                                         routed_scaling_factor=c.routed_scaling_factor, profile=profile)
        order = np.argsort(ids.reshape(-1), kind="stable")
        xs = embedding.gather(x2, (order // k).astype(np.int32), profile=profile)
        counts = np.bincount(ids.reshape(-1), minlength=E)
        self.last_tokens = counts
        outs, start = [], 0
        for e in range(E):
            n = int(counts[e])
            if n:
                rows = xs[start:start + n]
                p = f"mlp.experts.{e}."
                if "experts" in exact:
                    outs.append(_exact(ref.mlp(rows, w[p + "gate_proj.weight"], w[p + "up_proj.weight"],
                                               w[p + "down_proj.weight"]), dt))
                else:
                    outs.append(self._mlp(rows, p, s, profile))
                if not self.keep:
                    w.forget(p)
                start += n
        cols = [gw]
        if c.n_shared_experts:
            p = "mlp.shared_experts."
            if "experts" in exact:
                outs.append(_exact(ref.mlp(x2, w[p + "gate_proj.weight"], w[p + "up_proj.weight"],
                                           w[p + "down_proj.weight"]), dt))
            else:
                outs.append(self._mlp(x2, p, s, profile))
            cols.append(np.ones((T, 1), np.float32))
        ys = np.concatenate(outs)  # host: the experts' rows in expert order (+ the shared rows)
        pos = np.empty(T * k, np.int64)
        pos[order] = np.arange(T * k)
        index = pos.reshape(T, k)
        if c.n_shared_experts:
            index = np.concatenate([index, T * k + np.arange(T)[:, None]], axis=1)
        collected = embedding.gather(ys, index.astype(np.int32), profile=profile)
        out = moe.combine(collected, np.ascontiguousarray(np.concatenate(cols, axis=1)), profile=profile)
        return out.reshape(lead + (c.hidden_size,))

    @functools.partial(torch_aware, where="MoeBlock.reference", main="x")
    def reference(self, x):
        c = self.config
        return ref.moe_block(c, self.weights, np.asarray(x).reshape(-1, c.hidden_size),
                             forget=not self.keep).reshape(np.shape(x))

    def plan(self, phase="decode", batch=1, context=4096, dtype="bf16", strategies=None, profile=None,
             expert_tokens=None):
        """The block's plan (an fp32 router weight plans an fp32 router)."""
        router = "fp32" if self.router_dtype == "fp32" else None
        return plan_moe(self.config, phase, batch, context, dtype, strategies, profile, expert_tokens, router)


def plan_moe(config, phase="decode", batch=1, context=4096, dtype="bf16", strategies=None, profile=None,
             expert_tokens=None, router_dtype=None) -> LayerPlan:
    """The MoE block's plan for ``T = batch`` (decode) or ``batch * context`` (prefill) tokens.
    ``router_dtype``: the router linear's and the gating's dtype (None: ``dtype``; "fp32": the
    router kept in fp32)."""
    c = resolve(config)
    s = choose(strategies, MOE_CHOICES, MOE_PICKS)
    dt = dtypes.storage_name(dtype)
    if dt is None or phase not in ("decode", "prefill"):
        raise ConfigError(f"plan: dtype {dtype!r} / phase {phase!r}: a storage dtype and 'decode' or 'prefill'")
    rt = dt if router_dtype is None else dtypes.storage_name(router_dtype)
    if rt not in (dt, "fp32"):
        raise ConfigError(f"plan: router_dtype {router_dtype!r}; the storage dtype {dt} or fp32")
    T = int(batch) * (1 if phase == "decode" else int(context))
    H, E, k, I = c.hidden_size, c.n_routed_experts, c.num_experts_per_tok, c.moe_intermediate_size
    tokens = balanced_tokens(T, k, E) if expert_tokens is None else np.asarray(expert_tokens, np.int64)
    if tokens.shape != (E,) or tokens.sum() != T * k:
        raise ConfigError(f"plan: expert_tokens must be [{E}] counts summing to T*k = {T * k}")
    kw = {"profile": profile}
    lin = getattr(linear, f"plan_{s['linear']}")
    steps = []

    def add(name, op, strategy, plan=None, note=""):
        steps.append(Step(name, op, strategy, plan, note))

    def mlp(name, m, inter):
        if s["swiglu"] == "epilogue":
            add(name, "swiglu", "epilogue", swiglu.plan_epilogue((m, H), (inter, H), dt, **kw))
        else:
            add(name, "linear", s["linear"], lin((m, H), (2 * inter, H), dt, bias=False, **kw))
            add(name, "swiglu", s["swiglu"], getattr(swiglu, f"plan_{s['swiglu']}")((m, inter), dt, **kw))
        add(name, "linear", s["linear"], lin((m, inter), (H, inter), dt, bias=False, **kw))

    add("router", "linear", s["linear"], lin((T, H), (E, H), rt, bias=False, **kw),
        "" if rt == dt else "x is widened to fp32 on the host")
    if c.scoring_func == "sigmoid":
        add("gating", "moe", "sigmoid_gating",
            moe.plan_sigmoid_gating((T, E), rt, top_k=k, bias_dtype="fp32", n_group=c.n_group,
                                    topk_group=c.topk_group, group_score="top2_sum", renormalize=c.norm_topk_prob,
                                    **kw))
    else:
        add("gating", "moe", "softmax_gating",
            moe.plan_softmax_gating((T, E), rt, top_k=k, renormalize=c.norm_topk_prob, **kw))
    add("dispatch", "embedding", "gather", embedding.plan_gather((T, H), (T * k,), dt, "int32", **kw))
    for n in tokens:
        if n:
            mlp("experts", int(n), I)
    width = k
    if c.n_shared_experts:
        mlp("shared", T, I * c.n_shared_experts)
        width += 1
    rows = T * k + (T if c.n_shared_experts else 0)
    add("collect", "embedding", "gather", embedding.plan_gather((rows, H), (T, width), dt, "int32", **kw),
        "the expert outputs are concatenated on the host before this gather")
    add("combine", "moe", "combine", moe.plan_combine((T, width, H), dt, weights_dtype="fp32", **kw))
    return LayerPlan(layer=(c.name or "moe") + " moe", phase=phase, batch=int(batch), context=int(context), dtype=dt,
                     strategies=s, steps=tuple(steps), profile=profile)
