"""Qwen3's decoder layer composed of op calls (no kernel of its own).

    r = hidden (fp32 residual stream)
    x = rmsnorm(r)                                   input_norm   rmsnorm.plain (fused_add when stacked)
    q, k, v = x @ Wq^T, x @ Wk^T, x @ Wv^T           qkv          linear (3 calls)
    q, k = rope(rmsnorm_head(q)), rope(rmsnorm_head(k))
                                                     qk_norm_rope rope.fused_rmsnorm | rmsnorm.plain + rope.standard
    cache <- k, v                                    kv_write     attention.write_kv (paged, a copy kernel)
    a = attention(q, cache)                          attention    attention.online | flash (paged, causal)
    o = a @ Wo^T                                     o_proj       linear
    x, r = rmsnorm(r + o)                            post_norm    rmsnorm.fused_add | host add + plain
    h = swiglu(x @ [Wg; Wu]^T)                       gate_up, swiglu  linear + swiglu.fused | separate,
                                                                      or swiglu.epilogue
    d = h @ Wd^T                                     down         linear
    out = r + d                                      (fp32; in a stack, fused into the next layer's input norm)

torch: ``hidden`` (and ``positions``, ``delta``) may be CPU torch tensors; the results are then
tensors sharing our outputs' memory, in our dtypes (the layer's output is the fp32 residual
stream), by :func:`pypto_numba.interop.torch_aware`'s rules. A ``torch.dtype`` works as ``dtype``.

Rounding: every op output is in the storage dtype, the residual in fp32 (production's carry,
npu-facts 8.4); RMSNorm weights are fp32, q_norm/k_norm's are cast to the storage dtype for
``rope.fused_rmsnorm`` (it takes x's dtype only). Attention reads q and writes its result in the
projections' ``[B, S, H, D]`` layout (``layout="bshd"``). Host steps (the residual adds of the
unfused ``plain`` strategy and the layer's last add) count no kernel: the plan lists none.

``strategies={"rmsnorm": "deferred"}`` (with ``linear="fused_bias"`` and a gate/up projection,
not ``swiglu="epilogue"``): each norm writes only its fp32 1/rms per row (``rmsnorm.deferred``) and
the projections after it (q/k/v, gate/up) apply it in their epilogue (``row_scale=``) with the
gamma folded into their weights once (:meth:`Qwen3Layer.folded`, ``rmsnorm.fold``), so the normed
rows never reach GM (npu-facts 8.4's ``inv_rms_states``); the residual adds run on the host.
"""

from __future__ import annotations

import functools

import numpy as np

from .. import attention, linear, rmsnorm, rope, swiglu
from ..errors import ConfigError, ShapeError
from ..interop import torch_aware
from ..machine import dtypes
from ..strategy import SEED
from . import reference as ref
from .config import resolve
from .plan import LayerPlan, Step
from .weights import attention_shapes, layer_weights, mlp_shapes

# step -> (op, the choices): the keys of ``strategies=``
CHOICES = {
    "rmsnorm": ("rmsnorm", ("fused_add", "plain", "deferred")),
    "rope": ("rope", ("fused_rmsnorm", "standard")),
    "attention": ("attention", ("online", "flash")),
    "linear": ("linear", ("fused_bias", "matmul_add")),
    "swiglu": ("swiglu", ("fused", "separate", "epilogue")),
}
# the seed's picks where a layer sits: rmsnorm's and rope's seeds name the fused form for a norm
# with a residual add before it / a norm next to the RoPE (lab specs' Seed criteria)
SEED_PICKS = {"rmsnorm": SEED["rmsnorm"][1], "rope": SEED["rope"][1], "attention": SEED["attention"][0],
              "linear": SEED["linear"][0], "swiglu": SEED["swiglu"][0]}
STEPS = ("input_norm", "qkv", "qk_norm_rope", "attention", "o_proj", "post_norm", "gate_up", "swiglu", "down")


