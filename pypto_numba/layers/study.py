"""Layer-level precision: a layer against its float64 evaluation, drift over stacked layers, and
the attribution of the error to one op at a time (that op computed in float64).

Metrics: :func:`pypto_numba.precision.distribution` (rel-L2, cosine, fractions above thresholds,
the 0.5 % outlier rule; npu-facts 8.3).
"""

from __future__ import annotations

import functools

import numpy as np

from .. import precision
from ..interop import torch_aware
from ..machine import dtypes
from .qwen3 import STEPS, Qwen3Layer


@functools.partial(torch_aware, where="run_stack", main="hidden")  # a torch hidden: a tensor out
def run_stack(layers, hidden, caches=None, strategies=None, profile=None, exact=(), progress=None):
    """Run ``layers`` in order on ``hidden`` (a prefill from empty caches unless ``caches``), the
    residual add of each layer fused into the next one's input norm -> fp32 ``[B, S, H]``.
    ``progress``: a callable ``(done, total)`` called after each layer (a progress bar)."""
    caches = caches or [None] * len(layers)
    r, d = hidden, None
    for i, (layer, cache) in enumerate(zip(layers, caches)):
        r, d = layer.forward(r, cache=cache, strategies=strategies, profile=profile, delta=d, exact=exact)
        if progress is not None:
            progress(i + 1, len(layers))
    return r + d.astype(np.float32)


def reference_stack(layers, hidden):
    """The float64 stack (each layer's float64 evaluation feeding the next)."""
    h = np.asarray(hidden).astype(np.float64)
    for layer in layers:
        h = layer.reference(h)
    return h


def layer_precision(layer, hidden, strategies=None, profile=None):
    """One layer (prefill of ``hidden``) against its float64 evaluation -> precision.Distribution."""
    out = layer(hidden, strategies=strategies, profile=profile)
    return precision.distribution(out, layer.reference(hidden), layer.dtype)


def make_stack(config, n, dtype="bf16", seed=0):
    """``n`` layers with different weights (layer indices 0..n-1 seed them)."""
    return [Qwen3Layer(config, seed=seed, dtype=dtype, layer=i) for i in range(n)]


def drift(config, depths=(1, 2, 4, 8), dtype="bf16", batch=1, tokens=8, strategies=None, seed=0, profile=None,
          progress=None):
    """Error of the stack's output against float64 after each depth -> [{"layers", "rel_l2", "cosine",
    "above_1e-2", "outliers"}]. One stack of ``max(depths)`` layers (different weights each)."""
    n = max(depths)
    layers = make_stack(config, n, dtype, seed)
    rng = np.random.default_rng(seed)
    hidden = dtypes.from_float32(rng.standard_normal((batch, tokens, layers[0].config.hidden_size)), dtype)
    rows = []
    for depth in sorted(depths):
        out = run_stack(layers[:depth], hidden, strategies=strategies, profile=profile, progress=progress)
        dist = precision.distribution(out, reference_stack(layers[:depth], hidden), dtype)
        rows.append({"layers": depth, "rel_l2": dist.rel_l2, "cosine": dist.cosine,
                     "above_1e-2": dist.above[1e-2], "outliers": dist.outliers, "dist": dist})
    return rows


def attribution(layer, hidden, strategies=None, profile=None, steps=STEPS):
    """Which step's rounding contributes most of the layer's error against float64 -> {"rel_l2"
    (the kernels' layer), "emulated" (the float64 layer with every step's output rounded where the
    kernels round it), "rows"}. Per step, sorted by ``removed``:

    - ``rel_l2``: the emulated layer with that one step in float64 (its output not rounded);
      ``removed`` = emulated - that, ``share`` = the part of the squared error it removes;
    - ``kernel_exact``: the kernels' layer with that step's arithmetic in float64 but its output still
      rounded to the storage dtype (what the op's own arithmetic adds beyond its output rounding).
    """
    from . import reference as ref

    c = layer.config
    B, S, _ = np.shape(hidden)
    pos = np.broadcast_to(np.arange(S), (B, S))
    expected = layer.reference(hidden)
    base = precision.rel_l2(layer(hidden, strategies=strategies, profile=profile), expected)

    def emulated(rounded):
        out = ref.qwen3_layer(c, layer.weights, hidden, pos, dtype=layer.dtype, rounded=rounded)[0]
        return precision.rel_l2(out, expected)

    full = emulated(ref.ROUNDED)
    rows = []
    for step in tuple(steps) + ("residual",):
        err = emulated(tuple(s for s in ref.ROUNDED if s != step))
        share = (full**2 - err**2) / full**2 if full else 0.0
        row = {"step": step, "rel_l2": err, "removed": full - err, "share": share}
        if step in STEPS:
            r, d = layer.forward(hidden, strategies=strategies, profile=profile, exact=(step,))
            row["kernel_exact"] = precision.rel_l2(r + d.astype(np.float32), expected)
        rows.append(row)
    rows.sort(key=lambda row: -row["removed"])
    return {"rel_l2": base, "emulated": full, "rows": rows}
