"""The decode tile bodies (few query rows) for one block of at most 4 keys: Q K^T and P @ V.

The keys of a block are rows of a flat array ``kf`` at ``kj, kj + uks, ...`` (``strided.flat1d``
of a dense cache and :func:`strided.key_row` offsets, or a page of the paged cache). A tile
calls them once per block of 4 keys in ascending order and once for its last ``n % 4`` keys:
:func:`tiles.tile_scores` and :func:`tiles.tile_pv` over a dense K/V, and the paged decode kernel
(paged_decode.py) over the heads of a page. Every score and output element is computed by the
same code whichever walks the blocks, so a paged call gives the dense call's bits.

QK^T: blocks of 4 query rows x 4 keys (:func:`machine.cube.dot4x4`, 16 vector accumulators over
D reduced together, plain sums for the ``D % 16`` rest and a tile's last keys); rows past the last
4-row block take keys in pairs. PV: 4 rows x 4 keys per pass over the O rows (:func:`cube.pv4x4`:
4 V loads, 4 O loads and stores per 16 FMAs, 512-bit over c), one key at a time past a multiple of
4. Indices are uint64 (machine/jit.py).
"""

from __future__ import annotations

import numpy as np

from ..machine import cube, dtypes
from ..machine.jit import device

_U4 = np.uint64(4)
ADJACENT = np.uint64(1)  # scores_keys' ``ue`` for a block of adjacent keys


@device(forceinline=True)
def scores_keys(qf, qo, R, D, kf, kj, uks, nk, s, so, un, ue, res):
    """``s[so + r*un + e*ue] = sum_d qf[qo + r*D + d] * kf[kj + e*uks + d]`` in fp32 for the R rows
    and the ``nk <= 4`` keys of a block (``nk == 4``: the dot4x4 blocks; else a tile's last keys).
    Each score's sum is its own, whatever the block's other keys, so any 4 keys may form a block.
    ``qo``, ``so``, ``un``, ``ue``, ``kj``, ``uks`` uint64; ``res``: 16 fp32 scratch slots."""
    uD = np.uint64(D)
    nv = uD // np.uint64(cube.V16)
    dv = nv * np.uint64(cube.V16)
    unk = np.uint64(nk)
    r = 0
    while r + 4 <= R:
        q0 = qo + np.uint64(r * D)
        s0 = so + np.uint64(r) * un
        if nk == 4:
            cube.dot4x4(qf, q0, uD, kf, kj, uks, nv, res)
            for i in range(_U4):
                qi = q0 + i * uD
                for e in range(_U4):
                    acc = res[i * _U4 + e]
                    ke = kj + e * uks
                    for d in range(dv, uD):  # the D % 16 rest
                        acc += qf[qi + d] * dtypes.widen(kf[ke + d])
                    s[s0 + i * un + e * ue] = acc
        else:
            for e in range(unk):
                ke = kj + e * uks
                for i in range(_U4):
                    qi = q0 + i * uD
                    acc = np.float32(0.0)
                    for d in range(uD):
                        acc += qf[qi + d] * dtypes.widen(kf[ke + d])
                    s[s0 + i * un + e * ue] = acc
        r += 4
    while r < R:
        q0 = qo + np.uint64(r * D)
        s0 = so + np.uint64(r) * un
        e = np.uint64(0)
        while e + np.uint64(2) <= unk:
            ka = kj + e * uks
            kb = ka + uks
            a0 = np.float32(0.0)
            c0 = np.float32(0.0)
            for d in range(uD):
                x0 = qf[q0 + d]
                a0 += x0 * dtypes.widen(kf[ka + d])
                c0 += x0 * dtypes.widen(kf[kb + d])
            s[s0 + e * ue] = a0
            s[s0 + (e + np.uint64(1)) * ue] = c0
            e += np.uint64(2)
        if e < unk:
            ka = kj + e * uks
            a0 = np.float32(0.0)
            for d in range(uD):
                a0 += qf[q0 + d] * dtypes.widen(kf[ka + d])
            s[s0 + e * ue] = a0
        r += 1


@device(forceinline=True)
def pv_keys(p, po, R, un, vf, vj, uvs, nk, o, oo, Dv):
    """``o[oo + r*Dv + c] += sum_e p[po + r*un + e] * vf[vj + e*uvs + c]`` for the R rows and the
    ``nk`` keys of a block (4, or 1 for a tile's keys past its last multiple of 4), each output
    ``o + p0 v0 + p1 v1 + ...``, one FMA each in key order: :func:`cube.pv4x4` / ``pv4x1`` over
    blocks of 4 rows and ``Dv`` rounded down to 16, plain loops for the rest. ``po``, ``un``,
    ``vj``, ``uvs``, ``oo`` uint64."""
    uDv = np.uint64(Dv)
    nv = uDv // np.uint64(cube.V16)
    c0 = nv * np.uint64(cube.V16)
    r = 0
    while r + 4 <= R:
        o0 = oo + np.uint64(r * Dv)
        pr = po + np.uint64(r) * un
        if nk == 4:
            cube.pv4x4(o, o0, uDv, p, pr, un, vf, vj, uvs, nv)
        else:
            cube.pv4x1(o, o0, uDv, p, pr, un, vf, vj, uvs, nv)
        if c0 < uDv:
            for i in range(_U4):
                _pv_row(p, pr + i * un, nk, vf, vj, uvs, o, o0 + i * uDv, c0, uDv)
        r += 4
    while r < R:
        _pv_row(p, po + np.uint64(r) * un, nk, vf, vj, uvs, o, oo + np.uint64(r * Dv), np.uint64(0), uDv)
        r += 1


@device(forceinline=True)
def _pv_row(p, pr, nk, vf, vj, uvs, o, o0, c0, c1):
    """One row of :func:`pv_keys` over the columns ``c0 .. c1``."""
    for c in range(c0, c1):
        acc = o[o0 + c]
        for e in range(np.uint64(nk)):
            acc += p[pr + e] * dtypes.widen(vf[vj + e * uvs + c])
        o[o0 + c] = acc
