"""The layers in float64, written directly in NumPy from their definitions (no op module is used).

Inputs are widened to float64 (bf16/fp16/fp32 values are exact there); nothing is rounded. These
functions are the ground truth of the layer tests, of ``precision`` at layer level, and the
"switched to float64" steps of the attribution study.
"""

from __future__ import annotations

import numpy as np


def f64(x):
    return np.asarray(x).astype(np.float64)


def rms_norm(x, weight, eps):
    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + float(eps)) * f64(weight)


def linear(x, weight):
    return f64(x) @ f64(weight).T


def cos_sin(positions, dim, theta):
    """HF tables in float64: ``cos(cat(f, f))``, ``f = p * theta**(-2i/dim)`` -> ``[..., dim]``."""
    inv = float(theta) ** (-np.arange(0, dim, 2, dtype=np.float64) / dim)
    f = np.asarray(positions, np.float64)[..., None] * inv
    f = np.concatenate([f, f], axis=-1)
    return np.cos(f), np.sin(f)


def rope(x, cos, sin):
    """Split-half RoPE of ``x[B, S, H, D]`` with ``cos, sin[B, S, D]``."""
    x = f64(x)
    half = x.shape[-1] // 2
    rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, :, None, :] + rot * sin[:, :, None, :]


def attention(q, k, v, kv_len):
    """``q[B, Hq, Sq, D]`` against ``k, v[B, Hkv, Skv, D]``, causal bottom-right, keys < kv_len[b]."""
    q, k, v = f64(q), f64(k), f64(v)
    B, Hq, Sq, D = q.shape
    G = Hq // k.shape[1]
    k, v = np.repeat(k, G, axis=1), np.repeat(v, G, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) / np.sqrt(D)
    j = np.arange(k.shape[2])
    lens = np.asarray(kv_len, np.int64)
    i_abs = np.arange(Sq)[None, :, None] + (lens[:, None, None] - Sq)
    keep = (j[None, None, :] <= i_abs) & (j[None, None, :] < lens[:, None, None])
    s = np.where(keep[:, None], s, -np.inf)
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhqk,bhkd->bhqd", p, v)


def silu_mul(gate, up):
    g = f64(gate)
    return g / (1.0 + np.exp(-g)) * f64(up)


def mlp(x, w_gate, w_up, w_down):
    return linear(silu_mul(linear(x, w_gate), linear(x, w_up)), w_down)


ROUNDED = ("input_norm", "qkv", "qk_norm_rope", "attention", "o_proj", "post_norm", "gate_up", "swiglu", "down",
           "residual")


def _rounder(dtype, steps):
    """``rnd(step, x)``: x rounded as the kernels store that step's output (the storage dtype; the
    residual in fp32) when ``step`` is in ``steps``, else x unchanged (float64)."""
    from ..machine import dtypes

    def rnd(step, x):
        if step not in steps:
            return x
        if step == "residual" or dtype == "fp32":
            return x.astype(np.float32).astype(np.float64)
        return dtypes.from_float32(x.astype(np.float32), dtype).astype(np.float64)

    return rnd


