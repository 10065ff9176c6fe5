"""Drift over stacked layers and the attribution of a layer's error to its steps."""

from __future__ import annotations

import numpy as np

from pypto_numba import layers, precision
from pypto_numba.layers import study
from pypto_numba.machine import dtypes

CFG = layers.config("qwen3-1.7b", hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                    intermediate_size=256)


def test_all_steps_exact_leaves_only_the_storage_roundings(rng):
    layer = layers.Qwen3Layer(CFG, dtype="fp32", seed=3)
    h = dtypes.from_float32(rng.standard_normal((1, 4, 128)), "fp32")
    r, d = layer.forward(h, exact=layers.qwen3.STEPS)
    assert precision.rel_l2(r + d, layer.reference(h)) < 1e-6


def test_attribution_rows_cover_every_step(rng):
    layer = layers.Qwen3Layer(CFG, dtype="bf16", seed=3)
    h = dtypes.from_float32(rng.standard_normal((1, 4, 128)), "bf16")
    a = study.attribution(layer, h)
    assert {row["step"] for row in a["rows"]} == set(layers.qwen3.STEPS)
    assert a["rows"][0]["removed"] >= a["rows"][-1]["removed"]
    assert 0 < a["rel_l2"] < 1e-2
    # removing a step's own rounding cannot make the layer worse by much: each stays near the base
    assert all(row["rel_l2"] < 1.5 * a["rel_l2"] for row in a["rows"])


def test_drift_over_depth_and_stack_against_float64(rng):
    seen = []
    rows = study.drift(CFG, depths=(1, 2, 4), dtype="bf16", tokens=3, progress=lambda i, n: seen.append((i, n)))
    assert [r["layers"] for r in rows] == [1, 2, 4]
    assert all(0 < r["rel_l2"] < 2e-2 and r["cosine"] > 0.999 for r in rows)
    assert seen[-1] == (4, 4)
