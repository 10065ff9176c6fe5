"""Whole-layer benchmarks: a Qwen3-1.7B decoder layer (pypto_numba.layers.Qwen3Layer, the seed's
strategy picks) against the same layer in torch (layers/torch_peer.py, same math, same dtype,
torch on the same threads), 2 threads.

- decode: batch 16, one new token against a paged cache of 4096 tokens (4095 filled);
- prefill (heavy set): batch 1, 2048 tokens from an empty cache.

- ``time_layer``: one layer call (kernels warmed up in setup()).
- ``track_vs_torch``: torch time / our time (median of alternating runs; > 1: we are faster).
  Issue 20's targets: decode bf16 >= 1.5x, fp32 >= 1.0x; prefill >= 1.0x. NaN without torch.
- ``track_estimate_us``: the layer plan's NPU estimate (ascend910b, pipes model).
- ``track_gm_bytes``: the layer plan's modelled GM traffic.
"""

from __future__ import annotations

import numpy as np

from pypto_numba import layers
from pypto_numba.machine import dtypes

from ._common import heavy, median_ratio, to_torch, torch_or_none, rounds  # noqa: F401 (rounds: read by asv)

MODEL = {"name": "qwen3-1.7b", "overrides": {}}  # a smoke test may shrink it
DTYPES = ["fp32", "bf16"]
DECODE = (16, 4096)  # batch, context
PREFILL = (1, 2048)  # batch, tokens


def _setup(phase, dtype):
    cfg = layers.config(MODEL["name"], **MODEL["overrides"])
    layer = layers.Qwen3Layer(cfg, dtype=dtype, seed=0)
    rng = np.random.default_rng(0)
    D, Hkv, H = cfg.head_dim, cfg.num_key_value_heads, cfg.hidden_size
    if phase == "decode":
        B, C = DECODE
        past = [dtypes.from_float32(rng.standard_normal((B, Hkv, C - 1, D), dtype=np.float32), dtype) for _ in range(2)]
        cache = layer.new_cache(B, C)
        cache.fill(*past)
        h = dtypes.from_float32(rng.standard_normal((B, 1, H), dtype=np.float32), dtype)

        def ours():
            cache.lens[:] = C - 1  # the same step every call: the token at position C - 1
            return layer(h, cache=cache)
    else:
        B, C = PREFILL
        past = None
        h = dtypes.from_float32(rng.standard_normal((B, C, H), dtype=np.float32), dtype)

        def ours():
            return layer(h, cache=layer.new_cache(B, C))
    plan = layer.plan(phase, B, C, dtype, stacked=False)
    return layer, h, past, ours, plan


def _torch_peer(layer, h, past):
    torch = torch_or_none()
    if torch is None:
        return None
    from pypto_numba.layers.torch_peer import TorchQwen3

    peer = TorchQwen3(layer, torch)
    ht = to_torch(torch, h)
    pk = pv = None
    if past is not None:
        pk, pv = (to_torch(torch, p) for p in past)
    B, S = h.shape[:2]
    P = 0 if past is None else past[0].shape[2]
    tables = peer.tables(P + np.broadcast_to(np.arange(S), (B, S)))

    def run():
        with torch.inference_mode():
            return peer(ht, past_k=pk, past_v=pv, tables=tables)

    return run


class _Layer:
    params = (DTYPES,)
    param_names = ["dtype"]
    timeout = 1200
    phase = "decode"

    def setup(self, dtype):
        self.layer, self.h, self.past, self.run, self.plan = _setup(self.phase, dtype)
        self.run()

    def time_layer(self, dtype):
        self.run()


class _LayerTrack(_Layer):
    repeat = 1
    number = 1

    def track_vs_torch(self, dtype):
        peer = _torch_peer(self.layer, self.h, self.past)
        return float("nan") if peer is None else median_ratio(self.run, peer, repeats=5)

    def track_estimate_us(self, dtype):
        return self.plan.estimate("ascend910b").seconds * 1e6

    def track_gm_bytes(self, dtype):
        return self.plan.cost.gm_bytes


class Qwen3DecodeLayer(_Layer):
    phase = "decode"


class Qwen3DecodeLayerTrack(_LayerTrack):
    phase = "decode"


@heavy
class HeavyQwen3PrefillLayer(_Layer):
    phase = "prefill"


@heavy
class HeavyQwen3PrefillLayerTrack(_LayerTrack):
    phase = "prefill"
