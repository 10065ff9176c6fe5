"""A layer's plan: the op plans of its steps, their summed Cost, and a per-op breakdown."""

from __future__ import annotations

import dataclasses

from ..machine.cost import Cost


@dataclasses.dataclass(frozen=True)
class Step:
    """One step of a layer: its name, the op call it makes and that call's plan (None: a host step,
    e.g. a NumPy residual add, which counts no kernel)."""

    name: str
    op: str
    strategy: str
    plan: object = None
    note: str = ""

    @property
    def cost(self) -> Cost:
        return Cost() if self.plan is None else self.plan.cost


@dataclasses.dataclass(frozen=True)
class LayerPlan:
    """What a layer runs for given shapes: ``steps`` in order; ``cost`` the sum of their plans' costs."""

    layer: str
    phase: str
    batch: int
    context: int
    dtype: str
    strategies: dict
    steps: tuple
    profile: object = None

    @property
    def cost(self) -> Cost:
        return sum((s.cost for s in self.steps), Cost())

    def estimate(self, profile=None, model="pipes"):
        return self.cost.estimate(profile or self.profile, self.dtype, model=model)

    def breakdown(self, profile=None, model="pipes") -> list:
        """Per op (steps of one op and strategy summed): kernels, GM bytes, estimated seconds, share."""
        prof = profile or self.profile
        rows = {}
        for s in self.steps:
            key = (s.name.split("[")[0], s.op, s.strategy)
            rows.setdefault(key, []).append(s)
        out = []
        for (name, op, strategy), steps in rows.items():
            cost = sum((s.cost for s in steps), Cost())
            seconds = cost.estimate(prof, self.dtype, model=model).seconds if cost.kernels else 0.0
            out.append({"step": name, "op": op, "strategy": strategy, "calls": len(steps), "kernels": cost.kernels,
                        "gm_bytes": cost.gm_bytes, "cube_flops": cost.cube_flops, "seconds": seconds,
                        "note": steps[0].note})
        total = sum(r["seconds"] for r in out) or 1.0
        for r in out:
            r["share"] = r["seconds"] / total
        return out

    def to_markdown(self, profile=None) -> str:
        rows = self.breakdown(profile)
        est = self.estimate(profile)
        lines = [f"{self.layer} {self.phase}, batch {self.batch}, context {self.context}, {self.dtype} "
                 f"on {est.profile}: {est.seconds * 1e6:.1f} us",
                 "", "| step | op.strategy | calls | kernels | GM MB | est. us | share |",
                 "|---|---|---:|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['step']} | {r['op']}.{r['strategy']} | {r['calls']} | {r['kernels']} | "
                         f"{r['gm_bytes'] / 1e6:.2f} | {r['seconds'] * 1e6:.1f} | {100 * r['share']:.1f} % |")
        c = self.cost
        lines.append(f"| **total** | | {sum(r['calls'] for r in rows)} | {c.kernels} | {c.gm_bytes / 1e6:.2f} | "
                     f"{est.seconds * 1e6:.1f} | 100 % |")
        notes = sorted({r["note"] for r in rows if r["note"]})
        if notes:
            lines += [""] + [f"- {n}" for n in notes]
        return "\n".join(lines)
