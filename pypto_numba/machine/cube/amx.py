"""bf16 blocks of the cube walk on a CPU's AMX tiles (AMX-BF16), where the host has them.

The decode loops (:mod:`.decode`) run bf16 operands in pairs on VDPBF16PS; a CPU with AMX does
16 x 16 x 32 MACs per ``TDPBF16PS`` instead, so :func:`amx_rows` computes a walk block's
``c[i, j] += sum_q a[i, q] * w[j, q]`` as ``c^T = w @ a^T`` on tiles: the weight's rows are the A
tiles, loaded straight from the row-major weight (16 rows x 32 elements), and ``a``'s rows,
packed once per call into the VNNI pair layout (:func:`pack_pairs`), are the B tile. Products
are exact in fp32 and every sum fp32, as the L0C's; the order of the additions is the tile
unit's, so the results are not the pairs loops' bits (tolerance-equal, ``tests/machine``).

:func:`enabled` is True only where it can run: numba's target CPU has ``amx-tile`` and
``amx-bf16``, Linux grants the process the tile data state (``arch_prctl``), and
``PYPTO_NUMBA_AMX`` is not ``0``. Measurements: docs/performance.md.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from ...errors import ConfigError
from .. import dtypes, ir as irb
from ..jit import device

TILE = 16  # rows of a tile (weight rows per A tile, rows of a per B tile)
STEP = 32  # bf16 elements of K per TDPBF16PS
GROUP = 4  # C tiles one call keeps at most (amx_w_at: weight tiles; amx_w_at2: 2 x 2)
MIN_ROWS = 2  # rows of a from which the walk uses AMX (one row streams faster through the loops)
ENV = "PYPTO_NUMBA_AMX"
_ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA, _SYS_ARCH_PRCTL_X86_64 = 0x1023, 18, 158
_I8, _I64 = ir.IntType(8), ir.IntType(64)


@functools.lru_cache(maxsize=None)
def enabled() -> bool:
    """Whether the walk may run its bf16 blocks on AMX here (decided once per process):
    ``PYPTO_NUMBA_AMX`` unset, empty or ``1`` and the CPU and kernel allow it; ``0`` never."""
    setting = os.environ.get(ENV, "").strip() or "1"
    if setting not in ("0", "1"):
        raise ConfigError(f"{ENV}={os.environ[ENV]!r}: expected 0 (the loops, the same bits on every host) or 1 "
                          "(AMX where the CPU has AMX-BF16, the default); set one of them or unset it")
    if setting == "0" or sys.platform != "linux":
        return False
    feats = str(numba.core.codegen.JITCPUCodegen("amx")._get_host_cpu_features()).split(",")
    if "+amx-tile" not in feats or "+amx-bf16" not in feats:
        return False
    try:  # the process asks once for the tile data state; threads and forks inherit it
        return ctypes.CDLL(None).syscall(_SYS_ARCH_PRCTL_X86_64, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


def _config(builder):
    """``ldtilecfg`` of palette 1 with its 8 tiles of 16 rows x 64 bytes (a stack buffer)."""
    cfg = cgutils.alloca_once(builder, ir.ArrayType(_I8, 64))
    cfg.align = 64
    builder.store(ir.Constant(ir.ArrayType(_I8, 64), [1] + [0] * 15 + [64, 0] * 8 + [0] * 16 + [16] * 8 + [0] * 8), cfg)
    return builder.bitcast(cfg, _I8.as_pointer())


class _Tiles:
    """The AMX instructions of one kernel on immediate tile numbers (``ldtilecfg`` done on creation)."""

    def __init__(self, builder):
        self.b = builder
        i8p = self.i8p = _I8.as_pointer()

        def decl(name, *a):
            return builder.module.declare_intrinsic(name, fnty=ir.FunctionType(ir.VoidType(), list(a)))

        self._load, self._dp = decl("llvm.x86.tileloadd64", _I8, i8p, _I64), decl("llvm.x86.tdpbf16ps", _I8, _I8, _I8)
        self._store, self._zero = decl("llvm.x86.tilestored64", _I8, i8p, _I64), decl("llvm.x86.tilezero", _I8)
        self._release = decl("llvm.x86.tilerelease")
        builder.call(decl("llvm.x86.ldtilecfg", i8p), [_config(builder)])

    def load(self, t, p, stride):
        self.b.call(self._load, [ir.Constant(_I8, t), p, stride])

    def dp(self, c, a, b):
        self.b.call(self._dp, [ir.Constant(_I8, c), ir.Constant(_I8, a), ir.Constant(_I8, b)])

    def store(self, t, p):
        self.b.call(self._store, [ir.Constant(_I8, t), p, _k(64)])

    def zero(self, t):
        self.b.call(self._zero, [ir.Constant(_I8, t)])

    def release(self):
        self.b.call(self._release, [])


def _k(n):
    return ir.Constant(_I64, n)


def _typing_ok(ct, w, xv):
    return (isinstance(ct, types.Array) and ct.dtype == types.float32 and irb.storage_array(w)
            and irb.bf16_array(xv))


def _amx_codegen(body):
    """The codegen of an intrinsic ``(ct, w, w0, ldw, xv, ...)``: C tiles 0-3 zeroed, ``body(builder,
    tiles, ct, w, xv, args)``, the tiles released. A CPU without AMX, or a ``w`` of another dtype
    (the walk's other dtypes type the branch but never take it), gets a trap instead."""

    def codegen(context, builder, sig, args):
        if not (irb.bf16_array(sig.args[1]) and irb.target_has(context, "amx-tile")
                and irb.target_has(context, "amx-bf16")):
            builder.call(builder.module.declare_intrinsic("llvm.trap", fnty=ir.FunctionType(ir.VoidType(), [])), [])
            return context.get_dummy_value()
        ct_, w_, xv_ = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1, 4))
        tiles = _Tiles(builder)
        for n in range(GROUP):
            tiles.zero(n)
        body(builder, tiles, builder.bitcast(ct_.data, tiles.i8p), builder.bitcast(w_.data, tiles.i8p),
             builder.bitcast(xv_.data, tiles.i8p), args)
        tiles.release()
        return context.get_dummy_value()

    return codegen


