"""``pypto-numba report``: the strategy pages in ``strategies/``, regenerated from the code.

Input: ``strategies/scenarios.toml`` (canonical model shapes per op). Output, in the same folder:

- ``strategy-comparison.md``: the seed's summary table (op, preferred, alternative, deciding
  criterion) with ``advise()``'s choice per scenario beside it, then every scenario's strategies
  with estimated NPU time, GM bytes, kernels, workspace and UB peak from their plans, then a
  measured section (compare() on small shapes: PASS/FAIL, errors, CPU time);
- ``<op>.md`` per op: per scenario the advice and its reasons, the plan table, a sweep over the
  scenario's axis (GM bytes and estimated NPU time per strategy, where a plan stops fitting with
  its TileError message) and the measured precision per strategy and dtype;
- ``charts/<scenario>-sweep.svg`` (plans only) and ``charts/<scenario>-precision.svg`` (measured).

Two kinds of content, kept apart so that CI can check the pages:

- plan-derived (tables, advice, sweep charts): a pure function of the code, the profile and the
  scenarios, byte-deterministic (SVG with a fixed hash salt, no date, text kept as text);
- measured (CPU time, precision, precision charts): lives between ``<!-- measured:begin ID -->``
  and ``<!-- measured:end ID -->`` markers. CPU time varies from run to run and precision depends
  on the BLAS build for the cube ops, so ``--check`` ignores these sections.

``--check`` regenerates the plan-derived content in memory (no kernel runs) and fails when a
page differs outside its measured sections; when matplotlib is importable and is the version that
wrote the committed sweep charts, the charts are compared byte for byte too (the markdown already
holds every number the charts plot, so ``--check`` needs no matplotlib). ``--no-measure`` rewrites
the plan-derived content and keeps the measured sections already on disk.

Every profile number comes from the default profile (``ascend910b``), whatever
``PYPTO_NUMBA_PROFILE`` says, so that the pages do not depend on the environment.
"""

from __future__ import annotations

import dataclasses
import difflib
import io
import math
import os
import re
import sys
import time

from .errors import ConstraintError, PyptoNumbaError, TileError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PAGE = "strategy-comparison.md"
CHARTS = "charts"
MEASURED_RE = re.compile(r"<!-- measured:begin (\S+) -->\n.*?<!-- measured:end \1 -->\n", re.S)
NOT_MEASURED = "_Not measured yet: run `pypto-numba report` (without `--no-measure`)._\n"
PLOT_HINT = "pip install .[plot]"  # matplotlib lives in the `plot` extra


# --- scenarios -------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Sweep:
    axis: str
    keys: tuple
    values: tuple


@dataclasses.dataclass(frozen=True)
class Scenario:
    name: str
    op: str
    title: str
    advise: dict
    also: tuple = ()
    sweep: Sweep = None
    compare: dict = None


def _tuples(value):
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def load_scenarios(path) -> list:
    """Parse and validate ``scenarios.toml``: ops known, advise keywords accepted, sweep keys present."""
    from .strategy import OPS, spec

    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise PyptoNumbaError(f"report: no scenarios file {path}; run from the repository root or pass --out") from None
    except tomllib.TOMLDecodeError as exc:
        raise PyptoNumbaError(f"report: {path}: {exc}") from None
    out, seen = [], set()
    for i, raw in enumerate(data.get("scenario", [])):
        where = f"report: {path}: scenario {i} ({raw.get('name', '?')})"
        for key in ("name", "op", "advise"):
            if key not in raw:
                raise PyptoNumbaError(f"{where}: missing {key!r}")
        op = raw["op"]
        if op not in OPS:
            raise PyptoNumbaError(f"{where}: unknown op {op!r}; known: {', '.join(OPS)}")
        if raw["name"] in seen or not re.fullmatch(r"[A-Za-z0-9_.-]+", raw["name"]):
            raise PyptoNumbaError(f"{where}: name must be unique and use letters, digits, _ . - only")
        seen.add(raw["name"])
        params = spec(op).scenario_keywords
        also = tuple(_tuples(a) for a in raw.get("also", ()))
        for d in (raw["advise"],) + also:
            bad = sorted(set(d) - set(params))
            if bad:
                raise PyptoNumbaError(f"{where}: advise {op} takes no {bad}; its keywords are {', '.join(params)}")
        sweep = None
        if "sweep" in raw:
            s = raw["sweep"]
            sweep = Sweep(axis=s["axis"], keys=tuple(s["keys"]), values=tuple(s["values"]))
            for key in sweep.keys:
                base = key.split(".")[0]
                if base not in raw["advise"]:
                    raise PyptoNumbaError(f"{where}: sweep key {key!r} is not one of the scenario's advise keywords")
        out.append(Scenario(name=raw["name"], op=op, title=raw.get("title", raw["name"]),
                            advise=_tuples(raw["advise"]), also=also, sweep=sweep,
                            compare=_tuples(raw["compare"]) if "compare" in raw else None))
    if not out:
        raise PyptoNumbaError(f"report: {path} defines no [[scenario]]")
    return out


