"""Linear benchmarks: linear.fused_bias / linear.matmul_add, K = N = 4096, M in {1, 8, 2048}.

Targets (2 threads, issue 20): fp32 M=2048, K=N=4096: ``fused_bias`` >= 1.0x NumPy
``x @ w.T + b``; decode: see :class:`LinearDecode`; bf16 weights: the ratio to
``torch.nn.functional.linear`` on bf16 is reported.

- ``time_linear``: one call (kernels warmed up in setup()).
- ``track_gm_bytes``: the plan's modelled GM traffic (read + write; deterministic).
- ``track_vs_numpy`` (fp32, M=2048): NumPy time / fused_bias time, alternating blocks of 3 runs
  in the same process (> 1: we are faster). NumPy's BLAS uses its own threads, which spin on
  for a while after each call and slowed a fused_bias run right after it by ~10%; in blocks
  only the first run of each pays that (2-core EPYC: 0.99-1.03 in blocks, 0.93-0.95 strictly
  alternating, same process). Ours runs one BLAS thread per prange task, each task a group of
  cube blocks of about 1024 x 1024 outputs (see pypto_numba.machine.cube: the counts stay per
  block).
- ``track_decode_vs_read`` (M in {1, 8, 15, 16}): the weight is the traffic that matters at
  decode, so the peer reads the weight's bytes once (``torch.sum``): 1.0 = weight streamed at
  read bandwidth. ``track_decode_vs_copy``: the same against a numba prange copy that moves the
  weight's bytes in total (reads w.nbytes/2, writes w.nbytes/2). Decode runs the hand-written
  skinny loops of the cube, not BLAS.
- ``track_vs_torch``: torch.nn.functional.linear time / fused_bias time, same dtype and threads
  (NaN when torch is not installed).
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

from pypto_numba import linear

from ._common import (  # noqa: F401 (rounds: read by asv)
    copy_peer, median_ratio, sum_peer, to_torch, torch_or_none, unpinned, rounds,
)

K = N = 4096
NP = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
DTYPES = ["fp32", "bf16", "fp16"]
MS = [1, 8, 2048]


def _data(m, dtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, K), dtype=np.float32).astype(NP[dtype])
    w = (rng.standard_normal((N, K), dtype=np.float32) * (1.0 / 64)).astype(NP[dtype])
    b = rng.standard_normal(N, dtype=np.float32).astype(NP[dtype])
    return x, w, b


class LinearTime:
    params = (["fused_bias", "matmul_add"], DTYPES, MS)
    param_names = ["strategy", "dtype", "m"]
    timeout = 600
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, strategy, dtype, m):
        self.x, self.w, self.b = _data(m, dtype)
        self.fn = getattr(linear, strategy)
        self.fn(self.x, self.w, self.b)  # compile / load from cache outside the timing

    def time_linear(self, strategy, dtype, m):
        self.fn(self.x, self.w, self.b)


class LinearBytes:
    params = (["fused_bias", "matmul_add"], DTYPES, MS)
    param_names = ["strategy", "dtype", "m"]

    def track_gm_bytes(self, strategy, dtype, m):
        return getattr(linear, f"plan_{strategy}")((m, K), (N, K), dtype).cost.gm_bytes

    track_gm_bytes.unit = "bytes"


# cube tiles for the fp32 prefill comparison: the profile default (npu-facts 4.3: 128/256 L1
# blocks), the gym baseline 128s, and 512-wide L1 blocks (legal for the budget rules, with 16
# L0C tiles per block; faster on the CPU because each task is one bigger BLAS call)
TILES = {
    "default": None,
    "gym128": ((128, 128), (128, 512), (128, 128)),
    "l1_512": ((128, 512), (32, 128), (128, 512)),
}


def _vs_numpy(tiles: str) -> float:
    """NumPy ``x @ w.T + b`` time / fused_bias time at fp32 M=2048, in blocks of 3 runs a side
    (NumPy's OpenBLAS workers spin on after its call, see median_ratio). Run through
    ``unpinned``: both sides in one child process without the machine's BLAS pins."""
    x, w, b = _data(2048, "fp32")
    t = TILES[tiles]
    ours = lambda: linear.fused_bias(x, w, b, t)  # noqa: E731
    ours()
    return median_ratio(ours, lambda: x @ w.T + b, 4, block=3)


class LinearVsNumpy:
    """fp32 M=2048: fused_bias vs NumPy ``x @ w.T + b`` with NumPy's own BLAS threads and without
    the machine's ``OPENBLAS_*`` pins (measured in a child process, ``_common.unpinned``)."""

    params = (list(TILES),)
    param_names = ["tiles"]
    timeout = 900
    repeat = 1
    number = 1

    def track_vs_numpy(self, tiles):
        return unpinned(__name__, "_vs_numpy", tiles)

    track_vs_numpy.unit = "x NumPy sgemm (BLAS pins unset)"


class LinearDecode:
    """Decode shapes: the weight's bytes streamed against a read of the same bytes, and against a
    copy of them. Issue 20's targets: M in {1, 8} >= 0.9x the read peer; M = 16 (a decode batch)
    >= 0.6x the read peer and at most 1.3x the time of M = 15 (no cliff at one cube fractal)."""

    params = (DTYPES, [1, 8, 15, 16])
    param_names = ["dtype", "m"]
    timeout = 600
    repeat = 1
    number = 1

    def setup(self, dtype, m):
        self.x, self.w, self.b = _data(m, dtype)
        self.ours = lambda: linear.fused_bias(self.x, self.w, self.b)
        self.ours()

    def track_decode_vs_read(self, dtype, m):
        """Against the read peer (torch.sum, else a numba prange sum) over the weight's bytes."""
        return median_ratio(self.ours, sum_peer(self.w.nbytes), 15)

    track_decode_vs_read.unit = "x read of the weight bytes (torch.sum)"

    def track_decode_vs_copy(self, dtype, m):
        """Against a numba prange copy moving the weight's bytes (w.nbytes/2 read + written)."""
        return median_ratio(self.ours, copy_peer(self.w.nbytes // 2), 15)

    track_decode_vs_copy.unit = "x copy of the weight bytes"

    def track_decode_weight_gbps(self, dtype, m):
        from ._common import median_seconds

        return self.w.nbytes / median_seconds(self.ours, 15) / 1e9

    track_decode_weight_gbps.unit = "GB/s"


class LinearVsTorch:
    params = (DTYPES, MS)
    param_names = ["dtype", "m"]
    timeout = 900
    repeat = 1
    number = 1

    def setup(self, dtype, m):
        self.x, self.w, self.b = _data(m, dtype)
        self.ours = lambda: linear.fused_bias(self.x, self.w, self.b)
        self.ours()
        self.torch = torch_or_none()
        if self.torch is not None:
            tx, tw, tb = (to_torch(self.torch, a) for a in (self.x, self.w, self.b))
            f = self.torch.nn.functional.linear
            self.peer = lambda: f(tx, tw, tb)

    def track_vs_torch(self, dtype, m):
        """Against ``torch.nn.functional.linear`` (same dtype, same threads)."""
        if self.torch is None:
            return math.nan
        return median_ratio(self.ours, self.peer, 5 if m > 8 else 15)

    track_vs_torch.unit = "x torch F.linear"
