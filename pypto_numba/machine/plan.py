"""Plans: the buffers each kernel of a strategy declares, checked against a hardware profile.

A strategy's ``plan()`` builds a :class:`Plan` from shapes and dtype alone (it never touches
data). Building it validates every buffer the way the NPU compiler would, and raises
:class:`~pypto_numba.errors.TileError` with the numbers and a way out when something does not fit:

- vector tiles: rank <= ``max_tile_rank``, every dim > 0, last dim x itemsize a multiple of
  ``align_bytes`` (32 B) -- :func:`vector_tile`;
- reduction tiles <= ``reduce_tile_max_bytes`` (64 KiB) -- :func:`reduce_tile`;
- cube tiles ``((mL0, mL1), (kL0, kL1), (nL0, nL1))`` with the L0A/L0B/L0C/L1/BT budget and
  alignment rules of npu-facts 4.3 -- :func:`cube_tiles`;
- per kernel, the buffers of one level that are live together fit its limit -- :class:`Plan`;
  for UB that is the compiler-safe Vec limit ``vec_safe_bytes`` (184 KB of the 192 KB on A2/A3,
  npu-facts 8.1), elsewhere the capacity.

The plan's :attr:`Plan.cost` is what the kernels must count when they run. :attr:`Plan.hints`
(PH001, MARGINAL) and :meth:`Plan.memory_report` are data for the CLI and pages
(machine/limits.py builds them); they never raise or warn.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import types

import numpy as np

from ..errors import TileError
from .cost import Cost
from .profile import HardwareProfile, load_profile

ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "int32": 4, "int64": 8, "int8": 1, "uint8": 1, "bool": 1}
LEVELS = ("UB", "L1", "L0A", "L0B", "L0C", "BT")
_PEAK_FIELD = {
    "UB": "ub_peak_bytes",
    "L1": "l1_peak_bytes",
    "L0A": "l0a_peak_bytes",
    "L0B": "l0b_peak_bytes",
    "L0C": "l0c_peak_bytes",
}


def align_up(n: int, multiple: int) -> int:
    """Smallest multiple of ``multiple`` that is >= ``n``."""
    return -(-int(n) // int(multiple)) * int(multiple)


def align_elems(n: int, dtype: str, profile: HardwareProfile) -> int:
    """``n`` elements rounded up so that they span a multiple of the alignment (32 B)."""
    per_block = max(1, profile.align_bytes // ITEMSIZE[dtype])
    return align_up(max(int(n), 1), per_block)


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One on-chip buffer of a kernel: a tile in UB, L1, L0A, L0B, L0C or BT."""

    name: str
    level: str
    shape: tuple
    dtype: str

    def __post_init__(self):
        if self.level not in LEVELS:
            raise ValueError(f"buffer {self.name!r}: unknown level {self.level!r}, expected one of {LEVELS}")
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]

    def __str__(self):
        dims = "x".join(str(d) for d in self.shape)
        return f"{self.name}[{dims}] {self.dtype} ({self.nbytes} B)"


