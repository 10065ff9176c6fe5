"""Plan helpers shared by the attention strategies: tile buffers, their fit, and kv_len as an array.

Default query tiles (``attention_q_tile`` / ``flash_q_tile`` rows of the [G*q_tile, D] block) are
halved until the tile buffers fit UB and the cube budgets (:func:`fit_q_tile`); an explicit
``q_tile`` that does not fit raises TileError.
"""

from __future__ import annotations

import numpy as np

from ..errors import TileError
from ..machine.plan import Buffer, align_elems, align_up, cube_tiles


def kv_len_array(kv_len, B, Skv):
    if kv_len is None:
        return np.full(B, Skv, dtype=np.int64)
    return np.asarray(kv_len, dtype=np.int64).reshape(B)


def cube_buffers(where, m, k, n, a_dtype, b_dtype, prof, hint):
    """Cube tiles for an [m, k] x [k, n] tile matmul: whole tile in L1, L0 split to fit.

    mL1 = A16(m), kL1 = A16(k), nL1 = A16(n); L0 tiles halve kL0, then mL0/nL0, until they fit
    L0A/L0B/L0C (each still dividing its L1 tile). TileError when even that does not fit (L1).
    """
    m1, k1, n1 = (align_up(x, 16) for x in (m, k, n))
    m0, k0, n0 = m1, k1, n1
    a_size, b_size = (4 if d == "fp32" else 2 for d in (a_dtype, b_dtype))

    def fits():
        return (m0 * k0 * a_size <= prof.l0a_bytes and n0 * k0 * b_size <= prof.l0b_bytes
                and m0 * n0 * 4 <= prof.l0c_bytes)

    def halve(x, whole):
        h = x // 2
        return h if h >= 16 and h % 16 == 0 and whole % h == 0 else x

    for _ in range(64):
        if fits():
            break
        nk = halve(k0, k1)
        if nk != k0 and (m0 * k0 * a_size > prof.l0a_bytes or n0 * k0 * b_size > prof.l0b_bytes):
            k0 = nk
            continue
        nm, nn = halve(m0, m1), halve(n0, n1)
        if m0 >= n0 and nm != m0:
            m0 = nm
        elif nn != n0:
            n0 = nn
        elif nm != m0:
            m0 = nm
        elif nk != k0:
            k0 = nk
        else:
            break
    try:
        return cube_tiles(((m0, m1), (k0, k1), (n0, n1)), a_dtype, b_dtype, prof, where)
    except TileError as exc:
        raise TileError(f"{exc}; {hint}") from None


def ub_tile(name, rows, cols, dtype, prof):
    """A UB buffer [rows, cols] with the last dim padded to 32 B (what gym does for short rows)."""
    return Buffer(name, "UB", (max(rows, 1), align_elems(cols, dtype, prof)), dtype)


def check_ub(where, buffers, prof, hint):
    used = sum(b.nbytes for b in buffers if b.level == "UB")
    if used > prof.ub_bytes:
        parts = " + ".join(str(b) for b in buffers if b.level == "UB")
        raise TileError(f"{where}: UB needs {used} B ({parts}) but {prof.name} has {prof.ub_bytes} B; {hint}")


def merge_cube(*groups):
    """Per buffer level, keep the group of cube buffers that needs the most (they run in turn)."""
    out = []
    levels = sorted({b.level for g in groups for b in g})
    for level in levels:
        best = max(groups, key=lambda g: sum(b.nbytes for b in g if b.level == level))
        out.extend(b for b in best if b.level == level)
    return tuple(out)

def fit_q_tile(tile_buffers, G, qt):
    """Buffers for the largest q_tile <= qt (halving) whose tiles fit; the first error otherwise.

    ``tile_buffers(Rmax)`` raises TileError when [Rmax = G*q_tile]-row tiles do not fit. The
    s_ub buffer (first) has Rmax rows, so the caller reads the chosen q_tile back from it.
    """
    first = None
    while True:
        try:
            return tile_buffers(G * qt)
        except TileError as exc:
            first = first or exc
            if qt == 1:
                raise first from None
            qt = max(1, qt // 2)