def _w_at_body(builder, tiles, cb, wb, xb, args):
    w0, ldw, x0, ks, nt = args[2], args[3], args[5], args[6], args[7]
    stride = builder.mul(ldw, _k(2))  # bytes per weight row
    wb = builder.gep(wb, [builder.mul(w0, _k(2))])
    xb = builder.gep(xb, [builder.mul(x0, _k(2))])
    live = [builder.icmp_unsigned(">", nt, _k(n)) for n in range(GROUP)]
    with cgutils.for_range(builder, ks) as loop:
        s = loop.index
        tiles.load(4, builder.gep(xb, [builder.mul(s, _k(TILE * STEP * 2))]), _k(64))
        ws = builder.gep(wb, [builder.mul(s, _k(STEP * 2))])
        for n in range(GROUP):
            with builder.if_then(live[n], likely=True):
                tiles.load(5 + n % 2, builder.gep(ws, [builder.mul(stride, _k(TILE * n))]), stride)
                tiles.dp(n, 5 + n % 2, 4)
    for n in range(GROUP):
        with builder.if_then(live[n]):
            tiles.store(n, builder.gep(cb, [_k(n * TILE * TILE * 4)]))


@intrinsic
def amx_w_at(typingctx, ct, w, w0, ldw, xv, x0, ksteps, ntiles):
    """``ct[t*256 + j*16 + i] = sum_q w[w0 + (16t + j)*ldw + q] * a_i[q]`` for ``t < ntiles``
    (<= ``GROUP``), ``j, i < 16``, ``q < 32*ksteps``: C tiles of ``w @ a^T`` stored row-major
    (weight row, then row of a), ``a``'s 16 rows given packed by :func:`pack_pairs` at ``xv[x0:]``.
    ``w`` raw bf16 (uint16), offsets and counts uint64, ``ldw`` in elements; ``ct`` fp32 with room
    for ``256*GROUP``. Tiles 0-3 hold C, 4 the B tile of a step, 5-6 the A tiles (alternating); the
    walk's decode passes call it with one weight tile."""
    if _typing_ok(ct, w, xv):
        u64 = types.uint64
        return types.void(ct, w, u64, u64, xv, u64, u64, u64), _amx_codegen(_w_at_body)


