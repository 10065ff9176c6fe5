"""The vector unit's instruction costs, and the instruction sequences of the functions it lacks.

Costs (:func:`instruction_seconds`), in this order of sources:

1. PTO-ISA's device-fitted formula (npu-facts 8.6; ``hw-native-sys/pto-isa``
   ``include/pto/costmodel/a2a3/formula_costmodel/formula_params.csv``):
   ``cycles = slope * rows * cols + bias`` per (op, dtype, cols), at the core clock. The rows are
   embedded below as facts (:data:`PTO_ROWS`). PTO-ISA looks a row up by exact cols; the tile
   widths of a plan rarely match, so we take the nearest listed cols (the widest for wider tiles,
   ties to the narrower). A ``*`` row (TEXP, TSQRT) holds for any dtype and cols.
2. Where PTO-ISA has no row (TADD, TDIV, TLOG, TRECIP, TCVT, TRSQRT, TMAX, TSEL, ...), the
   hicann simulator's per-tile-op formula (npu-facts 5.2, ``PostSimulatorA2A3.h``):
   ``cycles = floor((a * bytes * pr * 1e-6 + b) * 2000) + 1`` at the simulator's 2 GHz, bytes =
   elements x dtype bytes, pr = 1 for fp32 DIV/EXP/LN/SQRT, else 2 (:data:`HICANN_AB`);
3. and for ops in neither, the simulator's fallback ``latency + 2 * repeats - 1``, 256 B per
   repeat (npu-facts 5.2, :data:`HICANN_LATENCY`).

:data:`FALLBACK` names, for every op without a PTO-ISA row, which of 2 or 3 it takes and under
what hicann name; each is an approximation we state, not a fact.

Sequences (:data:`SEQUENCES`): the PTO tile ISA has TEXP, TLOG, TSQRT, TRSQRT, TRECIP, TDIV and
no tanh, erf or sigmoid instruction (npu-facts 8.6); the seed's skill text says ``pypto.tanh`` has
hardware acceleration (npu-facts 1.2). The two readings are the named variants of
:data:`VARIANTS`: ``"pto-isa"`` (the default: tanh is composed) and ``"seed"`` (tanh is one
instruction; no cost is published for it, so it is charged as TEXP, the one fitted
transcendental). A plan's vector mix names op kinds (instructions or sequence names); a sequence
expands under the variant into instructions, each charged per element of the tile.
"""

from __future__ import annotations

import functools
import math

from ..errors import ConstraintError

