"""The report's scenarios: ``strategies/scenarios.toml`` parsed and checked against the ops' advise rules."""

from __future__ import annotations

import dataclasses
import re

from ..errors import PyptoNumbaError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib


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
    from ..strategy import OPS, spec

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
