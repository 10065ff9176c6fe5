"""``strategies/calibration.md``: the NPU time model against the published device figures.

Plan-derived only (``report --check`` covers it): every device figure of npu-facts 8.5 and 7 that
the lab can express (published value, our estimate, ratio, bound), how the answers move when each
named assumption of the pipe model (machine/pipes.py, docs/model.md) changes, and every scenario
where advise contradicts the seed, with the pipe that decides it.
"""

from __future__ import annotations

import dataclasses
import math

from .markdown import HEADER, fmt_bytes, table

PAGE = "calibration.md"


@dataclasses.dataclass(frozen=True)
class Assumption:
    name: str      # as machine/pipes.py and docs/model.md name it
    field: str     # the profile field it sets ("pipes.<name>" or a HardwareProfile field)
    values: tuple  # (value, label) pairs tried besides the profile's own
    why: str


ASSUMPTIONS = (
    Assumption("hbm_bytes_per_s", "pipes.hbm_bytes_per_s",
               ((1.2e12, "1.2 TB/s"), (1.6e12, "1.6 TB/s")),
               "910B HBM is quoted as 1.2 or 1.6 TB/s (npu-facts 8.5, unverified); the profile's 1.42 TB/s is "
               "the ini's 32 B/cycle/core x 1.85 GHz x 24"),
    Assumption("l2_bytes_per_s", "pipes.l2_bytes_per_s",
               ((2.84e12, "2.84 TB/s (2x HBM)"), (4.26e12, "4.26 TB/s (3x HBM)")),
               "no public figure; the profile's 4.88 TB/s is the ini's 110 B/cycle/core x 1.85 GHz x 24, the "
               "matmul guide says \"more than 3x\" HBM (npu-facts 4.1)"),
    Assumption("contention cap", "pipes.contention",
               (("off", "off (per-core fits only)"),),
               "PTO-ISA's fit leaves its shared caps at 0 (\"no observable contention at n <= 4\"); the profile "
               "caps every core at its share of the chip's HBM and L2"),
    Assumption("gm_to_l1_peak_gibs", "pipes.gm_to_l1_peak_gibs",
               ((28.61, "28.61 GiB/s (the fit's peak)"),),
               "PTO-ISA's GM->L1 fit was made at <= 4 cores; the profile takes its flat table's 135 GiB/s"),
    Assumption("clock_hz", "clock_hz",
               ((1.8e9, "1.80 GHz (910B2C ini)"),),
               "the profile's 1.85 GHz is PTO-ISA's kMainFrequencyHz; the 910B2C ini says 1800 MHz (npu-facts 8.5)"),
)


def variant(prof, assumption: Assumption, value):
    """``prof`` with one named assumption changed."""
    if assumption.field == "pipes.contention":
        pipes = dataclasses.replace(prof.pipes, hbm_bytes_per_s=math.inf, l2_bytes_per_s=math.inf)
        return dataclasses.replace(prof, pipes=pipes)
    if assumption.field.startswith("pipes."):
        pipes = dataclasses.replace(prof.pipes, **{assumption.field[6:]: value})
        return dataclasses.replace(prof, pipes=pipes)
    return dataclasses.replace(prof, **{assumption.field: value})


def _us(seconds) -> str:
    us = seconds * 1e6
    return f"{us:,.1f} us" if us < 10000 else f"{us:,.0f} us"


def _published(seconds) -> str:
    return f"{seconds * 1e3:g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:g} us"


def _figures():
    """(spec, DeviceFigure) of every op that declares published device timings (OP.figures)."""
    from ..strategy import specs

    return [(spec, f) for spec in specs() for f in spec.figures]


def _priced(spec, f, prof):
    """(Tuned, Search) of a figure's strategy at its tiles on ``prof``."""
    from ..tune import search

    s = search(spec.name, top=1, profile=prof, progress=False, **f.scenario)
    return (s.best if f.tiles == "best" else s.defaults)[f.strategy], s