def at(scenario: dict, keys, value) -> dict:
    """``scenario`` with every sweep key set to ``value`` ("shape.0" sets element 0 of ``shape``)."""
    s = dict(scenario)
    for key in keys:
        name, _, index = key.partition(".")
        if index:
            t = list(s[name])
            t[int(index)] = value
            s[name] = tuple(t)
        else:
            s[name] = value
    return s


# --- plans -----------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Priced:
    """One strategy priced by its plans, or the error that rules it out."""

    label: str
    cost: object = None
    seconds: float = float("nan")
    bound: str = ""
    error: str = ""  # "TileError: ..." or "ConstraintError: ..."
    via: str = ""  # the `also` override that made it a candidate, if any


@dataclasses.dataclass
class Point:
    value: object
    priced: dict  # label -> Priced
    chosen: str


def price_all(op: str, scenario: dict, also=(), profile=None) -> dict:
    """Every candidate strategy of ``advise``'s scenario (plus the ``also`` overrides), priced."""
    from .advise import total
    from .strategy import spec

    out = {}
    for override in ({},) + tuple(also):
        cands = spec(op).advise(profile, **{**scenario, **override})[0]
        via = ", ".join(f"{k}={v!r}" for k, v in override.items())
        for cand in cands:
            if cand.label in out:
                continue
            try:
                cost, seconds, bound = total(tuple(cand.plans()))
            except (TileError, ConstraintError) as exc:
                out[cand.label] = Priced(cand.label, error=f"{type(exc).__name__}: {exc}", via=via)
                continue
            out[cand.label] = Priced(cand.label, cost, seconds, bound, via=via)
    return out


def advise_or_none(op, scenario, profile):
    from .advise import advise

    try:
        return advise(op, profile=profile, **scenario)
    except (TileError, ConstraintError):
        return None


@dataclasses.dataclass
class PlanResult:
    scenario: Scenario
    advice: object
    priced: dict
    points: list


_PLANNED: dict = {}  # (repr(scenario), profile) -> PlanResult: plans are pure functions of the code


def plan_scenario(sc: Scenario, profile) -> PlanResult:
    key = (repr(sc), str(profile))
    if key not in _PLANNED:
        _PLANNED[key] = _plan_scenario(sc, profile)
    return _PLANNED[key]


def _plan_scenario(sc: Scenario, profile) -> PlanResult:
    advice = advise_or_none(sc.op, sc.advise, profile)
    priced = price_all(sc.op, sc.advise, sc.also, profile)
    points = []
    if sc.sweep:
        for v in sc.sweep.values:
            s = at(sc.advise, sc.sweep.keys, v)
            a = advise_or_none(sc.op, s, profile)
            points.append(Point(v, price_all(sc.op, s, sc.also, profile), a.chosen if a else ""))
    return PlanResult(sc, advice, priced, points)


# --- formatting ------------------------------------------------------------------------------------

def fmt_bytes(n) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_us(seconds) -> str:
    us = seconds * 1e6
    return f"{us:.3g} us" if us < 1000 else f"{us:,.0f} us"


def fmt_call(op, scenario) -> str:
    return f"advise({op!r}, " + ", ".join(f"{k}={v!r}" for k, v in scenario.items()) + ")"


def cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(head, rows) -> list:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return lines


def short_error(error: str) -> str:
    return error.split(":", 1)[0]


def axis_x(value) -> float:
    return float(value) if not isinstance(value, tuple) else float(math.prod(value))


def plan_rows(res: PlanResult) -> list:
    chosen = res.advice.chosen if res.advice else ""
    seed = res.advice.seed if res.advice else ""
    rows = []
    for label, p in res.priced.items():
        marks = []
        if label == chosen:
            marks.append("**advise**")
        if label == seed:
            marks.append("seed")
        if p.via:
            marks.append(f"priced with {p.via}")
        if p.error:
            rows.append([f"`{label}`", short_error(p.error), "", "", "", "", "", "", "; ".join(marks)])
            continue
        c = p.cost
        rows.append([f"`{label}`", fmt_us(p.seconds), p.bound, str(c.kernels), fmt_bytes(c.gm_bytes),
                     fmt_bytes(c.workspace_bytes), fmt_bytes(c.ub_peak_bytes), str(c.tasks), "; ".join(marks)])
    return rows


PLAN_HEAD = ["strategy", "est. NPU time", "bound", "kernels", "GM bytes", "workspace", "UB peak", "tasks", ""]


