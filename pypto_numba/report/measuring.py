"""The measured sections: compare() on each scenario's small shape, per dtype."""

from __future__ import annotations

import dataclasses
import os
import time

from ..errors import ConstraintError, TileError
from .scenarios import Scenario


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
    distribution: object = None  # precision.Distribution of the float output with the largest rel-L2


def worst_distribution(results):
    """The Distribution with the largest rel-L2 among ``results`` (precision.Result), None if none."""
    dists = [r.distribution for r in results if r.distribution is not None]
    return max(dists, key=lambda d: d.rel_l2) if dists else None


def measure(sc: Scenario, dtype: str, profile, repeats: int) -> list:
    """compare() on the scenario's small shape in one dtype; a failure becomes an error row."""
    from ..compare import compare, make_inputs

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
                        cpu_seconds=row.seconds, gm_bytes=row.cost.gm_bytes,
                        distribution=worst_distribution(row.precision)))
    return runs


def _measure_variants(op, spec, dtype, profile, repeats) -> list:
    """compare()'s scoring for one strategy run once per option set (e.g. gqa="expand_clone" / "head_loop").

    compare() passes every option to the reference too, and the attention reference takes no
    ``gqa`` (the reference is the same either way), so these rows are scored here the way
    compare() scores its rows: same inputs, reference, policy and tolerances.
    """
    import statistics

    from .. import precision
    from ..compare import case, make_inputs
    from ..machine.cost import Cost
    from ..strategy import get, strategies, trace

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
                            gm_bytes=sum((r.cost for r in t.records), Cost()).gm_bytes,
                            distribution=worst_distribution(res)))
    return runs


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
