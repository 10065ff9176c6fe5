"""softmax benchmarks: softmax.whole_row / softmax.online over the last dim, fp32 / bf16, 2 threads.

The issue's targets (issue 20): each strategy moves its planned GM bytes at >= 0.9x the speed of a
numba prange copy of the same bytes in fp32, and runs >= 2x faster than ``torch.softmax``.

Shapes: ``rows`` = [8192, 4096] (attention-score-sized rows, 32M elements: 128 MiB fp32 in + out)
and ``vocab`` = [64, 151936] (Qwen3 vocab-sized logits rows, 9.7M elements; longer than
whole_row's 64 KiB fp32 row tile, so whole_row is skipped there).

- ``time_softmax``: one call into a preallocated ``out=`` (kernel warmed up in setup()).
- ``track_gm_bytes``: the plan's modelled GM traffic (read + write; online reads x twice).
- ``track_vs_copy``: copy time / softmax time, the copy moving the plan's GM bytes (half read,
  half written); 1.0 = copy speed of the planned bytes.
- ``track_vs_torch``: ``torch.softmax(x, -1)`` time / softmax time in the same dtype (> 1: we are
  faster); torch on the same threads. NaN when torch is not installed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import softmax
from pypto_numba.errors import TileError

from ._common import (  # noqa: F401 (rounds: read by asv)
    copy_peer, median_ratio, to_torch, torch_or_none, rounds,
)

NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16}
SHAPES = {"rows": (8192, 4096), "vocab": (64, 151936)}
STRATEGIES = ["whole_row", "online"]
DTYPES = ["fp32", "bf16"]


def _data(shape, dtype):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(shape, dtype=np.float32) * 3.0).astype(NP[dtype])


def _setup(bench, strategy, dtype, shape):
    shape = SHAPES[shape]
    plan_fn = getattr(softmax, f"plan_{strategy}")
    try:
        bench.plan = plan_fn(shape, dtype)
    except TileError as exc:  # whole_row on rows longer than its tile: not a case
        raise NotImplementedError(str(exc)) from None
    bench.x = _data(shape, dtype)
    bench.out = np.empty_like(bench.x)  # out=: a fresh result's page faults would cost more than the kernel
    fn = getattr(softmax, strategy)
    bench.run = lambda: fn(bench.x, out=bench.out)
    bench.run()  # compile / load from cache outside the timing


class SoftmaxTime:
    params = (STRATEGIES, DTYPES, list(SHAPES))
    param_names = ["strategy", "dtype", "shape"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, strategy, dtype, shape):
        _setup(self, strategy, dtype, shape)

    def time_softmax(self, strategy, dtype, shape):
        self.run()


class SoftmaxTrack:
    params = (STRATEGIES, DTYPES, list(SHAPES))
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
        return median_ratio(self.run, copy_peer(self.plan.cost.gm_bytes // 2), 7)

    track_vs_copy.unit = "x copy of the planned GM bytes"

    def track_vs_torch(self, strategy, dtype, shape):
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        xt = to_torch(torch, self.x)
        return median_ratio(self.run, lambda: torch.softmax(xt, -1), 5)

    track_vs_torch.unit = "x torch.softmax"