def fit_lines(res: PlanResult) -> list:
    """Where each strategy stops fitting over the sweep, with its TileError message."""
    sw = res.scenario.sweep
    labels = list(dict.fromkeys(l for pt in res.points for l in pt.priced))
    out = []
    for label in labels:
        fails = [pt for pt in res.points if label in pt.priced and pt.priced[label].error]
        fits = [pt for pt in res.points if label in pt.priced and not pt.priced[label].error]
        if not fails:
            out.append(f"- `{label}` fits at every point of the {sw.axis} sweep.")
            continue
        first = fails[0]
        if not fits:
            head = f"- `{label}` is ruled out at every point of the {sw.axis} sweep"
        else:
            last_fit = [pt for pt in fits if res.points.index(pt) < res.points.index(first)]
            head = (f"- `{label}` fits up to {sw.axis} = {last_fit[-1].value}" if last_fit
                    else f"- `{label}` does not fit at {sw.axis} = {first.value}")
            head += f"; from {sw.axis} = {first.value} its plan raises"
        out.append(f"{head}: {first.priced[label].error}")
    return out


def sweep_table(res: PlanResult) -> list:
    sw = res.scenario.sweep
    labels = list(dict.fromkeys(l for pt in res.points for l in pt.priced))
    head = [sw.axis] + [f"`{l}` {what}" for l in labels for what in ("GM", "time")] + ["advise"]
    rows = []
    for pt in res.points:
        row = [str(pt.value)]
        for l in labels:
            p = pt.priced.get(l)
            if p is None:
                row += ["", ""]
            elif p.error:
                row += [short_error(p.error), ""]
            else:
                row += [fmt_bytes(p.cost.gm_bytes), fmt_us(p.seconds)]
        row.append(f"`{pt.chosen}`" if pt.chosen else "none fits")
        rows.append(row)
    return table(head, rows)


# --- charts ----------------------------------------------------------------------------------------

def _mpl():
    try:
        import matplotlib
    except ImportError:
        raise PyptoNumbaError(f"report: the charts need matplotlib; install it with `{PLOT_HINT}`") from None
    matplotlib.use("Agg", force=False)
    return matplotlib


RC = {
    "svg.hashsalt": "pypto-numba-report",  # stable element ids
    "svg.fonttype": "none",  # text stays text: no glyph paths, smaller and stable files
    "font.family": "DejaVu Sans",  # ships with matplotlib
    "font.size": 9,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "path.simplify": False,
}
COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")


def _svg(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _short_number(x: float) -> str:
    for suffix, scale in (("M", 2**20), ("K", 2**10)):
        if x >= scale and x % scale == 0:
            return f"{int(x // scale)}{suffix}"
    return f"{x:g}"


def _log_axes(ax, lo, hi, unit):
    """Log y axis with readable labels: powers of two for bytes, 1-2-5 steps for time."""
    from matplotlib import ticker

    if unit == "bytes":
        octaves = math.log2(max(hi, 1) / max(lo, 1))
        base, subs = 2, ((1.0, 1.25, 1.5, 1.75) if octaves < 2 else (1.0,))
        fmt = fmt_bytes
    else:
        decades = math.log10(max(hi, 1e-300) / max(lo, 1e-300))
        base, subs = 10, ((1.0, 2.0, 3.0, 5.0, 7.0) if decades < 1.5 else (1.0, 2.0, 5.0) if decades < 4 else (1.0,))
        fmt = lambda v: f"{v:g}"  # noqa: E731
    ax.yaxis.set_major_locator(ticker.LogLocator(base=base, subs=subs))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: fmt(v)))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


_CHARTED: dict = {}


def sweep_svg(res: PlanResult) -> bytes:
    key = repr(res.scenario)
    if key not in _CHARTED:
        _CHARTED[key] = _sweep_svg(res)
    return _CHARTED[key]


