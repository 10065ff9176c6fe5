"""Tile search: ``search(op, **scenario)`` ranks every legal tile shape of every strategy.

The search space is data: the op's ``OP.tiles`` (pypto_numba/lab/spec.py) lists, for a scenario,
one Candidate per strategy and tile shape (the tile keywords its plans take: ``tile``,
``token_tile``, ``kv_tile`` / ``q_tile``, ``cube_tiles``, ...). The profile's own default tiles
(the advise rule's candidates) are always in the pool, so the best is never worse than the
default. Each candidate is planned (a plan that refuses, TileError or ConstraintError, is dropped
and counted) and ranked by its plans' NPU-time estimate (the "pipes" model: machine/pipes.py);
ties go to fewer kernels, fewer GM bytes, then the default tiles.

``measure=True`` runs the first few on the CPU through compare's machinery (the scenario's
compare shape, ``Candidate.shape``) and adds their precision verdict and CPU time.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
import time

from ..errors import ConstraintError, PyptoNumbaError, TileError

MEASURE_TOP = 3  # measure=True runs this many of the ranked results


@dataclasses.dataclass(frozen=True)
class Tuned:
    """One strategy at one tile shape, planned and priced."""

    strategy: str
    tiles: dict        # the tile keywords given to its plans ({}: the profile's defaults)
    default: bool      # these plans are the ones the profile's default tiles give
    plans: tuple
    cost: object       # the plans' summed Cost
    estimate: object   # the slowest plan's Estimate (its bound) -- seconds are the sum below
    seconds: float     # estimated NPU seconds, summed over the plans
    bound: str         # the bound of the plan that takes longest
    pipes: dict        # busy seconds per pipe, summed over the plans' kernels
    shape: tuple = None  # compare's --shape for the scenario
    measured: dict = None  # measure=True: {"verdict", "cpu_seconds", "max_abs_err"} or {"error"}

    @property
    def microseconds(self) -> float:
        return self.seconds * 1e6

    @property
    def hints(self) -> tuple:
        """(plan, Hint) of every plan."""
        return tuple((p.where, h) for p in self.plans for h in p.hints)

    def memory_report(self) -> str:
        return "\n".join(str(p.memory_report()) for p in self.plans)

    @property
    def label(self) -> str:
        tiles = ", ".join(f"{k}={v!r}" for k, v in self.tiles.items())
        return f"{self.strategy}({tiles or 'default tiles'})"

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "tiles": self.tiles, "default": self.default,
                "seconds": self.seconds, "bound": self.bound, "pipes": self.pipes,
                "kernels": self.cost.kernels, "gm_bytes": self.cost.gm_bytes,
                "memory": [row for p in self.plans for row in p.memory_report().to_dicts()],
                "hints": [dict(vars(h), plan=w) for w, h in self.hints],
                "measured": self.measured}


@dataclasses.dataclass
class Search:
    """``search``'s answer: the top results, and per strategy its best and its default."""

    op: str
    scenario: dict   # every advise keyword, defaults filled in
    profile: str
    results: list    # the top Tuned, best first
    best: dict       # strategy -> its best Tuned
    defaults: dict   # strategy -> Tuned at the profile's default tiles (absent when they refuse)
    evaluated: int   # tile shapes planned
    refused: dict    # strategy -> tile shapes its plans refused
    searched: bool   # the op declares a tile search space (OP.tiles)

    def __iter__(self):
        return iter(self.results)

    def __len__(self):
        return len(self.results)

    def __getitem__(self, i):
        return self.results[i]

    def __str__(self):
        lines = [f"tune {self.op} {_kw(self.scenario)} on {self.profile}: {self.evaluated} tile shapes "
                 f"planned, {sum(self.refused.values())} refused"
                 + ("" if self.searched else " (the op declares no tile search space: default tiles only)")]
        for i, t in enumerate(self.results, 1):
            pipes = ", ".join(f"{p} {s * 1e6:.1f}" for p, s in t.pipes.items() if s > 0)
            vs = ""
            d = self.defaults.get(t.strategy)
            if d is not None and d.seconds > 0:
                vs = f", {t.seconds / d.seconds:.2f}x its default"
            lines.append(f"{i:3d}. {t.label}: {t.microseconds:.1f} us ({t.bound}-bound{vs}), "
                         f"{t.cost.kernels} kernel(s), GM {t.cost.gm_bytes} B; per-task pipe busy us: {pipes or '-'}")
            if t.measured:
                m = t.measured
                lines.append("     CPU: " + (m["error"] if "error" in m else
                                             f"{m['verdict']}, max abs err {m['max_abs_err']:.3g}, "
                                             f"{m['cpu_seconds'] * 1e3:.2f} ms"))
        for strategy, d in self.defaults.items():
            b = self.best[strategy]
            lines.append(f"  {strategy}: default tiles {d.microseconds:.1f} us, best {b.microseconds:.1f} us "
                         f"({_kw(b.tiles) or 'the defaults'})")
        return "\n".join(lines)

    def details(self, n: int = 1) -> str:
        """The memory report and hints of the first ``n`` results."""
        out = []
        for t in self.results[:n]:
            out.append(f"== {t.label}")
            out.append(t.memory_report())
            out.append("hints:")
            out += [f"  {w}: {h}" for w, h in t.hints] or ["  (none)"]
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"op": self.op, "scenario": self.scenario, "profile": self.profile,
                "evaluated": self.evaluated, "refused": self.refused,
                "results": [t.to_dict() for t in self.results],
                "defaults": {k: v.to_dict() for k, v in self.defaults.items()},
                "best": {k: v.to_dict() for k, v in self.best.items()}}


