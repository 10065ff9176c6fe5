"""``compare``: run every strategy of an op on the same inputs, side by side.

One row per strategy: precision against the float64 reference (max abs, max rel, ulps), against
the strategy's mirror (its kernel-faithful golden, lab/spec.py: worst storage ulps with the
criterion's ok/BAD mark and the % of points over 1 ulp; precision.mirror_check), PASS/FAIL under a named tolerance policy, the counted Cost (kernels, tasks, GM bytes, workspace,
buffer peaks), CPU time (median of warm runs) and the NPU estimates: the pipes model's with its
bound ("NPU us (bound)"), then the roofline's and the hicann simulator formula's (machine/cost.py).
A model more than 2x from the pipes estimate is marked ``!``, a model whose fastest strategy is not
the pipes model's marks its pick ``#``; the lines under the table say which and by how much
(:func:`model_check`). A strategy that the plan rules out (TileError, ConstraintError) stays in the
table with the reason. :meth:`Comparison.timeline` is the pipe model's schedule of every scored
call as one Chrome / Perfetto trace.

How to build inputs for an op, call its reference, read its outputs and score them is declared
once per op, in the op's ``OP`` spec (pypto_numba/lab/spec.py).
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import statistics
import time

import numpy as np

from . import precision
from .errors import ConstraintError, DTypeError, PyptoNumbaError, ShapeError, TileError
from .exact import exact_active
from .lab.spec import OpSpec, Variant  # noqa: F401  (Variant: compare's row type, re-exported)
from .machine import dtypes
from .machine.cost import MODELS, Cost
from .machine.profile import resolve_cast_mode, use_cast_mode
from .strategy import spec as op_spec
from .strategy import trace


@dataclasses.dataclass
class Row:
    strategy: str
    recommended: bool
    ruled_out: str = ""  # the TileError/ConstraintError message when the plan refuses
    precision: list = dataclasses.field(default_factory=list)  # precision.Result per output
    mirror: list = dataclasses.field(default_factory=list)  # precision.MirrorResult per output (its mirror)
    cost: object = None
    seconds: float = float("nan")
    estimate: object = None
    hints: tuple = ()  # the plans' hints (machine/limits.py), in launch order
    estimates: dict = dataclasses.field(default_factory=dict)  # model -> Estimate (MODELS; "pipes" is .estimate)
    trace: object = dataclasses.field(default=None, repr=False)  # the Trace of the scored call (timeline)

    @property
    def verdict(self) -> str:
        if self.ruled_out:
            return "RULED OUT"
        return "PASS" if all(r.passed for r in self.precision) else "FAIL"

    def as_dict(self) -> dict:
        d = {"strategy": self.strategy, "recommended": self.recommended, "verdict": self.verdict}
        if self.ruled_out:
            d["ruled_out"] = self.ruled_out
            return d
        d["precision"] = [dataclasses.asdict(r) for r in self.precision]
        d["mirror"] = [dataclasses.asdict(m) for m in self.mirror]
        d["cost"] = self.cost.as_dict()
        d["cpu_seconds"] = self.seconds
        d["npu_estimate_seconds"] = self.estimate.seconds
        d["npu_bound"] = self.estimate.bound
        d["npu_estimates"] = {m: {"seconds": e.seconds, "bound": e.bound} for m, e in self.estimates.items()}
        return d


@dataclasses.dataclass
class Comparison:
    op: str
    shapes: tuple
    dtype: str
    policy: str
    profile: str
    rows: list
    exact: bool = False  # run under use_exact(): bf16/fp16 inputs widened, fp32 storage (exact.py)

    def _table(self):
        head = ["strategy", "verdict", "max_abs", "max_rel", "ulps", "mirror ulps", ">1ulp %", "kernels", "tasks", "GM read",
                "GM write", "workspace", "UB peak", "CPU ms", "NPU us (bound)"] + [f"{m} us" for m in OTHER_MODELS]
        body = []
        check = self.model_check()
        for r in self.rows:
            name = r.strategy + (" *" if r.recommended else "")
            if r.ruled_out:
                body.append([name, "RULED OUT", r.ruled_out] + [""] * (len(head) - 3))
                continue
            worst = max(r.precision, key=lambda p: p.max_abs)
            c = r.cost
            body.append([
                name, r.verdict, f"{worst.max_abs:.3g}", f"{worst.max_rel:.3g}", f"{worst.max_ulps:.3g}",
                *_mirror_cells(r.mirror),
                str(c.kernels), str(c.tasks), _bytes(c.gm_read_bytes), _bytes(c.gm_write_bytes),
                _bytes(c.workspace_bytes), _bytes(c.ub_peak_bytes), f"{r.seconds * 1e3:.3f}",
                f"{r.estimate.seconds * 1e6:.1f} ({r.estimate.bound})",
            ] + [_model_cell(r, m, check) for m in OTHER_MODELS])
        return head, body

    def model_check(self) -> dict:
        """Where the estimators disagree (:func:`model_check`)."""
        return model_check([(r.strategy, r.estimates) for r in self.rows if not r.ruled_out and r.estimates])

    def timelines(self, profile=None) -> list:
        """(``op.strategy``, Timeline) of every scored strategy: the pipe model's schedule of its call."""
        return [(f"{self.op}.{r.strategy}", r.trace.timeline(profile)) for r in self.rows
                if not r.ruled_out and r.trace is not None and r.trace.records]

    def timeline(self, profile=None):
        """Every scored strategy's schedule in one trace, one group of processes per strategy
        ("gelu.tanh: AIV 0", ...), all from time 0 (:class:`~pypto_numba.machine.timeline.Timeline`)."""
        from .machine.timeline import Timeline

        return Timeline.combine(self.timelines(profile))

    def title(self) -> str:
        shapes = " ".join("x".join(map(str, s)) for s in self.shapes)
        exact = ", EXACT (fp32 storage, no intermediate rounding)" if self.exact else ""
        return f"{self.op} [{shapes}] {self.dtype} on {self.profile}, policy {self.policy}{exact}"

    def to_markdown(self) -> str:
        head, body = self._table()
        lines = [f"**{self.title()}** (* = the seed's recommendation)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
        notes = self.model_check()["notes"]
        if notes:
            lines += [""] + [f"- {n}" for n in notes]
        return "\n".join(lines)

    def to_table(self) -> str:
        head, body = self._table()
        wide = [r for r in body if r[1] == "RULED OUT"]
        narrow = [r for r in body if r[1] != "RULED OUT"]
        widths = [max(len(head[i]), *(len(r[i]) for r in narrow)) if narrow else len(head[i]) for i in range(len(head))]
        fmt = lambda row: "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()  # noqa: E731
        out = [self.title() + "  (* = seed's recommendation)", fmt(head), fmt(["-" * w for w in widths])]
        out += [fmt(r) for r in narrow]
        out += [f"{r[0]}  RULED OUT: {r[2]}" for r in wide]
        out += [f"models: {n}" for n in self.model_check()["notes"]]
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"op": self.op, "shapes": [list(s) for s in self.shapes], "dtype": self.dtype,
                "policy": self.policy, "profile": self.profile, "exact": self.exact,
                "rows": [r.as_dict() for r in self.rows],
                "model_check": self.model_check()}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=float)

    def __str__(self):
        return self.to_table()