def _sweep_svg(res: PlanResult) -> bytes:
    mpl = _mpl()
    from matplotlib import ticker
    from matplotlib.figure import Figure

    sw = res.scenario.sweep
    labels = list(dict.fromkeys(l for pt in res.points for l in pt.priced))
    xs = [axis_x(pt.value) for pt in res.points]
    with mpl.rc_context(RC):
        fig = Figure(figsize=(9.0, 3.6))
        axes = fig.subplots(1, 2)
        for ax, what, unit in ((axes[0], "GM bytes (read + write)", "bytes"), (axes[1], "estimated NPU time", "us")):
            ys_all = []
            for i, label in enumerate(labels):
                color = COLORS[i % len(COLORS)]
                px, py = [], []
                for x, pt in zip(xs, res.points):
                    p = pt.priced.get(label)
                    if p is not None and not p.error:
                        px.append(x)
                        py.append(p.cost.gm_bytes if unit == "bytes" else p.seconds * 1e6)
                ys_all += py
                ax.plot(px, py, marker="o", markersize=3.5, color=color, label=label)
                fails = [(j, pt.priced[label].error) for j, pt in enumerate(res.points)
                         if label in pt.priced and pt.priced[label].error]
                if fails:
                    j, error = fails[0]
                    ax.axvline(xs[j], color=color, linestyle="--", linewidth=1)
                    ax.plot([xs[j]], [0.97], marker="x", color=color, markersize=7,
                            transform=ax.get_xaxis_transform(), clip_on=False)
                    left = j < len(xs) / 2  # write the label on the side with room
                    text = f"{label}: {short_error(error)}" + (" from here" if left else "")
                    ax.annotate(text, (xs[j], 0.9 - 0.07 * i), xycoords=("data", "axes fraction"), fontsize=7,
                                color=color, ha="left" if left else "right", xytext=(3 if left else -3, 0),
                                textcoords="offset points")
            ax.set_yscale("log")
            if ys_all:
                _log_axes(ax, min(ys_all), max(ys_all), unit)
            if max(xs) / max(min(xs), 1e-30) >= 8:
                ax.set_xscale("log", base=2)
                ax.set_xticks(xs, [_short_number(x) for x in xs])
                ax.xaxis.set_minor_formatter(ticker.NullFormatter())
            ax.set_xlabel(sw.axis)
            ax.set_ylabel(unit)
            ax.set_title(what)
        axes[0].legend(fontsize=7, loc="lower right")
        fig.suptitle(f"{res.scenario.name} (plans on {res.advice.profile if res.advice else 'ascend910b'})",
                     fontsize=9)
        fig.tight_layout()
        return _svg(fig)