def _w_at2_body(builder, tiles, cb, wb, xb, args):
    w0, ldw, x0, xs, ks, nw, nm = args[2], args[3], args[5], args[6], args[7], args[8], args[9]
    stride = builder.mul(ldw, _k(2))
    wb = builder.gep(wb, [builder.mul(w0, _k(2))])
    xbs = [builder.gep(xb, [builder.mul(builder.add(x0, builder.mul(xs, _k(u))), _k(2))]) for u in range(2)]
    live_w = [builder.icmp_unsigned(">", nw, _k(v)) for v in range(2)]
    live_m = [builder.icmp_unsigned(">", nm, _k(u)) for u in range(2)]
    with cgutils.for_range(builder, ks) as loop:
        s = loop.index
        for u in range(2):
            with builder.if_then(live_m[u], likely=True):
                tiles.load(6 + u, builder.gep(xbs[u], [builder.mul(s, _k(TILE * STEP * 2))]), _k(64))
        ws = builder.gep(wb, [builder.mul(s, _k(STEP * 2))])
        for v in range(2):
            with builder.if_then(live_w[v], likely=True):
                tiles.load(4 + v, builder.gep(ws, [builder.mul(stride, _k(TILE * v))]), stride)
                for u in range(2):
                    with builder.if_then(live_m[u], likely=True):
                        tiles.dp(2 * v + u, 4 + v, 6 + u)
    for v in range(2):
        for u in range(2):
            with builder.if_then(builder.and_(live_w[v], live_m[u])):
                tiles.store(2 * v + u, builder.gep(cb, [_k((2 * v + u) * TILE * TILE * 4)]))


@intrinsic
def amx_w_at2(typingctx, ct, w, w0, ldw, xv, x0, xs, ksteps, nw, nm):
    """:func:`amx_w_at` for two weight tiles against two tiles of ``a`` (prefill): C tile ``2v + u``
    = weight rows ``16v .. 16v+15`` times the rows of ``a`` packed at ``xv[x0 + u*xs]``, for
    ``v < nw``, ``u < nm`` (each 1 or 2), stored to ``ct[(2v + u)*256 + j*16 + i]``. Per step two A
    (tiles 4-5) and two B tiles (6-7) feed four TDPBF16PS, where four weight tiles take five loads."""
    if _typing_ok(ct, w, xv):
        u64 = types.uint64
        return types.void(ct, w, u64, u64, xv, u64, u64, u64, u64, u64), _amx_codegen(_w_at2_body)


@numba.njit(cache=True, nogil=True, boundscheck=False)
def pack_pairs(a):
    """``a[M, K]`` (raw bf16) in the VNNI pair layout of B tiles: per 16 rows of ``a`` and step ``s``
    of 32 elements, one 1 KiB tile ``xv[(t*ks + s)*512 + r*32 + 2i + e] = a[16t + i, 32s + 2r + e]``
    (``ks = K // 32``; rows past ``M`` are zeros). Once per call: every task of the walk reads it."""
    M, K = a.shape
    ks = K // STEP
    nt = (M + TILE - 1) // TILE
    xv = np.zeros(nt * ks * TILE * STEP, np.uint16)
    for row in range(M):
        t, i = row // TILE, row % TILE
        for s in range(ks):
            base = (t * ks + s) * TILE * STEP + 2 * i
            for r in range(TILE):
                xv[base + r * STEP] = a[row, s * STEP + 2 * r]
                xv[base + r * STEP + 1] = a[row, s * STEP + 2 * r + 1]
    return xv


