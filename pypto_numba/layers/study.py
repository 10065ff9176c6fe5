"""Layer-level precision: a layer against its float64 evaluation, drift over stacked layers, and
the attribution of the error to one op at a time (that op computed in float64).

Metrics: :func:`pypto_numba.precision.distribution` (rel-L2, cosine, fractions above thresholds,
the 0.5 % outlier rule; npu-facts 8.3).
"""

from __future__ import annotations

import numpy as np

from .. import precision
from ..machine import dtypes
from .qwen3 import STEPS, Qwen3Layer


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
    """Rel-L2 of the layer's output with each step in turn computed in float64 (rounded to its
    output dtype) -> rows sorted by how much of the error that step removes."""
    expected = layer.reference(hidden)
    base = precision.rel_l2(layer(hidden, strategies=strategies, profile=profile), expected)
    rows = []
    for step in steps:
        r, d = layer.forward(hidden, strategies=strategies, profile=profile, exact=(step,))
        err = precision.rel_l2(r + d.astype(np.float32), expected)
        rows.append({"step": step, "rel_l2": err, "removed": base - err,
                     "share": (base**2 - err**2) / base**2 if base else 0.0})
    rows.sort(key=lambda row: -row["removed"])
    return {"rel_l2": base, "rows": rows}