def _call(spec, f) -> str:
    return f"{spec.name}.{f.strategy} at " + ", ".join(f"{k}={v!r}" for k, v in f.scenario.items())


def _slowest(t) -> dict:
    return max((k for p in t.plans for k in p.estimate().kernels), key=lambda k: k["seconds"])


def figures(prof) -> list:
    lines = ["## Device figures (npu-facts 8.5 and 7)", "",
             f"Each published figure an op declares (`OP.figures`) is priced from its strategy's plans on `{prof.name}` "
             "with the default model: at the profile's default tiles, or (a tuned run) at `tune.search`'s best.", ""]
    rows, notes, priced = [], [], {}
    for spec, f in _figures():
        t, s = _priced(spec, f, prof)
        priced[(spec.name, repr(f.scenario), f.strategy, f.tiles)] = t
        rows.append((f.label, f.source, _published(f.seconds), _us(t.seconds), f"{t.seconds / f.seconds:.2f}", t.bound))
        if f.flops:
            rows.append(("  the same as throughput", f.source, f.throughput, f"{f.flops / t.seconds / 1e12:.0f} TFLOPS",
                         f"{f.seconds / t.seconds:.2f}", t.bound))
        k = _slowest(t)
        where = (f"`{_call(spec, f)}`, " + (f"tiles {_kw(t.tiles)}" if f.tiles == "best" else "the default tiles")
                 + f" (tune.search planned {s.evaluated} tile shapes, {sum(s.refused.values())} refused)")
        checks = []
        if f.within:
            ok = f.seconds / f.within <= t.seconds <= f.seconds * f.within
            checks.append(f"within {f.within}x of {_published(f.seconds)}: {'PASS' if ok else 'FAIL'}")
        if f.bound:
            checks.append(f"{f.bound}-bound as the source says: {'PASS' if t.bound == f.bound else 'FAIL (' + t.bound + ')'}")
        roof, sim = (sum(p.estimate(model=m).seconds for p in t.plans) for m in ("roofline", "sim"))
        notes.append(
            f"- **{f.label}**: {where}. " + (f"**Check**: {'; '.join(checks)}. " if checks else "")
            + f"Its slowest kernel: {k['tasks']} tasks in {k['waves']} wave(s) over {k['cores']} cores, {k['tiles']} tile "
            f"steps each" + (f", L0 tile {k['l0_tile']} (tune.l0_tile)" if k["l0_tile"] else "")
            + "; busy per task: " + ", ".join(f"{p} {v * 1e6:.1f} us" for p, v in k["pipes"].items() if v > 0)
            + f"; the chip's shared GM {_us(k['gm_chip'])} against the cores' {_us(k['waves'] * k['task_seconds'])}"
            + (f" ({fmt_bytes(k['l2_read_bytes'])} of re-reads from L2: the {fmt_bytes(k['gm_unique_bytes'])} of distinct "
               f"bytes fit the {fmt_bytes(prof.pipes.l2_bytes)} L2)" if k["l2_fits"] and k["l2_read_bytes"] else "")
            + f". The other estimators: roofline {_us(roof)} ({roof / f.seconds:.2f}x), sim {_us(sim)} "
            f"({sim / f.seconds:.2f}x)." + (f" {f.note[0].upper()}{f.note[1:]}." if f.note else ""))
    groups = {}
    for spec, f in _figures():
        groups.setdefault((spec.name, repr(f.scenario), f.strategy), {})[f.tiles] = f
    for key, pair in groups.items():
        if "default" in pair and "best" in pair:
            d, b = priced[key + ("default",)], priced[key + ("best",)]
            pub = pair["default"].seconds / pair["best"].seconds
            rows.append(("  the tuning's gain (default / tuned)", pair["best"].source, f"{pub:.2f}x",
                         f"{d.seconds / b.seconds:.2f}x", f"{d.seconds / b.seconds / pub:.2f}", ""))
            notes.append(f"- The tuned run gained {pub:.2f}x on the device, tune.search's tiles {d.seconds / b.seconds:.2f}x "
                         f"in the model ({pair['best'].label}: {b.seconds / pair['best'].seconds:.2f}x of the published "
                         f"{_published(pair['best'].seconds)}).")
    lines += table(("figure", "source", "published", "our estimate", "ratio (est / published)", "bound"), rows)
    lines += [""] + notes + [""] + _not_expressible(prof)
    return lines


