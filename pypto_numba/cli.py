"""The ``pypto-numba`` command line: ``profiles``, ``compare``, ``advise``, ``plan``, ``tune``, ``report``.

``pypto-numba compare`` with no op runs every op's default scenario and prints one table per op:
the main job, followed by the hints of each strategy's plans. ``pypto-numba compare gelu --shape
8,11008 --dtype bf16`` compares one op. ``pypto-numba plan gelu --shape 8,11008 --dtype bf16``
prints each strategy's memory report and hints for an advise scenario, without running anything.
"""

from __future__ import annotations

import argparse
import json
import sys

from .errors import PyptoNumbaError


def _profiles(args) -> int:
    from .machine.profile import DEFAULT_PROFILE, active_profile, load_profile, profiles

    active = active_profile().name
    if args.format == "json":
        import dataclasses

        print(json.dumps({n: {k: v for k, v in dataclasses.asdict(load_profile(n)).items()} for n in profiles()},
                         indent=2, default=list))
        return 0
    for name in profiles():
        p = load_profile(name)
        mark = " (active)" if name == active else (" (default)" if name == DEFAULT_PROFILE else "")
        print(f"{name}{mark}: {p.description}")
        print(f"    UB {p.ub_bytes // 1024} KiB (Vec safe {p.vec_safe_bytes // 1024} KiB), L1 {p.l1_bytes // 1024} KiB, L0A/L0B {p.l0a_bytes // 1024}/"
              f"{p.l0b_bytes // 1024} KiB, L0C {p.l0c_bytes // 1024} KiB, BT {p.bt_bytes} B, "
              f"align {p.align_bytes} B; {p.cube_cores} cube + {p.vector_cores} vector cores at "
              f"{p.clock_hz / 1e9:.2f} GHz; GM {p.gm_bytes_per_s / 1e12:.2f} TB/s")
    return 0


def _hint_lines(pairs) -> list:
    """``hints:`` and one line per (label, hint); ``(none)`` when there are none."""
    lines = [f"  {label}: {h}" for label, h in pairs]
    return ["hints:"] + (lines or ["  (none)"])


def _row_hints(result) -> list:
    return [(f"{row.strategy}: {where}", h) for row in result.rows for where, h in row.hints]


def _compare(args) -> int:
    from . import strategy
    from .compare import compare, make_inputs, parse_shape

    if args.op == "layer":
        return _layer(args)
    ops = [args.op] if args.op else list(strategy.OPS)
    results = []
    if getattr(args, "exact", False):  # this command only, under use_exact()
        from .exact import use_exact

        with use_exact():
            return _compare(argparse.Namespace(**{**vars(args), "exact": False}))
    for op in ops:
        shape = parse_shape(args.shape) if args.shape else None
        inputs = make_inputs(op, shape, args.dtype, seed=args.seed)
        options = {}
        if args.dim is not None:
            options["dim"] = args.dim
        result = compare(
            op,
            *inputs,
            strategies=args.strategy,
            policy=args.policy,
            repeats=args.repeats,
            profile=args.profile,
            **options,
        )
        results.append(result)
        if args.format == "table":
            print(result.to_table(), *_hint_lines(_row_hints(result)), sep="\n", end="\n\n", flush=True)
        elif args.format == "markdown":
            print(result.to_markdown(), "", *(f"- {line.strip()}" for line in _hint_lines(_row_hints(result))[1:]),
                  sep="\n", end="\n\n", flush=True)
    if args.format == "json":
        print(json.dumps([r.to_dict() for r in results], indent=2, default=float))
    if args.timeline:
        _save_timeline(results, args.timeline)
    return 0


def _save_timeline(results, path):
    """One trace file: a group of processes per compared strategy ("gelu.tanh: AIV 0", ...), all from 0."""
    from .machine.timeline import Timeline

    groups = [g for r in results for g in r.timelines()]
    if not groups:
        raise PyptoNumbaError("compare --timeline: every strategy was ruled out; there is no schedule to write")
    tl = Timeline.combine(groups)
    tl.save(path)
    print(f"compare: wrote the modelled timeline of {len(groups)} strategies ({len(tl.events)} trace events) "
          f"to {path}; open it in https://ui.perfetto.dev or chrome://tracing", file=sys.stderr)


def _scenario_value(text: str):
    import ast

    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text  # a bare word such as bf16 or sigmoid


def _scenario(extra, who: str) -> dict:
    """``--name value`` / ``--name=value`` pairs -> scenario keywords."""
    scenario = {}
    it = iter(extra)
    for flag in it:
        if not flag.startswith("--"):
            raise PyptoNumbaError(f"{who}: expected --name value, got {flag!r}")
        key = flag[2:].replace("-", "_")
        if "=" in key:
            key, value = key.split("=", 1)
        else:
            value = next(it, None)
            if value is None:
                raise PyptoNumbaError(f"{who}: {flag} needs a value")
        scenario[key] = _scenario_value(value)
    return scenario


