"""Hardware profiles: the NPU's buffers, rules, cores and rates, loaded from ``tiles/*.toml``.

The TOML files are the single source of truth for every hardware number. A profile may name a
``base`` profile and override only what differs. The active profile is, in order: the innermost
``use_profile(...)`` of the current thread/context, ``$PYPTO_NUMBA_PROFILE``, ``ascend910b``.

The cast mode of the vector unit's fp32 -> bf16/fp16 narrowings (``machine/dtypes.py``) is, in
order: a strategy's ``cast_mode=`` argument, the innermost ``use_cast_mode(...)``,
``$PYPTO_NUMBA_CAST_MODE``, the profile's ``[numerics] cast_mode`` (``rint`` for the hicann
lineage, npu-facts 4.5). PyPTO's ``pl.cast`` defaults to ``round`` (ties away, npu-facts 8.3):
``use_cast_mode("round")`` emulates a kernel written with it. The cube's FIXPIPE always narrows
with ``rint`` (npu-facts 8.3), whatever the mode.
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import re
import sys
from functools import lru_cache
from pathlib import Path
from typing import Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on CPython 3.10 by tox
    import tomli as tomllib

from ..errors import PyptoNumbaError

DEFAULT_PROFILE = "ascend910b"
ENV_VAR = "PYPTO_NUMBA_PROFILE"
CAST_MODE_ENV_VAR = "PYPTO_NUMBA_CAST_MODE"


class ProfileError(PyptoNumbaError, KeyError):
    """An unknown or malformed hardware profile."""

    def __str__(self):  # KeyError would otherwise repr() the message
        return str(self.args[0]) if self.args else ""


def _tiles_dir() -> Path:
    here = Path(__file__).resolve().parent.parent
    for candidate in (here / "tiles", here.parent / "tiles"):  # wheel, then source tree
        if candidate.is_dir():
            return candidate
    raise ProfileError(f"no tiles/ directory found next to {here}")


@dataclasses.dataclass(frozen=True)
class CubeModel:
    """Constants of the device-fitted L0 tile model (``[cube_model]``; npu-facts 8.2, used by
    ``pypto_numba.tune``). Rates in bytes per cube-core cycle, costs in cycles."""

    bw_a: float             # L1 -> L0A
    bw_b: float             # L1 -> L0B
    mad_head: float         # issue overhead per K-fractal of a TMATMUL
    mad_fp32_passes: int    # passes per K-fractal of an fp32-operand MMAD
    k_fractal_bytes: int    # K-fractal width (kt = k_fractal_bytes / operand bytes); L0C N0 likewise
    drain_fixed: float      # FIXPIPE cost per output tile
    drain_row: float        # FIXPIPE floor per M-row
    bw_drain: float         # FIXPIPE bytes per cycle per M-row
    drain_penalty: float    # per M-row and extra pass of a non-power-of-two N-fractal count
    l0c_align_m: int        # L0C M alignment (rows) of an fp32 accumulator
    isa_mad_head: float     # PTO-ISA's simpler MAD formula (npu-facts 8.6): fixed cycles per TMATMUL
    isa_fp32_passes: int    # PTO-ISA's passes for fp32 operands (1 otherwise)


@dataclasses.dataclass(frozen=True)
class PipeRates:
    """Constants of the per-pipe time model (``[pipes]``; machine/pipes.py, docs/model.md).

    Per-core transfers follow PTO-ISA's size-dependent fit ``bw(B) = peak * B / (k + B)`` GiB/s
    (npu-facts 8.6; k = 0 is a flat rate); all cores share the chip's HBM and L2 bandwidths.
    Overheads are hicann simulator cycles at ``sim_clock_hz`` (npu-facts 5.2)."""

    gm_to_ub_peak_gibs: float   # MTE2 GM -> UB
    gm_to_ub_k_bytes: float
    gm_to_l1_peak_gibs: float   # MTE2 GM -> L1
    gm_to_l1_k_bytes: float
    ub_to_gm_peak_gibs: float   # MTE3 UB -> GM
    ub_to_gm_k_bytes: float
    l2_bytes: int               # the chip's L2
    hbm_bytes_per_s: float      # assumption: the chip's HBM bandwidth, shared by all cores
    l2_bytes_per_s: float       # assumption: the chip's L2 bandwidth for re-read (hit) bytes
    vector_slope_scale: float   # per-element vector cycles relative to the A2/A3 fit (1 on A2/A3)
    sim_clock_hz: float         # the clock of the hicann cycle counts below
    stitch_cycles: float        # per kernel launch (device stitch latency)
    submit_cycles: float        # per kernel launch (submit latency)
    aicpu_completion_cycles: float  # per task
    aicpu_scheduler_cycles: float   # per task
    aicpu_resolve_cycles: float     # per task
    aicpu_threads: int          # AICPU scheduler threads dispatching tasks

    @property
    def launch_s(self) -> float:
        return (self.stitch_cycles + self.submit_cycles) / self.sim_clock_hz

    @property
    def task_s(self) -> float:
        """AICPU time per task: completion + resolve + schedule."""
        return (self.aicpu_completion_cycles + self.aicpu_scheduler_cycles + self.aicpu_resolve_cycles) / self.sim_clock_hz


@dataclasses.dataclass(frozen=True)
class HardwareProfile:
    """One NPU's numbers. Sizes in bytes, rates per second."""

    name: str
    description: str
    # buffers
    ub_bytes: int           # physical UB
    vec_safe_bytes: int     # what the compiler lets Vec buffers use inside UB (npu-facts 8.1)
    l1_bytes: int
    l0a_bytes: int
    l0b_bytes: int
    l0c_bytes: int
    bt_bytes: int
    fb_bytes: int
    # rules
    align_bytes: int
    max_tile_rank: int
    reduce_tile_max_bytes: int
    topk_tile_max_bytes: int
    matmul_inner_max: int
    max_elements: int
    cube_fractal: tuple
    # cores
    cube_cores: int
    vector_cores: int
    clock_hz: float
    # rates (for the NPU-time estimate)
    gm_bytes_per_s: float
    cube_flops_per_s: float
    cube_fp32_flops_per_s: float
    vector_ops_per_s: float
    launch_s: float
    # default tile shapes per op
    tiles: Mapping[str, object] = dataclasses.field(default_factory=dict)
    # the cube's L0 tile cost model ([cube_model])
    cube_model: CubeModel = None
    # the per-pipe time model ([pipes])
    pipes: PipeRates = None
    # the default fp32 -> bf16/fp16 cast mode of the vector unit ([numerics] cast_mode)
    cast_mode: str = "rint"

    def tile(self, key: str):
        """The default tile for ``key`` (e.g. ``"gelu_tile"``); KeyError names the profile."""
        try:
            return self.tiles[key]
        except KeyError:
            raise ProfileError(
                f"profile {self.name!r} has no default tile {key!r}; known: {sorted(self.tiles)}"
            ) from None

    def capacity(self, level: str) -> int:
        """Capacity in bytes of buffer level ``UB``, ``L1``, ``L0A``, ``L0B``, ``L0C`` or ``BT``."""
        return {
            "UB": self.ub_bytes,
            "L1": self.l1_bytes,
            "L0A": self.l0a_bytes,
            "L0B": self.l0b_bytes,
            "L0C": self.l0c_bytes,
            "BT": self.bt_bytes,
            "FB": self.fb_bytes,
        }[level]

    def limit(self, level: str) -> int:
        """What plans may use of ``level``: the capacity, except UB, where the compiler's safe Vec
        limit ``vec_safe_bytes`` applies (npu-facts 8.1)."""
        return self.vec_safe_bytes if level == "UB" else self.capacity(level)