# PTO-ISA formula_params.csv (a2a3), every row: "op dtype: cols:slope:bias ..." (npu-facts 8.6)
_PTO_CSV = """
TADDS fp16: 32:0.0078:25 64:0.0078:25 96:0.0078:25 128:0.0078:25 144:0.0078:42 160:0.0078:42 192:0.0078:42 208:0.0078:42 240:0.0078:42 272:0.0078:42 464:0.0078:42 496:0.0078:42 592:0.0078:42 1008:0.0078:42
TADDS fp32: 32:0.0156:25 48:0.0164:21 64:0.0156:25 80:0.0156:42 96:0.0156:42 112:0.0156:42 128:0.0169:16.5 176:0.0156:42 336:0.0156:42
TCOLMAX fp16: 32:0.5352:16 64:0.2695:16 96:0.1836:19 128:0.1367:17 160:0.2187:2 192:0.1823:2.3325
TCOLMAX fp32: 8:2.125:24 32:0.5391:16 64:0.2734:17 96:0.3646:2 128:0.1571:10
TCOLSUM fp16: 16:1.1916:20.664 32:0.5977:15 64:0.3008:15 96:0.2044:15 128:0.1523:15 160:0.1312:14 208:0.1029:25 240:0.09:28 272:0.0838:27 304:0.0755:30 336:0.069:30 368:0.069:30 400:0.0616:29 432:0.057:36 464:0.0536:36 496:0.0507:36 528:0.0498:35 560:0.0474:35 592:0.0453:35 624:0.0434:35 656:0.0431:34
TCOLSUM fp32: 8:2.375:29 16:1.1958:18.271 32:0.6016:15 64:0.3047:15 96:0.2187:14 128:0.1728:8 144:0.1578:27 176:0.1314:30 208:0.1166:36 240:0.1031:36 272:0.096:35 304:0.0876:35 336:0.0833:34
TDIVS fp16: 32:0.0703:45 64:0.0703:45 80:0.0709:38 96:0.0703:45 128:0.0703:45 144:0.0703:62 160:0.0703:62 192:0.0703:62 208:0.0703:62 240:0.0703:62 272:0.0703:62 336:0.0703:62 528:0.0703:62 656:0.0703:62 784:0.0703:62
TDIVS fp32: 32:0.0781:45 48:0.0792:40 64:0.0781:45 80:0.0781:62 96:0.0781:62 112:0.0781:62 128:0.0794:36.5 208:0.0781:62 304:0.0781:62
TEXP any: *:0.0314:30.1
TMINS fp16: 32:0.0078:23 64:0.0078:23 96:0.0078:23 128:0.0078:23 160:0.0078:40 192:0.0078:40
TMINS fp32: 32:0.0156:23 64:0.0156:23 96:0.0156:40 128:0.0169:14.5 144:0.0156:40
TMUL fp16: 32:0.0625:43 64:0.0313:42 80:0.025:42 96:0.0208:42 112:0.0179:43 128:0.0156:26 144:0.0156:43 160:0.0156:43 176:0.0156:43 208:0.0156:43 240:0.0156:43 272:0.0156:43 304:0.0156:43 336:0.0156:43 368:0.0156:43 400:0.0156:43 432:0.0156:43 464:0.0156:43 496:0.0156:43 528:0.0156:43 560:0.0156:43 592:0.0156:43 624:0.0156:43 656:0.0156:43
TMUL fp32: 32:0.0625:43 64:0.0313:26 80:0.0312:43 96:0.0312:43 112:0.0312:43 128:0.0325:17.5 144:0.0312:43 176:0.0312:43 208:0.0312:43 240:0.0312:43 272:0.0312:43 304:0.0312:43 336:0.0312:43
TMULS fp16: 32:0.0078:26 64:0.0078:26 96:0.0078:26 112:0.0083:23 128:0.0078:26 160:0.0078:43 176:0.0078:43 192:0.0078:43 208:0.0078:43 240:0.0078:43 272:0.0078:43 432:0.0078:43 688:0.0079:43 816:0.0079:43
TMULS fp32: 32:0.0156:26 48:0.0164:21 64:0.0156:26 80:0.0156:43 96:0.0156:43 112:0.0156:43 128:0.0169:17.5 304:0.0156:43 400:0.0156:43 432:0.0156:43 464:0.0156:43
TROWEXPAND fp16: 32:0.4375:37 64:0.2187:37 96:0.1458:37 128:0.1094:37 160:0.0937:37 192:0.0781:37
TROWEXPAND fp32: 8:1.7596:33.4 32:0.4375:37 64:0.2187:37 96:0.1562:37 128:0.1176:34.5
TROWMAX fp16: 32:0.2187:48 64:0.1094:43 96:0.0729:43 128:0.0547:33 160:0.0562:62 208:0.0433:63 240:0.0388:62 272:0.0369:74 304:0.0323:80 336:0.0302:97 368:0.0276:93 400:0.0279:92 432:0.025:101 464:0.0232:119 496:0.0222:119 528:0.0254:111 560:0.0241:110 592:0.0232:127 624:0.022:127 656:0.0224:125
TROWMAX fp32: 8:0.875:46 32:0.2188:47 64:0.1094:32 96:0.0937:61 128:0.0625:48 144:0.0692:77 176:0.0558:79 208:0.0517:100 240:0.0448:100 272:0.0485:98 304:0.0434:110 336:0.0418:131
TROWSUM fp16: 32:0.2188:62 64:0.1094:57 96:0.0729:57 128:0.0547:47 160:0.0563:78 208:0.0436:79 240:0.0391:79 272:0.0366:94 304:0.0323:102 336:0.0298:115 368:0.0272:111 400:0.0275:103 432:0.0255:103 464:0.0238:121 496:0.0229:121 528:0.0249:111 560:0.0234:106 592:0.0219:140 624:0.0208:140 656:0.0213:126
TROWSUM fp32: 8:0.875:58 32:0.2187:59 64:0.1094:44 96:0.0938:75 128:0.0625:61.5 144:0.0698:92 176:0.0575:93 208:0.0535:99 240:0.0469:99 272:0.0484:104 304:0.0431:104 336:0.0419:121
TSQRT any: *:0.0314:31.1
TSUB fp16: 32:0.0625:42 64:0.0312:41 96:0.0208:41 128:0.0156:25 160:0.0156:42 176:0.0156:42 208:0.0156:42 240:0.0156:42 272:0.0156:42 304:0.0156:42 336:0.0156:42 368:0.0156:42 400:0.0156:42 432:0.0156:42 464:0.0156:42 496:0.0156:42 528:0.0156:42 560:0.0156:42 592:0.0156:42 624:0.0156:42 656:0.0156:42
TSUB fp32: 32:0.0625:42 64:0.0313:25 96:0.0312:42 128:0.0325:16.5 144:0.0312:42 176:0.0312:42 208:0.0312:42 240:0.0312:42 272:0.0312:42 304:0.0312:42 336:0.0312:42
"""