@dataclasses.dataclass(frozen=True)
class KernelPlan:
    """One kernel launch: its tile tasks, live buffers, GM traffic and work.

    The fields after ``vector_ops`` are optional inputs of the pipe time model
    (machine/pipes.py); left at their defaults, :func:`~pypto_numba.machine.pipes.work_of_plan`
    derives them from the fields before. They are plan-only: no kernel counts them.

    - ``gm_unique_bytes``: distinct GM bytes read (None: derived; every byte once for a vector
      kernel, the walk's operands for a cube kernel);
    - ``tiles_per_task``: tile steps per task (0: GM reads per task / one tile's loads);
    - ``load_bytes`` / ``store_bytes``: bytes of one GM read / write transfer (0: the tile's buffers);
    - ``vector_mix``: ((kind, dtype, elements), ...) over the whole kernel, kinds from
      machine/isa.py (PTO instructions or sequences such as "tanh"); () charges ``vector_ops`` as
      fp32 TMULs;
    - ``vector_tile_elems`` / ``vector_cols``: elements and cols of one vector instruction's tile
      (0: the largest UB buffer);
    - ``cube_task``: (M, N, K) of one task's matmul (None: derived from the L1 buffers).
    """

    name: str
    unit: str  # "vector", "cube" or "mixed" (cube + vector in one fused kernel)
    tasks: int
    buffers: tuple = ()
    gm_read_bytes: int = 0
    gm_write_bytes: int = 0
    workspace_bytes: int = 0
    cube_flops: int = 0
    vector_ops: int = 0
    gm_unique_bytes: int = None
    tiles_per_task: int = 0
    load_bytes: int = 0
    store_bytes: int = 0
    vector_mix: tuple = ()
    vector_tile_elems: int = 0
    vector_cols: int = 0
    cube_task: tuple = None

    def level_bytes(self, level: str) -> int:
        return sum(b.nbytes for b in self.buffers if b.level == level)

    @functools.cached_property
    def work(self):
        """The pipe model's per-task inputs (:class:`~pypto_numba.machine.pipes.Work`)."""
        from .pipes import work_of_plan

        return work_of_plan(self)

    @functools.cached_property
    def cost(self) -> Cost:
        """The planned Cost (computed once: plans are immutable and shared, machine/memo.py)."""
        peaks = {field: self.level_bytes(level) for level, field in _PEAK_FIELD.items()}
        work = self.work
        return Cost(
            gm_unique_bytes=work.gm_unique_bytes,
            work=work,
            kernels=1,
            tasks=self.tasks,
            gm_read_bytes=self.gm_read_bytes,
            gm_write_bytes=self.gm_write_bytes,
            workspace_bytes=self.workspace_bytes,
            cube_flops=self.cube_flops,
            vector_ops=self.vector_ops,
            **peaks,
        )


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a strategy will do for given shapes: validated against ``profile`` on creation.

    ``params`` holds the resolved options (tile sizes and such) the kernels will be run with.
    ``hint`` is the way out offered when a buffer does not fit.
    """

    op: str
    strategy: str
    dtype: str
    profile: HardwareProfile
    kernels: tuple
    params: dict = dataclasses.field(default_factory=dict)
    hint: str = ""

    def __post_init__(self):
        object.__setattr__(self, "kernels", tuple(self.kernels))
        # read-only: plans are shared between calls (machine/memo.py)
        object.__setattr__(self, "params", types.MappingProxyType(dict(self.params)))
        for kernel in self.kernels:
            for level in LEVELS:
                used = kernel.level_bytes(level)
                cap = self.profile.limit(level)
                if used > cap:
                    self._refuse(kernel, level, used, cap)

    def _refuse(self, kernel, level, used, cap):
        buffers = [b for b in kernel.buffers if b.level == level]
        parts = " + ".join(str(b) for b in buffers)
        largest = max(buffers, key=lambda b: b.nbytes)
        if level == "UB":
            limit = (f"{self.profile.name} allows {cap} B (the compiler-safe Vec limit, npu-facts 8.1; "
                     f"physical UB {self.profile.ub_bytes} B)")
        else:
            limit = f"{self.profile.name} has {cap} B"
        tiles = {k: v for k, v in self.params.items() if "tile" in k}
        cause = f"largest buffer {largest.name!r} ({largest.nbytes} B)" + (f", tiles {tiles}" if tiles else "")
        raise TileError(
            f"{self.where}: kernel {kernel.name!r} needs {used} B of {level} ({parts}) but {limit}; "
            f"{cause}; " + (self.hint or "use smaller tiles")
        )

    @functools.cached_property
    def hints(self) -> tuple:
        """Performance and capacity hints (:class:`~pypto_numba.machine.limits.Hint` records)."""
        from .limits import plan_hints

        return plan_hints(self)

    def memory_report(self):
        """Per kernel and space: used, limit, usage % (like the compiler's
        ``memory_after_AllocateMemoryAddr.txt``, npu-facts 8.1)."""
        from .limits import memory_report

        return memory_report(self)

    @property
    def where(self) -> str:
        return f"{self.op}.{self.strategy}"

    @functools.cached_property
    def cost(self) -> Cost:
        """The planned Cost of all kernels (computed once)."""
        return sum((k.cost for k in self.kernels), Cost())

    def estimate(self, profile=None, model: str = "pipes", variant: str = None):
        """NPU time on this plan's profile (or ``profile``) by ``model`` ("pipes", "roofline", "sim";
        see :meth:`pypto_numba.machine.cost.Cost.estimate`)."""
        return self.cost.estimate(profile or self.profile, self.dtype, model=model, variant=variant)

    def timeline(self, profile=None, variant: str = None):
        """The pipe model's schedule of this plan's kernels as a Chrome / Perfetto trace
        (:class:`~pypto_numba.machine.timeline.Timeline`: ``.events``, ``.to_json()``, ``.save(path)``);
        its makespan is ``self.estimate(profile).seconds``."""
        from .timeline import plan_timeline

        return plan_timeline(self, profile, variant)


def vector_tile(name: str, shape, dtype: str, profile: HardwareProfile, where: str, hint: str = "") -> Buffer:
    """A UB tile after checking PyPTO's vector tile rules (npu-facts 4.2)."""
    shape = tuple(int(d) for d in shape)
    tail = f"; {hint}" if hint else ""
    if not 1 <= len(shape) <= profile.max_tile_rank:
        raise TileError(
            f"{where}: tile {name} has rank {len(shape)}; PyPTO tiles have 1 to "
            f"{profile.max_tile_rank} dims{tail}"
        )
    if any(d <= 0 for d in shape):
        raise TileError(f"{where}: tile {name} shape {shape} has a dim <= 0{tail}")
    last = shape[-1] * ITEMSIZE[dtype]
    if last % profile.align_bytes:
        good = align_elems(shape[-1], dtype, profile)
        raise TileError(
            f"{where}: tile {name} last dim {shape[-1]} x {ITEMSIZE[dtype]} B = {last} B is not a "
            f"multiple of {profile.align_bytes} B ({profile.name}); use {good}{tail}"
        )
    return Buffer(name, "UB", shape, dtype)