def qwen3_layer(cfg, w, hidden, positions, past_k=None, past_v=None, dtype="fp32", rounded=()):
    """One Qwen3 decoder layer in float64 -> ``(out [B, S, H], k, v [B, Hkv, P + S, D])``.

    ``w``: the layer's weights by HF name (``w["self_attn.q_proj.weight"]``); ``hidden[B, S, H]``;
    ``positions[B, S]``; ``past_k/past_v[B, Hkv, P, D]``: the cache before this call (P keys).
    ``rounded``: steps of :data:`ROUNDED` whose outputs are rounded to ``dtype`` (the residual to
    fp32), an emulation of where the kernels round; none by default (exact float64)."""
    B, S, H = np.shape(hidden)
    D, Hq, Hkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    eps = cfg.rms_norm_eps
    rnd = _rounder(dtype, set(rounded))
    r = f64(hidden)
    x = rnd("input_norm", rms_norm(r, w["input_layernorm.weight"], eps))
    q = rnd("qkv", linear(x, w["self_attn.q_proj.weight"])).reshape(B, S, Hq, D)
    k = rnd("qkv", linear(x, w["self_attn.k_proj.weight"])).reshape(B, S, Hkv, D)
    v = rnd("qkv", linear(x, w["self_attn.v_proj.weight"])).reshape(B, S, Hkv, D)
    cos, sin = cos_sin(positions, D, cfg.rope_theta)
    q = rnd("qk_norm_rope", rope(rms_norm(q, w["self_attn.q_norm.weight"], eps), cos, sin)).transpose(0, 2, 1, 3)
    k = rnd("qk_norm_rope", rope(rms_norm(k, w["self_attn.k_norm.weight"], eps), cos, sin)).transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    if past_k is not None:
        k = np.concatenate([f64(past_k), k], axis=2)
        v = np.concatenate([f64(past_v), v], axis=2)
    a = rnd("attention", attention(q, k, v, np.full(B, k.shape[2]))).transpose(0, 2, 1, 3).reshape(B, S, Hq * D)
    r = rnd("residual", r + rnd("o_proj", linear(a, w["self_attn.o_proj.weight"])))
    x = rnd("post_norm", rms_norm(r, w["post_attention_layernorm.weight"], eps))
    g = rnd("gate_up", linear(x, w["mlp.gate_proj.weight"]))
    u = rnd("gate_up", linear(x, w["mlp.up_proj.weight"]))
    d = rnd("down", linear(rnd("swiglu", silu_mul(g, u)), w["mlp.down_proj.weight"]))
    return rnd("residual", r + d), k, v


def moe_block(cfg, w, x, forget=False):
    """DeepSeek-V3's MoE block in float64 on ``x[T, H]`` (the normed hidden states) -> ``[T, H]``.

    Router: ``s = sigmoid(x @ gate^T)``, selection by ``s + bias``: groups scored by the sum of
    their top two, the ``topk_group`` best kept, then the top ``k`` experts; weights ``s`` of the
    picks over their sum (``norm_topk_prob``) times ``routed_scaling_factor``; plus the shared
    expert's MLP on every token."""
    x = f64(x)
    T = x.shape[0]
    E, k, g, kg = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    s = 1.0 / (1.0 + np.exp(-linear(x, w["mlp.gate.weight"])))
    sel = s + f64(w["mlp.gate.e_score_correction_bias"])
    out = np.zeros_like(x)
    picks = {}
    for t in range(T):
        groups = sel[t].reshape(g, E // g)
        score = np.sort(groups, axis=1)[:, -2:].sum(axis=1) if E // g >= 2 else groups[:, 0]
        keep_groups = np.argsort(-score, kind="stable")[:kg]
        masked = np.full(E, -np.inf)
        for gi in keep_groups:
            masked[gi * (E // g):(gi + 1) * (E // g)] = sel[t, gi * (E // g):(gi + 1) * (E // g)]
        ids = np.argsort(-masked, kind="stable")[:k]
        wt = s[t, ids]
        if cfg.norm_topk_prob:
            wt = wt / (wt.sum() + 1e-20)
        wt = wt * cfg.routed_scaling_factor
        picks[t] = list(zip(ids, wt))
    for e in range(E):  # expert by expert: each expert's weights are read (or generated) once
        rows = [(t, we) for t in range(T) for i, we in picks[t] if i == e]
        if rows:
            p = f"mlp.experts.{e}."
            y = mlp(x[[t for t, _ in rows]], w[p + "gate_proj.weight"], w[p + "up_proj.weight"],
                    w[p + "down_proj.weight"])
            for (t, we), yt in zip(rows, y):
                out[t] += we * yt
            if hasattr(w, "forget") and forget:
                w.forget(p)
    if cfg.n_shared_experts:
        p = "mlp.shared_experts."
        out += mlp(x, w[p + "gate_proj.weight"], w[p + "up_proj.weight"], w[p + "down_proj.weight"])
    return out