ANY_COLS = 0  # the "*" rows


def _parse(text: str) -> dict:
    rows = {}
    for line in text.strip().splitlines():
        head, body = line.split(":", 1)
        op, dtype = head.split()
        entries = []
        for item in body.split():
            cols, slope, bias = item.split(":")
            entries.append((ANY_COLS if cols == "*" else int(cols), float(slope), float(bias)))
        rows[(op, dtype)] = tuple(sorted(entries))
    return rows


PTO_ROWS = _parse(_PTO_CSV)
"""(op, dtype) -> ((cols, slope, bias), ...), sorted by cols; dtype "any" for the ``*`` rows."""

# npu-facts 5.2: hicann per-tile-op (a, b); a in us per MB, b in us (our reading, npu-facts 5.2)
HICANN_AB = {
    "ADD": (2.40457, 0.0188), "SUB": (1.64044, 0.02152), "MUL": (1.63706, 0.01419),
    "DIV": (3.82854, 0.02462), "EXP": (3.49358, 0.02597), "LN": (3.49358, 0.02597),
    "SQRT": (3.67358, 0.02197), "MULS": (0.9527, 0.015), "NEG": (0.9527, 0.015),
    "CAST": (0.9125, 0.015687), "EXPAND": (0.58, 0.014), "RECIPROCAL": (0.98673, 0.00989),
    "ROWSUMLINE": (14.58731, 0.07288), "ROWMAX_SINGLE": (15.58731, 0.00888),
}
HICANN_PR1 = ("DIV", "EXP", "LN", "SQRT")  # pr = 1 for these in fp32, else 2
HICANN_CYCLES_PER_US = 2000  # the formula's hard-coded 2 GHz (npu-facts 5.2)
# npu-facts 5.2: fallback latencies (cycles) for ops outside the (a, b) table
HICANN_LATENCY = {"UB_ADD": 6, "UB_MUL": 7, "UB_DIV": 13, "UB_EXP": 12, "UB_SQRT": 13, "UB_RSQRT": 5}
REPEAT_BYTES = 256