_FIELDS = {
    ("memory", "ub_bytes"): int,
    ("memory", "l1_bytes"): int,
    ("memory", "l0a_bytes"): int,
    ("memory", "l0b_bytes"): int,
    ("memory", "l0c_bytes"): int,
    ("memory", "bt_bytes"): int,
    ("memory", "fb_bytes"): int,
    ("memory", "vec_safe_bytes"): int,
    ("rules", "align_bytes"): int,
    ("rules", "max_tile_rank"): int,
    ("rules", "reduce_tile_max_bytes"): int,
    ("rules", "topk_tile_max_bytes"): int,
    ("rules", "matmul_inner_max"): int,
    ("rules", "max_elements"): int,
    ("rules", "cube_fractal"): tuple,
    ("cores", "cube"): int,
    ("cores", "vector"): int,
    ("cores", "clock_hz"): float,
    ("rates", "gm_bytes_per_s"): float,
    ("rates", "cube_flops_per_s"): float,
    ("rates", "cube_fp32_flops_per_s"): float,
    ("rates", "vector_ops_per_s"): float,
    ("rates", "launch_s"): float,
}
_RENAME = {("cores", "cube"): "cube_cores", ("cores", "vector"): "vector_cores"}


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


# a profile name is a file stem in tiles/: no path separators, no leading dot ("../x" must not
# reach a file outside tiles/)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def _read(name: str, seen: tuple = ()) -> dict:
    path = _tiles_dir() / f"{name}.toml"
    if not isinstance(name, str) or not _NAME.fullmatch(name) or not path.is_file():
        raise ProfileError(
            f"unknown hardware profile {name!r}; known profiles: {', '.join(profiles())} "
            f"(files in {_tiles_dir()})"
        )
    if name in seen:
        raise ProfileError(f"profile {name!r}: 'base' chain loops through {seen}")
    with open(path, "rb") as fh:
        try:
            data = tomllib.load(fh)
        except tomllib.TOMLDecodeError as exc:
            raise ProfileError(f"profile file {path} is not valid TOML: {exc}") from None
    base = data.pop("base", None)
    if base is not None:
        data = _merge(_read(base, seen + (name,)), data)
    return data


