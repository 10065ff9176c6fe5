"""Task decomposition of the attention kernels: which query tiles of which KV head one CPU task walks.

An NPU tile task is one (batch, KV head, query tile[, KV split]). On the CPU, one prange task of
flash or online walks ``Q_GROUP`` consecutive query tiles of a (batch, KV head) through the KV
tiles together, so each K^T / V tile is read from L3 once per group and reused from L2 by the
other query tiles. Each query tile keeps its own Q block and state and runs exactly the steps of a
task of its own, in the same order: the grouping changes neither bits nor counts, only the CPU's
loop order (measurements: docs/performance-attention.md).
"""

from __future__ import annotations

import numba

from ..machine.jit import device
from .tiles import GEMM_MIN_ROWS

Q_GROUP = 4


@device
def block_geometry(q, k, v, qt, qg):
    """The preamble of a tiled kernel: ``(B, Hq, Sq, D, Hkv, Skv, Dv, G, nq, ng, Rmax)`` for
    query tiles of ``qt`` positions (``nq`` of them, block rows up to ``Rmax = G*qt``) walked in
    groups of ``qg`` (``ng`` groups per (batch, KV head))."""
    B, Hq, Sq, D = q.shape
    Hkv = k.shape[1]
    Skv = k.shape[2]
    Dv = v.shape[3]
    G = Hq // Hkv
    nq = (Sq + qt - 1) // qt
    ng = (nq + qg - 1) // qg
    Rmax = G * min(qt, Sq)
    return B, Hq, Sq, D, Hkv, Skv, Dv, G, nq, ng, Rmax


@device
def query_tile(qi, qt, Sq, G):
    """Query tile ``qi``: its first position ``i0``, valid positions ``qv`` and block rows ``G*qv``."""
    i0 = qi * qt
    qv = min(qt, Sq - i0)
    return i0, qv, G * qv


@device
def group_task(it, Hkv, nq, qg):
    """prange iteration ``it`` over ``B*Hkv*ceil(nq/qg)`` query-tile groups (:func:`query_group`)
    -> (b, kvh, first query tile, query tiles in the group)."""
    ng = (nq + qg - 1) // qg
    b = it // (Hkv * ng)
    rem = it - b * (Hkv * ng)
    kvh = rem // ng
    q_lo = (rem - kvh * ng) * qg
    return b, kvh, q_lo, min(qg, nq - q_lo)


def query_group(blocks, nq, Rmax, n_split=1):
    """Query tiles one CPU task walks together: :data:`Q_GROUP` for prefill tiles, fewer while
    that would leave under ``4 * threads`` tasks, 1 for decode-shaped tiles and split-KV."""
    if Rmax < GEMM_MIN_ROWS or n_split > 1:
        return 1
    qg = min(Q_GROUP, nq)
    while qg > 1 and blocks // nq * -(-nq // qg) < 4 * numba.get_num_threads():
        qg //= 2
    return qg