def _not_expressible(prof) -> list:
    from ..machine.profile import load_profile

    p950 = load_profile("ascend950")
    rows = [
        ("910B2C: 24 AIC / 48 AIV at 1800 MHz", "npu-facts 8.5",
         f"`{prof.name}`: {prof.cube_cores} / {prof.vector_cores} at {prof.clock_hz / 1e6:.0f} MHz",
         "a profile input, not an estimate; the clock is an assumption below"),
        ("950PR_957bx: 28 AIC at 1650 MHz, 248 KB UB, 256 KB L0C", "npu-facts 8.5",
         f"`{p950.name}`: {p950.cube_cores} AIC at {p950.clock_hz / 1e6:.0f} MHz, UB {p950.ub_bytes // 1024} KB, "
         f"L0C {p950.l0c_bytes // 1024} KB", "the profile follows the 950PR_958x ini (32 AIC, npu-facts 4.1)"),
        ("910B HBM 1.2 or 1.6 TB/s", "npu-facts 8.5", f"{prof.pipes.hbm_bytes_per_s / 1e12:.2f} TB/s",
         "a named assumption: both values below"),
        ("QuantIndexerProlog 76 -> 56 -> 49 us", "npu-facts 7", "--", "no such op in the lab"),
        ("GatedDeltaRule inverse 8x22 us -> 2x62 us, 8x28 us -> 49 us", "npu-facts 7", "--", "no such op in the lab"),
        ("gemma4 GQA decode bench", "npu-facts 7", "--", "the script has no recorded results"),
        ("whole-layer device timings", "npu-facts 8.5", "--", "kept aside by the project to check the model later"),
    ]
    return ["Figures the lab does not estimate:", ""] + table(
        ("figure", "source", "the lab", "why not an estimate"), rows) + [""]


def sensitivity(prof, results) -> list:
    """How the figures' estimates and advise's choices move with each named assumption."""
    from ..advise import advise

    figs = _figures()
    base_choice = {r.scenario.name: r.advice.chosen for r in results if r.advice}
    scenarios = [r.scenario for r in results if r.advice]

    def cells(p):
        out = []
        for spec, f in figs:
            t, _ = _priced(spec, f, p)
            out.append(f"{_us(t.seconds)} ({t.bound}, {t.seconds / f.seconds:.2f}x)")
        return tuple(out)

    rows = [("(the profile)", "") + cells(prof) + ("--",)]
    for a in ASSUMPTIONS:
        for value, label in a.values:
            v = variant(prof, a, value)
            moved = []
            for sc in scenarios:
                try:
                    chosen = advise(sc.op, profile=v, **sc.advise).chosen
                except Exception as exc:  # noqa: BLE001 -- shown on the page, not hidden
                    chosen = type(exc).__name__
                if chosen != base_choice[sc.name]:
                    moved.append(f"{sc.name}: {base_choice[sc.name]} -> {chosen}")
            rows.append((a.name, label) + cells(v) + ("<br>".join(moved) or f"none of {len(scenarios)}",))
    lines = [
        "## How the answers move with each named assumption",
        "",
        "Each row changes one assumption of the pipe model (docs/model.md, \"Named assumptions\") and re-plans: "
        "every device figure above (estimate, bound, ratio to the published time; a tuned figure re-searched) and "
        "`advise()` (best tiles) on every scenario of scenarios.toml. \"contention cap off\" removes the chip's shared "
        "HBM / L2 limit, leaving each core its PTO-ISA per-transfer fit.",
        "",
    ]
    lines += table(("assumption", "value") + tuple(f.label for _, f in figs) + ("advise's choice changes",), rows)
    lines += [""] + [f"- `{a.name}`: {a.why}." for a in ASSUMPTIONS] + [""]
    return lines


