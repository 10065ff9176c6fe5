"""The SVG charts: sweeps (plans only, byte-deterministic) and measured precision (matplotlib, optional)."""

from __future__ import annotations

import io
import math
import re

from ..errors import PyptoNumbaError
from .markdown import fmt_bytes, short_error
from .pricing import PlanResult


PLOT_HINT = "pip install .[plot]"  # matplotlib lives in the `plot` extra


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


def axis_x(value) -> float:
    return float(value) if not isinstance(value, tuple) else float(math.prod(value))


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


PIPE_COLORS = {"tasks": "#7f7f7f", "MTE2": "#1f77b4", "MTE1": "#17becf", "CUBE": "#d62728", "VECTOR": "#2ca02c",
               "FIXPIPE": "#9467bd", "MTE3": "#ff7f0e", "kernels": "#8c564b", "GM": "#bcbd22", "AICPU": "#e377c2"}


def chosen_plans(res: PlanResult) -> tuple:
    """The plans of advise's pick for the scenario (as pricing built them, ``also`` overrides included)."""
    from ..advise import candidates

    sc = res.scenario
    for override in ({},) + tuple(sc.also):
        for cand in candidates(sc.op, res.advice.profile, **{**sc.advise, **override})[0]:
            if cand.label == res.advice.chosen:
                return tuple(cand.plans())
    raise PyptoNumbaError(f"report: {sc.name}: advise's pick {res.advice.chosen!r} is not a candidate")


def scenario_timeline(res: PlanResult):
    """The pipe model's timeline (machine/timeline.py) of advise's pick, its plans one after the other."""
    from ..machine.timeline import kernel_schedules, schedules_timeline

    runs = []
    for plan in chosen_plans(res):
        runs += kernel_schedules([(f"{plan.where}: {k.name}", k.cost) for k in plan.kernels], plan.profile,
                                 plan.dtype)
    return schedules_timeline(runs)


def _merged(spans, gap):
    """Sorted (start, end) spans with the ones closer than ``gap`` joined (a bar per visible run)."""
    out = []
    for a, b in sorted(spans):
        if out and a - out[-1][1] <= gap:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def timeline_svg(op: str, res: PlanResult) -> bytes:
    """A small Gantt chart of :func:`scenario_timeline`: the chip's lanes (kernels, GM, AICPU) and the
    first AIC's and AIV's task and pipe lanes; bars closer than a pixel are drawn as one."""
    mpl = _mpl()
    from matplotlib.figure import Figure

    tl = scenario_timeline(res)
    procs = {e["pid"]: e["args"]["name"] for e in tl.events if e["ph"] == "M" and e["name"] == "process_name"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in tl.events
               if e["ph"] == "M" and e["name"] == "thread_name"}
    shown = [pid for pid in sorted(procs) if procs[pid] in ("chip", "AIC 0", "AIV 0")]
    lanes = [key for key in sorted(threads) if key[0] in shown]
    span = tl.seconds * 1e6
    spans = {key: [] for key in lanes}
    for e in tl.events:
        key = (e["pid"], e["tid"])
        if e["ph"] == "X" and key in spans and e["name"] != "launch":
            spans[key].append((e["ts"], e["ts"] + e["dur"]))
    launches = [(e["ts"], e["dur"]) for e in tl.events if e["ph"] == "X" and e["name"] == "launch"]
    with mpl.rc_context(RC):
        fig = Figure(figsize=(9.0, 0.9 + 0.24 * len(lanes)))
        ax = fig.subplots()
        labels = []
        for y, key in enumerate(reversed(lanes)):
            thread = threads[key]
            labels.append(f"{procs[key[0]]} {thread}")
            bars = [(a, max(b - a, span / 2000)) for a, b in _merged(spans[key], span / 1500)]
            ax.broken_barh(bars, (y - 0.35, 0.7), facecolors=PIPE_COLORS.get(thread, "#333333"), linewidth=0)
            if thread == "kernels":
                ax.broken_barh(launches, (y - 0.35, 0.7), facecolors="#dddddd", edgecolors="#8c564b",
                               linewidth=0.5, hatch="////")
        ax.set_yticks(range(len(labels)), labels, fontsize=7)
        ax.set_xlim(0, span * 1.01)
        ax.set_xlabel("modelled time (us); hatched: kernel launch")
        ax.grid(axis="y", visible=False)
        cores = sorted(n for n in procs.values() if n != "chip")
        a = res.advice
        first = " and ".join(procs[pid] for pid in shown if procs[pid] != "chip")
        ax.set_title(f"{res.scenario.name}: {op}.{a.chosen} on {a.profile}, {span:.4g} us "
                     f"(pipes model; {len(cores)} cores busy, {first} shown)", fontsize=8)
        fig.tight_layout()
        return _svg(fig)
