"""``generate``: plan every scenario, draw the charts, measure, write the pages (or check them)."""

from __future__ import annotations

import os
import sys
import time

from ..errors import PyptoNumbaError
from .calibration import calibration_page
from .charts import PLOT_HINT, precision_svg, sweep_svg, timeline_svg
from .check import _check, old_measured
from .markdown import CHARTS, PAGE, measured_lines, op_page, summary_measured, summary_page, timeline_result
from .measuring import measure
from .pricing import plan_scenario
from .scenarios import load_scenarios


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


def generate(
    out_dir: str,
    *,
    measure_runs: bool = True,
    check: bool = False,
    repeats: int = 3,
    stream=None,
    scenarios_path=None,
    charts: bool = None,
) -> int:
    """Regenerate (or, with ``check``, verify) the pages in ``out_dir``; returns the exit code.

    ``charts=None`` draws (or checks) the charts and requires matplotlib to write pages; ``False``
    skips every chart (markdown only: for tests and for ``--check`` without matplotlib).
    """
    from ..machine.profile import DEFAULT_PROFILE

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
        for op in dict.fromkeys(sc.op for sc in scenarios):  # one timeline chart per op page
            r = timeline_result([r for r in results if r.scenario.op == op])
            if r is not None:
                files[f"{CHARTS}/{op}-timeline.svg"] = timeline_svg(op, r)

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
    pages["calibration.md"] = calibration_page(results, profile)
    layers_md = os.path.join(out_dir, "layers.md")
    if os.path.exists(layers_md):  # pypto_numba.layers.page's: its plans checked, its numerics kept as on disk
        from ..layers.page import build as layers_page

        pages["layers.md"] = layers_page(numerics=False, measured=old_measured(layers_md))
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
