"""MoeBlock (DeepSeek-V3 routing, reduced expert count) against its float64 block; plan == counted."""

from __future__ import annotations

import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import layers
from pypto_numba.errors import ConfigError
from pypto_numba.machine import dtypes

CFG = layers.config("deepseek-v3", hidden_size=128, n_routed_experts=8, n_group=4, topk_group=2,
                    num_experts_per_tok=3, moe_intermediate_size=64)
REL_L2 = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 3e-3}


@pytest.mark.parametrize("dt", ["fp32", "bf16", "fp16"])
def test_moe_block_matches_float64(dt, rng):
    block = layers.MoeBlock(CFG, dtype=dt, seed=5)
    x = dtypes.from_float32(rng.standard_normal((2, 7, 128)), dt)
    with pn.trace() as t:
        out = block(x)
    assert out.shape == x.shape and dtypes.storage_name(out.dtype) == dt
    d = pn.precision.distribution(out, block.reference(x), dt)
    assert d.rel_l2 < REL_L2[dt], str(d)
    assert block.last_tokens.sum() == 14 * 3
    p = block.plan("prefill", batch=2, context=7, dtype=dt, expert_tokens=block.last_tokens)
    assert t.total == p.cost, t.total.differences(p.cost)


def test_moe_epilogue_strategy_plan_matches(rng):
    block = layers.MoeBlock(CFG, dtype="bf16")
    x = dtypes.from_float32(rng.standard_normal((4, 128)), "bf16")
    s = {"swiglu": "epilogue"}
    with pn.trace() as t:
        block(x, strategies=s)
    p = block.plan("decode", batch=4, dtype="bf16", strategies=s, expert_tokens=block.last_tokens)
    assert t.total == p.cost


def test_full_scale_deepseek_plan_without_weights():
    p = layers.plan_moe("deepseek-v3", "decode", batch=16, dtype="bf16")
    experts = [s for s in p.steps if s.name == "experts"]
    # balanced routing: 16 tokens x 8 picks over 256 experts -> 128 experts with one token, 3 calls each
    assert len(experts) == 128 * 3
    assert p.cost.kernels == sum(s.cost.kernels for s in p.steps)
    with pytest.raises(ConfigError, match="expert_tokens"):
        layers.plan_moe("deepseek-v3", expert_tokens=[1] * 256)


def test_a_dense_config_is_refused():
    with pytest.raises(ConfigError, match="n_routed_experts=0"):
        layers.MoeBlock("qwen3-1.7b")


def test_experts_generated_one_at_a_time_give_the_same_block(rng):
    x = dtypes.from_float32(rng.standard_normal((5, 128)), "bf16")
    kept = layers.MoeBlock(CFG, dtype="bf16", seed=9)
    lazy = layers.MoeBlock(CFG, dtype="bf16", seed=9, keep_bytes=0)
    assert kept.keep and not lazy.keep
    a, b = kept(x), lazy(x)
    assert np.array_equal(a.view(np.uint16), b.view(np.uint16))
    assert not any(n.startswith("mlp.experts.") for n in lazy.weights._arrays)
    np.testing.assert_array_equal(kept.reference(x), lazy.reference(x))
