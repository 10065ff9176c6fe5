"""Layer configs (named, HF dicts, bad fields) and weights (generated, dict, safetensors)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from pypto_numba import PyptoNumbaError, layers
from pypto_numba.errors import ConfigError, DTypeError, ShapeError
from pypto_numba.layers import weights as lw
from pypto_numba.machine import dtypes

SMALL = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96)


def test_named_configs_hold_the_public_hf_values():
    c = layers.config("qwen3-14b")
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size) == (
        5120, 40, 8, 128, 17408)  # npu-facts 8.4
    c = layers.config("qwen3-1.7b")
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.rope_theta) == (
        2048, 16, 8, 6144, 1e6)
    d = layers.config("deepseek-v3")
    assert (d.n_routed_experts, d.num_experts_per_tok, d.n_group, d.topk_group, d.moe_intermediate_size,
            d.routed_scaling_factor, d.n_shared_experts) == (256, 8, 8, 4, 2048, 2.5, 1)


def test_overrides_and_hf_dict():
    c = layers.config("qwen3-1.7b", **SMALL, my_field=3)
    assert c.hidden_size == 64 and c.extra["my_field"] == 3 and c.rms_norm_eps == 1e-6
    h = layers.config_from_hf({"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96,
                               "rope_theta": 5e5, "torch_dtype": "bfloat16"})
    assert h.head_dim == 16 and h.num_key_value_heads == 4 and h.extra["torch_dtype"] == "bfloat16"


@pytest.mark.parametrize("name, overrides, field", [
    ("qwen3-1.7b", {"num_key_value_heads": 3}, "num_key_value_heads"),
    ("qwen3-1.7b", {"head_dim": 63}, "head_dim"),
    ("qwen3-1.7b", {"hidden_size": 0}, "hidden_size"),
    ("deepseek-v3", {"num_experts_per_tok": 300}, "num_experts_per_tok"),
    ("deepseek-v3", {"n_routed_experts": 12}, "n_group"),
    ("deepseek-v3", {"topk_group": 9}, "topk_group"),
    ("deepseek-v3", {"n_routed_experts": 16, "topk_group": 1}, "num_experts_per_tok"),
])
def test_bad_config_names_the_field(name, overrides, field):
    with pytest.raises(ConfigError, match=field) as e:
        layers.config(name, **overrides)
    assert isinstance(e.value, ValueError) and isinstance(e.value, PyptoNumbaError)


def test_hf_dict_without_head_dim_needs_divisible_heads():
    with pytest.raises(ConfigError, match="head_dim is not given.*hidden_size=100.*num_attention_heads=3"):
        layers.config_from_hf({"hidden_size": 100, "num_attention_heads": 3, "intermediate_size": 64})
    with pytest.raises(ConfigError, match="missing field 'intermediate_size'"):
        layers.config_from_hf({"hidden_size": 96, "num_attention_heads": 3})


def test_unknown_name_suggests():
    with pytest.raises(ConfigError, match="qwen3-14b"):
        layers.config("qwen3-14")


def test_generated_weights_are_fan_in_scaled_and_reproducible():
    cfg = layers.config("qwen3-1.7b", **SMALL)
    a = layers.Qwen3Layer(cfg, seed=3, dtype="bf16")
    b = layers.Qwen3Layer(cfg, seed=3, dtype="bf16")
    q = a["self_attn.q_proj.weight"]
    assert q.shape == (64, 64) and dtypes.storage_name(q.dtype) == "bf16"
    assert np.array_equal(q.view(np.uint16), b["self_attn.q_proj.weight"].view(np.uint16))
    d = a["mlp.down_proj.weight"].astype(np.float64)
    assert abs(d.std() * np.sqrt(96) - 1.0) < 0.1  # N(0, 1/fan_in)
    assert a["input_layernorm.weight"].dtype == np.float32  # norms stay fp32
    assert not np.array_equal(q, layers.Qwen3Layer(cfg, seed=3, layer=1)["self_attn.q_proj.weight"])


@pytest.mark.parametrize("dt", ["fp32", "bf16", "fp16"])
def test_safetensors_round_trip_is_bit_exact(tmp_path, dt, rng):
    arrays = {"a": dtypes.from_float32(rng.standard_normal((3, 5)), dt),
              "b.c": dtypes.from_float32(rng.standard_normal((7,)), dt)}
    path = tmp_path / "t.safetensors"
    lw.write_safetensors(path, arrays, metadata={"format": "pt"})
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    assert header["a"]["dtype"] == {"fp32": "F32", "bf16": "BF16", "fp16": "F16"}[dt]
    assert header["a"]["shape"] == [3, 5] and header["__metadata__"] == {"format": "pt"}
    back = lw.read_safetensors(path)
    for k, v in arrays.items():
        assert back[k].dtype == v.dtype and back[k].shape == v.shape
        assert np.array_equal(back[k].view(np.uint8), v.view(np.uint8))


def test_safetensors_reads_a_hand_made_file(tmp_path):
    """A file built byte by byte from the format (no writer involved): BF16 1.0, -2.0."""
    header = json.dumps({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "h.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<HH", 0x3F80, 0xC000))
    x = lw.read_safetensors(path)["x"]
    assert x.astype(np.float32).tolist() == [1.0, -2.0]


def _full_names(layer, index=0):
    return {lw.prefix(index) + n: layer[n] for n in layer.weights.shapes}


def test_layer_from_safetensors_equals_layer_from_dict(tmp_path):
    cfg = layers.config("qwen3-1.7b", **SMALL)
    gen = layers.Qwen3Layer(cfg, seed=1, dtype="fp16", layer=2)
    path = tmp_path / "layer.safetensors"
    lw.write_safetensors(path, _full_names(gen, 2))
    from_file = layers.Qwen3Layer(cfg, weights=str(path), dtype="fp16", layer=2)
    from_dict = layers.Qwen3Layer(cfg, weights=_full_names(gen, 2), dtype="fp16", layer=2)
    for n in gen.weights.shapes:
        assert np.array_equal(from_file[n], gen[n]) and np.array_equal(from_dict[n], gen[n])


def test_missing_key_names_it_and_close_matches(tmp_path):
    cfg = layers.config("qwen3-1.7b", **SMALL)
    names = _full_names(layers.Qwen3Layer(cfg, dtype="fp32"))
    names["model.layers.0.self_attn.k_prj.weight"] = names.pop("model.layers.0.self_attn.k_proj.weight")
    path = tmp_path / "bad.safetensors"
    lw.write_safetensors(path, names)
    with pytest.raises(KeyError, match=r"model\.layers\.0\.self_attn\.k_proj\.weight.*close matches.*k_prj"):
        layers.Qwen3Layer(cfg, weights=str(path), dtype="fp32")


def test_wrong_shape_or_dtype_names_the_parameter():
    cfg = layers.config("qwen3-1.7b", **SMALL)
    names = _full_names(layers.Qwen3Layer(cfg, dtype="fp32"))
    bad = dict(names, **{"model.layers.0.mlp.up_proj.weight": np.zeros((95, 64), np.float32)})
    with pytest.raises(ShapeError, match=r"mlp\.up_proj\.weight has shape \(95, 64\).*\(96, 64\)"):
        layers.Qwen3Layer(cfg, weights=bad, dtype="fp32")
    bad = dict(names, **{"model.layers.0.self_attn.o_proj.weight": np.zeros((64, 64), np.float16)})
    with pytest.raises(DTypeError, match=r"o_proj\.weight has dtype float16.*fp32"):
        layers.Qwen3Layer(cfg, weights=bad, dtype="fp32")


def test_a_model_file_with_several_layers_reads_only_its_layer(tmp_path):
    cfg = layers.config("qwen3-1.7b", **SMALL)
    names = {}
    for i in range(3):
        names.update(_full_names(layers.Qwen3Layer(cfg, seed=i, dtype="bf16", layer=i), i))
    names["model.embed_tokens.weight"] = np.zeros((10, 64), np.float32)
    path = tmp_path / "model.safetensors"
    lw.write_safetensors(path, names)
    assert len(lw.safetensors_names(path)) == len(names)
    one = layers.Qwen3Layer(cfg, weights=path, dtype="bf16", layer=1)
    assert np.array_equal(one["mlp.down_proj.weight"].view(np.uint16),
                          names["model.layers.1.mlp.down_proj.weight"].view(np.uint16))
    assert set(lw.read_safetensors(path, names={"model.embed_tokens.weight"})) == {"model.embed_tokens.weight"}