_WHY = {
    "GM": "the chip's shared GM (HBM and L2 time of the bytes moved)",
    "launch": "kernel launches (5.05 us each, npu-facts 5.2)",
    "schedule": "AICPU dispatch (0.415 us per task over the scheduler threads, npu-facts 5.2)",
    "MTE2": "the MTE2 pipe (GM -> UB / L1 loads at the per-core fitted rate)",
    "MTE3": "the MTE3 pipe (UB -> GM stores at the per-core fitted rate)",
    "VECTOR": "the VECTOR pipe (PTO-ISA's fitted instruction cycles)",
    "CUBE": "the CUBE pipe (tune.l0_tile's MAD cycles)",
    "MTE1": "the MTE1 pipe (L1 -> L0 loads)",
    "FIXPIPE": "the FIXPIPE drain",
}


def _spend(plans, prof) -> dict:
    """Chip-level seconds per resource of a strategy's plans: launches, the shared GM, AICPU
    dispatch, and each pipe's busy time over the cores (busy per task x tasks / cores)."""
    out = dict.fromkeys(_WHY, 0.0)
    for p in plans:
        for k in p.estimate().kernels:
            out["launch"] += k["launch"]
            out["GM"] += k["gm_chip"]
            out["schedule"] += k["schedule"]
            for pipe, busy in k["pipes"].items():
                out[pipe] += busy * k["tasks"] / k["cores"]
    return out


def _deciding(seed_plans, chosen_plans, prof):
    """(resource, seconds the seed's pick spends more on it, both spends) of the largest difference."""
    a, b = _spend(seed_plans, prof), _spend(chosen_plans, prof)
    name = max(a, key=lambda r: a[r] - b[r])
    return name, a[name] - b[name], a, b


def contradictions(results, prof) -> list:
    """Every scenario where advise (best tiles) picks another strategy than the seed's."""
    from ..advise import advise
    from ..strategy import spec
    from ..tune.search import search

    lines = ["## Where the plans contradict the seed, and the pipe that decides it", "",
             "advise() at the best tiles against the seed's pick for the scenario (the seed's table, ../shared/seed "
             "section 十, as each op's `OP.seed` quotes it). The deciding pipe is the resource the seed's pick spends "
             "most time on beyond advise's choice, at chip level: launches, the shared GM's HBM / L2 time, AICPU "
             "dispatch, or a pipe's busy time summed over tasks and divided by the cores.", ""]
    rows, notes = [], []
    for r in results:
        a = r.advice
        if a is None or a.agrees_with_seed:
            continue
        ranking = {row[0]: row for row in a.ranking}
        c_row = ranking[a.chosen]
        default = advise(r.scenario.op, profile=prof, tiles="default", **r.scenario.advise)
        still = "yes" if not default.agrees_with_seed else f"no: `{default.chosen}` at the default tiles"
        if a.seed not in ranking:
            why = a.rejected.get(a.seed, "not a candidate of this scenario")
            rows.append((r.scenario.name, f"`{a.chosen}` {_us(c_row[1])}", f"`{a.seed}` refused", "constraints",
                         still))
            notes.append(f"- **{r.scenario.name}**: the seed's `{a.seed}` is refused: {why[:200]}.")
            continue
        found = search(r.scenario.op, top=1, profile=prof, progress=False, **r.scenario.advise)
        s_t, c_t = found.best[a.seed], found.best[a.chosen]
        name, extra, sa, sb = _deciding(s_t.plans, c_t.plans, prof)
        s_sec = ranking[a.seed][1]
        rows.append((r.scenario.name, f"`{a.chosen}` {_us(c_row[1])} ({c_row[2]})",
                     f"`{a.seed}` {_us(s_sec)} ({ranking[a.seed][2]})", name, still))
        crit = spec(r.scenario.op).seed.criterion
        tie = (" -- within advise's 5 % tie, so the tie-break (fewer kernels, then fewer GM bytes, then fusion) "
               "decides" if s_sec <= c_row[1] * 1.05 else "")
        spends = ", ".join(f"{k} {_us(sa[k])} vs {_us(sb[k])}" for k in _WHY if max(sa[k], sb[k]) >= 0.05 * s_sec)
        notes.append(
            f"- **{r.scenario.name}** ({r.scenario.op}; the seed: \"{crit}\"): `{a.seed}` at {_kw(s_t.tiles)} is "
            f"{s_sec / c_row[1]:.2f}x `{a.chosen}` at {_kw(c_t.tiles)}{tie}. Decided by {_WHY[name]}: "
            f"+{_us(extra)} for `{a.seed}` ({s_t.cost.kernels} kernel(s), GM {fmt_bytes(s_t.cost.gm_bytes)}, "
            f"{s_t.cost.tasks} tasks against {c_t.cost.kernels}, {fmt_bytes(c_t.cost.gm_bytes)}, "
            f"{c_t.cost.tasks}). Chip-level spend, seed vs advise: {spends}.")
        notes += _cube_caveats(r.scenario.name, (s_t, c_t))
    if not rows:
        return lines + ["advise agrees with the seed on every scenario.", ""]
    lines += table(("scenario", "advise (best tiles)", "the seed's pick", "deciding resource",
                    "contradicts at the default tiles too"), rows)
    return lines + [""] + notes + [""]


