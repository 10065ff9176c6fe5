"""A/B speed check of two source trees on the asv suite's hot paths, in alternating processes.

``asv continuous`` builds an environment per commit and runs every benchmark in a fresh process;
for a refactor that must change no speed, this is quicker: each round runs the selected ``time_*``
benchmarks (median of ``--repeats`` warmed calls) and ``track_*_vs_*`` ratios (each a same-process
ratio against its peer) once in a process of the old tree, then once in a process of the new
tree, alternating, each tree with its own warm ``NUMBA_CACHE_DIR``; the report gives the median
over rounds and new/old per benchmark::

    python tools/ab.py --old ../base --new . --rounds 3 --bench 'Gelu|Rope' --out ab.json

``--bench`` is a regular expression searched in ``Class.method(params)``. Compile-time and
``peakmem_*`` benchmarks and deterministic byte counts are not run (they have no speed).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import json
import os
import pkgutil
import re
import statistics
import subprocess
import sys
import tempfile
import time

SKIP_CLASS = re.compile(r"Compile|PeakMem")
METHOD = re.compile(r"^(time_\w+|track_\w*vs_\w+|track_\w*speedup\w*)$")


def _benchmarks(pattern):
    import asv_benchmarks

    for info in pkgutil.iter_modules(asv_benchmarks.__path__):
        if not info.name.startswith("bench_"):
            continue
        mod = importlib.import_module(f"asv_benchmarks.{info.name}")
        for cname, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ != mod.__name__ or SKIP_CLASS.search(cname):
                continue
            params = getattr(cls, "params", ())
            if params and not isinstance(params[0], (list, tuple)):
                params = (params,)
            combos = list(itertools.product(*params)) if params else [()]
            for mname in sorted(m for m in dir(cls) if METHOD.match(m)):
                for combo in combos:
                    name = f"{cname}.{mname}{combo!r}"
                    if pattern and not re.search(pattern, name):
                        continue
                    yield name, cls, mname, combo


def _child(tree, pattern, repeats, out):
    sys.path.insert(0, tree)
    results = {}
    setups = {}
    for name, cls, mname, combo in _benchmarks(pattern):
        try:
            key = (cls, combo)
            if key not in setups:  # one setup per class and parameters, shared by its methods
                setups.clear()
                obj = cls()
                if hasattr(obj, "setup"):
                    obj.setup(*combo)
                setups[key] = obj
            obj = setups[key]
            fn = getattr(obj, mname)
            if mname.startswith("time_"):
                number = getattr(obj, "number", 1) or 1  # asv's calls per sample
                fn(*combo)
                times = []
                for _ in range(repeats):
                    t0 = time.perf_counter()
                    for _ in range(number):
                        fn(*combo)
                    times.append((time.perf_counter() - t0) / number)
                results[name] = statistics.median(times)
            else:
                results[name] = float(fn(*combo))
        except NotImplementedError:  # asv's "skip this combination"
            continue
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            results[name] = f"error: {type(exc).__name__}: {exc}"
        print(f"{name}: {results[name]}", file=sys.stderr, flush=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


def _report(old_runs, new_runs, tolerance):
    lines, worse = [], 0
    for name in old_runs[0]:
        o = [r[name] for r in old_runs if isinstance(r.get(name), float)]
        n = [r[name] for r in new_runs if isinstance(r.get(name), float)]
        if not o or not n:
            lines.append(f"{name}: error ({old_runs[0].get(name)} / {new_runs[0].get(name)})")
            continue
        mo, mn = statistics.median(o), statistics.median(n)
        if ".time_" in name:
            change = mn / mo  # > 1: new is slower
            flag = change > 1 + tolerance
            text = f"old {mo * 1e3:.3f} ms  new {mn * 1e3:.3f} ms  new/old {change:.3f}"
        else:
            change = mn / mo  # a speed ratio against a peer: < 1 means new is slower
            flag = change < 1 - tolerance
            text = f"old {mo:.3f}  new {mn:.3f}  new/old {change:.3f}"
        worse += flag
        lines.append(f"{'SLOWER ' if flag else '       '}{name}: {text}")
    return lines, worse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", required=True, help="source tree of the old commit")
    ap.add_argument("--new", required=True, help="source tree of the new commit")
    ap.add_argument("--bench", default="", help="regular expression on Class.method(params)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per time_* benchmark")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--out", help="write every run's results as JSON")
    ap.add_argument("--child", nargs=2, metavar=("TREE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.bench, args.repeats, args.child[1])
        return 0
    tmp = tempfile.mkdtemp(prefix="ab_")
    caches = {side: os.path.join(tmp, f"cache-{side}") for side in ("old", "new")}
    runs = {"old": [], "new": []}
    for rnd in range(args.rounds):
        for side in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
            tree = os.path.abspath(getattr(args, side))
            out = os.path.join(tmp, f"{side}-{rnd}.json")
            env = dict(os.environ, NUMBA_CACHE_DIR=caches[side], PYTHONPATH=tree)
            env.setdefault("NUMBA_NUM_THREADS", "2")
            print(f"== round {rnd + 1}: {side} ({tree})", file=sys.stderr, flush=True)
            subprocess.run([sys.executable, os.path.abspath(__file__), "--old", "-", "--new", "-",
                            "--bench", args.bench, "--repeats", str(args.repeats), "--child", tree, out],
                           env=env, check=True, cwd=tree)
            with open(out) as f:
                runs[side].append(json.load(f))
    lines, worse = _report(runs["old"], runs["new"], args.tolerance)
    print("\n".join(lines))
    print(f"{len(lines) - worse} of {len(lines)} benchmarks within {args.tolerance:.0%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(runs, f, indent=1)
    return 1 if worse else 0


if __name__ == "__main__":
    sys.exit(main())