def _build(name: str, data: dict) -> HardwareProfile:
    kwargs = {"name": data.get("name", name), "description": data.get("description", "")}
    for (section, key), kind in _FIELDS.items():
        try:
            raw = data[section][key]
        except KeyError:
            raise ProfileError(f"profile {name!r} lacks [{section}] {key}") from None
        try:
            value = tuple(int(v) for v in raw) if kind is tuple else kind(raw)
        except (TypeError, ValueError):
            raise ProfileError(f"profile {name!r}: [{section}] {key} = {raw!r} is not a {kind.__name__}") from None
        if kind is not tuple and value <= 0:
            raise ProfileError(f"profile {name!r}: [{section}] {key} = {raw!r} must be > 0")
        kwargs[_RENAME.get((section, key), key)] = value
    if kwargs["vec_safe_bytes"] > kwargs["ub_bytes"]:
        raise ProfileError(f"profile {name!r}: [memory] vec_safe_bytes = {kwargs['vec_safe_bytes']} exceeds "
                           f"ub_bytes = {kwargs['ub_bytes']}")
    tiles = {}
    for key, value in data.get("tiles", {}).items():
        tiles[key] = _freeze(value)
    kwargs["tiles"] = tiles
    kwargs["cube_model"] = _cube_model(name, data.get("cube_model", {}))
    kwargs["pipes"] = _section(name, "pipes", PipeRates, data.get("pipes", {}), zero_ok=("_k_bytes",))
    kwargs["cast_mode"] = _cast_mode_field(name, data.get("numerics", {}))
    return HardwareProfile(**kwargs)


def _cast_mode_field(name: str, section: dict) -> str:
    from .dtypes import CAST_MODES

    mode = section.get("cast_mode", "rint")
    if mode not in CAST_MODES:
        raise ProfileError(f"profile {name!r}: [numerics] cast_mode = {mode!r} is not one of {', '.join(CAST_MODES)}")
    return mode


def _cube_model(name: str, section: dict) -> CubeModel:
    return _section(name, "cube_model", CubeModel, section)


