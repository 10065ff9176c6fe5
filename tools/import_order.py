"""Does the order of ``import torch`` and our first parallel kernel change anyone's speed?

Two OpenMP runtimes in one process (numba's threading layer and torch's own) once made torch's
SDPA 2.5-10x slower when pypto_numba ran a parallel kernel before torch was imported. This tool
measures it: each process imports in one order, then times torch's SDPA, matmul and GELU
alternating with our ``attention.flash``, ``linear.fused_bias`` and ``gelu.tanh`` on the same
shapes (median of ``--repeats`` alternating calls each). Orders alternate across ``--processes``
launches per order; the report gives, per condition and op, the median over launches per order,
the ratio of the two orders and the spread between launches of one order (max/min).

Conditions: ``quiet``, and ``loaded``: a competing process spins on the last CPU while the
processes run (as a second user would). Usage::

    python tools/import_order.py --processes 9 --out import-order.json

``--verdict`` exits 1 when an order differs by more than ``max(5 %, same-order spread)``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ORDERS = ("torch-first", "ours-first")
OPS = ("sdpa", "matmul", "gelu")


def _child(order: str, repeats: int) -> dict:
    """One process: import in ``order``, then time torch's op and ours, alternating."""
    if order == "torch-first":
        import torch
    import numpy as np

    import pypto_numba as pn

    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32)
    k = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32)
    v = rng.standard_normal((1, 8, 2048, 128), dtype=np.float32)
    a = rng.standard_normal((2048, 2048), dtype=np.float32)
    w = rng.standard_normal((2048, 2048), dtype=np.float32)
    g = rng.standard_normal((4096, 4096), dtype=np.float32)
    pn.attention.flash(q, k, v, causal=True)  # our first parallel launch
    if order == "ours-first":
        import torch
    ours = {
        "sdpa": lambda: pn.attention.flash(q, k, v, causal=True),
        "matmul": lambda: pn.linear.fused_bias(a, w),
        "gelu": lambda: pn.gelu.tanh(g),
    }
    tq, tk, tv, ta, tw, tg = (torch.from_numpy(x) for x in (q, k, v, a, w, g))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    theirs = {
        "sdpa": lambda: sdpa(tq, tk, tv, is_causal=True),
        "matmul": lambda: ta @ tw.T,
        "gelu": lambda: torch.nn.functional.gelu(tg, approximate="tanh"),
    }
    result = {}
    for op in OPS:
        times = {"torch": [], "ours": []}
        for fn in (theirs[op], ours[op]):
            fn()  # warm
        for _ in range(repeats):
            for side, fn in (("torch", theirs[op]), ("ours", ours[op])):
                t0 = time.perf_counter()
                fn()
                times[side].append(time.perf_counter() - t0)
        result[op] = {side: statistics.median(ts) for side, ts in times.items()}
    return result


def _spin():
    """A competing process busy on the last CPU."""
    code = "import os\nos.sched_setaffinity(0, {max(os.sched_getaffinity(0))})\nwhile True:\n    pass\n"
    return subprocess.Popen([sys.executable, "-c", code])


def _launch(order, repeats, env):
    with tempfile.NamedTemporaryFile("r", suffix=".json") as f:
        subprocess.run([sys.executable, os.path.abspath(__file__), "--child", order, f.name,
                        "--repeats", str(repeats)], env=env, check=True)
        return json.load(open(f.name))


def measure(processes: int = 9, repeats: int = 7, conditions=("quiet", "loaded")) -> dict:
    """{condition: {order: [per-process results]}}, orders alternating, one warm-up launch first."""
    env = dict(os.environ)
    env.setdefault("NUMBA_CACHE_DIR", tempfile.mkdtemp(prefix="import_order_"))
    env.setdefault("NUMBA_NUM_THREADS", "2")
    _launch("torch-first", 1, env)  # compiles our kernels into the shared cache
    runs = {}
    for cond in conditions:
        spinner = _spin() if cond == "loaded" else None
        try:
            runs[cond] = {o: [] for o in ORDERS}
            for i in range(processes):
                for order in (ORDERS if i % 2 == 0 else ORDERS[::-1]):
                    runs[cond][order].append(_launch(order, repeats, env))
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
    return runs


def summarise(runs: dict) -> list:
    """Rows (condition, op, side, median per order, ours-first/torch-first, same-order spread)."""
    rows = []
    for cond, by_order in runs.items():
        for op in OPS:
            for side in ("torch", "ours"):
                per = {o: [r[op][side] for r in by_order[o]] for o in ORDERS}
                med = {o: statistics.median(ts) for o, ts in per.items()}
                spread = max(max(ts) / min(ts) for ts in per.values()) - 1
                rows.append({"condition": cond, "op": op, "side": side,
                             **{o: med[o] for o in ORDERS},
                             "ratio": med["ours-first"] / med["torch-first"], "spread": spread})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--processes", type=int, default=9, help="launches per order and condition")
    ap.add_argument("--repeats", type=int, default=7, help="alternating calls per op in a launch")
    ap.add_argument("--conditions", default="quiet,loaded")
    ap.add_argument("--out", help="write the runs and the summary as JSON")
    ap.add_argument("--verdict", action="store_true", help="exit 1 if an order differs beyond the bound")
    ap.add_argument("--child", nargs=2, metavar=("ORDER", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        with open(args.child[1], "w") as f:
            json.dump(_child(args.child[0], args.repeats), f)
        return 0
    runs = measure(args.processes, args.repeats, tuple(args.conditions.split(",")))
    rows = summarise(runs)
    worse = 0
    print(f"{'condition':9} {'op':7} {'side':6} {'torch-first':>12} {'ours-first':>12} {'ratio':>7} {'spread':>7}")
    for r in rows:
        bound = max(0.05, r["spread"])
        off = abs(r["ratio"] - 1) > bound
        worse += off
        print(f"{r['condition']:9} {r['op']:7} {r['side']:6} {r['torch-first'] * 1e3:10.2f}ms "
              f"{r['ours-first'] * 1e3:10.2f}ms {r['ratio']:7.3f} {r['spread']:6.1%}{'  OFF' if off else ''}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"runs": runs, "summary": rows}, f, indent=1)
    return 1 if (args.verdict and worse) else 0


if __name__ == "__main__":
    sys.exit(main())