# op without a PTO-ISA row -> ("ab", hicann name) or ("latency", hicann name). Stated approximations:
# TMAX/TMAXS/TSEL/TABS have no entry in either table and are charged as ADD (one pass, no
# arithmetic beyond an add's); TTANH ("seed" variant only) has no published cost and is charged as
# TEXP (below, in _row_of); TMAXS takes TMINS's PTO-ISA row (the mirror instruction).
FALLBACK = {
    "TADD": ("ab", "ADD"), "TDIV": ("ab", "DIV"), "TLOG": ("ab", "LN"), "TRECIP": ("ab", "RECIPROCAL"),
    "TCVT": ("ab", "CAST"), "TNEG": ("ab", "NEG"), "TEXPAND": ("ab", "EXPAND"),
    "TMAX": ("ab", "ADD"), "TSEL": ("ab", "ADD"), "TABS": ("ab", "ADD"),
    "TRSQRT": ("latency", "UB_RSQRT"),
}
ALIAS = {"TMAXS": "TMINS", "TTANH": "TEXP", "TSIGMOID": "TEXP"}

# Sequences the vector unit issues for a function it lacks: kind -> variant -> ((instr, count), ...)
# per element. Sources:
#   tanh (pto-isa): tanh u = (e - 1) / (e + 1), e = exp(2u): TMULS, TEXP, TADDS x2, TDIV -- "tanh
#       through exp and div" (issue 19), the ISA having no tanh (npu-facts 8.6);
#   tanh (seed): one instruction, "pypto.tanh has HW acceleration" (npu-facts 1.2);
#   erf: x P(x^2) / Q(x^2), degrees 5/5 on a clamp to [-4, 4] -- the rational the lab's vector unit
#       evaluates (machine/vmath.py); PyPTO's own expansion is not public (npu-facts 1.2: "erf's
#       acceleration status uncertain"), and its 5 fp32 temp tiles (npu-facts 4.2) fit this form:
#       TMINS + TMAXS (clamp), TMUL (x^2), 2 x Horner (TMULS + TADDS + 4 x (TMUL + TADDS)),
#       TMUL (x * P), TDIV;
#   sigmoid: 1 / (exp(-x) + 1): TMULS, TEXP, TADDS, TDIV (npu-facts 1.2 "exp->add->div" and
#       1.7 "INTRINSIC div"; the seed also calls sigmoid HW-optimised, but PyPTO composes it);
#   rsqrt: TRSQRT; recip_sqrt: TSQRT + TDIV (IEEE sqrt then division, machine/vmath.py's rsqrt;
#       npu-facts 8.3: the two forms differ in precision, pypto-lib PR #361).
_ERF = (("TMINS", 1), ("TMAXS", 1), ("TMUL", 1), ("TMULS", 2), ("TADDS", 10), ("TMUL", 8),
        ("TMUL", 1), ("TDIV", 1))
SEQUENCES = {
    "tanh": {"pto-isa": (("TMULS", 1), ("TEXP", 1), ("TADDS", 2), ("TDIV", 1)), "seed": (("TTANH", 1),)},
    "erf": {"pto-isa": _ERF, "seed": _ERF},
    "sigmoid": {"pto-isa": (("TMULS", 1), ("TEXP", 1), ("TADDS", 1), ("TDIV", 1)),
                "seed": (("TMULS", 1), ("TEXP", 1), ("TADDS", 1), ("TDIV", 1))},
    "rsqrt": {"pto-isa": (("TRSQRT", 1),), "seed": (("TRSQRT", 1),)},
    "recip_sqrt": {"pto-isa": (("TSQRT", 1), ("TDIV", 1)), "seed": (("TSQRT", 1), ("TDIV", 1))},
    "exp": {"pto-isa": (("TEXP", 1),), "seed": (("TEXP", 1),)},
}
VARIANTS = ("pto-isa", "seed")
DEFAULT_VARIANT = "pto-isa"
GENERIC = "TMUL"  # a plan that counts only vector_ops: each op charged as an fp32 TMUL