def _advise(args, extra) -> int:
    from .advise import advise

    scenario = _scenario(extra, "advise")
    if args.op == "layer":
        return _layer(args, scenario)
    result = advise(args.op, profile=args.profile, **scenario)
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        print(result)
    return 0


def _plan(args, extra) -> int:
    from .errors import ConstraintError, TileError
    from .strategy import spec

    rule = spec(args.op, "plan")
    scenario = _scenario(extra, "plan")
    try:
        cands = rule.advise(args.profile, **scenario)[0]
    except TypeError as exc:
        raise PyptoNumbaError(f"plan {args.op}: {exc}; scenario keywords are "
                              f"{', '.join(rule.scenario_keywords)}") from None
    out = []
    for cand in cands:
        try:
            plans = tuple(cand.plans())
        except (TileError, ConstraintError) as exc:
            out.append({"strategy": cand.label, "refused": f"{type(exc).__name__}: {exc}"})
            continue
        out.append({"strategy": cand.label, "plans": plans})
    if args.format == "json":
        print(json.dumps([{"strategy": o["strategy"], "refused": o["refused"]} if "refused" in o else
                          {"strategy": o["strategy"],
                           "memory": [row for p in o["plans"] for row in p.memory_report().to_dicts()],
                           "hints": [dict(vars(h)) for p in o["plans"] for h in p.hints]} for o in out],
                         indent=2))
        return 0
    for o in out:
        print(f"== {args.op} {o['strategy']}")
        if "refused" in o:
            print(f"REFUSED: {o['refused']}", end="\n\n")
            continue
        for p in o["plans"]:
            print(p.memory_report())
        print(*_hint_lines([(p.where, h) for p in o["plans"] for h in p.hints]), sep="\n", end="\n\n")
    return 0


def _tune(args, extra) -> int:
    from .tune import search

    scenario = _scenario(extra, "tune")
    result = search(args.op, top=args.top, profile=args.profile, measure=args.measure,
                    progress=None if args.format == "text" else False, **scenario)
    if args.format == "json":
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return 0
    print(result, "", result.details(args.details), sep="\n")
    return 0


def _report(args) -> int:
    from .report import generate

    return generate(args.out, measure_runs=not args.no_measure, check=args.check, repeats=args.repeats)


def _shape_orders() -> str:
    """Each op's --shape order, from its OP spec."""
    from .strategy import specs

    return "--shape per op:\n" + "\n".join(f"  {s.name}: {s.inputs.help}" for s in specs())


