"""Model configs for the layers: by name, or from a dict of Hugging Face config.json fields.

``config("qwen3-1.7b", hidden_size=256, ...)`` returns a :class:`LayerConfig`; overrides use the
Hugging Face field names. ``config_from_hf(d)`` reads a config.json dict (unknown keys are kept in
``extra``). Every config is checked on creation: an inconsistent field raises :class:`ConfigError`
naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib

from ..errors import ConfigError

# Public Hugging Face config.json values (the fields the layers use):
#   Qwen/Qwen3-1.7B:  hidden 2048, 16 heads / 8 KV heads, head_dim 128, intermediate 6144,
#                     28 layers, rms_norm_eps 1e-6, rope_theta 1e6, vocab 151936,
#                     max_position_embeddings 40960 (huggingface.co/Qwen/Qwen3-1.7B/blob/main/config.json)
#   Qwen/Qwen3-14B:   hidden 5120, 40 heads / 8 KV heads, head_dim 128, intermediate 17408,
#                     40 layers, rms_norm_eps 1e-6, rope_theta 1e6, vocab 151936 (npu-facts 8.4 agrees)
#                     (huggingface.co/Qwen/Qwen3-14B/blob/main/config.json)
#   deepseek-ai/DeepSeek-V3: hidden 7168, intermediate 18432 (dense layers), moe_intermediate 2048,
#                     256 routed experts, 1 shared, 8 per token, n_group 8, topk_group 4,
#                     routed_scaling_factor 2.5, norm_topk_prob true, scoring sigmoid (noaux_tc),
#                     128 heads (MLA: q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v 128),
#                     61 layers (first 3 dense), rms_norm_eps 1e-6, rope_theta 10000, vocab 129280
#                     (huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json)
_NAMED = {
    "qwen3-1.7b": dict(
        model_type="qwen3", hidden_size=2048, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
        intermediate_size=6144, num_hidden_layers=28, rms_norm_eps=1e-6, rope_theta=1000000.0,
        vocab_size=151936, max_position_embeddings=40960),
    "qwen3-14b": dict(
        model_type="qwen3", hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
        intermediate_size=17408, num_hidden_layers=40, rms_norm_eps=1e-6, rope_theta=1000000.0,
        vocab_size=151936, max_position_embeddings=40960),
    "deepseek-v3": dict(
        model_type="deepseek_v3", hidden_size=7168, num_attention_heads=128, num_key_value_heads=128,
        head_dim=128, intermediate_size=18432, num_hidden_layers=61, rms_norm_eps=1e-6, rope_theta=10000.0,
        vocab_size=129280, max_position_embeddings=163840, n_routed_experts=256, n_shared_experts=1,
        num_experts_per_tok=8, n_group=8, topk_group=4, moe_intermediate_size=2048,
        routed_scaling_factor=2.5, norm_topk_prob=True, scoring_func="sigmoid",
        extra={"q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
               "v_head_dim": 128, "first_k_dense_replace": 3, "topk_method": "noaux_tc"}),
}
NAMES = tuple(_NAMED)


@dataclasses.dataclass(frozen=True)
class LayerConfig:
    """The fields of a decoder layer, under their Hugging Face names."""

    model_type: str
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    vocab_size: int = 0
    max_position_embeddings: int = 0
    # MoE (DeepSeek-V3 style); n_routed_experts 0 = a dense MLP
    n_routed_experts: int = 0
    n_shared_experts: int = 0
    num_experts_per_tok: int = 0
    n_group: int = 1
    topk_group: int = 1
    moe_intermediate_size: int = 0
    routed_scaling_factor: float = 1.0
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"
    name: str = ""
    extra: dict = dataclasses.field(default_factory=dict, compare=False)

    def __post_init__(self):
        _check(self)

    @property
    def kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    def replace(self, **overrides) -> "LayerConfig":
        return _build(dataclasses.asdict(self) | {"extra": dict(self.extra)}, overrides, self.name)


_FIELDS = {f.name for f in dataclasses.fields(LayerConfig)}
_INTS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
         "num_hidden_layers")


def _need_int(cfg, name, minimum):
    value = getattr(cfg, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"config {cfg.name or cfg.model_type!r}: {name} must be an integer >= {minimum}, "
                          f"got {value!r}")


def _check(cfg):
    who = f"config {cfg.name or cfg.model_type!r}"
    for name in _INTS:
        _need_int(cfg, name, 1)
    for name in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok", "moe_intermediate_size"):
        _need_int(cfg, name, 0)
    for name in ("n_group", "topk_group"):
        _need_int(cfg, name, 1)
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        raise ConfigError(f"{who}: num_attention_heads={cfg.num_attention_heads} is not a multiple of "
                          f"num_key_value_heads={cfg.num_key_value_heads} (GQA shares each KV head among "
                          f"a whole number of query heads)")
    if cfg.head_dim % 2:
        raise ConfigError(f"{who}: head_dim={cfg.head_dim} must be even (RoPE rotates pairs)")
    if not (isinstance(cfg.rms_norm_eps, (int, float)) and 0 <= cfg.rms_norm_eps < 1):
        raise ConfigError(f"{who}: rms_norm_eps must be a number in [0, 1), got {cfg.rms_norm_eps!r}")
    if not (isinstance(cfg.rope_theta, (int, float)) and cfg.rope_theta > 0):
        raise ConfigError(f"{who}: rope_theta must be a number > 0, got {cfg.rope_theta!r}")
    if not cfg.is_moe:
        return
    E, k, g, kg = cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group
    if cfg.moe_intermediate_size < 1:
        raise ConfigError(f"{who}: moe_intermediate_size must be >= 1 with n_routed_experts={E}")
    if k < 1 or k > E:
        raise ConfigError(f"{who}: num_experts_per_tok={k} must be in [1, n_routed_experts={E}]")
    if E % g:
        raise ConfigError(f"{who}: n_routed_experts={E} is not a multiple of n_group={g} (the groups are equal)")
    if kg > g:
        raise ConfigError(f"{who}: topk_group={kg} exceeds n_group={g}")
    if k > kg * (E // g):
        raise ConfigError(f"{who}: num_experts_per_tok={k} exceeds the experts of the topk_group={kg} best "
                          f"groups ({kg} x {E // g}); raise topk_group or lower num_experts_per_tok")
    if cfg.scoring_func not in ("sigmoid", "softmax"):
        raise ConfigError(f"{who}: scoring_func must be 'sigmoid' or 'softmax', got {cfg.scoring_func!r}")


def _build(base: dict, overrides: dict, name: str) -> LayerConfig:
    values = dict(base)
    extra = dict(values.pop("extra", {}) or {})
    for key, value in overrides.items():
        if key in _FIELDS and key != "extra":
            values[key] = value
        else:
            extra[key] = value
    values["name"] = name
    hidden, heads = values.get("hidden_size"), values.get("num_attention_heads")
    if values.get("head_dim") is None and isinstance(hidden, int) and isinstance(heads, int) and heads > 0:
        if hidden % heads:  # HF's default head_dim = hidden_size // num_attention_heads needs it exact
            raise ConfigError(f"config {name!r}: head_dim is not given and hidden_size={hidden} is not a multiple "
                              f"of num_attention_heads={heads}; give head_dim")
        values["head_dim"] = hidden // heads
    if values.get("num_key_value_heads") is None:
        values["num_key_value_heads"] = values.get("num_attention_heads")
    missing = [f for f in ("model_type",) + _INTS[:-1] if values.get(f) is None]
    if missing:
        raise ConfigError(f"config {name!r}: missing field {missing[0]!r} (Hugging Face config.json name)")
    return LayerConfig(**values, extra=extra)


def config(name: str, **overrides) -> LayerConfig:
    """The named config (``"qwen3-1.7b"``, ``"qwen3-14b"``, ``"deepseek-v3"``) with HF-named overrides.

    A reduced numerical run overrides sizes, e.g. ``config("deepseek-v3", n_routed_experts=16,
    hidden_size=512)``; plans use the full config."""
    key = str(name).lower()
    if key not in _NAMED:
        close = difflib.get_close_matches(key, NAMES, n=3)
        raise ConfigError(f"unknown model config {name!r}; known: {', '.join(NAMES)}"
                          + (f" (did you mean {close[0]!r}?)" if close else ""))
    base = dict(_NAMED[key])
    return _build(base, overrides, key)


def config_from_hf(fields: dict, name: str = "") -> LayerConfig:
    """A config from a Hugging Face config.json dict (unknown keys go to ``extra``)."""
    if not isinstance(fields, dict):
        raise ConfigError(f"config_from_hf takes a dict of config.json fields, got {type(fields).__name__}")
    fields = dict(fields)
    fields.setdefault("model_type", "qwen3")
    fields.setdefault("head_dim", None)
    fields.setdefault("num_key_value_heads", None)
    return _build({}, fields, name or str(fields.get("_name_or_path", fields["model_type"])))


def resolve(cfg) -> LayerConfig:
    """A LayerConfig from a config, a name or an HF dict."""
    if isinstance(cfg, LayerConfig):
        return cfg
    if isinstance(cfg, str):
        return config(cfg)
    if isinstance(cfg, dict):
        return config_from_hf(cfg)
    raise ConfigError(f"a layer config is a name ({', '.join(NAMES)}), a dict of Hugging Face fields or a "
                      f"LayerConfig, got {type(cfg).__name__}")
