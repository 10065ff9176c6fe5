"""A Qwen3 layer and a MoE block in torch, written from the same math as :class:`Qwen3Layer` and
:class:`MoeBlock` (the layer policy's peer and the benchmarks' peer; torch is imported when
called, it is not a dependency).

Same rounding points as production: projections and attention in the storage dtype (torch's CPU
bf16/fp16 matmuls accumulate in fp32), norms, RoPE and SwiGLU in fp32 with one cast, the residual
in fp32."""

from __future__ import annotations

import numpy as np


def _t(torch, a):
    a = np.asarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


class TorchQwen3:
    """``TorchQwen3(layer)``: the torch peer of a :class:`Qwen3Layer` (its weights, its dtype)."""

    def __init__(self, layer, torch=None):
        if torch is None:
            import torch
        self.torch, self.layer = torch, layer
        self.w = {n: _t(torch, layer[n]) for n in layer.weights.shapes}
        self.w["gate_up"] = torch.cat([self.w["mlp.gate_proj.weight"], self.w["mlp.up_proj.weight"]])

    def _norm(self, x, w, dt):
        x = x.float()
        eps = self.layer.config.rms_norm_eps
        return (x * self.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(dt)

    def tables(self, positions):
        c = self.layer.config
        D = c.head_dim
        inv = 1.0 / (c.rope_theta ** (self.torch.arange(0, D, 2, dtype=self.torch.float64) / D))
        f = self.torch.as_tensor(positions, dtype=self.torch.float64)[..., None] * inv
        f = self.torch.cat([f, f], -1)
        return f.cos().float(), f.sin().float()

    def _rope(self, x, cos, sin, w, dt):
        x = self._norm(x, w, dt).float()
        half = x.shape[-1] // 2
        rot = self.torch.cat([-x[..., half:], x[..., :half]], -1)
        return (x * cos[:, :, None] + rot * sin[:, :, None]).to(dt)

    def __call__(self, hidden, positions=None, past_k=None, past_v=None, tables=None):
        """``hidden`` a numpy array or tensor ``[B, S, H]`` -> fp32 tensor ``[B, S, H]``."""
        torch, w, c = self.torch, self.w, self.layer.config
        F = torch.nn.functional
        h = hidden if isinstance(hidden, torch.Tensor) else _t(torch, hidden)
        dt = w["self_attn.q_proj.weight"].dtype
        B, S, H = h.shape
        D, Hq, Hkv = c.head_dim, c.num_attention_heads, c.num_key_value_heads
        P = 0 if past_k is None else past_k.shape[2]
        r = h.float()
        x = self._norm(h, w["input_layernorm.weight"], dt)
        q = F.linear(x, w["self_attn.q_proj.weight"]).view(B, S, Hq, D)
        k = F.linear(x, w["self_attn.k_proj.weight"]).view(B, S, Hkv, D)
        v = F.linear(x, w["self_attn.v_proj.weight"]).view(B, S, Hkv, D)
        if tables is None:
            tables = self.tables(P + np.broadcast_to(np.arange(S), (B, S)) if positions is None else positions)
        cos, sin = tables
        q = self._rope(q, cos, sin, w["self_attn.q_norm.weight"], dt).transpose(1, 2)
        k = self._rope(k, cos, sin, w["self_attn.k_norm.weight"], dt).transpose(1, 2)
        v = v.transpose(1, 2)
        if past_k is not None:
            k = torch.cat([past_k if isinstance(past_k, torch.Tensor) else _t(torch, past_k), k], 2)
            v = torch.cat([past_v if isinstance(past_v, torch.Tensor) else _t(torch, past_v), v], 2)
        keep = torch.arange(P + S)[None, :] <= (torch.arange(S)[:, None] + P)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, enable_gqa=Hq != Hkv)
        r = r + F.linear(a.transpose(1, 2).reshape(B, S, Hq * D), w["self_attn.o_proj.weight"]).float()
        x = self._norm(r, w["post_attention_layernorm.weight"], dt)
        g, u = F.linear(x, w["gate_up"]).float().chunk(2, -1)
        d = F.linear((F.silu(g) * u).to(dt), w["mlp.down_proj.weight"])
        return r + d.float()


class TorchMoe:
    """``TorchMoe(block)``: the torch peer of a sigmoid-scored :class:`MoeBlock` (its weights, its
    dtype), from the same math as ``reference.moe_block``. The router in its weight's dtype (an fp32
    router widens x, as HF's DeepSeek-V3 gate does), the experts as :class:`TorchQwen3`'s MLP, the
    weighted sum in fp32 with one cast to the storage dtype; ``last_tokens``: tokens per expert."""

    def __init__(self, block, torch=None):
        if torch is None:
            import torch
        self.torch, self.block = torch, block
        self.w = {n: _t(torch, block.weights[n]) for n in block.weights.shapes}

    def _mlp(self, x, p):
        F, w = self.torch.nn.functional, self.w
        g, u = F.linear(x, self.torch.cat([w[p + "gate_proj.weight"], w[p + "up_proj.weight"]])).float().chunk(2, -1)
        return F.linear((F.silu(g) * u).to(x.dtype), w[p + "down_proj.weight"])

    def __call__(self, x):
        """``x`` a numpy array or tensor ``[..., H]`` -> a tensor of x's shape in the storage dtype."""
        torch, w, c = self.torch, self.w, self.block.config
        x = x if isinstance(x, torch.Tensor) else _t(torch, x)
        lead, x = x.shape, x.reshape(-1, c.hidden_size)
        T, E, k, g, kg = x.shape[0], c.n_routed_experts, c.num_experts_per_tok, c.n_group, c.topk_group
        gate = w["mlp.gate.weight"]
        s = torch.nn.functional.linear(x.to(gate.dtype), gate).float().sigmoid()
        sel = (s + w["mlp.gate.e_score_correction_bias"]).view(T, g, E // g)
        score = sel.topk(2, -1).values.sum(-1) if E // g >= 2 else sel[..., 0]
        keep = torch.zeros(T, g, dtype=torch.bool).scatter_(1, score.topk(kg, -1).indices, True)
        ids = sel.masked_fill(~keep[..., None], float("-inf")).view(T, E).topk(k, -1).indices
        wt = s.gather(1, ids)
        if c.norm_topk_prob:
            wt = wt / (wt.sum(-1, keepdim=True) + 1e-20)
        wt = wt * c.routed_scaling_factor
        self.last_tokens = torch.bincount(ids.reshape(-1), minlength=E).numpy()
        out = torch.zeros(T, c.hidden_size)
        for e in range(E):
            t, j = (ids == e).nonzero(as_tuple=True)
            if len(t):
                out.index_add_(0, t, self._mlp(x[t], f"mlp.experts.{e}.").float() * wt[t, j, None])
        if c.n_shared_experts:
            out += self._mlp(x, "mlp.shared_experts.").float()
        return out.to(x.dtype).view(lead)