def _cube_caveats(name, tuned) -> list:
    """A kernel whose pipe-model cube work (tasks x 2 M N K of its inferred task) is under its
    planned cube FLOPs: its CUBE time is short by that ratio (machine/pipes.py infers the task).
    More modelled work than planned is the 16-row fractal's padding (decode rows), not a caveat."""
    out = []
    for t in tuned:
        for p in t.plans:
            for k in p.kernels:
                w = k.work
                if not k.cube_flops or not w.cube:
                    continue
                M, N, K, _ = w.cube
                modelled = 2 * M * N * K * w.tasks
                if modelled < 0.9 * k.cube_flops:
                    out.append(f"  - caveat: `{p.where}` kernel `{k.name}` plans {k.cube_flops:.3g} cube FLOPs, but the "
                               f"pipe model's task ({M} x {N} x {K}, {w.tasks} tasks) does {modelled:.3g}: its CUBE "
                               f"time is {modelled / k.cube_flops:.2f}x of the planned work (machine/pipes.py infers "
                               f"one (M, N, K) per task from the L1 buffers; the plan could set `cube_task`).")
    return out


def _kw(d) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in (d or {}).items()) or "the default tiles"


_PAGES: dict = {}  # (profile, scenarios) -> page: plan-derived, a pure function of the code


def calibration_page(results, profile) -> str:
    key = (str(profile), tuple(repr(r.scenario) for r in results))
    if key not in _PAGES:
        _PAGES[key] = _page(results, profile)
    return _PAGES[key]


def _page(results, profile) -> str:
    from ..machine.profile import load_profile

    prof = load_profile(profile)
    lines = [
        HEADER,
        "",
        "# Calibration: the NPU time model against published device figures",
        "",
        f"Every number here is plan-derived on `{prof.name}` with the default estimator (`Cost.estimate(model="
        "\"pipes\")`, machine/pipes.py; docs/model.md has the equations and sources). No constant was fitted to "
        "these figures: each comes from a documented hardware number, a documented fitted constant or a named "
        "assumption (tiles/*.toml says which), so this page is the check, not the fit.",
        "",
    ]
    lines += figures(prof)
    lines += sensitivity(prof, results)
    lines += contradictions(results, prof)
    return "\n".join(lines).rstrip("\n") + "\n"
