"""What a run costs on the NPU, and estimates of its time on a hardware profile.

A :class:`Cost` is both predicted (by a strategy's plan, from shapes alone) and counted (by the
kernels, at the points where they move or compute). Tests hold the two equal for the counted
fields. Two fields are plan-only, which no kernel counts: ``gm_unique_bytes`` (the distinct GM
bytes among ``gm_read_bytes``: what the L2 can serve again is ``gm_read_bytes - gm_unique_bytes``)
and ``work`` (the pipe model's per-task inputs, machine/pipes.py). A counted Cost takes them from
its plan's kernel, so they are equal by construction and ``differences`` leaves them out.

``Cost.estimate(profile, dtype, model=...)`` has three models:

- ``"pipes"`` (the default): the per-pipe model of machine/pipes.py (MTE2, MTE1, CUBE, VECTOR,
  FIXPIPE, MTE3 per task, double-buffered overlap, waves over the cores, shared HBM and L2,
  launch and AICPU overheads); docs/model.md.
- ``"sim"``: the hicann simulator's per-tile-op cycle formula (machine/sim.py), a second
  estimator to compare with;
- ``"roofline"``: the first model, kept for comparison, below.

Counts add up across kernels; buffer peaks take the maximum. A Cost that is the sum of several
kernels remembers each kernel's own Cost (``kernel_costs()``) so the estimate can be made per
kernel: kernels run one after the other, each bounded by its slowest resource.

Roofline per kernel (documented model, rates from ``tiles/*.toml``)::

    cores     = cube cores if the kernel does cube FLOPs, else vector cores
    occupancy = min(tasks, cores) / cores           (tile tasks spread over the AI cores)
    t_memory  = (gm_read + gm_write) / (gm_bytes_per_s * occupancy)
    t_cube    = cube_flops / (cube rate for the operand dtype * occupancy)
    t_vector  = vector_ops / (vector_ops_per_s * occupancy)
    t_kernel  = launch_s + max(t_memory, t_cube, t_vector)

The bound of a kernel is the term that wins ("launch" when launch_s exceeds all three, and
"occupancy" when fewer than half the cores get a task); the bound of a run is the bound of the
kernel that contributes most time.
"""

from __future__ import annotations

import dataclasses

_COUNTS = (
    "kernels",
    "tasks",
    "gm_read_bytes",
    "gm_write_bytes",
    "workspace_bytes",
    "cube_flops",
    "vector_ops",
)
_PLANNED = ("gm_unique_bytes",)  # plan-only counts (see the module docstring)
MODELS = ("pipes", "roofline", "sim")
_PEAKS = (
    "ub_peak_bytes",
    "l1_peak_bytes",
    "l0a_peak_bytes",
    "l0b_peak_bytes",
    "l0c_peak_bytes",
)


