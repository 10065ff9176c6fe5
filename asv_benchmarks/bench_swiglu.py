"""SwiGLU benchmarks: swiglu.separate / swiglu.fused at the Qwen3-1.7B MLP (intermediate_size 6144),
fp32 / bf16 / fp16, 2 threads, gate and up as two tensors, ``out=`` given.

Shapes: [2048, 6144] (a 2K-token Qwen3-1.7B prefill) and [16, 6144] (decode batch 16).
``SwigluEpilogue*`` times ``swiglu.epilogue`` (= ``linear.gate_up_swiglu``) on x[M, 2048] and two
[6144, 2048] weights (Qwen3-1.7B hidden 2048), M = 16 and 2048; its torch peer is
``F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)`` in the same dtype.

- ``time_swiglu``: one call with ``out=`` (kernels warmed up in setup()).
- ``track_gm_bytes``: the plan's modelled GM traffic (read + write; separate also writes and reads
  back silu(gate)).
- ``track_vs_copy``: copy time / swiglu time (median of alternating runs), the peer a numba prange
  copy (``_common.copy_peer``) of the plan's GM bytes, half read and half written, into a buffer
  allocated once (as our ``out=``); 1.0 = copy speed (issue 20's target: >= 0.9x for fused in fp32).
- ``track_vs_torch``: torch time / our time, the peer ``torch.nn.functional.silu(g) * u`` on
  tensors sharing our inputs' memory, same dtype, torch on the same threads (> 1: we are faster;
  issue 20's target: >= 2x); NaN without torch.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import swiglu

from ._common import (  # noqa: F401 (rounds: read by asv)
    copy_peer, median_ratio, to_torch, torch_or_none, rounds,
)

NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
STRATEGIES = ["separate", "fused"]
DTYPES = ["fp32", "bf16", "fp16"]
SHAPES = ["2048x6144", "16x6144"]


def _shape(name):
    return tuple(int(d) for d in name.split("x"))


def _data(shape, dtype):
    rng = np.random.default_rng(0)
    gate = (3.0 * rng.standard_normal(shape, dtype=np.float32)).astype(NP[dtype])
    up = rng.standard_normal(shape, dtype=np.float32).astype(NP[dtype])
    return gate, up


def _setup(bench, strategy, dtype, shape):
    s = _shape(shape)
    bench.gate, bench.up = _data(s, dtype)
    out = np.empty_like(bench.gate)
    fn = getattr(swiglu, strategy)
    bench.run = lambda: fn(bench.gate, bench.up, out=out)
    bench.run()  # compile / load from cache outside the timing
    bench.plan = getattr(swiglu, f"plan_{strategy}")(s, dtype)


class SwigluTime:
    params = (STRATEGIES, DTYPES, SHAPES)
    param_names = ["strategy", "dtype", "shape"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, strategy, dtype, shape):
        _setup(self, strategy, dtype, shape)

    def time_swiglu(self, strategy, dtype, shape):
        self.run()


class SwigluTrack:
    params = (STRATEGIES, DTYPES, SHAPES)
    param_names = ["strategy", "dtype", "shape"]
    timeout = 600
    repeat = 1
    number = 1

    def setup(self, strategy, dtype, shape):
        _setup(self, strategy, dtype, shape)

    def track_gm_bytes(self, strategy, dtype, shape):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_vs_copy(self, strategy, dtype, shape):
        """Copy time / our time; the copy moves the plan's GM bytes (half read, half written)."""
        copy = copy_peer(self.plan.cost.gm_bytes // 2)
        return median_ratio(self.run, copy, 7)

    track_vs_copy.unit = "x copy speed"

    def track_vs_torch(self, strategy, dtype, shape):
        """torch time / our time; the peer is ``F.silu(g) * u`` in the same dtype."""
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        g, u = to_torch(torch, self.gate), to_torch(torch, self.up)
        silu = torch.nn.functional.silu

        def peer():
            silu(g) * u

        peer()
        return median_ratio(self.run, peer, 7)

    track_vs_torch.unit = "x torch"


EPI_SHAPES = ["16x2048x6144", "2048x2048x6144"]  # M x hidden x intermediate


def _setup_epilogue(bench, dtype, shape):
    m, k, n = _shape(shape)
    rng = np.random.default_rng(0)
    bench.x = rng.standard_normal((m, k), dtype=np.float32).astype(NP[dtype])
    bench.wg = (k**-0.5 * rng.standard_normal((n, k), dtype=np.float32)).astype(NP[dtype])
    bench.wu = (k**-0.5 * rng.standard_normal((n, k), dtype=np.float32)).astype(NP[dtype])
    bench.run = lambda: swiglu.epilogue(bench.x, bench.wg, bench.wu)
    bench.run()  # compile / load from cache outside the timing


class SwigluEpilogueTime:
    params = (DTYPES, EPI_SHAPES)
    param_names = ["dtype", "shape"]
    timeout = 600
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, dtype, shape):
        _setup_epilogue(self, dtype, shape)

    def time_epilogue(self, dtype, shape):
        self.run()


class SwigluEpilogueTrack:
    params = (DTYPES, EPI_SHAPES)
    param_names = ["dtype", "shape"]
    timeout = 900
    repeat = 1
    number = 1

    def setup(self, dtype, shape):
        _setup_epilogue(self, dtype, shape)

    def track_epilogue_vs_torch(self, dtype, shape):
        """torch time / our time; the peer is ``F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)``."""
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        x, wg, wu = (to_torch(torch, a) for a in (self.x, self.wg, self.wu))
        F = torch.nn.functional

        def peer():
            F.silu(F.linear(x, wg)) * F.linear(x, wu)

        peer()
        return median_ratio(self.run, peer, 5)

    track_epilogue_vs_torch.unit = "x torch"