def applies(rows: int, k: int, m1: int, kernel_dtype) -> bool:
    """Whether a walk of ``rows`` rows of ``a`` over ``k``, in blocks of ``m1`` rows, runs on AMX:
    bf16 (uint16 kernel views), at least ``MIN_ROWS`` rows and one step of K, blocks of whole
    16-row tiles of ``a``, and :func:`enabled`."""
    return (np.dtype(kernel_dtype) == np.uint16 and rows >= MIN_ROWS and k >= STEP and m1 % TILE == 0
            and enabled())


NO_PACK = np.zeros(1, np.uint16)  # a kernel's packed ``a`` when it does not run AMX


@device(boundscheck=False)
def amx_rows(c, j0, m, n, a, abase, lda, xv, row0, w, wbase, ldw, k, ct):
    """``c[i, j0 + j] += sum_{q < k} a[abase + i*lda + q] * w[wbase + j*ldw + q]`` for ``i < m`` and
    the first ``16*(n // 16)`` weight rows ``j``: the whole steps of 32 on AMX tiles, then the
    ``k % 32`` rest in a loop; returns that row count (the caller does the weight rows past it).

    ``a`` raw bf16 (flat uint16, the block's rows), also packed by :func:`pack_pairs` in ``xv``,
    where the block starts at row ``row0`` of the packed matrix (a multiple of 16); ``w`` raw bf16
    (flat uint16); ``ct`` fp32 scratch of ``256*GROUP``.
    """
    ks = np.uint64(k // STEP)
    per = ks * np.uint64(TILE * STEP)  # packed elements per 16 rows of a
    x0 = np.uint64(row0 // TILE) * per
    nfull = n - n % TILE
    _tiles(c, j0, m, nfull, xv, x0, per, ks, w, wbase, ldw, ct)
    kv = np.uint64(k - k % STEP)
    for i in range(m):  # the k % 32 rest of the tiles' sums
        ri = np.uint64(abase) + np.uint64(i) * np.uint64(lda)
        for j in range(nfull):
            wj = np.uint64(wbase) + np.uint64(j) * np.uint64(ldw)
            s = np.float32(0.0)
            for q in range(kv, np.uint64(k)):
                s += dtypes.widen(a[ri + q]) * dtypes.widen(w[wj + q])
            c[i, j0 + j] += s
    return nfull


@device(boundscheck=False)
def _tiles(c, j0, m, nfull, xv, x0, per, ks, w, wbase, ldw, ct):
    """:func:`amx_rows`' tile part over the ``nfull`` weight rows."""
    if m <= TILE:  # decode: one weight tile per pass streams the fewest rows at once
        for jb in range(0, nfull, TILE):
            amx_w_at(ct, w, np.uint64(wbase) + np.uint64(jb) * np.uint64(ldw), np.uint64(ldw), xv, np.uint64(x0),
                     ks, np.uint64(1))
            for jj in range(TILE):
                for i in range(m):
                    c[i, j0 + jb + jj] += ct[jj * TILE + i]
        return
    for jb in range(0, nfull, 2 * TILE):  # prefill: two weight tiles against two tiles of a
        nw = min(2, (nfull - jb) // TILE)
        for mt in range(0, m, 2 * TILE):
            nm = min(2, (m - mt + TILE - 1) // TILE)
            amx_w_at2(ct, w, np.uint64(wbase) + np.uint64(jb) * np.uint64(ldw), np.uint64(ldw), xv,
                      np.uint64(x0) + np.uint64(mt // TILE) * per, per, ks, np.uint64(nw), np.uint64(nm))
            for v in range(nw):
                for u in range(nm):
                    at = (2 * v + u) * TILE * TILE
                    r0 = mt + u * TILE
                    for jj in range(TILE):
                        for i in range(min(TILE, m - r0)):
                            c[r0 + i, j0 + jb + v * TILE + jj] += ct[at + jj * TILE + i]