def _check_deferred(s):
    """``rmsnorm="deferred"`` hands each norm's 1/rms to the next projection's epilogue: that needs
    ``linear.fused_bias`` (``row_scale=``) and a separate gate/up projection."""
    if s["rmsnorm"] != "deferred":
        return
    if s["linear"] != "fused_bias":
        raise ConfigError("strategies: rmsnorm 'deferred' applies its scale in linear.fused_bias's epilogue "
                          f"(row_scale=); linear {s['linear']!r} has none: use linear 'fused_bias'")
    if s["swiglu"] == "epilogue":
        raise ConfigError("strategies: rmsnorm 'deferred' needs a gate/up projection with row_scale=; swiglu "
                          "'epilogue' has none: use swiglu 'fused' or 'separate'")


def choose(strategies, choices=CHOICES, picks=SEED_PICKS) -> dict:
    out = dict(picks)
    for key, value in (strategies or {}).items():
        if key not in choices:
            raise ConfigError(f"strategies: unknown step {key!r}; the layer's steps: {', '.join(choices)}")
        if value not in choices[key][1]:
            raise ConfigError(f"strategies[{key!r}] = {value!r}; choices: {', '.join(choices[key][1])}")
        out[key] = value
    return out


def block_size(context: int) -> int:
    """Paged-cache page: 128 tokens (npu-facts 8.4), smaller (a multiple of 16) for short contexts."""
    return min(128, max(16, -(-int(context) // 16) * 16))


class KVCache:
    """The layer's paged KV cache (vLLM layout, attention/paged.py): ``k, v[num_blocks, block_size,
    Hkv, D]``, ``table[B, pages]`` (sequence b owns pages ``b*pages ..``), ``lens[B]`` tokens held."""

    def __init__(self, batch, context, kv_heads, head_dim, dtype):
        self.batch, self.context, self.dtype = int(batch), int(context), dtypes.storage_name(dtype)
        if self.dtype is None:
            raise ConfigError(f"new_cache: dtype {dtype!r} is not a storage dtype (fp32, bf16, fp16)")
        self.block_size = block_size(context)
        pages = -(-self.context // self.block_size)
        shape = (self.batch * pages, self.block_size, kv_heads, head_dim)
        self.k = np.zeros(shape, dtypes.STORAGE[self.dtype])
        self.v = np.zeros(shape, dtypes.STORAGE[self.dtype])
        self.table = np.arange(self.batch * pages, dtype=np.int32).reshape(self.batch, pages)
        self.lens = np.zeros(self.batch, np.int64)

    def slots(self, positions):
        """Slot of each (b, position): ``table[b, p // bs] * bs + p % bs`` -> int64 ``[B*S]``."""
        bs = self.block_size
        b = np.arange(self.batch)[:, None]
        return (self.table[b, positions // bs].astype(np.int64) * bs + positions % bs).reshape(-1)

    def dense(self, b_len=None):
        """``(k, v)[B, Hkv, L, D]`` of the first ``L = max(lens)`` tokens (for references)."""
        L = int(self.lens.max()) if b_len is None else int(b_len)
        pos = np.broadcast_to(np.arange(L), (self.batch, L))
        s = self.slots(pos).reshape(self.batch, L)
        flat_k = self.k.reshape(-1, *self.k.shape[2:])
        flat_v = self.v.reshape(-1, *self.v.shape[2:])
        return flat_k[s].transpose(0, 2, 1, 3), flat_v[s].transpose(0, 2, 1, 3)

    @functools.partial(torch_aware, where="KVCache.fill", main="k")
    def fill(self, k, v):
        """Write ``k, v[B, Hkv, L, D]`` as the first L tokens of every sequence."""
        B, Hkv, L, D = k.shape
        pos = np.broadcast_to(np.arange(L), (B, L))
        attention.write_kv(self.k, self.v, np.ascontiguousarray(k.transpose(0, 2, 1, 3)).reshape(B * L, Hkv, D),
                           np.ascontiguousarray(v.transpose(0, 2, 1, 3)).reshape(B * L, Hkv, D), self.slots(pos))
        self.lens[:] = L


def _cast(a, dt):
    return dtypes.from_float32(np.asarray(a, np.float32), dt)


def _exact(a64, dt):
    """A float64 result as its step would store it (fp32, then the storage dtype)."""
    return _cast(np.asarray(a64, np.float64).astype(np.float32), dt)


class Qwen3Layer:
    """``Qwen3Layer(config, weights=None, seed=0, dtype="bf16", layer=0)``: one decoder layer.

    ``weights``: None (generated from ``seed``), a dict of arrays or a safetensors path (HF names,
    ``model.layers.{layer}.`` prefix optional). ``layer(hidden[B, S, H], cache=, positions=,
    strategies=)`` runs it; ``layer.plan(...)`` plans it from shapes."""

    kind = "qwen3"

    @functools.partial(torch_aware, where="Qwen3Layer")  # a torch.dtype as dtype
    def __init__(self, config, weights=None, seed=0, dtype="bf16", layer=0):
        self.config = resolve(config)
        self.dtype = dtypes.storage_name(dtype)
        if self.dtype is None:
            raise ConfigError(f"Qwen3Layer: dtype {dtype!r} is not a storage dtype (fp32, bf16, fp16)")
        shapes = attention_shapes(self.config) | mlp_shapes(self.config)
        self.weights = layer_weights(self.config, shapes, self.dtype, weights, seed, layer)
        self.layer_index = layer
        self._gate_up = None
        self._folded = {}

    def folded(self, name, norm):
        """Projection ``name``'s weight with RMSNorm ``norm``'s gamma folded in (``rmsnorm.fold``),
        made once: what ``rmsnorm="deferred"`` projects with."""
        if (name, norm) not in self._folded:
            w = self.gate_up_weight() if name == "gate_up" else self.weights[name]
            self._folded[name, norm] = rmsnorm.fold(self.weights[norm], w)
        return self._folded[name, norm]

    def __getitem__(self, name):
        return self.weights[name]

    @functools.partial(torch_aware, where="Qwen3Layer.new_cache")
    def new_cache(self, batch, context, dtype=None):
        c = self.config
        return KVCache(batch, context, c.num_key_value_heads, c.head_dim, dtype or self.dtype)

    # --- numerical run ---

    @functools.partial(torch_aware, where="Qwen3Layer", main="hidden")
    def __call__(self, hidden, cache=None, positions=None, strategies=None, profile=None):
        r, d = self.forward(hidden, cache=cache, positions=positions, strategies=strategies, profile=profile)
        return r + d.astype(np.float32)

    @functools.partial(torch_aware, where="Qwen3Layer.forward", main="hidden")
    def forward(self, hidden, cache=None, positions=None, strategies=None, profile=None, delta=None, exact=()):
        """-> ``(r, d)``: the fp32 residual after attention and the MLP's output (storage dtype);
        the layer's output is ``r + d``. ``delta``: the previous layer's ``d`` (``hidden`` is then
        its ``r``; the input norm adds them). ``exact``: step names computed in float64 instead."""
        c, dt, w = self.config, self.dtype, self.weights
        s = choose(strategies)
        _check_deferred(s)
        deferred = s["rmsnorm"] == "deferred"
        bad = set(exact) - set(STEPS)
        if bad:
            raise ConfigError(f"exact: unknown steps {sorted(bad)}; the steps: {', '.join(STEPS)}")
        hidden = np.asarray(hidden)
        if hidden.ndim != 3 or hidden.shape[-1] != c.hidden_size:
            raise ShapeError(f"Qwen3Layer: hidden must be [B, S, hidden_size={c.hidden_size}], got {hidden.shape}")
        B, S, H = hidden.shape
        D, Hq, Hkv, eps = c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.rms_norm_eps
        if cache is None:
            cache = self.new_cache(B, S)
        if cache.batch != B or cache.dtype != dt:
            raise ShapeError(f"Qwen3Layer: cache is for batch {cache.batch} {cache.dtype}, hidden {hidden.shape} {dt}")
        if positions is None:
            positions = cache.lens[:, None] + np.arange(S)[None, :]
        positions = np.asarray(positions, np.int64).reshape(B, S)
        if (positions.max(axis=1) + 1 > cache.context).any():
            raise ShapeError(f"Qwen3Layer: positions up to {int(positions.max())} do not fit the cache's "
                             f"context of {cache.context} tokens; make it with new_cache(batch, context)")
        kw = {"profile": profile}
        lin = getattr(linear, s["linear"])

        def project(step, x, name):
            if step in exact:
                return _exact(ref.linear(x, w[name]), dt)
            return lin(x, w[name], profile=profile)

        def normed(step, src, scale, norm, name):
            """The projection ``name`` of RMSNorm ``norm`` of ``src``: with ``scale`` (deferred),
            the folded weight and the row scale in the epilogue; else ``src`` is the normed x."""
            if scale is None:
                return project(step, src, name)
            if step in exact:
                return _exact(ref.linear(ref.rms_norm(src, w[norm], eps), self.weights_of(name)), dt)
            return linear.fused_bias(src, self.folded(name, norm), row_scale=scale, profile=profile)

        # input norm (with the previous layer's residual add when stacked)
        w_in = w["input_layernorm.weight"]
        scale = None
        if deferred and "input_norm" not in exact:  # only the 1/rms: the projections apply it
            if delta is None:
                r = hidden.astype(np.float32)
                x = hidden if dtypes.storage_name(hidden.dtype) == dt else _cast(hidden, dt)
            else:
                r = hidden.astype(np.float32) + delta.astype(np.float32)
                x = _cast(r, dt)
            scale = rmsnorm.deferred(x, eps, **kw)
        elif delta is None:
            r = hidden.astype(np.float32)
            x_in = hidden if dtypes.storage_name(hidden.dtype) == dt else _cast(hidden, dt)
            if "input_norm" in exact:
                x = _exact(ref.rms_norm(x_in, w_in, eps), dt)
            else:
                x = rmsnorm.plain(x_in, w_in, eps, **kw)
        elif "input_norm" in exact:
            r = (hidden.astype(np.float32) + delta.astype(np.float32))
            x = _exact(ref.rms_norm(r, w_in, eps), dt)
        elif s["rmsnorm"] == "fused_add":
            x, r = rmsnorm.fused_add(delta, hidden.astype(np.float32), w_in, eps, **kw)
        else:
            r = hidden.astype(np.float32) + delta.astype(np.float32)
            x = rmsnorm.plain(_cast(r, dt), w_in, eps, **kw)
        # projections, q/k norm + RoPE
        q = normed("qkv", x, scale, "input_layernorm.weight", "self_attn.q_proj.weight").reshape(B, S, Hq, D)
        k = normed("qkv", x, scale, "input_layernorm.weight", "self_attn.k_proj.weight").reshape(B, S, Hkv, D)
        v = normed("qkv", x, scale, "input_layernorm.weight", "self_attn.v_proj.weight").reshape(B, S, Hkv, D)
        qn, kn = w["self_attn.q_norm.weight"], w["self_attn.k_norm.weight"]
        if "qk_norm_rope" in exact:
            cos64, sin64 = ref.cos_sin(positions, D, c.rope_theta)
            q = _exact(ref.rope(ref.rms_norm(q, qn, eps), cos64, sin64), dt)
            k = _exact(ref.rope(ref.rms_norm(k, kn, eps), cos64, sin64), dt)
        else:
            cos, sin = rope.cos_sin(positions, D, c.rope_theta, dtypes.STORAGE[dt], profile=profile)
            if s["rope"] == "fused_rmsnorm":
                q = rope.fused_rmsnorm(q, qn.astype(q.dtype), cos, sin, eps, **kw)
                k = rope.fused_rmsnorm(k, kn.astype(k.dtype), cos, sin, eps, **kw)
            else:
                q = rope.standard(rmsnorm.plain(q, qn, eps, **kw), cos, sin, **kw)
                k = rope.standard(rmsnorm.plain(k, kn, eps, **kw), cos, sin, **kw)
        # cache write, attention
        attention.write_kv(cache.k, cache.v, k.reshape(B * S, Hkv, D), v.reshape(B * S, Hkv, D),
                           cache.slots(positions), **kw)
        lens = np.maximum(cache.lens, positions.max(axis=1) + 1)
        if "attention" in exact:
            kd, vd = cache.dense(int(lens.max()))
            a = _exact(ref.attention(q.transpose(0, 2, 1, 3), kd, vd, lens).transpose(0, 2, 1, 3), dt)
        else:  # q and the result in the projections' [B, S, H, D] layout: no host transpose
            a = getattr(attention, s["attention"])(q, cache.k, cache.v, block_table=cache.table, kv_len=lens,
                                                   causal=True, layout="bshd", **kw)
        cache.lens[:] = lens
        a = a.reshape(B, S, Hq * D)
        o = project("o_proj", a, "self_attn.o_proj.weight")
        # post-attention norm with the residual add
        w_post = w["post_attention_layernorm.weight"]
        scale = None
        if deferred and "post_norm" not in exact:
            r = r + o.astype(np.float32)
            x = _cast(r, dt)
            scale = rmsnorm.deferred(x, eps, **kw)
        elif "post_norm" in exact:
            r = r + o.astype(np.float32)
            x = _exact(ref.rms_norm(r, w_post, eps), dt)
        elif s["rmsnorm"] == "fused_add":
            x, r = rmsnorm.fused_add(o, r, w_post, eps, **kw)
        else:
            r = r + o.astype(np.float32)
            x = rmsnorm.plain(_cast(r, dt), w_post, eps, **kw)
        # MLP
        wg, wu = w["mlp.gate_proj.weight"], w["mlp.up_proj.weight"]
        if s["swiglu"] == "epilogue" and not {"gate_up", "swiglu"} & set(exact):
            h = swiglu.epilogue(x, wg, wu, **kw)
        else:
            I = c.intermediate_size
            if scale is not None:
                gu = normed("gate_up", x, scale, "post_attention_layernorm.weight", "gate_up")
            elif "gate_up" in exact:
                gu = _exact(ref.linear(x, np.concatenate([wg, wu])), dt)
            else:
                gu = lin(x, self.gate_up_weight(), profile=profile)
            if "swiglu" in exact:
                h = _exact(ref.silu_mul(gu[..., :I], gu[..., I:]), dt)
            else:
                h = getattr(swiglu, "separate" if s["swiglu"] == "separate" else "fused")(gu, **kw)
        d = project("down", h, "mlp.down_proj.weight")
        return r, d

    def weights_of(self, name):
        return self.gate_up_weight() if name == "gate_up" else self.weights[name]

    def gate_up_weight(self):
        """``[Wg; Wu]`` ``[2I, H]`` (one projection feeds swiglu's ``[..., 2I]`` input), made once."""
        if self._gate_up is None:
            self._gate_up = np.concatenate([self.weights["mlp.gate_proj.weight"], self.weights["mlp.up_proj.weight"]])
        return self._gate_up

    @functools.partial(torch_aware, where="Qwen3Layer.reference", main="hidden")
    def reference(self, hidden, positions=None, past_k=None, past_v=None):
        """The float64 layer (layers/reference.py) on the same weights."""
        B, S, _ = np.shape(hidden)
        P = 0 if past_k is None else past_k.shape[2]
        if positions is None:
            positions = P + np.broadcast_to(np.arange(S), (B, S))
        return ref.qwen3_layer(self.config, self.weights, hidden, positions, past_k, past_v)[0]

    # --- plan ---

    def plan(self, phase="decode", batch=1, context=4096, dtype="bf16", strategies=None, profile=None, stacked=True):
        return plan_qwen3(self.config, phase, batch, context, dtype, strategies, profile, stacked)


def plan_qwen3(config, phase="decode", batch=1, context=4096, dtype="bf16", strategies=None, profile=None,
               stacked=True) -> LayerPlan:
    """The plan of one Qwen3 layer: ``decode`` = one new token per sequence against ``context``
    tokens (the new one included), ``prefill`` = ``context`` tokens from an empty cache.
    ``stacked``: the input norm is ``fused_add`` with the previous layer's add (a layer inside a
    stack); ``False``: the first layer's ``plain`` on its storage-dtype input."""
    c = resolve(config)
    s = choose(strategies)
    _check_deferred(s)
    deferred = s["rmsnorm"] == "deferred"
    dt = dtypes.storage_name(dtype)
    if dt is None:
        raise ConfigError(f"plan: dtype {dtype!r} is not a storage dtype (fp32, bf16, fp16)")
    if phase not in ("decode", "prefill"):
        raise ConfigError(f"plan: phase must be 'decode' or 'prefill', got {phase!r}")
    B, C = int(batch), int(context)
    S = 1 if phase == "decode" else C
    H, D, Hq, Hkv, I = c.hidden_size, c.head_dim, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size
    kw = {"profile": profile}
    steps = []
    lin = getattr(linear, f"plan_{s['linear']}")

    def add(name, op, strategy, plan=None, note=""):
        steps.append(Step(name, op, strategy, plan, note))

    def project(name, m_shape, n, k, scaled=False):
        extra = {"row_scale": True} if scaled else {}  # deferred: the norm's 1/rms in the epilogue
        add(name, "linear", s["linear"], lin(m_shape + (k,), (n, k), dt, bias=False, **kw, **extra))

    host_add = "the unfused residual add runs on the host (no add op): plain's rows price the norm only"
    x_shape = (B, S, H)
    fold_note = "the gamma folded into the projections' weights; the projections apply the 1/rms"
    if deferred:
        add("input_norm", "rmsnorm", "deferred", rmsnorm.plan_deferred(x_shape, dt, **kw),
            fold_note + ("; " + host_add if stacked else ""))
    elif not stacked:
        add("input_norm", "rmsnorm", "plain", rmsnorm.plan_plain(x_shape, dt, weight_dtype="fp32", **kw))
    elif s["rmsnorm"] == "fused_add":
        add("input_norm", "rmsnorm", "fused_add",
            rmsnorm.plan_fused_add(x_shape, dt, residual_dtype="fp32", weight_dtype="fp32", **kw))
    else:
        add("input_norm", "rmsnorm", "plain", rmsnorm.plan_plain(x_shape, dt, weight_dtype="fp32", **kw), host_add)
    for n in (Hq * D, Hkv * D, Hkv * D):
        project("qkv", (B, S), n, H, deferred)
    add("qk_norm_rope", "rope", "cos_sin", rope.plan_cos_sin((B, S), D, dt, **kw))
    for heads in (Hq, Hkv):
        if s["rope"] == "fused_rmsnorm":
            add("qk_norm_rope", "rope", "fused_rmsnorm", rope.plan_fused_rmsnorm((B, S, heads, D), (B, S, D), dt, **kw))
        else:
            add("qk_norm_rope", "rmsnorm", "plain", rmsnorm.plan_plain((B, S, heads, D), dt, weight_dtype="fp32", **kw))
            add("qk_norm_rope", "rope", "standard", rope.plan_standard((B, S, heads, D), (B, S, D), dt, **kw))
    bs = block_size(C)
    pages = -(-C // bs)
    add("kv_write", "attention", "write_kv",
        attention.plan_write_kv((B * S, Hkv, D), (B * pages, bs, Hkv, D), dt, **kw))
    opts = dict(kv_tile=None, q_tile=None, causal=True, has_mask=False, window=None, softcap=None, has_sinks=False)
    opts.update(dict(num_splits=None, return_lse=False) if s["attention"] == "flash" else dict(pv="storage"))
    add("attention", "attention", s["attention"],
        attention.plan_paged(s["attention"], (B, Hq, S, D), (B * pages, bs, Hkv, D), (B, pages), None, dt,
                             kv_len=[C] * B, **kw, **opts))
    project("o_proj", (B, S), H, Hq * D)
    if deferred:
        add("post_norm", "rmsnorm", "deferred", rmsnorm.plan_deferred(x_shape, dt, **kw), fold_note + "; " + host_add)
    elif s["rmsnorm"] == "fused_add":
        add("post_norm", "rmsnorm", "fused_add",
            rmsnorm.plan_fused_add(x_shape, dt, residual_dtype="fp32", weight_dtype="fp32", **kw))
    else:
        add("post_norm", "rmsnorm", "plain", rmsnorm.plan_plain(x_shape, dt, weight_dtype="fp32", **kw), host_add)
    if s["swiglu"] == "epilogue":
        add("gate_up+swiglu", "swiglu", "epilogue", swiglu.plan_epilogue((B, S, H), (I, H), dt, **kw))
    else:
        project("gate_up", (B, S), 2 * I, H, deferred)
        add("swiglu", "swiglu", s["swiglu"], getattr(swiglu, f"plan_{s['swiglu']}")((B, S, I), dt, **kw))
    project("down", (B, S), H, I)
    return LayerPlan(layer=c.name or "qwen3", phase=phase, batch=B, context=C, dtype=dt, strategies=s,
                     steps=tuple(steps), profile=profile)
