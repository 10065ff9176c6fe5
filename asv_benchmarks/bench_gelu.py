"""GELU benchmarks: gelu.tanh / gelu.erf on 64M elements, fp32 / bf16 / fp16, 2 threads.

The issue's targets (64M float32 elements, 2 threads): each strategy moves its bytes at >= 0.9x
the speed of a numba prange copy of the same bytes and runs >= 5x faster than
``torch.nn.functional.gelu`` with the same approximation; bf16 in/out >= 0.8x copy speed.

- ``time_gelu``: one call (kernel warmed up in setup()).
- ``track_gm_bytes``: the plan's modelled GM traffic (read + write, deterministic).
- ``track_gbps``: modelled GM bytes / median seconds.
- ``track_vs_copy``: median of alternating runs, copy time / gelu time, where the copy reads and
  writes ``x.nbytes`` each (the same bytes gelu moves); 1.0 = copy speed. gelu allocates its
  output per call, whose pages the kernel faults in (~half the time). ``track_vs_copy_out``: the
  same with a preallocated ``out=np.empty_like(x)`` (the copy's destination is preallocated too).
- ``track_vs_torch``: torch time / gelu time (> 1: we are faster); torch on the same threads and
  the same dtype (``approximate="tanh"`` / ``"none"``). NaN when torch is not installed.
- ``GeluCompile``: first-call seconds in a new process with an empty NUMBA_CACHE_DIR (compile),
  and again from that cache (load). Targets: <= 3 s and <= 0.5 s.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import gelu

from ._common import (  # noqa: F401 (rounds: read by asv)
    M64, compile_seconds, heavy, copy_peer, median_ratio, median_seconds, to_torch, torch_or_none, rounds,
)

N = M64  # 64M elements: 256 MB fp32 in + 256 MB out; setup ~2-4 s on 2 cores
NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
STRATEGIES = ["tanh", "erf"]
DTYPES = ["fp32", "bf16", "fp16"]
TORCH_APPROX = {"tanh": "tanh", "erf": "none"}


def _data(dtype):
    rng = np.random.default_rng(0)
    return (rng.standard_normal(N, dtype=np.float32) * 3.0).astype(NP[dtype])


class GeluTime:
    params = (STRATEGIES, DTYPES)
    param_names = ["strategy", "dtype"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, strategy, dtype):
        self.x = _data(dtype)
        self.fn = getattr(gelu, strategy)
        self.fn(self.x)  # compile / load from cache outside the timing

    def time_gelu(self, strategy, dtype):
        self.fn(self.x)


class GeluTrack:
    params = (STRATEGIES, DTYPES)
    param_names = ["strategy", "dtype"]
    timeout = 600
    repeat = 1
    number = 1

    def setup(self, strategy, dtype):
        self.x = _data(dtype)
        fn = getattr(gelu, strategy)
        self.run = lambda: fn(self.x)
        self.run()
        self.plan = getattr(gelu, f"plan_{strategy}")(self.x.shape, dtype)

    def track_gm_bytes(self, strategy, dtype):
        return self.plan.cost.gm_bytes

    track_gm_bytes.unit = "bytes"

    def track_gbps(self, strategy, dtype):
        return self.plan.cost.gm_bytes / median_seconds(self.run, 7) / 1e9

    track_gbps.unit = "GB/s"

    def track_vs_copy(self, strategy, dtype):
        return median_ratio(self.run, copy_peer(self.x.nbytes), 7)

    track_vs_copy.unit = "x copy of the input bytes"

    def track_vs_copy_out(self, strategy, dtype):
        out = np.empty_like(self.x)
        fn = getattr(gelu, strategy)
        return median_ratio(lambda: fn(self.x, out=out), copy_peer(self.x.nbytes), 7)

    track_vs_copy_out.unit = "x copy of the input bytes"

    def track_vs_torch(self, strategy, dtype):
        torch = torch_or_none()
        if torch is None:
            return float("nan")
        xt = to_torch(torch, self.x)
        approx = TORCH_APPROX[strategy]
        peer = lambda: torch.nn.functional.gelu(xt, approximate=approx)  # noqa: E731
        return median_ratio(self.run, peer, 5)

    track_vs_torch.unit = "x torch F.gelu"


_SNIPPET = """
import ml_dtypes, numpy as np
from pypto_numba import gelu
def setup():
    global x
    x = np.linspace(-4, 4, 1000, dtype=np.float32).astype({np_dtype})
def first_call():
    gelu.{strategy}(x)
"""


@heavy
class HeavyGeluCompile:
    """First call in a fresh process: compile (empty cache) and load (warm cache)."""

    timeout = 600
    repeat = 1
    number = 1

    def setup_cache(self):
        out = {}
        for dtype, np_dtype in (("fp32", "np.float32"), ("bf16", "ml_dtypes.bfloat16")):
            out[dtype] = compile_seconds(_SNIPPET.format(np_dtype=np_dtype, strategy="tanh"))
        return out

    def track_first_call_seconds(self, seconds):
        return seconds["fp32"][0]

    track_first_call_seconds.unit = "seconds"

    def track_cached_call_seconds(self, seconds):
        return seconds["fp32"][1]

    track_cached_call_seconds.unit = "seconds"

    def track_first_call_seconds_bf16(self, seconds):
        return seconds["bf16"][0]

    track_first_call_seconds_bf16.unit = "seconds"

    def track_cached_call_seconds_bf16(self, seconds):
        return seconds["bf16"][1]

    track_cached_call_seconds_bf16.unit = "seconds"
