"""The cube's L0 tile model (``tune.l0_tile``), fitted on device by PyPTO.

``l0_tile(M, N, K)`` picks the L0 tile ``(m, n, k)`` of one ``[M, K] @ [K, N]`` cube task (its
operands already in L1) the way PyPTO's ``ChooseL0Tile`` does (npu-facts 8.2; the pass doc
``pypto:docs/en/dev/passes/15-auto_tile_matmul_l0.md``, "Cost model & design space"): an
exhaustive search over every legal aligned tile and design point for the least wall-clock in
cube-core cycles. Its constants are the profile's ``[cube_model]`` (``tiles/*.toml``).

The search space (dims are multiples of the 16 fractal; M, N, K are padded up to it):

- L0C  ``AlignUp(m, l0c_align_m) * n * 4 * dbC <= L0C`` (fp32 accumulator), dbC in {1, 2};
- L0A  ``m * k * bytes_a * dbA <= L0A`` and L0B ``k * n * bytes_b * dbB <= L0B``;
- stationarity ``output`` (both operands double-buffered, dbA = dbB = 2), ``A`` (A held
  single-buffered over the grid, dbA = 1, needs k == K) or ``B`` (the mirror). dbC = 2 needs
  k == K and a grid of at least 2 x 2 tiles (the pass doc's condition for emitting it).

The cycles, with P = ceil(M/m), Q = ceil(N/n), T = P * Q output tiles, kb = ceil(K/k) K blocks,
every tile charged at its full (m, n, k) as the drain formula is (``a = m*kb*k*bytes_a / bw_a``
and ``b = kb*k*n*bytes_b / bw_b`` are one A and one B panel's L1 -> L0 cycles):

- ``load``: k < K re-extracts both panels per tile, ``T * (a + b)``. k == K holds one panel in
  the outer loop: rows outer ``P*a + T*b`` (A held), cols outer ``T*a + Q*b`` (B held), the pass
  doc's bandwidth-weighted ``held_A`` / ``held_B``; A- and B-stationary take theirs,
  output-stationary the cheaper (``outer`` says which).
- ``mad = T * kb * ceil(k/kt) * (mad_head + passes * ceil(m/16) * ceil(n/16))``, kt = 32 /
  bytes_a, passes = mad_fp32_passes for fp32 operands, else 1.
- ``drain = T * (drain_fixed + m * (max(drain_row, 4*n/bw_drain) + drain_penalty * (odd(ceil(n/8)) - 1)))``.
- ``wall = max(load, mad) + drain`` (dbC = 1), ``max(load, mad, drain) + min(compute, drain) / T``
  (dbC = 2) with compute = max(load, mad), so dbC = 2 equals dbC = 1 at T = 1.

Ties break on (padded compute volume P*m * Q*n * kb*k, kb, load) as npu-facts 8.2 says, then, our
choice where it is silent: dbC = 1 before 2, output before A before B, wider n, larger k, larger m.
The pass doc's illustration (128, 128, 256) bf16 -> (128, 128, 64) is not reproduced (we give
k = 128): k = 64 and 128 tie on wall and volume and the K-blocks key takes 128; issue 19 calls
that illustration non-binding.

Where the model is ours: npu-facts and the pass doc give C_mad as "issue overhead x K-fractal
count" only. Read literally (``T * kb * ceil(k/kt) * mad_head * passes``), it reproduces three of
the four pinned tiles and picks (256, 128, 32) for (256, 256, 256, fp32): that model has the
cube nearly free, so the search is load-bound and L0B's slower bandwidth favours tall tiles. With
each K-fractal also paying its fractal work (``passes * ceil(m/16) * ceil(n/16)`` cycles, one
16x16 fractal per pass, the volume term of PTO-ISA's formula) the search is MAD-bound there, as
the pass doc's "MAD-bound (m,n)<->(n,m) ties" implies, and all four pinned tiles come out.

``isa_mad_cycles`` is PTO-ISA's simpler per-TMATMUL formula (npu-facts 8.6), ``6 + passes *
ceil(m/16) * ceil(k/kt) * ceil(n/16)``; ``L0Tile.isa_mad`` sums it over the tile's T * kb
TMATMULs. The two share the fractal work (same passes on a2a3) and differ only in the overhead:
6 cycles per TMATMUL against mad_head = 21 per K-fractal, i.e. ``21 * ceil(k/kt) - 6`` more
cycles per TMATMUL, 78 for the pinned tiles (bf16 k = 64 and fp32 k = 32 are both 4
K-fractals). On the pinned tiles the fitted C_mad is 1192 vs 1036 cycles (1.15x) for
(256, 256, 64), 2232 vs 1764 (1.27x) for (272, 272, 64), 2424 vs 1956 (1.24x) for (320, 320, 64)
and 17728 vs 16480 (1.08x) for (256, 256, 256) fp32: the smaller the tile's m * n, the larger
the share of the overhead. The difference does not change the winners: with PTO-ISA's formula
as C_mad the same search picks the same four tiles (the bf16 ones are drain-bound). On a5 the
fitted passes are 8 for fp32; PTO-ISA's (A2/A3) formula keeps 2.
"""

