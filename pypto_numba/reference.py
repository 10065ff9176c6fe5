"""Float64 NumPy oracles for every op: the ground truth that strategies are measured against.

Each op declares its oracles in its ``OP`` spec (``OpSpec.oracles``, at the end of the op's
module); this module re-exports them by name (``reference.gelu_tanh``, ``reference.attention``,
...) and holds the one helper they share. Each oracle widens its float inputs to float64
(bf16/fp16 values are exact in float32 and float64) and computes the op exactly as its formula in
../shared/API.md says, with no tiling and no intermediate rounding. They are written for clarity,
not speed.
"""

from __future__ import annotations

import numpy as np


def f64(x) -> np.ndarray:
    """Widen a float32/float16/bfloat16 (or any numeric) array to float64."""
    return np.asarray(x).astype(np.float64)


def _oracles() -> dict:
    from .strategy import specs

    return {name: fn for spec in specs() for name, fn in spec.oracles.items()}


def __getattr__(name):
    oracles = _oracles()
    if name in oracles:
        return oracles[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_oracles()))