def reduce_tile(buffer: Buffer, profile: HardwareProfile, where: str, hint: str = "") -> Buffer:
    """Check that a reduction's input tile stays within ``reduce_tile_max_bytes`` (64 KiB)."""
    if buffer.nbytes > profile.reduce_tile_max_bytes:
        raise TileError(
            f"{where}: reduction tile {buffer} exceeds the {profile.reduce_tile_max_bytes} B "
            f"limit of {profile.name}" + (f"; {hint}" if hint else "")
        )
    return buffer


def _a16(n: int) -> int:
    return align_up(n, 16)


def cube_tiles(tiles, a_dtype: str, b_dtype: str, profile: HardwareProfile, where: str, *, bias: bool = False) -> tuple:
    """Validate ``((mL0, mL1), (kL0, kL1), (nL0, nL1))`` and return the cube buffers.

    Rules (npu-facts 4.3): every value > 0 and a multiple of the alignment unit of its operand
    dtype (32 bytes, and at least the 16-element cube fractal: 16 elements for fp16/bf16 and for
    fp32, 32 for int8), L0 <= L1 and L1 % L0 == 0; ``A16(mL0)*A16(kL0)*sizeof(a) <= L0A``, ``A16(nL0)*A16(kL0)*sizeof(b) <=
    L0B``, ``A16(mL0)*A16(nL0)*4 <= L0C`` (fp32 accumulator),
    ``A16(mL1)*A16(kL1)*sizeof(a) + A16(nL1)*A16(kL1)*sizeof(b) <= L1``; with a bias,
    ``nL0*4 <= BT``. Returns the buffers (L1 A/B, L0A, L0B, L0C[, BT]).
    """
    shape_msg = f"{where}: cube_tiles must be ((mL0, mL1), (kL0, kL1), (nL0, nL1)) of integers, got {tiles!r}"
    try:
        pairs = [tuple(p) for p in tiles]
    except TypeError:
        raise TileError(shape_msg) from None
    if len(pairs) != 3 or any(len(p) != 2 for p in pairs):
        raise TileError(shape_msg)
    # int() would truncate 16.5 to 16 and read True as 1: only true integers are tile sizes
    if any(isinstance(v, (bool, np.bool_)) or not isinstance(v, numbers.Integral) for p in pairs for v in p):
        raise TileError(shape_msg)
    (m0, m1), (k0, k1), (n0, n1) = ((int(a), int(b)) for a, b in pairs)
    a_size, b_size = ITEMSIZE[a_dtype], ITEMSIZE[b_dtype]
    for axis, (l0, l1), size in (("m", (m0, m1), a_size), ("k", (k0, k1), a_size), ("n", (n0, n1), b_size)):
        if l0 <= 0 or l1 <= 0:
            raise TileError(f"{where}: cube tile {axis} = [{l0}, {l1}] must be > 0")
        if l0 > l1 or l1 % l0:
            raise TileError(
                f"{where}: cube tile {axis} = [{l0}, {l1}] needs {axis}L0 <= {axis}L1 and "
                f"{axis}L1 % {axis}L0 == 0"
            )
        unit = max(profile.cube_fractal[0], profile.align_bytes // size)
        for value in (l0, l1):
            if value % unit:
                raise TileError(
                    f"{where}: cube tile {axis} value {value} is not a multiple of {unit} elements "
                    f"(32-byte and fractal alignment for {size}-byte operands on {profile.name}); "
                    f"use {align_up(value, unit)}"
                )
    l0a = _a16(m0) * _a16(k0) * a_size
    l0b = _a16(n0) * _a16(k0) * b_size
    l0c = _a16(m0) * _a16(n0) * 4
    l1 = _a16(m1) * _a16(k1) * a_size + _a16(n1) * _a16(k1) * b_size
    checks = (
        ("L0A", l0a, profile.l0a_bytes, f"A16(mL0={m0})*A16(kL0={k0})*{a_size}"),
        ("L0B", l0b, profile.l0b_bytes, f"A16(nL0={n0})*A16(kL0={k0})*{b_size}"),
        ("L0C", l0c, profile.l0c_bytes, f"A16(mL0={m0})*A16(nL0={n0})*4"),
        ("L1", l1, profile.l1_bytes, f"A16(mL1={m1})*A16(kL1={k1})*{a_size} + A16(nL1={n1})*A16(kL1={k1})*{b_size}"),
    )
    if bias:
        checks += (("BT", n0 * 4, profile.bt_bytes, f"nL0={n0}*4"),)
    for level, used, cap, formula in checks:
        if used > cap:
            raise TileError(
                f"{where}: cube tiles {((m0, m1), (k0, k1), (n0, n1))} need {level} = {formula} = "
                f"{used} B but {profile.name} has {cap} B; use smaller tiles on that axis"
            )
    buffers = (
        Buffer("a_l1", "L1", (_a16(m1), _a16(k1)), a_dtype),
        Buffer("b_l1", "L1", (_a16(n1), _a16(k1)), b_dtype),
        Buffer("a_l0", "L0A", (_a16(m0), _a16(k0)), a_dtype),
        Buffer("b_l0", "L0B", (_a16(n0), _a16(k0)), b_dtype),
        Buffer("c_l0", "L0C", (_a16(m0), _a16(n0)), "fp32"),
    )
    if bias:
        buffers += (Buffer("bias_bt", "BT", (n0,), "fp32"),)
    return buffers


def resolve_profile(profile) -> HardwareProfile:
    """``profile=`` argument of every public function: None, a name, or a HardwareProfile."""
    return load_profile(profile)
