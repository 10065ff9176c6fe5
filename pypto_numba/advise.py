"""``advise``: pick a strategy for a scenario from plans alone (no data, instant for any shape).

The seed's four principles, applied in order:

1. constraints first: a strategy whose plan does not fit the profile's buffers (TileError) or
   breaks a PyPTO rule (ConstraintError) is rejected, with the plan's message;
2. kernel count and GM traffic: the survivors are ranked by the NPU-time estimate of their
   plans (the per-pipe model, machine/pipes.py), each strategy at its best legal tiles
   (``tiles="best"``, the default: :func:`pypto_numba.tune.search`) or at the profile's default
   tiles (``tiles="default"``, the answers before the tile search);
3. decode vs prefill: the scenario's shapes (q_len, kv_len, tokens) drive the plans, so the
   decision changes with them where the numbers say so;
4. a fused kernel over a composition: when two candidates are within ``TIE`` of each other, the
   one with fewer kernels (then fewer GM bytes, then the fused one) wins; a complete tie keeps
   the seed's choice.

Semantic choices that are not the advisor's to make (the model's router, RoPE layout, tanh vs
erf when exact GELU is required) are scenario arguments; the advice still prices the alternative.
Where the numbers contradict the seed's recommendation, the advice says so.
"""

from __future__ import annotations

import dataclasses

from .errors import ConstraintError, PyptoNumbaError, TileError
from .lab.spec import Candidate  # noqa: F401  (advise's candidate type, re-exported)
from .machine.cost import Cost
from .machine.profile import load_profile
from .strategy import SEED
from .strategy import spec as op_spec

TIE = 0.05  # candidates within 5 % of estimated NPU time are a tie, decided by principle 4


