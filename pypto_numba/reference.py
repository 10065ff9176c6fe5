"""Float64 NumPy oracles for every op: the ground truth that strategies are measured against.

Each oracle widens its float inputs to float64 (bf16/fp16 values are exact in float32 and
float64) and computes the op exactly as its formula in ../shared/API.md says, with no tiling and
no intermediate rounding. They are written for clarity, not speed.
"""

from __future__ import annotations

import numpy as np
from scipy import special


def f64(x) -> np.ndarray:
    """Widen a float32/float16/bfloat16 (or any numeric) array to float64."""
    return np.asarray(x).astype(np.float64)


# --- gelu -------------------------------------------------------------------------------------

def gelu_tanh(x) -> np.ndarray:
    """``0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))``, evaluated as ``x*sigmoid(2u)``.

    The two are equal (``(1 + tanh(u))/2 = sigmoid(2u)``); the sigmoid form does not cancel for
    x << 0, where ``1 + tanh(u)`` loses every digit even in float64 (x = -8: true -3.1e-21).
    """
    x = f64(x)
    u = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
    with np.errstate(invalid="ignore", over="ignore"):
        y = x * special.expit(2.0 * u)
    return np.where(x == -np.inf, 0.0, y)  # the limit at -inf


def gelu_erf(x) -> np.ndarray:
    """``0.5*x*(1 + erf(x/sqrt(2)))`` (exact GELU), evaluated as ``0.5*x*erfc(-x/sqrt(2))``."""
    x = f64(x)
    with np.errstate(invalid="ignore"):
        y = 0.5 * x * special.erfc(-x / np.sqrt(2.0))
    return np.where(x == -np.inf, 0.0, y)  # the limit at -inf


# --- mean -------------------------------------------------------------------------------------

def mean(x, dim: int = -1, keepdim: bool = False) -> np.ndarray:
    return f64(x).mean(axis=dim, keepdims=keepdim)


# --- rope / rmsnorm ---------------------------------------------------------------------------

def rmsnorm(x, weight, eps: float = 1e-6) -> np.ndarray:
    """``x * rsqrt(mean(x**2, -1) + eps) * weight``."""
    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(weight)


def _rope_tables(cos, sin):
    """cos/sin ``[..., S, R]`` -> broadcastable to ``x[..., S, H, R]``."""
    return f64(cos)[..., :, None, :], f64(sin)[..., :, None, :]


def rope_standard(x, cos, sin) -> np.ndarray:
    """Split-half (rotate_half) RoPE on the first R = cos.shape[-1] dims of ``x[..., S, H, D]``."""
    x = f64(x)
    c, s = _rope_tables(cos, sin)
    rot = c.shape[-1]
    half = rot // 2
    out = x.copy()
    x1, x2 = x[..., :half], x[..., half:rot]
    out[..., :rot] = x[..., :rot] * c + np.concatenate([-x2, x1], axis=-1) * s
    return out


def rope_interleaved(x, cos, sin) -> np.ndarray:
    """GPT-J pairs: ``out[2k] = x[2k]cos[2k] - x[2k+1]sin[2k]``, ``out[2k+1] = x[2k+1]cos[2k+1] + x[2k]sin[2k+1]``."""
    x = f64(x)
    c, s = _rope_tables(cos, sin)
    rot = c.shape[-1]
    out = x.copy()
    xe, xo = x[..., 0:rot:2], x[..., 1:rot:2]
    out[..., 0:rot:2] = xe * c[..., 0::2] - xo * s[..., 0::2]
    out[..., 1:rot:2] = xo * c[..., 1::2] + xe * s[..., 1::2]
    return out


def rope_fused_rmsnorm(x, weight, cos, sin, eps: float = 1e-6) -> np.ndarray:
    return rope_standard(rmsnorm(x, weight, eps), cos, sin)


def cos_sin(positions, rot_dim: int, theta: float = 10000.0):
    """HF tables: ``f[p, i] = positions[p] * theta**(-2i/rot_dim)``, ``cos(cat(f, f))``, ``sin(cat(f, f))``."""
    pos = np.asarray(positions, dtype=np.float64)
    inv = theta ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    f = pos[..., None] * inv
    emb = np.concatenate([f, f], axis=-1)
    return np.cos(emb), np.sin(emb)


# --- attention --------------------------------------------------------------------------------

def repeat_kv(kv, n_rep: int) -> np.ndarray:
    """``[B, Hkv, S, D] -> [B, Hkv*n_rep, S, D]``; output head h is input head h // n_rep."""
    return np.repeat(f64(kv), n_rep, axis=1)


