"""The plain numba register blocks (machine/cube/blocks_plain.py) give the bits of the LLVM IR
blocks (machine/cube/blocks.py) they are the readable reference of, on odd shapes, unaligned
offsets and every storage dtype of the weight.

The bf16 pairs blocks are compared on inputs without subnormals: VDPBF16PS (the hardware form,
used where the CPU has AVX512_BF16) flushes subnormal inputs and sums to zero, which the plain
loops and the FMA form do not. Random normal values times 2^-6 .. 2^6 in bf16 are far from
fp32's subnormal range, and so are their products and partial sums (a sum that cancels is either
0 or a multiple of an ulp of its terms).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from helpers import DTYPES, NP_DTYPE, make
from pypto_numba.machine import cube, dtypes
from pypto_numba.machine.cube import blocks_plain, ir_blocks
from helpers import needs_avx512_bf16

pytestmark = pytest.mark.slow(on="3.12")  # heavy compiles: once per tox run (tests/conftest.py)

U64 = np.uint64


def _dot_driver(block, rows, cols, lanes, stream):
    """njit: the IR block and the plain block on the same operands, results side by side."""

    @numba.njit
    def run(a, r0, lda, w, w0, ldw, nvec, res_ir, res_plain):
        if stream:
            block(a, r0, lda, w, w0, ldw, nvec, res_ir, U64(4) * ldw)
        else:
            block(a, r0, lda, w, w0, ldw, nvec, res_ir)
        blocks_plain.dot_block_plain(a, r0, lda, w, w0, ldw, nvec, res_plain, rows, cols, lanes)

    return run


DOT_BLOCKS = {  # name: (block, rows, cols, lanes, takes far)
    "dot4x4": (cube.dot4x4, 4, 4, cube.V16, False),
    "dot4x4_stream": (cube.dot4x4_stream, 4, 4, cube.V16, True),
    "dot4x2": (cube.dot4x2, 4, 2, cube.V16, False),
    "dot1x4": (cube.dot1x4, 1, 4, cube.V16, False),
    "dot1x4_stream": (cube.dot1x4_stream, 1, 4, cube.V16, True),
}


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", sorted(DOT_BLOCKS))
@pytest.mark.parametrize("k", [83, 37, 16, 5])
def test_dot_blocks_plain_same_bits(name, dt, k, rng):
    """fp32 ``a`` against a weight in every storage dtype: the plain loops give the IR block's
    bits over the first lanes*nvec elements of rows at odd (unaligned) offsets and strides."""
    block, rows, cols, lanes, stream = DOT_BLOCKS[name]
    lda, ldw = k + 3, k + 5
    r0, w0 = 7, 3
    a = rng.standard_normal(r0 + rows * lda).astype(np.float32)
    w = dtypes.kernel_view(make((w0 + 8 * ldw,), dt, rng))  # 8 rows: the far prefetch's rows exist
    nvec = k // lanes
    res_ir = np.full(rows * cols, np.nan, np.float32)
    res_plain = np.full(rows * cols, np.nan, np.float32)
    _dot_driver(block, rows, cols, lanes, stream)(a, U64(r0), U64(lda), w, U64(w0), U64(ldw), U64(nvec),
                                                  res_ir, res_plain)
    assert np.array_equal(res_ir.view(np.uint32), res_plain.view(np.uint32))
    if nvec:
        assert np.abs(res_plain).max() > 0.1


def _pairs_driver(b44, b14):
    @numba.njit
    def run(a, r0, lda, w, w0, ldw, nvec, ir44, plain44, ir14, plain14):
        far = U64(4) * ldw
        b44(a, r0, lda, w, w0, ldw, nvec, ir44, far)
        blocks_plain.pairs_block_plain(a, r0, lda, w, w0, ldw, nvec, plain44, 4, 4)
        b14(a, r0, lda, w, w0, ldw, nvec, ir14, far)
        blocks_plain.pairs_block_plain(a, r0, lda, w, w0, ldw, nvec, plain14, 1, 4)

    return run


def _pairs_blocks(mode):
    if mode == ir_blocks.PAIRS_AUTO:
        return cube.dot4x4_pairs_stream, cube.dot1x4_pairs_stream
    b44 = ir_blocks._dot4x4(cube.V16, cube.SKINNY_AHEAD, stream=True, pairs=mode)
    b14 = ir_blocks._dot_intrinsic(f"dot1x4_pairs_plain_test_{mode}",
                                   ir_blocks._tree_sums_codegen(4, rows=1, pairs=mode), stream=True, pairs=True)
    return b44, b14


@pytest.mark.parametrize("mode", [ir_blocks.PAIRS_FMA, pytest.param(ir_blocks.DPBF16, marks=needs_avx512_bf16),
                                  ir_blocks.PAIRS_AUTO])
@pytest.mark.parametrize("k", [99, 70, 32, 9])
def test_pairs_blocks_plain_same_bits(mode, k, rng):
    """bf16 ``a`` and weight (the pairs family is bf16 only), no subnormals (module docstring):
    the plain loops give the bits of the 4x4 and 1x4 pairs blocks, FMA form and VDPBF16PS."""

    def spread(n):  # magnitudes 2^-6 .. 2^6: most additions round
        v = rng.standard_normal(n) * 2.0 ** rng.integers(-6, 7, size=n)
        return dtypes.kernel_view(v.astype(np.float32).astype(NP_DTYPE["bf16"]))

    lda, ldw = k + 3, k + 1
    r0, w0 = 5, 1
    a, w = spread(r0 + 4 * lda), spread(w0 + 8 * ldw)
    nvec = k // cube.PAIR
    out = [np.full(16, np.nan, np.float32) for _ in range(4)]
    _pairs_driver(*_pairs_blocks(mode))(a, U64(r0), U64(lda), w, U64(w0), U64(ldw), U64(nvec), *out)
    ir44, plain44, ir14, plain14 = out
    assert np.array_equal(ir44.view(np.uint32), plain44.view(np.uint32))
    assert np.array_equal(ir14[:4].view(np.uint32), plain14[:4].view(np.uint32))
    assert np.array_equal(plain14[:4].view(np.uint32), plain44[:4].view(np.uint32))  # row 0 of both
    if nvec:
        assert np.abs(plain44).max() > 0.01


def _outer_driver(block, rows, cols):
    @numba.njit
    def run(c_ir, c_plain, c0, ldc, a, a0, lda, w, w0, ldw, k, acc):
        block(c_ir, c0, ldc, a, a0, lda, w, w0, ldw, k, acc)
        blocks_plain.outer_block_plain(c_plain, c0, ldc, a, a0, lda, w, w0, ldw, k, acc, rows, cols)

    return run


OUTER_BLOCKS = {"outer6x64": (6, 64), "outer4x64": (4, 64), "outer1x64": (1, 64), "outer4x16": (4, 16),
                "outer1x16": (1, 16)}


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("name", sorted(OUTER_BLOCKS))
@pytest.mark.parametrize("k", [67, 1, 0])
@pytest.mark.parametrize("acc", [cube.blocks.OUTER_START, cube.blocks.OUTER_CONTINUE])
def test_outer_blocks_plain_same_bits(name, dt, k, acc, rng):
    """fp32 ``a`` against B in every storage dtype, odd k and offsets, from 0 or continuing the
    sums in ``c``: the plain loops give the IR block's bits; nothing else in ``c`` changes."""
    rows, cols = OUTER_BLOCKS[name]
    block = getattr(cube.blocks, name)
    ldc, lda, ldw = cols + 3, k + 5, cols + 7
    c0, a0, w0 = 2, 3, 5
    c = rng.standard_normal(c0 + rows * ldc + 1).astype(np.float32)
    c_ir, c_plain = c.copy(), c.copy()
    a = rng.standard_normal(a0 + rows * lda).astype(np.float32)
    w = dtypes.kernel_view(make((w0 + max(k, 1) * ldw,), dt, rng))
    _outer_driver(block, rows, cols)(c_ir, c_plain, U64(c0), U64(ldc), a, U64(a0), U64(lda), w, U64(w0),
                                     U64(ldw), U64(k), U64(acc))
    assert np.array_equal(c_ir.view(np.uint32), c_plain.view(np.uint32))
    assert not np.array_equal(c_plain, c) or (k == 0 and acc)


