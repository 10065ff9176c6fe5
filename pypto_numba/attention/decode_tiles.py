"""The decode tile bodies (few query rows) for one block of at most 4 keys: Q K^T and P @ V.

The keys of a block are rows of a flat array ``kf`` at ``kj, kj + uks, ...`` (``strided.flat1d``
of a dense cache and :func:`strided.key_row` offsets, or a page of the paged cache). A tile
calls them once per block of 4 keys in ascending order and once for its last ``n % 4`` keys:
:func:`tiles.tile_scores` and :func:`tiles.tile_pv` over a dense K/V, and the paged decode kernel
(paged_decode.py) over the heads of a page. Every score and output element is computed by the
same code whichever walks the blocks, so a paged call gives the dense call's bits.

QK^T: blocks of 4 query rows x 4 keys (:func:`machine.cube.dot4x4`, 16 vector accumulators over
D reduced together, plain sums for the ``D % DOT4X4_LANES`` rest and a tile's last keys); rows
past the last 4-row block take keys in pairs. PV: 4 rows x 4 keys per pass over the O rows (4 V
loads, 4 O loads and stores per 16 FMAs, vectorised over c), one key at a time past a multiple
of 4. Indices are uint64 (machine/jit.py).
"""

from __future__ import annotations

import numpy as np

from ..machine import cube, dtypes
from ..machine.jit import device

_U4 = np.uint64(4)


@device(forceinline=True)
def scores_keys(qf, qo, R, D, kf, kj, uks, nk, s, so, un, res):
    """``s[so + r*un + e] = sum_d qf[qo + r*D + d] * kf[kj + e*uks + d]`` in fp32 for the R rows
    and the ``nk <= 4`` keys of a block (``nk == 4``: the dot4x4 blocks; else a tile's last keys).
    ``qo``, ``so``, ``un``, ``kj``, ``uks`` uint64; ``res``: 16 fp32 scratch slots."""
    uD = np.uint64(D)
    nv = uD // np.uint64(cube.DOT4X4_LANES)
    dv = nv * np.uint64(cube.DOT4X4_LANES)
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
                    for d in range(dv, uD):  # the D % DOT4X4_LANES rest
                        acc += qf[qi + d] * dtypes.widen(kf[ke + d])
                    s[s0 + i * un + e] = acc
        else:
            for e in range(unk):
                ke = kj + e * uks
                for i in range(_U4):
                    qi = q0 + i * uD
                    acc = np.float32(0.0)
                    for d in range(uD):
                        acc += qf[qi + d] * dtypes.widen(kf[ke + d])
                    s[s0 + i * un + e] = acc
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
            s[s0 + e] = a0
            s[s0 + e + np.uint64(1)] = c0
            e += np.uint64(2)
        if e < unk:
            ka = kj + e * uks
            a0 = np.float32(0.0)
            for d in range(uD):
                a0 += qf[q0 + d] * dtypes.widen(kf[ka + d])
            s[s0 + e] = a0
        r += 1


@device(forceinline=True)
def pv_keys(p, po, R, un, vf, vj, uvs, nk, o, oo, Dv):
    """``o[oo + r*Dv + c] += sum_e p[po + r*un + e] * vf[vj + e*uvs + c]`` for the R rows:
    ``nk == 4`` as one 4-key block ``(a0 w + a1 x) + (a2 y + a3 z)``, ``nk == 1`` one key (a
    tile's keys past its last multiple of 4). ``po``, ``un``, ``vj``, ``uvs``, ``oo`` uint64."""
    uDv = np.uint64(Dv)
    r = 0
    if nk == 1:
        while r + 4 <= R:
            o0 = oo + np.uint64(r * Dv)
            o1 = o0 + uDv
            o2 = o1 + uDv
            o3 = o2 + uDv
            pr = po + np.uint64(r) * un
            a0, b0, c0, d0 = p[pr], p[pr + un], p[pr + np.uint64(2) * un], p[pr + np.uint64(3) * un]
            for c in range(uDv):
                w = dtypes.widen(vf[vj + c])
                o[o0 + c] += a0 * w
                o[o1 + c] += b0 * w
                o[o2 + c] += c0 * w
                o[o3 + c] += d0 * w
            r += 4
        while r < R:
            o0 = oo + np.uint64(r * Dv)
            a0 = p[po + np.uint64(r) * un]
            for c in range(uDv):
                o[o0 + c] += a0 * dtypes.widen(vf[vj + c])
            r += 1
        return
    va = vj
    vb = va + uvs
    vc = vb + uvs
    vd = vc + uvs
    while r + 4 <= R:
        o0 = oo + np.uint64(r * Dv)
        o1 = o0 + uDv
        o2 = o1 + uDv
        o3 = o2 + uDv
        pr = po + np.uint64(r) * un
        a0, a1, a2, a3 = p[pr], p[pr + np.uint64(1)], p[pr + np.uint64(2)], p[pr + np.uint64(3)]
        q = pr + un
        b0, b1, b2, b3 = p[q], p[q + np.uint64(1)], p[q + np.uint64(2)], p[q + np.uint64(3)]
        q += un
        c0, c1, c2, c3 = p[q], p[q + np.uint64(1)], p[q + np.uint64(2)], p[q + np.uint64(3)]
        q += un
        d0, d1, d2, d3 = p[q], p[q + np.uint64(1)], p[q + np.uint64(2)], p[q + np.uint64(3)]
        for c in range(uDv):
            w = dtypes.widen(vf[va + c])
            x = dtypes.widen(vf[vb + c])
            y = dtypes.widen(vf[vc + c])
            z = dtypes.widen(vf[vd + c])
            o[o0 + c] += (a0 * w + a1 * x) + (a2 * y + a3 * z)
            o[o1 + c] += (b0 * w + b1 * x) + (b2 * y + b3 * z)
            o[o2 + c] += (c0 * w + c1 * x) + (c2 * y + c3 * z)
            o[o3 + c] += (d0 * w + d1 * x) + (d2 * y + d3 * z)
        r += 4
    while r < R:
        o0 = oo + np.uint64(r * Dv)
        pr = po + np.uint64(r) * un
        a0, a1, a2, a3 = p[pr], p[pr + np.uint64(1)], p[pr + np.uint64(2)], p[pr + np.uint64(3)]
        for c in range(uDv):
            o[o0 + c] += ((a0 * dtypes.widen(vf[va + c]) + a1 * dtypes.widen(vf[vb + c]))
                          + (a2 * dtypes.widen(vf[vc + c]) + a3 * dtypes.widen(vf[vd + c])))
        r += 1
