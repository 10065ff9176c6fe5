"""Cast-mode benchmarks: GELU bf16 (16M elements, 2 threads) with each fp32 -> bf16 narrowing mode.

The issue's targets: ``rint`` (the default, today's code) does not change speed (A/B against the
previous commit's ``GeluTime`` bf16), and every other mode runs at >= 0.9x of ``rint``'s speed.

- ``time_gelu``: one ``gelu.tanh(x, cast_mode=mode, out=out)`` call (compiled in setup()).
- ``track_vs_rint``: median of alternating runs, rint time / mode time (1.0 = rint's speed;
  the target is >= 0.9).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from pypto_numba import gelu
from pypto_numba.machine.dtypes import CAST_MODES

from ._common import M16, median_ratio, rounds  # noqa: F401 (rounds: read by asv)

N = M16


def _data():
    rng = np.random.default_rng(0)
    return (rng.standard_normal(N, dtype=np.float32) * 3.0).astype(ml_dtypes.bfloat16)


class CastModeGelu:
    params = (list(CAST_MODES),)
    param_names = ["mode"]
    timeout = 300
    number = 1
    repeat = (3, 5, 10.0)

    def setup(self, mode):
        self.x = _data()
        self.out = np.empty_like(self.x)
        gelu.tanh(self.x, cast_mode=mode, out=self.out)  # compile / load outside the timing
        gelu.tanh(self.x, cast_mode="rint", out=self.out)

    def time_gelu(self, mode):
        gelu.tanh(self.x, cast_mode=mode, out=self.out)

    def track_vs_rint(self, mode):
        return median_ratio(lambda: gelu.tanh(self.x, cast_mode=mode, out=self.out),
                            lambda: gelu.tanh(self.x, cast_mode="rint", out=self.out))

    track_vs_rint.unit = "x rint speed"
