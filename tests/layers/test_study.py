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
    assert {row["step"] for row in a["rows"]} == set(layers.qwen3.STEPS) | {"residual"}
    # the emulation (float64 with the kernels' output roundings) reproduces the kernels' error
    assert 0.7 < a["emulated"] / a["rel_l2"] < 1.3 and 0 < a["rel_l2"] < 1e-2
    removed = [row["removed"] for row in a["rows"]]
    assert removed == sorted(removed, reverse=True) and removed[0] > 0
    # every bf16 rounding point matters: a step switched to float64 removes part of the error
    assert sum(row["share"] > 0.01 for row in a["rows"]) >= 5
    assert all("kernel_exact" in row for row in a["rows"] if row["step"] != "residual")


def test_emulated_reference_with_no_rounding_is_the_float64_layer(rng):
    layer = layers.Qwen3Layer(CFG, dtype="bf16", seed=3)
    h = dtypes.from_float32(rng.standard_normal((1, 4, 128)), "bf16")
    pos = np.arange(4)[None]
    exact = layers.reference.qwen3_layer(CFG, layer.weights, h, pos)[0]
    assert np.array_equal(exact, layer.reference(h))
    rounded = layers.reference.qwen3_layer(CFG, layer.weights, h, pos, dtype="bf16",
                                           rounded=layers.reference.ROUNDED)[0]
    assert 1e-4 < precision.rel_l2(rounded, exact) < 1e-2


def test_drift_over_depth_and_stack_against_float64(rng):
    seen = []
    rows = study.drift(CFG, depths=(1, 2, 4), dtype="bf16", tokens=3, progress=lambda i, n: seen.append((i, n)))
    assert [r["layers"] for r in rows] == [1, 2, 4]
    assert all(0 < r["rel_l2"] < 2e-2 and r["cosine"] > 0.999 for r in rows)
    assert seen[-1] == (4, 4)
