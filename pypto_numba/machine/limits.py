"""A plan's hints and memory report: how close its buffers come to what the compiler enforces.

Both are data, built on demand from a validated :class:`~pypto_numba.machine.plan.Plan` (the
plan has already refused anything over a limit):

- :func:`plan_hints` -> :class:`Hint` records:
  ``PH001``: a kernel tiles an innermost dim under 512 B; the 910B backend's GM access granularity
  and L2 line are 512 B and the compiler emits ``[perf_hint PH001] TileInnermostDimGranularity``
  (npu-facts 8.1). One hint per plan, naming the narrow buffers (kernel.buffer), not one per
  buffer: bf16 D = 128 rows (256 B) are in most attention kernels.
  ``MARGINAL``: a kernel's space (UB against the safe Vec limit, L1, L0A, L0B, L0C) is within
  ``MARGIN`` of its limit, where a slightly larger tile or another live buffer would be refused.
- :func:`memory_report` -> :class:`MemoryReport`: per kernel and space, used / limit / usage,
  like the compiler's ``memory_after_AllocateMemoryAddr.txt`` (npu-facts 8.1).
"""

from __future__ import annotations

import dataclasses

GRANULE_BYTES = 512  # npu-facts 8.1: 910B GM access granularity / L2 line; PH001 below it
MARGIN = 0.15  # MARGINAL when used >= (1 - MARGIN) x limit
MARGIN_LEVELS = ("UB", "L1", "L0A", "L0B", "L0C")
_LOADED_LEVELS = ("UB", "L1")  # tiles that tile.load fills from GM


@dataclasses.dataclass(frozen=True)
class Hint:
    """One hint of a plan: ``code`` (``PH001`` or ``MARGINAL``), a message for people, the
    kernel(s) (comma-separated for PH001) and the buffer(s) or space it is about."""

    code: str
    message: str
    kernel: str
    buffer: str  # PH001: the narrow buffers as kernel.buffer, comma-separated; MARGINAL: the space (UB, L1, ...)

    def __str__(self):
        return f"[{self.code}] {self.message}"


@dataclasses.dataclass(frozen=True)
class MemoryRow:
    kernel: str
    space: str
    used: int
    limit: int

    @property
    def usage(self) -> float:
        """Used / limit, in percent."""
        return 100.0 * self.used / self.limit


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """Rows (kernel, space, used, limit, usage %) of one plan; ``str()`` is an aligned table."""

    where: str
    profile: str
    rows: tuple
    ub_physical: int

    def to_dicts(self) -> list:
        return [dict(dataclasses.asdict(r), usage=round(r.usage, 1)) for r in self.rows]

    def __str__(self):
        head = ("kernel", "space", "used", "limit", "usage")
        body = [(r.kernel, r.space, f"{r.used} B", f"{r.limit} B", f"{r.usage:.1f}%") for r in self.rows]
        widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h) for i, h in enumerate(head)]
        right = (False, False, True, True, True)
        fmt = lambda row: "  ".join(c.rjust(w) if r else c.ljust(w) for c, w, r in zip(row, widths, right)).rstrip()  # noqa: E731
        lines = [f"memory of {self.where} on {self.profile} (UB limit: compiler-safe Vec, physical UB "
                 f"{self.ub_physical} B)", fmt(head), fmt(["-" * w for w in widths])]
        return "\n".join(lines + [fmt(row) for row in body])


def memory_report(plan) -> MemoryReport:
    from .plan import LEVELS

    rows = []
    for kernel in plan.kernels:
        for level in LEVELS:
            used = kernel.level_bytes(level)
            if used:
                rows.append(MemoryRow(kernel.name, level, used, plan.profile.limit(level)))
    return MemoryReport(plan.where, plan.profile.name, tuple(rows), plan.profile.ub_bytes)


def plan_hints(plan) -> tuple:
    from .plan import ITEMSIZE

    hints = []
    narrow = [(k.name, b) for k in plan.kernels for b in k.buffers
              if b.level in _LOADED_LEVELS and b.shape and b.shape[-1] * ITEMSIZE[b.dtype] < GRANULE_BYTES]
    if narrow:  # one hint per plan: most bf16 D = 128 rows are 256 B, a hint per buffer would be noise
        shown = ", ".join(f"{k}.{b.name} ({b.shape[-1] * ITEMSIZE[b.dtype]} B)" for k, b in narrow[:3])
        more = f" and {len(narrow) - 3} more" if len(narrow) > 3 else ""
        kernels = ",".join(dict.fromkeys(k for k, _ in narrow))
        hints.append(Hint(
            "PH001",
            f"innermost tile dim under {GRANULE_BYTES} B (the 910B GM access granularity, npu-facts 8.1): "
            f"{shown}{more}; widen the last tile dim where the data allows",
            kernels, ",".join(f"{k}.{b.name}" for k, b in narrow)))
    for kernel in plan.kernels:
        for level in MARGIN_LEVELS:
            used = kernel.level_bytes(level)
            limit = plan.profile.limit(level)
            if used and used >= (1.0 - MARGIN) * limit:
                what = "the compiler-safe Vec limit" if level == "UB" else "its capacity"
                hints.append(Hint(
                    "MARGINAL",
                    f"kernel {kernel.name!r}: {level} {used} B is {100.0 * used / limit:.1f}% of "
                    f"{what} {limit} B on {plan.profile.name}; a larger tile or one more live buffer is refused",
                    kernel.name, level))
    return tuple(hints)