def _kw(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items())


class _Bar:
    """A progress bar on a stream: redrawn in place on a terminal, a line every 10 % otherwise."""

    def __init__(self, total, stream, label):
        self.total, self.done, self.stream, self.label = max(total, 1), 0, stream, label
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.t0 = time.perf_counter()
        self.shown = -1

    def step(self):
        self.done += 1
        tenth = 10 * self.done // self.total
        if not self.tty and tenth == self.shown:
            return
        self.shown = tenth
        filled = 28 * self.done // self.total
        text = (f"tune [{'#' * filled}{'-' * (28 - filled)}] {self.done}/{self.total} "
                f"{time.perf_counter() - self.t0:5.1f}s {self.label}")
        self.stream.write(("\r" + text.ljust(100)) if self.tty else text + "\n")
        if self.tty and self.done >= self.total:
            self.stream.write("\n")
        self.stream.flush()


def full_scenario(rule, scenario: dict, who: str) -> dict:
    """``scenario`` with the advise rule's defaults filled in; an unknown keyword is an error."""
    sig = inspect.signature(rule.advise)
    try:
        bound = sig.bind(None, **scenario)
    except TypeError as exc:
        raise PyptoNumbaError(f"{who} {rule.name}: {exc}; scenario keywords are "
                              f"{', '.join(rule.scenario_keywords)}") from None
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != "profile"}


def _price(cand, prof):
    plans = tuple(cand.plans())
    ests = [p.estimate(prof) for p in plans]
    seconds = sum(e.seconds for e in ests)
    worst = max(ests, key=lambda e: e.seconds) if ests else None
    pipes = {}
    for e in ests:
        for p, s in e.pipes.items():
            pipes[p] = pipes.get(p, 0.0) + s
    cost = sum((p.cost for p in plans[1:]), plans[0].cost) if plans else None
    return plans, cost, worst, seconds, pipes


def _key(plans) -> tuple:
    return tuple((p.where, tuple(sorted((k, repr(v)) for k, v in p.params.items()))) for p in plans)


def candidates(op: str, profile=None, **scenario):
    """(spec, full scenario, default candidates, seed, notes, tile candidates) of a scenario."""
    from ..strategy import spec as op_spec

    rule = op_spec(op, "tune")
    full = full_scenario(rule, scenario, "tune")
    try:
        defaults, seed, notes = rule.advise(profile, **full)
    except TypeError as exc:
        raise PyptoNumbaError(f"tune {op}: {exc}; scenario keywords are {', '.join(rule.scenario_keywords)}") from None
    labels = {c.label for c in defaults}
    tiles = []
    if rule.tiles is not None:
        tiles = [c for c in rule.tiles(profile, **full) if c.label in labels]
    return rule, full, list(defaults), seed, notes, tiles


