"""mean benchmarks: mean.sum_div on 64M elements, fp32 / bf16 / fp16, 2 threads.

The issue's target (64M float32 elements, 2 threads): ``mean.sum_div`` reads at >= 0.8x the
bandwidth of a plain numba prange sum of the same bytes and is not slower than ``torch.mean``.

Layouts (all 64M elements):

- ``rows``: ``[4096, 16384]``, dim=-1 -- one 64 KiB row tile per task, one kernel;
- ``flat``: ``[64M]``, dim=0 -- one long row, split into 48 groups through GM partials (2 kernels);
- ``dim0``: ``[16384, 4096]``, dim=0 -- the strided layout (rows of 2048 contiguous elements),
  split through GM partials because 2 inner blocks give too few tasks.

- ``time_mean``: one call (kernels warmed up in setup()).
- ``track_gm_bytes``: the plan's modelled GM traffic (read + write, incl. the partials).
- ``track_gbps``: input bytes / median seconds (read bandwidth).
- ``track_vs_sum``: median of alternating runs, prange-sum time / mean time, the sum reading the
  same number of bytes (as float32); 1.0 = as fast as the plain sum.
- ``track_vs_torch``: ``torch.mean(x, dim)`` time / mean time (> 1: we are faster), same dtype,
  same threads. NaN when torch is not installed.
- ``MeanCompile``: first-call seconds in a new process, empty cache and warm cache, for the rows
  kernel (fp32) and the strided split (fp32: two calls of one kernel signature).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import mean

from ._common import (  # noqa: F401 (rounds: read by asv)
    M64, compile_seconds, heavy, median_ratio, median_seconds, sum_peer, to_torch, torch_or_none, rounds,
)

N = M64  # 64M elements: 256 MB fp32; setup ~2 s on 2 cores
NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
LAYOUTS = {"rows": ((4096, 16384), -1), "flat": ((N,), 0), "dim0": ((16384, 4096), 0)}
DTYPES = ["fp32", "bf16", "fp16"]


def _data(layout, dtype):
    shape, dim = LAYOUTS[layout]
    rng = np.random.default_rng(0)
    return (rng.standard_normal(N, dtype=np.float32) + 0.5).astype(NP[dtype]).reshape(shape), dim


class MeanTime:
    params = (list(LAYOUTS), DTYPES)
    param_names = ["layout", "dtype"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, layout, dtype):
        self.x, self.dim = _data(layout, dtype)
        mean.sum_div(self.x, self.dim)  # compile / load from cache outside the timing

    def time_mean(self, layout, dtype):
        mean.sum_div(self.x, self.dim)


class MeanTrack:
    params = (list(LAYOUTS), DTYPES)
    param_names = ["layout", "dtype"]
    timeout = 600
    repeat = 1
    number = 1

    def setup(self, layout, dtype):
        self.x, self.dim = _data(layout, dtype)
        self.run = lambda: mean.sum_div(self.x, self.dim)
        self.run()
        self.plan = mean.plan_sum_div(self.x.shape, dtype, dim=self.dim)

    def track_gm_bytes(self, layout, dtype):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_gbps(self, layout, dtype):
        return self.x.nbytes / median_seconds(self.run, 7) / 1e9

    track_gbps.unit = "GB/s"

    def track_vs_sum(self, layout, dtype):
        return median_ratio(self.run, sum_peer(self.x.nbytes), 7)

    track_vs_sum.unit = "x read peer (torch.sum)"

    def track_vs_torch(self, layout, dtype):
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        xt = to_torch(torch, self.x)
        dim = self.dim
        return median_ratio(self.run, lambda: torch.mean(xt, dim), 5)

    track_vs_torch.unit = "x torch.mean"


_SNIPPET = """
import numpy as np
from pypto_numba import mean
def setup():
    global x
    x = np.ones({shape}, np.float32)
def first_call():
    mean.sum_div(x, {dim})
"""


@heavy
class HeavyMeanCompile:
    """First call in a fresh process: compile (empty cache) and load (warm cache)."""

    timeout = 600
    repeat = 1
    number = 1

    def setup_cache(self):
        return {
            "rows": compile_seconds(_SNIPPET.format(shape=(64, 1000), dim=-1)),
            "strided_split": compile_seconds(_SNIPPET.format(shape=(1, 4000, 64), dim=1)),
        }

    def track_first_call_seconds_rows(self, seconds):
        return seconds["rows"][0]

    track_first_call_seconds_rows.unit = "seconds"

    def track_cached_call_seconds_rows(self, seconds):
        return seconds["rows"][1]

    track_cached_call_seconds_rows.unit = "seconds"

    def track_first_call_seconds_strided(self, seconds):
        return seconds["strided_split"][0]

    track_first_call_seconds_strided.unit = "seconds"

    def track_cached_call_seconds_strided(self, seconds):
        return seconds["strided_split"][1]

    track_cached_call_seconds_strided.unit = "seconds"