def check_variant(variant) -> str:
    if variant is None:
        return DEFAULT_VARIANT
    if variant not in VARIANTS:
        raise ConstraintError(
            f"unknown vector ISA variant {variant!r}; known: {', '.join(VARIANTS)} "
            f"(pto-isa: tanh composed of exp and div; seed: tanh one instruction)"
        )
    return variant


def expand(kind: str, variant: str = DEFAULT_VARIANT) -> tuple:
    """The instructions ((instr, count per element), ...) of op kind ``kind`` under ``variant``."""
    if kind in SEQUENCES:
        return SEQUENCES[kind][check_variant(variant)]
    if kind.startswith("T") and kind.isupper():
        return ((kind, 1),)
    raise ConstraintError(
        f"unknown vector op kind {kind!r}; use a PTO instruction (TMUL, TADDS, ...) or one of "
        f"{', '.join(sorted(SEQUENCES))}"
    )


def _nearest(rows: tuple, cols: int) -> tuple:
    if rows[0][0] == ANY_COLS:
        return rows[0]
    return min(rows, key=lambda r: (abs(r[0] - cols), r[0]))


@functools.lru_cache(maxsize=None)
def _row_of(instr: str, dtype: str):
    """(source, data) for an instruction: ("pto", rows) or ("ab", (a, b, name)) or ("latency", ...)."""
    name = ALIAS.get(instr, instr)
    kind = dtype if dtype in ("fp32", "fp16") else "fp32"  # bf16 math runs in fp32 on A2/A3 (npu-facts 4.1)
    for key in ((name, kind), (name, "any"), (name, "fp32")):
        if key in PTO_ROWS:
            return "pto", PTO_ROWS[key]
    if name in FALLBACK:
        how, hname = FALLBACK[name]
        return how, hname
    raise ConstraintError(f"vector instruction {instr!r} has no cost row (PTO-ISA) and no hicann fallback")


def instruction_seconds(instr: str, dtype: str, elements: float, instructions: float, cols: int,
                        clock_hz: float, slope_scale: float = 1.0) -> float:
    """Seconds of ``instructions`` issues of ``instr`` over ``elements`` elements in all (tiles
    ``cols`` wide): PTO-ISA ``slope * n + bias`` per issue at ``clock_hz``, else the hicann
    fallbacks at 2 GHz. ``slope_scale`` scales the per-element part (a wider vector unit)."""
    if elements <= 0:
        return 0.0
    instructions = max(instructions, 1.0)
    how, data = _row_of(instr, dtype)
    if how == "pto":
        _, slope, bias = _nearest(data, cols)
        return (slope * slope_scale * elements + bias * instructions) / clock_hz
    nbytes = 4 if dtype in ("fp32", "bf16") else 2
    per = elements / instructions
    if how == "ab":
        a, b = HICANN_AB[data]
        pr = 1 if (data in HICANN_PR1 and nbytes == 4) else 2
        cycles = math.floor((a * per * nbytes * pr * slope_scale * 1e-6 + b) * HICANN_CYCLES_PER_US) + 1
    else:
        repeats = math.ceil(per * nbytes / REPEAT_BYTES)
        cycles = HICANN_LATENCY[data] + 2 * repeats * slope_scale - 1
    return cycles * instructions / (HICANN_CYCLES_PER_US * 1e6)


def mix_seconds(mix, elems_per_instr: int, cols: int, clock_hz: float, variant: str = DEFAULT_VARIANT,
                slope_scale: float = 1.0) -> dict:
    """Seconds per instruction of a mix ((kind, dtype, elements), ...), expanded under ``variant``;
    each instruction issued once per ``elems_per_instr`` elements."""
    out = {}
    for kind, dtype, elements in mix:
        for instr, count in expand(kind, variant):
            n = elements * count
            issues = math.ceil(n / max(elems_per_instr, 1))
            out[instr] = out.get(instr, 0.0) + instruction_seconds(instr, dtype, n, issues, cols, clock_hz, slope_scale)
    return out