def search(op: str, top: int = 10, profile=None, measure=False, progress=None, **scenario) -> Search:
    """The ``top`` tile shapes of ``op``'s strategies for ``scenario``, by estimated NPU time.

    Parameters
    ----------
    op : an op name (``pypto_numba.strategy.OPS``).
    top : how many results to keep (each strategy's best and default are kept apart in
        ``Search.best`` / ``Search.defaults`` whatever ``top`` is).
    profile : a profile name or HardwareProfile (None: the active one).
    measure : True (or a count) runs the first ``MEASURE_TOP`` (or that many) results on the CPU
        with compare() at the scenario's compare shape: precision verdict and CPU time.
    progress : True draws a progress bar on stderr, a stream draws it there, False never;
        None (default) draws it on a terminal when more than 100 tile shapes are planned.
    scenario : the op's advise keywords (``OP.advise`` in its module).
    """
    from ..machine.profile import load_profile

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise PyptoNumbaError(f"tune {op}: top must be a positive int, got {top!r}")
    rule, full, defaults, _seed, _notes, tiled = candidates(op, profile, **scenario)
    prof = load_profile(profile)
    shapes = {c.label: c.shape for c in tiled if c.shape is not None}
    defaults = [c if c.shape is not None else dataclasses.replace(c, shape=shapes.get(c.label)) for c in defaults]
    pool = [(c, True) for c in defaults] + [(c, False) for c in tiled]
    stream = sys.stderr if progress is True or progress is None else progress
    draw = bool(progress) if progress is not None else (len(pool) > 100 and getattr(stream, "isatty", lambda: False)())
    bar = _Bar(len(pool), stream, op) if draw else None
    seen, refused = {}, {}
    default_of = {}
    for cand, is_default in pool:
        try:
            plans, cost, worst, seconds, pipes = _price(cand, prof)
        except (TileError, ConstraintError):
            if not is_default:
                refused[cand.label] = refused.get(cand.label, 0) + 1
            if bar:
                bar.step()
            continue
        key = (cand.label, _key(plans))
        old = seen.get(key)
        if old is not None:  # the same plans again: keep the first, with the explicit tiles if any
            if cand.tiles and not old.tiles:
                seen[key] = dataclasses.replace(old, tiles=dict(cand.tiles))
                if old.default:
                    default_of[cand.label] = seen[key]
        else:
            t = Tuned(strategy=cand.label, tiles=dict(cand.tiles or {}), default=is_default, plans=plans,
                      cost=cost, estimate=worst, seconds=seconds, bound=worst.bound if worst else "none",
                      pipes=pipes, shape=cand.shape)
            seen[key] = t
            if is_default:
                default_of[cand.label] = t
        if bar:
            bar.step()
    ranked = sorted(seen.values(), key=_rank)
    if not ranked:
        raise TileError(f"tune {op}: no tile shape of any strategy fits {prof.name} for {_kw(full)}")
    best = {}
    for t in ranked:
        best.setdefault(t.strategy, t)
    defaults_now = {label: default_of[label] for label in best if label in default_of}
    results = ranked[:top]
    if measure:
        n = MEASURE_TOP if measure is True else int(measure)
        results = [_measure(op, t, full, prof) if i < n else t for i, t in enumerate(results)]
    return Search(op=op, scenario=full, profile=prof.name, results=results, best=best,
                  defaults=defaults_now, evaluated=len(pool), refused=refused, searched=rule.tiles is not None)


def _rank(t: Tuned):
    return (t.seconds, t.cost.kernels, t.cost.gm_bytes, not t.default, t.strategy, repr(sorted(t.tiles.items())))


def best_candidates(op: str, profile=None, **scenario) -> dict:
    """strategy -> (its best Tuned, its default Tuned or None): advise(tiles="best")'s input."""
    s = search(op, top=1, profile=profile, progress=False, **scenario)
    return {label: (t, s.defaults.get(label)) for label, t in s.best.items()}


def _measure(op, t: Tuned, scenario: dict, prof) -> Tuned:
    """Run ``t`` on the CPU with compare() at its compare shape."""
    from ..compare import compare, make_inputs

    if t.shape is None:
        return dataclasses.replace(t, measured={"error": "the op's tile space gives no compare shape"})
    dtype = scenario.get("dtype", "fp32")
    try:
        inputs = make_inputs(op, t.shape, dtype)
        result = compare(op, *inputs, strategies=[t.strategy], repeats=3, profile=prof, **t.tiles)
    except PyptoNumbaError as exc:
        return dataclasses.replace(t, measured={"error": f"{type(exc).__name__}: {exc}"})
    row = result.rows[0]
    if row.ruled_out:
        return dataclasses.replace(t, measured={"error": f"ruled out at {t.shape}: {row.ruled_out}"})
    err = max((r.max_abs for r in row.precision), default=float("nan"))
    return dataclasses.replace(t, measured={"verdict": row.verdict, "cpu_seconds": row.seconds,
                                            "max_abs_err": err, "shape": tuple(t.shape)})