@numba.njit
def _pv_driver(o_ir, o_plain, oo, ldo, p, po, ldp, v, va, ldv, keys, nvec):
    if keys == 4:
        cube.pv4x4(o_ir, oo, ldo, p, po, ldp, v, va, ldv, nvec)
    else:
        cube.pv4x1(o_ir, oo, ldo, p, po, ldp, v, va, ldv, nvec)
    blocks_plain.outer_block_plain(o_plain, oo, ldo, p, po, ldp, v, va, ldv, keys, cube.blocks.OUTER_CONTINUE,
                                   4, U64(16) * nvec)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("keys", [4, 1])
@pytest.mark.parametrize("nvec", [8, 3, 0])
def test_pv_blocks_plain_same_bits(dt, keys, nvec, rng):
    """Decode P @ V (``pv4x4``, ``pv4x1``) is the outer-product arithmetic continuing the sums in
    ``o``: the plain outer block gives its bits over 16*nvec columns at odd offsets and strides,
    for V in every storage dtype; nothing past those columns changes."""
    ldo, ldp, ldv = 16 * nvec + 5, keys + 3, 16 * nvec + 7
    oo, po, va = 3, 2, 5
    o = rng.standard_normal(oo + 4 * ldo).astype(np.float32)
    p = rng.random(po + 4 * ldp).astype(np.float32)
    v = dtypes.kernel_view(make((va + keys * ldv,), dt, rng))
    o_ir, o_plain = o.copy(), o.copy()
    _pv_driver(o_ir, o_plain, U64(oo), U64(ldo), p, U64(po), U64(ldp), v, U64(va), U64(ldv), keys, U64(nvec))
    assert np.array_equal(o_ir.view(np.uint32), o_plain.view(np.uint32))
    changed = o_ir != o
    assert changed.sum() > (4 * 16 * nvec) // 2 or nvec == 0
    for i in range(4):  # only the 16*nvec columns of the 4 rows
        changed[oo + i * ldo:oo + i * ldo + 16 * nvec] = False
    assert not changed.any()