def attention(q, k, v, scale=None, causal=False, kv_len=None, mask=None, return_lse=False):
    """Softmax attention with GQA, bottom-right causal alignment, kv_len and an additive mask.

    Fully masked query rows return zeros (and lse = -inf).
    """
    q, k, v = f64(q), f64(k), f64(v)
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    k, v = repeat_kv(k, Hq // Hkv), repeat_kv(v, Hq // Hkv)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if mask is not None:
        s = s + np.broadcast_to(f64(mask), s.shape)
    lens = np.full(B, Skv) if kv_len is None else np.asarray(kv_len).astype(np.int64)
    j = np.arange(Skv)
    allowed = j[None, :] < lens[:, None]  # [B, Skv]
    allowed = np.broadcast_to(allowed[:, None, None, :], s.shape)
    if causal:
        i = np.arange(Sq)
        limit = i[None, :, None] + (lens[:, None, None] - Sq)  # [B, Sq, 1]
        allowed = allowed & (j[None, None, :] <= limit)[:, None, :, :]
    s = np.where(allowed, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)  # NaN when an allowed score is NaN: the row is NaN
    dead = m == -np.inf  # no allowed key: zeros
    p = np.exp(s - np.where(dead, 0.0, m))
    p = np.where(allowed, p, 0.0)
    l = p.sum(axis=-1, keepdims=True)
    # keys past kv_len are ignored: whatever V holds there (NaN, inf) must not reach 0 * V
    v = np.where((j[None, :] < lens[:, None])[:, None, :, None], v, 0.0)
    out = np.einsum("bhqk,bhkd->bhqd", p / np.where(l > 0, l, 1.0), v)
    out = np.where((l > 0) | np.isnan(l), out, 0.0)
    if return_lse:
        with np.errstate(divide="ignore"):
            lse = np.where(l[..., 0] > 0, np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)) + np.where(dead[..., 0], 0.0, m[..., 0]), -np.inf)
            lse = np.where(np.isnan(l[..., 0]), np.nan, lse)
        return out, lse
    return out


# --- moe --------------------------------------------------------------------------------------

def _topk_desc(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest per row, descending, ties toward the lower index."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


def _moe_group_filter(sel, n_group, topk_group, group_score):
    """Selection scores with the experts outside the best ``topk_group`` groups set to -inf."""
    if n_group <= 1:
        return sel
    T, E = sel.shape
    g = sel.reshape(T, n_group, E // n_group)
    if group_score == "max":
        gs = g.max(axis=-1)
    else:
        gs = np.sort(g, axis=-1)[..., -2:].sum(axis=-1)
    keep = _topk_desc(gs, topk_group)
    eligible = np.zeros((T, n_group), dtype=bool)
    np.put_along_axis(eligible, keep, True, axis=-1)
    eligible = np.repeat(eligible, E // n_group, axis=-1)
    return np.where(eligible, sel, -np.inf)


def moe_sigmoid_gating(logits, top_k, bias=None, n_group=1, topk_group=1, group_score="max",
                       renormalize=True, routed_scaling_factor=1.0, eps=1e-20):
    """DeepSeek-V3 / GLM-4.5 routing. Returns (weights float64[T, k], ids int64[T, k])."""
    s = 1.0 / (1.0 + np.exp(-f64(logits)))
    sel = s + (f64(bias)[None, :] if bias is not None else 0.0)
    sel = _moe_group_filter(sel, n_group, topk_group, group_score)
    ids = _topk_desc(sel, top_k)
    w = np.take_along_axis(s, ids, axis=-1)
    if renormalize:
        w = w / (w.sum(axis=-1, keepdims=True) + eps)
    return w * routed_scaling_factor, ids


def moe_softmax_gating(logits, top_k, renormalize=False, routed_scaling_factor=1.0, n_group=1,
                       topk_group=1, group_score="max"):
    """Mixtral / Qwen-MoE routing. Returns (weights float64[T, k], ids int64[T, k]).

    ``n_group``/``topk_group``/``group_score``: the group filter of moe_sigmoid_gating applied to
    the probabilities (PyPTO's moe_gating_topk with norm_type softmax).
    """
    x = f64(logits)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ids = _topk_desc(_moe_group_filter(p, n_group, topk_group, group_score), top_k)
    w = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return w * routed_scaling_factor, ids


def moe_combine(expert_out, weights) -> np.ndarray:
    """``out[t, :] = sum_k weights[t, k] * expert_out[t, k, :]``."""
    return np.einsum("tkh,tk->th", f64(expert_out), f64(weights))


# --- linear / embedding -----------------------------------------------------------------------

def linear(x, weight, bias=None) -> np.ndarray:
    out = f64(x) @ f64(weight).T
    return out + f64(bias) if bias is not None else out


def embedding(weight, ids) -> np.ndarray:
    return f64(weight)[np.asarray(ids)]