def _section(name: str, title: str, cls, section: dict, zero_ok: tuple = ()):
    """A frozen dataclass of numbers from TOML section [title]: every field present, > 0 (>= 0
    for the fields whose names end with one of ``zero_ok``)."""
    values = {}
    for field in dataclasses.fields(cls):
        kind = int if field.type == "int" else float
        try:
            raw = section[field.name]
        except KeyError:
            raise ProfileError(f"profile {name!r} lacks [{title}] {field.name}") from None
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or (kind is int and raw != int(raw)):
            raise ProfileError(f"profile {name!r}: [{title}] {field.name} = {raw!r} is not a {kind.__name__}")
        may_be_zero = any(field.name.endswith(tail) for tail in zero_ok)
        if raw < 0 or (raw == 0 and not may_be_zero):
            raise ProfileError(f"profile {name!r}: [{title}] {field.name} = {raw!r} must be "
                               f"{'>= 0' if may_be_zero else '> 0'}")
        values[field.name] = kind(raw)
    return cls(**values)


def _freeze(value):
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def profiles() -> list:
    """Names of the profiles shipped in ``tiles/``, sorted."""
    return sorted(p.stem for p in _tiles_dir().glob("*.toml"))


@lru_cache(maxsize=None)
def _load(name: str) -> HardwareProfile:
    return _build(name, _read(name))


def load_profile(name=None) -> HardwareProfile:
    """The profile called ``name`` (a HardwareProfile passes through); None -> the active one."""
    if name is None:
        return active_profile()
    if isinstance(name, HardwareProfile):
        return name
    if not isinstance(name, str):
        raise ProfileError(f"profile must be a name or a HardwareProfile, not {type(name).__name__}")
    return _load(name)


_ACTIVE: contextvars.ContextVar = contextvars.ContextVar("pypto_numba_profile", default=None)


def active_profile() -> HardwareProfile:
    """The profile in force: innermost ``use_profile``, else ``$PYPTO_NUMBA_PROFILE``, else the default."""
    current = _ACTIVE.get()
    if current is not None:
        return current
    return _load(os.environ.get(ENV_VAR) or DEFAULT_PROFILE)


class use_profile:
    """Make ``name`` the active profile: ``with use_profile("ascend950"): ...``.

    Called without ``with`` it switches the profile for the current context until
    :meth:`restore` (or the end of the thread).
    """

    def __init__(self, name):
        self.profile = load_profile(name)
        self._token = _ACTIVE.set(self.profile)

    def restore(self):
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None

    def __enter__(self) -> HardwareProfile:
        return self.profile

    def __exit__(self, *exc):
        self.restore()
        return False


_CAST_MODE: contextvars.ContextVar = contextvars.ContextVar("pypto_numba_cast_mode", default=None)


def resolve_cast_mode(cast_mode=None, profile=None, where: str = None, narrows: bool = True):
    """The :class:`~.dtypes.CastMode` a strategy narrows with: ``cast_mode`` if given, else the
    innermost ``use_cast_mode``, else ``$PYPTO_NUMBA_CAST_MODE``, else the profile's default. An
    unknown name raises ``CastModeError`` listing the modes (prefixed ``where:``), whatever the
    dtype. ``narrows=False`` (an fp32 call): the name is still checked, and rint is returned, so
    such a call keeps the kernel it always had."""
    from .dtypes import RINT, cast_mode as _mode

    if cast_mode is None:
        cast_mode = _CAST_MODE.get()
    env = os.environ.get(CAST_MODE_ENV_VAR) if cast_mode is None else None
    if env:
        mode = _mode(env, f"${CAST_MODE_ENV_VAR}")
    else:
        mode = _mode(load_profile(profile).cast_mode if cast_mode is None else cast_mode, where)
    return mode if narrows else RINT


class use_cast_mode:
    """Make ``mode`` the cast mode of every strategy: ``with use_cast_mode("round"): ...``
    (PyPTO's ``pl.cast`` default). Like :class:`use_profile`, without ``with`` it holds for the
    current context until :meth:`restore`."""

    def __init__(self, mode):
        from .dtypes import cast_mode as _mode

        self.mode = _mode(mode, "use_cast_mode")
        self._token = _CAST_MODE.set(self.mode)

    def restore(self):
        if self._token is not None:
            _CAST_MODE.reset(self._token)
            self._token = None

    def __enter__(self):
        return self.mode

    def __exit__(self, *exc):
        self.restore()
        return False
