"""Every candidate strategy of a scenario priced by its plans (no kernel runs), and the sweep points."""

from __future__ import annotations

import dataclasses

from ..errors import ConstraintError, TileError
from .scenarios import Scenario, at


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
    from ..advise import candidates, total

    out = {}
    for override in ({},) + tuple(also):
        cands = candidates(op, profile, **{**scenario, **override})[0]
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
    from ..advise import advise

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