from __future__ import annotations

import dataclasses
import numbers

from ..errors import ConstraintError, ShapeError
from ..inputs import positive_int, storage_dtype
from ..machine import dtypes
from ..machine.profile import load_profile

STATIONARITIES = ("output", "A", "B")
DBCS = (1, 2)
ACC_BYTES = 4  # the L0C accumulator is fp32 (npu-facts 4.4)
WHERE = "tune.l0_tile"


@dataclasses.dataclass(frozen=True)
class L0Tile:
    """One L0 tile of an ``[M, K] @ [K, N]`` cube task and its cycles (cube-core cycles)."""

    M: int
    N: int
    K: int
    dtype: str
    profile: str
    m: int
    n: int
    k: int
    stationarity: str  # "output", "A" or "B"
    dbc: int           # L0C buffers: 1, or 2 to hide the drain behind the next tile's MAD
    outer: str         # the panel the outer loop holds when k == K ("A" or "B"), "" when K is split
    load: float        # MTE1, L1 -> L0A/L0B
    mad: float         # CUBE
    drain: float       # FIXPIPE, L0C -> out
    wall: float
    isa_mad: float     # PTO-ISA's MAD formula over the same TMATMULs (npu-facts 8.6)
    l0a_bytes: int     # L0 occupancy, buffering included
    l0b_bytes: int
    l0c_bytes: int
    clock_hz: float    # the profile's cube clock

    @property
    def wall_s(self) -> float:
        """The wall-clock in seconds at the profile's clock."""
        return self.wall / self.clock_hz

    @property
    def grid(self) -> tuple:
        """Output tiles (ceil(M/m), ceil(N/n))."""
        return (-(-self.M // self.m), -(-self.N // self.n))

    @property
    def tiles(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def k_blocks(self) -> int:
        return -(-self.K // self.k)

    @property
    def bound(self) -> str:
        """The pipe with the most cycles: "load", "mad" or "drain"."""
        return max(("load", "mad", "drain"), key=lambda pipe: getattr(self, pipe))

    @property
    def shape(self) -> tuple:
        return (self.m, self.n, self.k)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(x: int, unit: int) -> int:
    return _cdiv(x, unit) * unit


def _odd(x: int) -> int:
    """The odd part of x > 0 (x without its factors of 2)."""
    return x // (x & -x)


def isa_mad_cycles(m: int, k: int, n: int, dtype="bf16", profile=None) -> float:
    """Cycles of one ``[m, k] @ [k, n]`` TMATMUL by PTO-ISA's formula (npu-facts 8.6):
    ``isa_mad_head + passes * ceil(m/16) * ceil(k/kt) * ceil(n/16)``, kt = 32 / bytes_a, passes =
    ``isa_fp32_passes`` for fp32 operands, else 1. One 16x16x16 fp16 fractal per cycle."""
    where = "tune.isa_mad_cycles"
    m, k, n = (positive_int(v, name, where, error=ShapeError) for v, name in ((m, "m"), (k, "k"), (n, "n")))
    kind = storage_dtype(dtype, where)
    prof = load_profile(profile)
    cm, (fm, fn, _) = prof.cube_model, prof.cube_fractal
    operand_bytes = dtypes.itemsize(kind)
    kt = cm.k_fractal_bytes // operand_bytes
    passes = cm.isa_fp32_passes if operand_bytes == 4 else 1
    return cm.isa_mad_head + passes * _cdiv(m, fm) * _cdiv(k, kt) * _cdiv(n, fn)


def _choice(value, allowed: tuple, name: str):
    kinds = (str,) if isinstance(allowed[0], str) else (numbers.Integral,)
    if isinstance(value, bool) or not isinstance(value, kinds + (str,)) or value not in allowed + ("any",):
        listed = ", ".join(repr(a) for a in allowed + ("any",))
        raise ConstraintError(
            f"{WHERE}: {name} must be one of {listed}, got {value!r}; 'any' searches them all"
        )
    return allowed if value == "any" else (int(value) if kinds[0] is numbers.Integral else value,)


def l0_tile(M, N, K, dtype="bf16", profile=None, stationarity="output", dbc=1) -> L0Tile:
    """The L0 tile ``(m, n, k)`` of the least modelled wall-clock for an ``[M, K] @ [K, N]`` task.

    Parameters
    ----------
    M, N, K : positive ints; padded up to the cube fractal (16).
    dtype : operand storage dtype, "bf16", "fp16" (2 bytes) or "fp32" (4); accumulation is fp32.
    profile : a profile name or HardwareProfile (None: the active one); gives the L0 capacities,
        the fractal and the ``[cube_model]`` constants.
    stationarity : "output" (PyPTO's default), "A", "B", or "any" to search all three.
    dbc : L0C buffers, 1 (PyPTO's default) or 2, or "any" to search both.

    The defaults are the design point PyPTO's pass realises today. The module docstring gives
    the model; ``L0Tile`` carries the tile, the design point and the cycles.
    """
    M, N, K = (positive_int(v, name, WHERE, error=ShapeError) for v, name in ((M, "M"), (N, "N"), (K, "K")))
    kind = storage_dtype(dtype, WHERE)
    stationarities = _choice(stationarity, STATIONARITIES, "stationarity")
    dbcs = _choice(dbc, DBCS, "dbc")
    prof = load_profile(profile)
    best = _search(M, N, K, kind, prof, stationarities, dbcs)
    if best is None:
        raise ConstraintError(
            f"{WHERE}: no legal L0 tile for M={M}, N={N}, K={K} {kind} with stationarity="
            f"{stationarity!r}, dbc={dbc!r} on {prof.name} (L0A {prof.l0a_bytes} B, L0B "
            f"{prof.l0b_bytes} B, L0C {prof.l0c_bytes} B): A/B-stationary holds the whole K in a "
            f"single L0 buffer, dbc=2 needs the whole K and a grid of at least 2 x 2 tiles; use "
            f"stationarity='output', dbc=1 or 'any'"
        )
    return best


def _search(M, N, K, kind, prof, stationarities, dbcs):
    cm, (fm, fn, fk) = prof.cube_model, prof.cube_fractal
    ab = dtypes.itemsize(kind)  # bytes_a = bytes_b
    Mp, Np, Kp = _align(M, fm), _align(N, fn), _align(K, fk)
    best_key, best = None, None
    for stat in stationarities:
        db_a, db_b = (1, 2) if stat == "A" else (2, 1) if stat == "B" else (2, 2)
        for dbc in dbcs:
            for m in range(fm, Mp + 1, fm):
                l0c_row = _align(m, cm.l0c_align_m) * ACC_BYTES * dbc
                n_max = min(Np, prof.l0c_bytes // l0c_row // fn * fn)
                k_max_a = prof.l0a_bytes // (m * ab * db_a) // fk * fk
                for n in range(fn, n_max + 1, fn):
                    k_max = min(Kp, k_max_a, prof.l0b_bytes // (n * ab * db_b) // fk * fk)
                    if stat != "output" or dbc == 2:  # these hold the whole K
                        if k_max < Kp:
                            continue
                        if dbc == 2 and (_cdiv(Mp, m) < 2 or _cdiv(Np, n) < 2):
                            continue
                        ks = (Kp,)
                    else:
                        ks = range(fk, k_max + 1, fk)
                    for k in ks:
                        c = _cycles(Mp, Np, Kp, m, n, k, ab, stat, dbc, prof)
                        key = c["key"] + (dbc, STATIONARITIES.index(stat), -n, -k, -m)
                        if best_key is None or key < best_key:
                            best_key = key
                            best = L0Tile(
                                M=M, N=N, K=K, dtype=kind, profile=prof.name, m=m, n=n, k=k,
                                stationarity=stat, dbc=dbc, outer=c["outer"], load=c["load"],
                                mad=c["mad"], drain=c["drain"], wall=c["wall"], isa_mad=c["isa_mad"],
                                l0a_bytes=m * k * ab * db_a, l0b_bytes=k * n * ab * db_b,
                                l0c_bytes=_align(m, cm.l0c_align_m) * n * ACC_BYTES * dbc,
                                clock_hz=prof.clock_hz,
                            )
    return best


def _cycles(M, N, K, m, n, k, ab, stat, dbc, prof) -> dict:
    """The model's cycles of one design point; M, N, K already padded to the fractal."""
    cm, (fm, fn, _) = prof.cube_model, prof.cube_fractal
    P, Q, kb = _cdiv(M, m), _cdiv(N, n), _cdiv(K, k)
    T = P * Q
    a_panel = m * kb * k * ab / cm.bw_a  # one [m, K] A panel, L1 -> L0A
    b_panel = kb * k * n * ab / cm.bw_b  # one [K, n] B panel, L1 -> L0B
    outer = ""
    if kb > 1:
        load = T * (a_panel + b_panel)
    else:
        rows_outer = P * a_panel + T * b_panel
        cols_outer = T * a_panel + Q * b_panel
        outer = {"A": "A", "B": "B"}.get(stat, "A" if rows_outer <= cols_outer else "B")
        load = rows_outer if outer == "A" else cols_outer
    kt = cm.k_fractal_bytes // ab
    fractals = _cdiv(m, fm) * _cdiv(n, fn)
    passes = cm.mad_fp32_passes if ab == 4 else 1
    mad = T * kb * _cdiv(k, kt) * (cm.mad_head + passes * fractals)
    isa_passes = cm.isa_fp32_passes if ab == 4 else 1
    isa_mad = T * kb * (cm.isa_mad_head + isa_passes * fractals * _cdiv(k, kt))
    n0 = cm.k_fractal_bytes // ACC_BYTES  # N-fractal of the fp32 L0C: 8
    row = max(cm.drain_row, ACC_BYTES * n / cm.bw_drain) + cm.drain_penalty * (_odd(_cdiv(n, n0)) - 1)
    drain = T * (cm.drain_fixed + m * row)
    compute = max(load, mad)
    if dbc == 1:
        wall = compute + drain
    else:
        wall = max(load, mad, drain) + min(compute, drain) / T
    volume = P * m * Q * n * kb * k  # padded compute volume
    key = (round(wall, 6), volume, kb, round(load, 6))
    return dict(load=load, mad=mad, drain=drain, wall=wall, isa_mad=isa_mad, outer=outer, key=key)