def precision_svg(name: str, runs: list) -> bytes:
    """Bars: max abs error against the float64 reference per strategy (groups) and dtype (bars).

    Max abs rather than ulps or relative error: both of those divide by the reference and explode
    at outputs near zero (GELU near x = 0, attention outputs that cancel), which hides the
    differences between strategies; the tables keep all three.
    """
    mpl = _mpl()
    from matplotlib.figure import Figure

    dts = [d for d in ("fp32", "bf16", "fp16") if any(r.dtype == d for r in runs)]
    labels = list(dict.fromkeys(r.label for r in runs if not r.error))
    errors = [r.max_abs for r in runs if not r.error and r.max_abs > 0]
    floor = min(errors) / 10 if errors else 1e-9
    with mpl.rc_context(RC):
        fig = Figure(figsize=(max(4.5, 1.3 * len(labels) + 2.5), 3.2))
        ax = fig.subplots()
        width = 0.8 / max(len(dts), 1)
        for j, dt in enumerate(dts):
            xs, ys, texts = [], [], []
            for i, label in enumerate(labels):
                r = next((r for r in runs if r.dtype == dt and r.label == label and not r.error), None)
                if r is None:
                    continue
                xs.append(i + (j - (len(dts) - 1) / 2) * width)
                ys.append(max(r.max_abs, floor))
                texts.append(("0" if r.max_abs == 0 else f"{r.max_abs:.2g}") + ("" if r.verdict == "PASS" else " FAIL"))
            bars = ax.bar(xs, ys, width * 0.95, color=COLORS[j % len(COLORS)], label=dt)
            for b, t in zip(bars, texts):
                ax.annotate(t, (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom",
                            fontsize=6, xytext=(0, 1), textcoords="offset points")
        ax.set_xticks(range(len(labels)), labels, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("max abs error vs float64")
        ax.set_title(f"{name}: precision per strategy and dtype (0 = exact)", fontsize=8)
        if labels:
            ax.legend(fontsize=7)
        fig.tight_layout()
        return _svg(fig)


def svg_matplotlib_version(data: bytes):
    m = re.search(rb"Matplotlib v([0-9][0-9A-Za-z.+-]*)", data)
    return m.group(1).decode() if m else None


# --- measured --------------------------------------------------------------------------------------

@dataclasses.dataclass
class Run:
    label: str
    dtype: str
    verdict: str = ""
    max_abs: float = float("nan")
    max_rel: float = float("nan")
    ulps: float = float("nan")
    cpu_seconds: float = float("nan")
    gm_bytes: int = 0
    policy: str = ""
    error: str = ""


def measure(sc: Scenario, dtype: str, profile, repeats: int) -> list:
    """compare() on the scenario's small shape in one dtype; a failure becomes an error row."""
    from .compare import compare, make_inputs

    spec = sc.compare
    op = spec.get("op", sc.op)
    if spec.get("variants"):
        return _measure_variants(op, spec, dtype, profile, repeats)
    try:
        inputs = make_inputs(op, spec["shape"], dtype, seed=0)
        cmp = compare(op, *inputs, strategies=spec.get("strategies"), repeats=repeats, profile=profile,
                      **spec.get("options", {}))
    except Exception as exc:  # an in-progress edit elsewhere must not lose the whole report
        return [Run("(all)", dtype, error=f"{type(exc).__name__}: {exc}")]
    runs = []
    for row in cmp.rows:
        if row.ruled_out:
            runs.append(Run(row.strategy, dtype, verdict="RULED OUT", error=row.ruled_out))
            continue
        runs.append(Run(row.strategy, dtype, verdict=row.verdict, policy=cmp.policy,
                        max_abs=max(p.max_abs for p in row.precision),
                        max_rel=max(p.max_rel for p in row.precision),
                        ulps=max(p.max_ulps for p in row.precision),
                        cpu_seconds=row.seconds, gm_bytes=row.cost.gm_bytes))
    return runs


def _measure_variants(op, spec, dtype, profile, repeats) -> list:
    """compare()'s scoring for one strategy run once per option set (e.g. gqa="expand_clone" / "head_loop").

    compare() passes every option to the reference too, and the attention reference takes no
    ``gqa`` (the reference is the same either way), so these rows are scored here the way
    compare() scores its rows: same inputs, reference, policy and tolerances.
    """
    import statistics

    from . import precision
    from .compare import case, make_inputs
    from .machine.cost import Cost
    from .strategy import get, strategies, trace

    c = case(op)
    runs = []
    names = spec.get("strategies") or [e.name for e in strategies(op)]
    for var in spec["variants"]:
        options = {**spec.get("options", {}), **var.get("options", {})}
        for name in names:
            label = var["label"] if len(names) == 1 else f"{var['label']} ({name})"
            try:
                inputs = make_inputs(op, spec["shape"], dtype, seed=0)
                fn = get(op, name).fn
                with trace() as t:
                    out = fn(*inputs, profile=profile, **options)
                ref = c.reference(*inputs, strategy=name, **spec.get("options", {}))
                rtol, atol = c.tolerance(dtype)
                res = [precision.evaluate(o, r, dtype, c.tolerance.policy, rtol, atol)
                       for o, r in zip(c.outputs(out), ref if isinstance(ref, tuple) else (ref,))]
                times = []
                for _ in range(max(1, repeats)):
                    t0 = time.perf_counter()
                    fn(*inputs, profile=profile, **options)
                    times.append(time.perf_counter() - t0)
            except (TileError, ConstraintError) as exc:
                runs.append(Run(label, dtype, verdict="RULED OUT", error=str(exc)))
                continue
            except Exception as exc:  # an in-progress edit elsewhere must not lose the whole report
                runs.append(Run(label, dtype, error=f"{type(exc).__name__}: {exc}"))
                continue
            runs.append(Run(label, dtype, verdict="PASS" if all(r.passed for r in res) else "FAIL",
                            policy=c.tolerance.policy,
                            max_abs=max(r.max_abs for r in res), max_rel=max(r.max_rel for r in res),
                            ulps=max(r.max_ulps for r in res), cpu_seconds=statistics.median(times),
                            gm_bytes=sum((r.cost for r in t.records), Cost()).gm_bytes))
    return runs


def measured_table(runs: list) -> list:
    rows = []
    for r in runs:
        if r.error:
            rows.append([r.dtype, f"`{r.label}`", r.verdict or "ERROR", r.error, "", "", "", ""])
        else:
            rows.append([r.dtype, f"`{r.label}`", f"{r.verdict} ({r.policy})", f"{r.max_abs:.3g}",
                         f"{r.max_rel:.3g}", f"{r.ulps:.3g}", f"{r.cpu_seconds * 1e3:.3g}", fmt_bytes(r.gm_bytes)])
    return table(["dtype", "strategy", "verdict", "max abs", "max rel", "ulps", "CPU ms", "GM bytes (counted)"], rows)


def measured_block(block_id: str, lines: list) -> list:
    return [f"<!-- measured:begin {block_id} -->"] + lines + [f"<!-- measured:end {block_id} -->"]


def environment_line(repeats: int) -> str:
    import platform

    import numba
    import numpy

    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {platform.machine()} "
            f"({os.cpu_count()} CPUs{load}; numba {numba.__version__}, "
            f"NUMBA_NUM_THREADS={numba.get_num_threads()}, NumPy {numpy.__version__}, Python {platform.python_version()}). "
            f"CPU time: median of {repeats} warm runs of compare(); precision against the float64 "
            f"reference under the op's policy.")


# --- pages -----------------------------------------------------------------------------------------

HEADER = ("<!-- Generated by `pypto-numba report` from strategies/scenarios.toml: do not edit by hand. "
          "`pypto-numba report --check` verifies everything outside the measured sections. -->")


def summary_page(results: list, profile_name: str, measured: dict) -> str:
    from .strategy import SEED, strategies

    ops = [op for op in SEED if any(r.scenario.op == op for r in results)]
    lines = [HEADER, "", "# Strategy comparison: the seed's table against the plans", "",
             f"Plan-derived numbers are for the `{profile_name}` profile: **est. NPU time** is the roofline "
             "estimate of the strategy's plans (machine/cost.py: launches + max(GM bytes / bandwidth, FLOPs / "
             "throughput, vector ops / rate) per kernel), **GM bytes** are bytes read plus written. "
             "`advise()` picks from the same plans (constraints first, then estimated time, then fewer kernels / "
             "GM bytes / fusion on a 5 % tie). Scenarios and their model shapes: "
             "[scenarios.toml](scenarios.toml). One page per op has the sweeps and charts.", "",
             "## The seed's summary table, with advise()'s choice per scenario", ""]
    rows = []
    for op in ops:
        pref, alt, crit = SEED[op]
        res = [r for r in results if r.scenario.op == op]
        picks = []
        agree = 0
        for r in res:
            if r.advice is None:
                picks.append(f"[{r.scenario.name}]({op}.md#{r.scenario.name}): none fits")
                continue
            agree += r.advice.agrees_with_seed
            mark = "" if r.advice.agrees_with_seed else f" (seed here: `{r.advice.seed}`)"
            picks.append(f"[{r.scenario.name}]({op}.md#{r.scenario.name}): `{r.advice.chosen}`{mark}")
        rows.append([f"[{op}]({op}.md)", f"`{pref}`", f"`{alt}`" if alt else "--", crit, "<br>".join(picks),
                     f"{agree}/{len(res)}"])
    lines += table(["op", "seed: preferred", "seed: alternative", "seed: deciding criterion",
                    "advise() per scenario", "agrees with the seed"], rows)
    lines += ["", "Where the plans contradict the seed:", ""]
    for r in results:
        a = r.advice
        if a is None or a.agrees_with_seed:
            continue
        mine, seed = r.priced[a.chosen], r.priced.get(a.seed)
        if seed is None or seed.error:
            why = f"the seed's `{a.seed}` is ruled out" + (f" ({short_error(seed.error)})" if seed else "")
        else:
            why = (f"`{a.seed}` (the seed's pick) {fmt_us(seed.seconds)}, {seed.cost.kernels} kernel(s), "
                   f"GM {fmt_bytes(seed.cost.gm_bytes)}")
        lines.append(f"- [{r.scenario.name}]({r.scenario.op}.md#{r.scenario.name}): `{a.chosen}` "
                     f"{fmt_us(mine.seconds)}, {mine.cost.kernels} kernel(s), GM {fmt_bytes(mine.cost.gm_bytes)}; "
                     + why + ".")
    lines += ["", "## Every scenario, every strategy (plans only)", ""]
    rows = []
    for r in results:
        for i, row in enumerate(plan_rows(r)):
            rows.append(([f"[{r.scenario.name}]({r.scenario.op}.md#{r.scenario.name})", r.scenario.op] if i == 0
                         else ["", ""]) + row)
    lines += table(["scenario", "op"] + PLAN_HEAD[:-1] + ["note"], rows)
    lines += ["", "Ruled-out strategies carry their plan's message on the op page. "
              "Registered strategies: " + "; ".join(
                  f"{op}: " + ", ".join(f"`{s.name}`" for s in strategies(op)) for op in ops) + ".", ""]
    lines += ["## Measured on this CPU (small shapes)", ""]
    lines += measured_block("summary", measured.get("summary") or [NOT_MEASURED.rstrip()])
    return "\n".join(lines) + "\n"


def op_page(op: str, results: list, measured: dict) -> str:
    from .strategy import SEED, strategies

    pref, alt, crit = SEED[op]
    lines = [HEADER, "", f"# {op}", "",
             f"The seed prefers `{pref}`" + (f" over `{alt}`" if alt else " (no alternative)") + f": {crit}.", "",
             "Registered strategies:", ""]
    lines += [f"- `{op}.{s.name}`: {s.summary}" for s in strategies(op)]
    lines += ["", "Back to the [summary](strategy-comparison.md)."]
    for r in results:
        sc = r.scenario
        lines += ["", f"## {sc.name}", "", f"{sc.title}.", "", "```python", fmt_call(op, sc.advise), "```", ""]
        if r.advice is None:
            lines += ["**No strategy fits** this scenario on the profile.", ""]
        else:
            a = r.advice
            verdict = "agrees with the seed" if a.agrees_with_seed else f"the seed picks `{a.seed}` here"
            lines += [f"**advise: `{a.chosen}`** ({verdict}).", ""]
            lines += [f"- {cell(x)}" for x in a.reasons]
            lines += [f"- rejected `{k}`: {cell(v)}" for k, v in a.rejected.items()]
            lines += [""]
        lines += table(PLAN_HEAD, plan_rows(r))
        errors = [(l, p.error) for l, p in r.priced.items() if p.error]
        if errors:
            lines += [""] + [f"- `{l}`: {cell(e)}" for l, e in errors]
        if sc.sweep:
            lines += ["", f"### Sweep over {sc.sweep.axis}", "",
                      f"![GM bytes and estimated NPU time per strategy over {sc.sweep.axis}]"
                      f"({CHARTS}/{sc.name}-sweep.svg)",
                      "", f"Plans only; {sc.sweep.axis} sets `{'`, `'.join(sc.sweep.keys)}`. A dashed line marks the "
                      "first point where a strategy's plan is refused.", ""]
            lines += sweep_table(r)
            lines += ["", "Where each strategy stops fitting:", ""] + fit_lines(r)
        if sc.compare:
            spec = sc.compare
            cop = spec.get("op", op)
            opts = {**spec.get("options", {})}
            desc = f"`compare({cop!r}, shape={tuple(spec['shape'])!r}" + "".join(
                f", {k}={v!r}" for k, v in opts.items()) + ")`"
            for n, v in enumerate(spec.get("variants", ())):
                options = ", ".join(f"{k}={x!r}" for k, x in v.get("options", {}).items())
                desc += (" once per " if n == 0 else ", ") + f"`{v['label']}` ({options})"
            lines += ["", f"### Measured: {desc}", ""]
            lines += measured_block(sc.name, measured.get(sc.name) or [NOT_MEASURED.rstrip()])
    return "\n".join(lines) + "\n"


def measured_lines(sc: Scenario, runs: list) -> list:
    return [f"![precision per strategy and dtype]({CHARTS}/{sc.name}-precision.svg)", ""] + measured_table(runs)


def summary_measured(scenarios: list, runs_by: dict, repeats: int) -> list:
    lines = [environment_line(repeats), ""]
    rows = []
    for sc in scenarios:
        runs = runs_by.get(sc.name)
        if not runs:
            continue
        labels = list(dict.fromkeys(r.label for r in runs))
        dts = ("fp32", "bf16", "fp16")
        for i, label in enumerate(labels):
            cells = []
            for dt in dts:
                r = next((x for x in runs if x.label == label and x.dtype == dt), None)
                if r is None:
                    cells.append("")
                elif r.error:
                    cells.append(r.verdict or "ERROR")
                else:
                    cells.append(f"{r.verdict} {r.max_abs:.2g}, {r.cpu_seconds * 1e3:.3g} ms")
            shape = "x".join(map(str, sc.compare["shape"]))
            rows.append(([sc.name, shape] if i == 0 else ["", ""]) + [f"`{label}`"] + cells)
    lines += table(["scenario", "compare shape", "strategy", "fp32", "bf16", "fp16"], rows)
    lines += ["", "Cells: verdict under the op's tolerance policy, max abs error against the float64 reference, "
              "CPU time. The op pages have max rel error and ulps too."]
    return lines


# --- driver ----------------------------------------------------------------------------------------

class Progress:
    """A plain-text progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

    def __init__(self, total: int, stream=None, width: int = 28):
        self.total, self.done, self.width = max(total, 1), 0, width
        self.stream = stream or sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self.t0 = time.perf_counter()

    def step(self, label: str):
        self.done += 1
        filled = self.width * self.done // self.total
        bar = "#" * filled + "-" * (self.width - filled)
        text = f"report [{bar}] {self.done}/{self.total} {time.perf_counter() - self.t0:5.1f}s {label}"
        if self.tty:
            self.stream.write("\r" + text[:150].ljust(150))
            if self.done >= self.total:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


def strip_measured(text: str) -> str:
    """``text`` with every measured section emptied (its markers stay, so moving one is a change)."""
    return MEASURED_RE.sub(
        lambda m: f"<!-- measured:begin {m.group(1)} -->\n<!-- measured:end {m.group(1)} -->\n", text)


def old_measured(path) -> dict:
    """The measured blocks of a page already on disk: id -> inner lines."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        return {}
    out = {}
    for m in MEASURED_RE.finditer(text):
        inner = m.group(0).split("\n")[1:-2]
        out[m.group(1)] = inner
    return out


def generate(out_dir: str, *, measure_runs: bool = True, check: bool = False, repeats: int = 3,
             stream=None, scenarios_path=None, charts: bool = None) -> int:
    """Regenerate (or, with ``check``, verify) the pages in ``out_dir``; returns the exit code.

    ``charts=None`` draws (or checks) the charts and requires matplotlib to write pages; ``False``
    skips every chart (markdown only: for tests and for ``--check`` without matplotlib).
    """
    from .machine.profile import DEFAULT_PROFILE

    stream = stream or sys.stderr
    profile = DEFAULT_PROFILE
    scenarios = load_scenarios(scenarios_path or os.path.join(out_dir, "scenarios.toml"))
    have_mpl = charts is not False
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        have_mpl = False
    if not have_mpl and not check and charts is None:
        raise PyptoNumbaError(f"report: the charts need matplotlib; install it with `{PLOT_HINT}` "
                              "(`--check` works without it)")
    dtypes_of = {sc.name: tuple(sc.compare.get("dtypes", ("fp32", "bf16", "fp16"))) for sc in scenarios if sc.compare}
    n_measure = sum(len(d) for d in dtypes_of.values()) if measure_runs and not check else 0
    n_charts = sum(1 for sc in scenarios if sc.sweep) if have_mpl else 0
    n_precision = len(dtypes_of) if n_measure and have_mpl else 0
    progress = Progress(len(scenarios) + n_charts + n_measure + n_precision + 1, stream)

    results = []
    for sc in scenarios:
        results.append(plan_scenario(sc, profile))
        progress.step(f"plans: {sc.name}")
    files = {}  # relative path -> bytes (plan-derived charts and pages)
    if have_mpl:
        for r in results:
            if r.scenario.sweep:
                files[f"{CHARTS}/{r.scenario.name}-sweep.svg"] = sweep_svg(r)
                progress.step(f"chart: {r.scenario.name}-sweep.svg")

    ops = list(dict.fromkeys(sc.op for sc in scenarios))
    measured = {}
    if n_measure:
        runs_by = {}
        for sc in scenarios:
            if not sc.compare:
                continue
            runs = []
            for dt in dtypes_of[sc.name]:
                runs += measure(sc, dt, profile, repeats)
                progress.step(f"compare: {sc.name} {dt}")
            runs_by[sc.name] = runs
            if have_mpl:
                files[f"{CHARTS}/{sc.name}-precision.svg"] = precision_svg(sc.name, [r for r in runs if not r.error])
                progress.step(f"chart: {sc.name}-precision.svg")
            measured[sc.name] = measured_lines(sc, runs)
        measured["summary"] = summary_measured(scenarios, runs_by, repeats)
    elif not check:
        for name in [PAGE] + [f"{op}.md" for op in ops]:
            measured.update(old_measured(os.path.join(out_dir, name)))

    pages = {PAGE: summary_page(results, profile, measured)}
    for op in ops:
        pages[f"{op}.md"] = op_page(op, [r for r in results if r.scenario.op == op], measured)
    progress.step("pages")

    if check:
        return _check(out_dir, pages, files, have_mpl, stream)
    os.makedirs(os.path.join(out_dir, CHARTS), exist_ok=True)
    for rel, text in pages.items():
        with open(os.path.join(out_dir, rel), "w", encoding="utf-8", newline="\n") as fh:
            fh.write(text)
    for rel, data in files.items():
        with open(os.path.join(out_dir, rel), "wb") as fh:
            fh.write(data)
    stream.write(f"report: wrote {len(pages)} pages and {len(files)} charts to {out_dir} "
                 f"in {time.perf_counter() - progress.t0:.1f} s\n")
    return 0


def _check(out_dir, pages, files, have_mpl, stream) -> int:
    bad = []
    for rel, text in pages.items():
        path = os.path.join(out_dir, rel)
        try:
            with open(path, encoding="utf-8") as fh:
                old = fh.read()
        except FileNotFoundError:
            bad.append((rel, [f"missing: {path}\n"]))
            continue
        a, b = strip_measured(old), strip_measured(text)
        if a != b:
            diff = list(difflib.unified_diff(a.splitlines(True), b.splitlines(True), f"committed/{rel}",
                                             f"regenerated/{rel}", n=1))
            bad.append((rel, diff))
    skipped = ""
    if have_mpl:
        import matplotlib

        for rel, data in files.items():
            path = os.path.join(out_dir, rel)
            try:
                with open(path, "rb") as fh:
                    old = fh.read()
            except FileNotFoundError:
                bad.append((rel, [f"missing: {path}\n"]))
                continue
            made_with = svg_matplotlib_version(old)
            if made_with != matplotlib.__version__:
                skipped = (f"charts not compared: they were made with matplotlib {made_with}, "
                           f"this is {matplotlib.__version__}")
                continue
            if old != data:
                bad.append((rel, [f"{rel}: chart bytes differ ({len(old)} B committed, {len(data)} B regenerated)\n"]))
    else:
        skipped = f"charts not compared: matplotlib is not installed ({PLOT_HINT}) or charts=False"
    if skipped:
        stream.write(f"report --check: {skipped}; the markdown tables hold the charted numbers\n")
    if not bad:
        stream.write(f"report --check: {len(pages)} pages" + ("" if skipped else f" and {len(files)} charts")
                     + f" in {out_dir} are up to date\n")
        return 0
    for rel, diff in bad:
        stream.write(f"--- {rel} differs:\n")
        stream.writelines(diff[:40])
        if len(diff) > 40:
            stream.write(f"... ({len(diff) - 40} more diff lines)\n")
    stream.write(f"report --check: {len(bad)} file(s) out of date in {out_dir}: "
                 + ", ".join(rel for rel, _ in bad) + "\nrun `pypto-numba report` to update\n")
    return 1