OTHER_MODELS = tuple(m for m in MODELS if m != "pipes")  # the table's columns after "NPU us (bound)"
DISAGREE_RATIO = 2.0  # a model more than 2x from the pipes estimate is flagged "!"


def model_check(rows) -> dict:
    """Where the estimators disagree, for rows ((strategy, {model: Estimate}), ...).

    ``winners``: model -> the fastest strategy (ties within 1e-9 keep the first); ``winner_differs``:
    the models whose fastest strategy is not among the pipes model's fastest (and vice versa);
    ``over_2x``: strategy -> the models more than 2x from its pipes estimate, with the ratio;
    ``notes``: the same as sentences (the lines under compare's table; ``!`` and ``#`` there)."""
    rows = [(name, est) for name, est in rows if "pipes" in est]
    out = {"winners": {}, "winner_differs": [], "over_2x": {}, "notes": []}
    if not rows:
        return out
    fastest = {}
    for m in MODELS:
        times = [(name, est[m].seconds) for name, est in rows if m in est]
        if not times:
            continue
        best = min(t for _, t in times)
        fastest[m] = [name for name, t in times if t <= best * (1 + 1e-9)]
        out["winners"][m] = fastest[m][0]
    pipes_best = fastest["pipes"]
    for m in OTHER_MODELS:
        if len(rows) > 1 and m in fastest and not (set(fastest[m]) & set(pipes_best)):
            out["winner_differs"].append(m)
    for name, est in rows:
        base = est["pipes"].seconds
        for m in OTHER_MODELS:
            if m in est and base > 0:
                ratio = est[m].seconds / base
                if ratio > DISAGREE_RATIO or ratio < 1 / DISAGREE_RATIO:
                    out["over_2x"].setdefault(name, {})[m] = ratio
    by = dict(rows)
    for m in out["winner_differs"]:
        w, p = out["winners"][m], out["winners"]["pipes"]
        out["notes"].append(
            f"# {m} picks {w} ({by[w][m].seconds * 1e6:.1f} us, {by[w][m].bound}-bound) where the pipes model "
            f"picks {p} ({by[p]['pipes'].seconds * 1e6:.1f} us, {by[p]['pipes'].bound}-bound)")
    for name, ratios in out["over_2x"].items():
        parts = ", ".join(f"{m} {r:.2g}x ({by[name][m].bound}-bound)" for m, r in ratios.items())
        pipes = by[name]["pipes"]
        out["notes"].append(f"! {name}: {parts} of the pipes estimate, {pipes.seconds * 1e6:.1f} us "
                            f"({pipes.bound}-bound)")
    return out


