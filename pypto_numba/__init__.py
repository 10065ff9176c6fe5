"""pypto_numba: a CPU laboratory for the operator strategies PyPTO developers choose between.

Every strategy is a numba kernel family that follows the Ascend NPU's tile discipline, rounds
where the NPU rounds, and counts what it does (kernels, GM bytes, workspace, buffer peaks,
FLOPs). Typical use::

    import pypto_numba as pn
    out = pn.gelu.tanh(x)                      # x: float32 / float16 / ml_dtypes.bfloat16
    with pn.trace() as t:
        pn.mean.sum_div(x, dim=-1)
    print(t.records[-1].cost, t.records[-1].cost.estimate("ascend910b"))
"""

from .errors import ConfigError, ConstraintError, DTypeError, PyptoNumbaError, ShapeError, TileError
from .machine.cost import Cost, Estimate
from .machine.plan import Plan
from .machine.profile import HardwareProfile, active_profile, load_profile, profiles, use_cast_mode, use_profile
from .strategy import SEED, strategies, trace
from .exact import exact_active, use_exact
from .compare import compare
from .advise import advise

# The ops, in the order the lab lists them (strategy.OPS, SEED, compare's tables, the report):
# each module registers its strategies and, at its end, its OP spec (pypto_numba/lab/spec.py).
# A new op is one more name here.
from . import gelu, mean, rope, attention, repeat_kv, moe, linear, embedding, rmsnorm, softmax, swiglu  # noqa: E402,I001
from . import tune  # noqa: E402  (tile search and the cube L0 model, from plans and profiles)
from . import layers  # noqa: E402  (model layers composed of the ops' calls)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "ConstraintError",
    "Cost",
    "DTypeError",
    "Estimate",
    "HardwareProfile",
    "Plan",
    "PyptoNumbaError",
    "SEED",
    "ShapeError",
    "TileError",
    "active_profile",
    "advise",
    "attention",
    "compare",
    "embedding",
    "exact_active",
    "gelu",
    "layers",
    "linear",
    "load_profile",
    "mean",
    "moe",
    "profiles",
    "repeat_kv",
    "rmsnorm",
    "rope",
    "softmax",
    "strategies",
    "swiglu",
    "trace",
    "tune",
    "use_cast_mode",
    "use_exact",
    "use_profile",
]
