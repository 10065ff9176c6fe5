"""The layer policy (issue 20): a layer's rel-L2 against float64 is at most 1.5x that of the torch
peer (the same math in torch, same dtype)."""

from __future__ import annotations

import numpy as np
import pytest

from pypto_numba import layers, precision
from pypto_numba.layers.torch_peer import TorchQwen3
from pypto_numba.machine import dtypes

pytestmark = pytest.mark.slow(on="3.11")  # heavy compiles: once per tox run (tests/conftest.py)

torch = pytest.importorskip("torch")
CFG = layers.config("qwen3-1.7b", hidden_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                    intermediate_size=512)


def test_torch_peer_is_the_same_layer_in_fp32(rng):
    layer = layers.Qwen3Layer(CFG, dtype="fp32", seed=7)
    h = dtypes.from_float32(rng.standard_normal((2, 5, 256)), "fp32")
    np.testing.assert_allclose(TorchQwen3(layer)(h).numpy(), layer.reference(h), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dt", ["bf16", "fp16"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_layer_error_is_within_1_5x_of_torch(dt, phase, rng):
    layer = layers.Qwen3Layer(CFG, dtype=dt, seed=8)
    B, C = 2, 9
    if phase == "prefill":
        h = dtypes.from_float32(rng.standard_normal((B, C, 256)), dt)
        ours, past = layer(h), (None, None)
    else:
        past = tuple(dtypes.from_float32(rng.standard_normal((B, 2, C - 1, 64)), dt) for _ in range(2))
        cache = layer.new_cache(B, C)
        cache.fill(*past)
        h = dtypes.from_float32(rng.standard_normal((B, 1, 256)), dt)
        ours = layer(h, cache=cache)
    expected = layer.reference(h, past_k=past[0], past_v=past[1])
    peer = TorchQwen3(layer)(h, past_k=past[0], past_v=past[1]).numpy()
    e_ours, e_peer = precision.rel_l2(ours, expected), precision.rel_l2(peer, expected)
    assert e_ours <= 1.5 * e_peer, (e_ours, e_peer)