def _model_cell(row, model: str, check: dict) -> str:
    """``12.3`` plus ``!`` (more than 2x from the pipes estimate) and ``#`` (this model's fastest
    strategy, where it differs from the pipes model's)."""
    est = row.estimates.get(model)
    if est is None:
        return ""
    marks = "!" if model in check["over_2x"].get(row.strategy, {}) else ""
    if model in check["winner_differs"] and check["winners"].get(model) == row.strategy:
        marks += "#"
    return f"{est.seconds * 1e6:.1f}" + (f" {marks}" if marks else "")


def _mirror_cells(results) -> list:
    """The worst ulps against the mirror with its mark ("ok": within the criterion, "BAD": an
    algorithm bug, not rounding; none for fp32 outputs, MirrorResult.judged; precision.mirror_check)
    and the percentage of points over 1 ulp."""
    if not results:
        return ["", ""]
    mx = max(m.max_ulps for m in results)
    judged = [m for m in results if m.judged]
    mark = (" ok" if all(m.ok for m in judged) else " BAD") if judged else ""
    return [f"{mx:.3g}{mark}", f"{100 * max(m.frac_1ulp for m in results):.2g}"]


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _out_dtype(out, default: str) -> str:
    """The storage dtype of one scored output (MoE weights stay fp32 in a bf16 run)."""
    return dtypes.storage_name(np.asarray(out).dtype) or default


def case(op: str) -> OpSpec:
    """The op's spec; an unknown op raises compare's PyptoNumbaError."""
    return op_spec(op, "compare")


def make_inputs(op: str, shape=None, dtype: str = "fp32", seed: int = 0) -> tuple:
    """Deterministic random inputs for ``op`` (shape defaults to the op's default scenario)."""
    c = case(op)
    if dtype not in dtypes.STORAGE:
        raise PyptoNumbaError(f"compare: dtype must be one of {', '.join(dtypes.STORAGE)}, got {dtype!r}")
    return c.inputs.make(tuple(shape or c.inputs.default_shape), dtype, np.random.default_rng(seed))


