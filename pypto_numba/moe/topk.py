"""MoE's top-k building blocks (device code): a sorted list of k filled by branch-free insertion,
the row max and the row top two."""

from __future__ import annotations

import numpy as np

from ..machine.jit import device


@device
def _push_desc(vals, idx, v, i):
    """Insert (v, i) into the full descending list ``vals`` when ``v > vals[-1]``.

    Branch-free: every position takes the carried entry where ``v > vals[j]`` (from the insertion
    point on, as the list is sorted) and passes its own entry on; a data-dependent shift loop
    would mispredict its exit on most insertions. Candidates arrive in increasing index order and
    an entry equal to ``v`` stays ahead of it (strict ``>``), so ties go to the lower index.
    """
    carry_v = v
    carry_i = np.int32(i)
    for j in range(vals.size):
        a = vals[j]
        ai = idx[j]
        shift = v > a
        vals[j] = carry_v if shift else a
        idx[j] = carry_i if shift else ai
        carry_v = a if shift else carry_v
        carry_i = ai if shift else carry_i


@device
def _scan_desc(scores, lo, hi, vals, idx):
    """Offer ``scores[lo:hi]`` (in index order) to the full descending list ``vals``.

    A separate function with the k-th value in a register: inlined into the kernel body, the
    compiler reloads it on every element (the stores of _push_desc may alias).
    """
    last = vals.size - 1
    kth = vals[last]
    for e in range(lo, hi):
        v = scores[e]
        if v > kth:
            _push_desc(vals, idx, v, e)
            kth = vals[last]


@device
def _max_of(x, lo, hi):
    """max(x[lo:hi]) with four independent chains: a single compare-select chain is
    latency-bound (and without the nnan flag LLVM does not vectorise a float max reduction)."""
    m0 = x[lo]
    m1 = m0
    m2 = m0
    m3 = m0
    e = lo
    while e + 4 <= hi:
        a = x[e]
        b = x[e + 1]
        c = x[e + 2]
        d = x[e + 3]
        m0 = a if a > m0 else m0
        m1 = b if b > m1 else m1
        m2 = c if c > m2 else m2
        m3 = d if d > m3 else m3
        e += 4
    while e < hi:
        a = x[e]
        m0 = a if a > m0 else m0
        e += 1
    m0 = m1 if m1 > m0 else m0
    m2 = m3 if m3 > m2 else m2
    return m2 if m2 > m0 else m0


@device
def _top2_of(x, lo, hi):
    """(largest, second largest) of x[lo:hi] (the second is -inf for one element), branch-free,
    two interleaved chains merged at the end. Equal values count twice: top-2 of [a, a] is a, a."""
    a1 = np.float32(-np.inf)
    a2 = a1
    b1 = a1
    b2 = a1
    e = lo
    while e + 2 <= hi:
        u = x[e]
        v = x[e + 1]
        lo_u = u if u < a1 else a1
        lo_v = v if v < b1 else b1
        a2 = lo_u if lo_u > a2 else a2
        b2 = lo_v if lo_v > b2 else b2
        a1 = u if u > a1 else a1
        b1 = v if v > b1 else b1
        e += 2
    if e < hi:
        u = x[e]
        lo_u = u if u < a1 else a1
        a2 = lo_u if lo_u > a2 else a2
        a1 = u if u > a1 else a1
    m1 = a1 if a1 > b1 else b1
    cross = b1 if a1 > b1 else a1
    m2 = a2 if a2 > b2 else b2
    m2 = cross if cross > m2 else m2
    return m1, m2


@device
def _reset_desc(vals, idx):
    for j in range(vals.size):
        vals[j] = -np.inf
        idx[j] = -1