def _layer(args, scenario=None) -> int:
    """``compare layer`` (per-op table, totals, drift over --layers) and ``advise layer`` (the
    chosen strategy combination), from pypto_numba.layers."""
    from . import layers

    opts = dict(model="qwen3-1.7b", phase="decode", batch=16, context=4096, dtype="bf16")
    if scenario is None:  # compare layer: its own flags
        opts.update({k: getattr(args, k) for k in ("model", "phase", "batch", "context", "dtype")})
    else:
        unknown = set(scenario) - set(opts)
        if unknown:
            raise PyptoNumbaError(f"advise layer: unknown keywords {sorted(unknown)}; known: {sorted(opts)}")
        opts.update(scenario)
    advice = layers.advise_layer(opts["model"], opts["phase"], opts["batch"], opts["context"], opts["dtype"],
                                 args.profile)
    if scenario is not None:
        print(json.dumps(advice, indent=2, default=str) if args.format == "json" else layers.advice_text(advice))
        return 0
    cfg = layers.config(opts["model"]) if isinstance(opts["model"], str) else opts["model"]
    plan_fn = layers.plan_moe if cfg.is_moe else layers.plan_qwen3
    for title, strategies in (("seed's picks", None), ("advised", advice["chosen"])):
        p = plan_fn(cfg, opts["phase"], opts["batch"], opts["context"], opts["dtype"], strategies, args.profile)
        print(f"== {title}: {dict(p.strategies)}")
        print(p.to_markdown(args.profile))
        print()
    if args.layers and not cfg.is_moe:
        def bar(done, total):
            print(f"\r  layers {done}/{total} " + "#" * done + "." * (total - done), end="", file=sys.stderr)

        depths = sorted({d for d in (1, 2, 4, 8, args.layers) if d <= args.layers})
        print(f"== drift over {args.layers} layers vs float64 ({opts['dtype']}, a prefill of 1 x 4 tokens, "
              f"seed's picks)")
        rows = layers.drift(cfg, depths, opts["dtype"], batch=1, tokens=4, progress=bar, profile=args.profile)
        print(file=sys.stderr)
        print("| layers | rel-L2 | cosine | > 1e-2 | outliers (0.5 % rule) |\n|---:|---:|---:|---:|---:|")
        for r in rows:
            print(f"| {r['layers']} | {r['rel_l2']:.3g} | {r['cosine']:.6f} | {100 * r['above_1e-2']:.2f} % | "
                  f"{r['outliers']}/{r['dist'].allowed} |")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pypto-numba", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("profiles", help="list the hardware profiles")
    p.add_argument("--format", choices=("table", "json"), default="table")
    p.set_defaults(func=_profiles)

    p = sub.add_parser("compare", help="run every strategy of an op side by side",
                       epilog=_shape_orders(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("op", nargs="?", help="op to compare (default: every op's default scenario)")
    p.add_argument("--shape", help="input shape, comma-separated (default: the op's default scenario)")
    p.add_argument("--dtype", default="bf16", choices=("fp32", "bf16", "fp16"))
    p.add_argument("--profile", default=None, help="hardware profile (default: the active one)")
    p.add_argument("--policy", default=None, choices=("allclose", "outlier", "dual", "allclose_ratio", "reldiff",
                                                      "distribution"))
    p.add_argument("--exact", action="store_true",
                   help="run under use_exact(): inputs widened to fp32, no intermediate rounding (pypto_numba/exact.py)")
    p.add_argument("--strategy", action="append", help="only this strategy (repeatable)")
    p.add_argument("--dim", type=int, default=None, help="reduction dim (mean)")
    p.add_argument("--repeats", type=int, default=5, help="warm runs timed per strategy (median)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--format", choices=("table", "markdown", "json"), default="table")
    p.add_argument("--timeline", metavar="OUT.json", default=None,
                   help="write the pipe model's schedule of every compared strategy as one Chrome/Perfetto "
                        "trace (a process group per strategy, all from time 0)")
    p.add_argument("--model", default="qwen3-1.7b", help="compare layer: qwen3-1.7b, qwen3-14b or deepseek-v3")
    p.add_argument("--phase", default="decode", choices=("decode", "prefill"), help="compare layer")
    p.add_argument("--batch", type=int, default=16, help="compare layer")
    p.add_argument("--context", type=int, default=4096, help="compare layer: tokens in the cache / prefilled")
    p.add_argument("--layers", type=int, default=0, help="compare layer: drift over this many stacked layers")
    p.set_defaults(func=_compare)

    p = sub.add_parser(
        "advise", help="pick a strategy for a scenario from plans alone",
        description="Scenario keywords follow the op, e.g. advise attention --batch 1 --q-len 1 "
                    "--kv-len 32768 --q-heads 32 --kv-heads 8 --head-dim 128 --dtype bf16; "
                    "advise linear --tokens 16 --in-features 4096 --out-features 4096.")
    p.add_argument("op")
    p.add_argument("--profile", default=None)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=_advise, takes_extra=True)

    p = sub.add_parser(
        "plan", help="memory report and hints of each strategy's plans for a scenario (nothing runs)",
        description="Scenario keywords as for advise, e.g. plan gelu --shape 8,11008 --dtype bf16; "
                    "plan attention --batch 1 --q-len 2048 --kv-len 2048 --head-dim 128. Per kernel: space, "
                    "used, limit (UB: the compiler-safe Vec limit), usage; then PH001 / MARGINAL hints.")
    p.add_argument("op")
    p.add_argument("--profile", default=None)
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=_plan, takes_extra=True)

    p = sub.add_parser(
        "tune", help="rank every legal tile shape of an op's strategies by estimated NPU time",
        description="Scenario keywords as for advise, e.g. tune linear --tokens 6144 --in-features 6144 "
                    "--out-features 6144 --dtype fp16 --bias False; tune gelu --shape 2048,9216. Prints the top N "
                    "(bound, per-task pipe busy times), then the memory report and hints of the first --details.")
    p.add_argument("op")
    p.add_argument("--profile", default=None)
    p.add_argument("--top", type=int, default=10, help="results to show (default 10)")
    p.add_argument("--measure", action="store_true",
                   help="run the first three on the CPU (compare): precision verdict and CPU time")
    p.add_argument("--details", type=int, default=1, help="memory reports and hints of this many results")
    p.add_argument("--format", choices=("text", "json"), default="text")
    p.set_defaults(func=_tune, takes_extra=True)

    p = sub.add_parser(
        "report", help="regenerate the strategy pages (strategies/*.md, charts) or check them",
        description="Regenerates strategy-comparison.md, one page per op and the SVG charts from "
                    "<out>/scenarios.toml. --check regenerates the plan-derived content only (no kernel "
                    "runs) and exits 1 when the pages differ outside their measured sections.")
    p.add_argument("--out", default="strategies", help="folder with scenarios.toml and the pages (default: strategies)")
    p.add_argument("--check", action="store_true", help="verify the committed pages instead of writing them")
    p.add_argument("--no-measure", action="store_true",
                   help="skip the compare() runs; keep the measured sections already on disk")
    p.add_argument("--repeats", type=int, default=3, help="warm runs timed per strategy (median)")
    p.set_defaults(func=_report)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "takes_extra", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if getattr(args, "takes_extra", False):
            return args.func(args, extra)
        return args.func(args)
    except PyptoNumbaError as exc:
        print(f"pypto-numba: error: {exc}", file=sys.stderr)
        return 2