@dataclasses.dataclass(frozen=True)
class Cost:
    """Kernel launches, tile tasks, GM traffic, GM workspace, on-chip buffer peaks and work."""

    kernels: int = 0
    tasks: int = 0
    gm_read_bytes: int = 0
    gm_write_bytes: int = 0
    workspace_bytes: int = 0
    ub_peak_bytes: int = 0
    l1_peak_bytes: int = 0
    l0a_peak_bytes: int = 0
    l0b_peak_bytes: int = 0
    l0c_peak_bytes: int = 0
    cube_flops: int = 0
    vector_ops: int = 0
    gm_unique_bytes: int = 0
    parts: tuple = dataclasses.field(default=(), compare=False, repr=False)
    work: object = dataclasses.field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for name in _COUNTS + _PEAKS + _PLANNED:
            value = getattr(self, name)
            if int(value) != value or value < 0:
                raise ValueError(f"Cost.{name} must be a non-negative integer, got {value!r}")
            object.__setattr__(self, name, int(value))

    @property
    def gm_bytes(self) -> int:
        """GM bytes read plus written."""
        return self.gm_read_bytes + self.gm_write_bytes

    def kernel_costs(self) -> tuple:
        """The per-kernel Costs this Cost is the sum of (itself for a single kernel, none for zero)."""
        if self.parts:
            return self.parts
        return () if self == Cost() else (self,)

    def __add__(self, other: "Cost") -> "Cost":
        if not isinstance(other, Cost):
            return NotImplemented
        values = {n: getattr(self, n) + getattr(other, n) for n in _COUNTS + _PLANNED}
        values.update({n: max(getattr(self, n), getattr(other, n)) for n in _PEAKS})
        return Cost(**values, parts=self.kernel_costs() + other.kernel_costs())

    def __radd__(self, other):
        if other == 0:  # sum([...]) starts from 0
            return self
        return NotImplemented

    def as_dict(self) -> dict:
        return {n: getattr(self, n) for n in _COUNTS + _PEAKS + _PLANNED}

    def differences(self, other: "Cost") -> dict:
        """Counted fields where ``self`` and ``other`` differ: name -> (self, other)."""
        return {
            n: (getattr(self, n), getattr(other, n))
            for n in _COUNTS + _PEAKS
            if getattr(self, n) != getattr(other, n)
        }

    def estimate(self, profile=None, dtype: str = "bf16", model: str = "pipes", variant: str = None) -> "Estimate":
        """NPU time on ``profile`` (name or HardwareProfile; None = active profile).

        ``model``: "pipes" (default, machine/pipes.py), "roofline" or "sim" (the hicann
        simulator's per-tile-op formula, machine/sim.py). ``dtype`` is the cube operand dtype
        where the Cost carries no plan (the roofline's "fp32" uses the fp32 cube rate).
        ``variant`` (pipes and sim): the vector ISA reading of machine/isa.py, "pto-isa"
        (default: tanh composed of exp and div) or "seed" (tanh one instruction).
        """
        from .profile import load_profile

        if model not in MODELS:
            raise ValueError(f"unknown estimate model {model!r}; known: {', '.join(MODELS)}")
        prof = load_profile(profile)
        if model == "roofline":
            rows = [_kernel_estimate(k, prof, dtype) for k in self.kernel_costs()]
        else:
            from . import isa, pipes, sim

            variant = isa.check_variant(variant)
            run = pipes.kernel_estimate if model == "pipes" else sim.kernel_estimate
            rows = [run(k, k.work if k.work is not None else pipes.work_of_cost(k, dtype), prof, variant)
                    for k in self.kernel_costs()]
        total = sum(r["seconds"] for r in rows)
        bound = max(rows, key=lambda r: r["seconds"])["bound"] if rows else "none"
        return Estimate(seconds=total, bound=bound, kernels=tuple(rows), profile=prof.name, model=model)


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Estimated NPU time of a run and the resource that bounds it."""

    seconds: float
    bound: str
    kernels: tuple = ()
    profile: str = ""
    model: str = "roofline"

    @property
    def pipes(self) -> dict:
        """Busy seconds per pipe summed over the kernels (pipes and sim; {} for the roofline)."""
        out = {}
        for row in self.kernels:
            for pipe, seconds in row.get("pipes", {}).items():
                out[pipe] = out.get(pipe, 0.0) + seconds
        return out

    @property
    def microseconds(self) -> float:
        return self.seconds * 1e6

    def __str__(self):
        return f"{self.seconds * 1e6:.1f} us ({self.bound}-bound on {self.profile})"


def _kernel_estimate(k: Cost, prof, dtype: str) -> dict:
    launches = max(k.kernels, 1)
    cores = prof.cube_cores if k.cube_flops else prof.vector_cores
    tasks = max(k.tasks, 1)
    occupancy = min(tasks, cores) / cores
    cube_rate = prof.cube_fp32_flops_per_s if dtype == "fp32" else prof.cube_flops_per_s
    terms = {
        "memory": k.gm_bytes / (prof.gm_bytes_per_s * occupancy),
        "cube": k.cube_flops / (cube_rate * occupancy),
        "vector": k.vector_ops / (prof.vector_ops_per_s * occupancy),
    }
    launch = launches * prof.launch_s
    bound, work = max(terms.items(), key=lambda kv: kv[1])
    if launch >= work:
        bound = "launch"
    elif occupancy < 0.5:
        # fewer than half the cores have a task: the winning term would be at least twice as
        # small on a fully occupied NPU, so occupancy is what limits this kernel
        bound = "occupancy"
    return {"seconds": launch + work, "bound": bound, "occupancy": occupancy, **terms}