def compare(
    op: str,
    *inputs,
    strategies=None,
    policy=None,
    repeats: int = 5,
    profile=None,
    **options,
) -> Comparison:
    """Run every strategy of ``op`` (or those named) on ``inputs`` and score each one."""
    c = case(op)
    variants = c.rows()
    if strategies is not None:
        names = [strategies] if isinstance(strategies, str) else list(strategies)
        unknown = set(names) - {v.label for v in variants}
        if unknown:
            raise PyptoNumbaError(
                f"compare: {op} has no strategy {sorted(unknown)}; it has {[v.label for v in variants]}")
        variants = [v for v in variants if v.label in names]
    if isinstance(repeats, (bool, np.bool_)) or not isinstance(repeats, numbers.Integral):
        raise PyptoNumbaError(f"compare: repeats must be a positive int, got {repeats!r}")
    policy = policy or c.tolerance.policy
    precision.tolerances(policy, "fp32")  # an unknown policy fails before anything runs
    if not inputs:
        inputs = make_inputs(op)
    arrays = [i for i in inputs if isinstance(i, np.ndarray)]
    if not arrays:
        raise DTypeError(
            f"compare: {op} inputs must include numpy arrays, got {[type(i).__name__ for i in inputs]}; "
            f"use numpy.asarray(x, dtype=numpy.float32)"
        )
    dtype = dtypes.storage_name(arrays[0].dtype) or str(arrays[0].dtype)
    exact = exact_active()
    run_dtype = "fp32" if exact else dtype  # exact runs are fp32 runs: scored and priced as such
    rtol, atol = c.tolerance(run_dtype)
    rows = []
    timed = []
    prof_name = None
    for variant in variants:
        row = Row(strategy=variant.label, recommended=variant.recommended)
        try:
            with trace() as t:
                result = variant.call(*inputs, profile=profile, **options)
        except (TileError, ConstraintError) as exc:
            row.ruled_out = str(exc)
            rows.append(row)
            continue
        prof_name = t.records[-1].profile
        ref = variant.reference(*inputs, **options)
        refs = ref if isinstance(ref, tuple) else (ref,)
        outs = c.outputs(result)
        scores = refs[len(outs)] if len(refs) > len(outs) else None  # selection scores: tie-aware ids
        row.precision = [precision.evaluate(o, r, run_dtype, policy, rtol, atol, scores=scores)
                         for o, r in zip(outs, refs)]
        with use_cast_mode(resolve_cast_mode(options.get("cast_mode"), profile, "compare").name):
            # profile: its plan's tiles; the mode: the one the strategy's vector casts used
            mref = variant.reference(*inputs, mirror=True, profile=profile, **options)
        mrefs = mref if isinstance(mref, tuple) else (mref,)
        row.mirror = [precision.mirror_check(o, r, _out_dtype(o, dtype)) for o, r in zip(outs, mrefs)]
        row.cost = sum((r.cost for r in t.records), Cost())
        plans = list({id(r.plan): r.plan for r in t.records}.values())
        row.hints = tuple((p.where, h) for p in plans for h in p.hints)
        row.estimates = {m: row.cost.estimate(prof_name, run_dtype, model=m) for m in MODELS}
        row.estimate = row.estimates["pipes"]
        row.trace = t
        rows.append(row)
        timed.append((row, variant))
    # CPU times last, the strategies' warm runs interleaved: timed right after its float64
    # reference, a strategy would share the cores with NumPy's BLAS threads, which spin for a while
    # after a call (docs/performance.md). Interleaving spreads a shared host's noise over all alike.
    times = [[] for _ in timed]
    for _ in range(max(1, repeats)):
        for (_, variant), ts in zip(timed, times):
            t0 = time.perf_counter()
            variant.call(*inputs, profile=profile, **options)
            ts.append(time.perf_counter() - t0)
    for (row, _), ts in zip(timed, times):
        row.seconds = statistics.median(ts)
    from .machine.profile import load_profile

    return Comparison(op=op, shapes=tuple(a.shape for a in arrays),
                      dtype=dtype, policy=policy, profile=prof_name or load_profile(profile).name, rows=rows,
                      exact=exact)


def parse_shape(text: str) -> tuple:
    """``"8,11008"`` -> (8, 11008); a clear ShapeError otherwise."""
    try:
        shape = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ShapeError(f"--shape must be comma-separated integers like 8,11008, got {text!r}") from None
    if not shape or any(d <= 0 for d in shape):
        raise ShapeError(f"--shape must be positive integers like 8,11008, got {text!r}")
    return shape