@dataclasses.dataclass
class Advice:
    op: str
    scenario: dict
    profile: str
    chosen: str
    reasons: list
    rejected: dict  # label -> reason
    ranking: list  # (label, estimated seconds, bound, kernels, GM bytes, workspace)
    seed: str
    agrees_with_seed: bool
    tiles: dict = dataclasses.field(default_factory=dict)  # label -> tile keywords used ({}: defaults)

    def __str__(self):
        lines = [f"advise {self.op} {self.scenario} on {self.profile}: use {self.chosen}"]
        lines += [f"  - {r}" for r in self.reasons]
        for label, reason in self.rejected.items():
            lines.append(f"  x {label}: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def total(plans) -> tuple:
    cost = sum((p.cost for p in plans), Cost())
    seconds = 0.0
    bound = None
    worst = -1.0
    for p in plans:
        est = p.estimate()
        seconds += est.seconds
        if est.seconds > worst:
            worst, bound = est.seconds, est.bound
    return cost, seconds, bound


def _decide(
    op: str,
    scenario: dict,
    profile,
    candidates,
    seed_choice: str = None,
    notes=(),
) -> Advice:
    prof = load_profile(profile)
    rejected, ranked = {}, []
    for cand in candidates:
        try:
            plans = tuple(cand.plans())
        except (TileError, ConstraintError) as exc:
            rejected[cand.label] = f"{type(exc).__name__}: {exc}"
            continue
        cost, seconds, bound = total(plans)
        ranked.append((cand, cost, seconds, bound))
    if not ranked:
        # every candidate broke a PyPTO constraint (e.g. top_k out of range): that is the error;
        # any buffer that does not fit makes it a TileError
        kind = ConstraintError if all(v.startswith("ConstraintError") for v in rejected.values()) else TileError
        raise kind(f"advise {op}: no strategy fits {prof.name} for {scenario}: "
                   + "; ".join(f"{k}: {v}" for k, v in rejected.items()))
    ranked.sort(key=lambda r: r[2])
    best_time = ranked[0][2]
    ties = [r for r in ranked if r[2] <= best_time * (1 + TIE)]
    seed = seed_choice or SEED[op][0]
    # full ties (same time, kernels, GM bytes, fusion) keep the seed's choice
    ties.sort(key=lambda r: (r[1].kernels, r[1].gm_bytes, not r[0].fused, r[0].label != seed, r[2]))
    chosen = ties[0]
    cand, cost, seconds, bound = chosen
    reasons = [
        f"fits {prof.name}: UB peak {cost.ub_peak_bytes} B of the {prof.vec_safe_bytes} B Vec limit, L1 peak "
        f"{cost.l1_peak_bytes} B, L0C peak {cost.l0c_peak_bytes} B",
        f"estimated NPU time {seconds * 1e6:.1f} us ({bound}-bound): {cost.kernels} kernel(s), "
        f"GM {cost.gm_read_bytes} B read + {cost.gm_write_bytes} B written, workspace {cost.workspace_bytes} B",
    ]
    for other in ranked:
        if other is chosen:
            continue
        o_cand, o_cost, o_sec, o_bound = other
        rel = o_sec / seconds if seconds else float("inf")
        why = (f"{o_cand.label}: {o_sec * 1e6:.1f} us ({rel:.2f}x), {o_cost.kernels} kernel(s), "
               f"GM {o_cost.gm_bytes} B, workspace {o_cost.workspace_bytes} B")
        if other in ties:
            why += " -- a tie on time, decided by kernel count / GM traffic / fusion"
        reasons.append(why)
    reasons += list(notes)
    agrees = cand.label == seed
    if not agrees:
        reasons.append(f"the seed recommends {seed} here; the plans' numbers above favour {cand.label}")
    ranking = [(c.label, s, b, co.kernels, co.gm_bytes, co.workspace_bytes) for c, co, s, b in ranked]
    used = {c.label: dict(c.tiles or {}) for c, _, _, _ in ranked}
    return Advice(op=op, scenario=dict(scenario), profile=prof.name, chosen=cand.label, reasons=reasons,
                  rejected=rejected, ranking=ranking, seed=seed, agrees_with_seed=agrees, tiles=used)


def price(cand) -> str:
    """One line pricing a candidate the scenario leaves out (e.g. the router the model does not use)."""
    try:
        cost, seconds, bound = total(cand.plans())
    except (TileError, ConstraintError) as exc:
        return f"{cand.label} would be ruled out: {exc}"
    return f"{cand.label} {seconds * 1e6:.1f} us ({bound}-bound), GM {cost.gm_bytes} B"


def __getattr__(name):
    if name == "SCENARIOS":  # op -> its advise rule (OpSpec.advise), for callers of the old table
        from .strategy import specs

        return {s.name: s.advise for s in specs()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TILES = ("best", "default")


def advise(op: str, profile=None, tiles: str = "best", **scenario) -> Advice:
    """Advice for ``op`` in ``scenario`` (the keywords of the op's rule, ``OP.advise`` in its module).

    ``tiles="best"`` (default) prices each strategy at its best legal tiles (``tune.search`` over
    the op's ``OP.tiles`` space, the profile's defaults included; a strategy its default tiles
    refuse stays refused, and the notes name the tiles at which it fits); ``"default"`` at the
    profile's default tiles only. ``Advice.tiles`` says which tiles each ranked strategy used.

    ``advise("layer", model=..., phase=..., batch=..., context=..., dtype=...)`` picks a whole
    layer's combination of strategies instead: :func:`pypto_numba.layers.advise_layer` (a dict)."""
    if op == "layer":
        from .layers import advise_layer

        return advise_layer(profile=profile, **scenario)
    cands, seed, notes = candidates(op, profile, tiles, **scenario)
    return _decide(op, scenario, profile, cands, seed, notes)


def candidates(op: str, profile=None, tiles: str = "best", **scenario) -> tuple:
    """(candidates, seed choice, notes) that ``advise`` ranks: the op's rule's candidates, each at
    its best legal tiles (``tiles="best"``) or at the profile's defaults (``"default"``). Pages
    that price a scenario's strategies price these, so that their numbers are advise's own."""
    rule = op_spec(op, "advise")
    if tiles not in TILES:
        raise PyptoNumbaError(f"advise {op}: tiles must be one of {TILES}, got {tiles!r}")
    try:
        cands, seed, notes = rule.advise(profile, **scenario)
    except TypeError as exc:
        raise PyptoNumbaError(f"advise {op}: {exc}; scenario keywords are {', '.join(rule.scenario_keywords)}") from None
    notes = list(notes)
    if tiles == "best" and rule.tiles is not None:
        cands, note = _best_tiles(op, profile, scenario, cands)
        notes.append(note)
    elif rule.tiles is None:
        notes.append(f"{op} declares no tile search space (OP.tiles): the profile's default tiles")
    else:
        notes.append("tiles='default': each strategy at the profile's default tiles (no tile search)")
    return cands, seed, notes


def _best_tiles(op, profile, scenario, cands):
    """The candidates at their best legal tiles (tune.search) and the note that says so."""
    from .tune.search import search

    try:
        found = search(op, top=1, profile=profile, progress=False, **scenario)
    except (TileError, ConstraintError):
        return cands, "no tile shape fits any strategy: the default tiles' refusals follow"
    out, moved = [], []
    for cand in cands:
        best = found.best.get(cand.label)
        default = found.defaults.get(cand.label)
        if best is None or default is None:
            # refused at its default tiles: it stays refused (the strategy's own call with no tile
            # keyword raises), and the note names the tiles at which it would fit
            out.append(cand)
            if best is not None:
                moved.append(f"{cand.label} is refused at its default tiles but fits at {_kw(best.tiles)}: "
                             f"{best.microseconds:.1f} us (not ranked: pass those tiles to use it)")
            continue
        out.append(dataclasses.replace(cand, plans=lambda best=best: best.plans, tiles=dict(best.tiles)))
        if best.seconds < default.seconds:
            moved.append(f"{cand.label} {best.microseconds:.1f} us at {_kw(best.tiles)} "
                         f"({best.seconds / default.seconds:.2f}x of {default.microseconds:.1f} us at the defaults)")
    note = (f"tiles='best': each strategy at its best legal tiles (tune.search planned {found.evaluated} tile "
            f"shapes); " + ("; ".join(moved) if moved else "the profile's default tiles are already the best")
            + "; advise(..., tiles='default') prices the defaults")
    return out, note


def _kw(d: dict) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in d.items()) or "the default tiles"
