"""machine/ir and the readable references: each hand-written IR kernel against its plain numba
form (llm.c keeps kernel1 beside kernel6), bit for bit, on odd shapes and every storage dtype.
Prefetches, fences and streaming-store hints have no plain form and change no bits."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from pypto_numba import embedding, gelu
from pypto_numba.machine import dtypes, tile
from pypto_numba.machine import ir as irb
from pypto_numba.machine.jit import kernel

STORAGE = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def _values(n, dt, rng):
    """Normal values, and the edges GELU's formula must keep (inf, nan, huge, tiny)."""
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[: 8] = [np.inf, -np.inf, np.nan, 0.0, -0.0, 1e30, -1e30, 1e-30][: min(8, n)]
    with np.errstate(over="ignore"):  # +-1e30 is inf in fp16
        return x.astype(STORAGE[dt])


# ---- round_ir: the vector rounding of softmax_exp == widen(narrow(v)) ---------------------------


def _round_map():
    @intrinsic
    def apply(typingctx, x, like, out):
        kind = like.dtype

        def codegen(context, builder, sig, args):
            xa = context.make_array(sig.args[0])(context, builder, args[0])
            oa = context.make_array(sig.args[2])(context, builder, args[2])
            vf = ir.VectorType(ir.FloatType(), 16)
            n = builder.udiv(xa.nitems, ir.Constant(ir.IntType(64), 16))

            def body(j):
                v = irb.load(builder, xa.data, j, vf, 4)
                builder.store(irb.round_ir(builder, v, kind), irb.ptr(builder, oa.data, j, vf), align=4)

            irb.steps(builder, ir.Constant(ir.IntType(64), 0), n, 16, body)
            return context.get_dummy_value()

        return types.void(x, like, out), codegen

    @numba.njit
    def run(x, like, out):
        apply(x, like, out)

    return run


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_round_ir_is_narrow_then_widen(name):
    """round_ir (one instruction sequence per format) rounds every 16-bit neighbourhood like the
    scalar converters: all 2^16 high halves with assorted low halves, ties included."""
    hi = np.arange(1 << 16, dtype=np.uint32) << 16
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF, 0x1000, 0xF000, 0x0FFF, 0x2000, 0x1FFF, 0x3000,
                     0x4321, 0xABCD, 0x7FFE, 0x8002], np.uint32)
    bits = (hi[:, None] | lows[None, :]).reshape(-1)
    x = bits.view(np.float32)
    got = np.empty_like(x)
    _round_map()(x, np.zeros(1, dtypes.KERNEL[name]), got)
    want = dtypes.to_float32(dtypes.from_float32(x, name))
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint32), want[~nan].view(np.uint32))


# ---- GELU's span: the line_span template around the math, against the plain loop ---------------


@kernel
def _gelu_both(x, out_ir, out_plain, n, use_erf, stream):
    for t in prange(3):  # three spans: a head and a tail in each
        start = np.uint64(t * n)
        if use_erf:
            gelu._span_erf(x, start, out_ir, start, np.uint64(n), stream)
        else:
            gelu._span_tanh(x, start, out_ir, start, np.uint64(n), stream)
        gelu._span_plain(x, start, out_plain, start, np.uint64(n), use_erf)
        if stream:
            tile.store_fence()
    return 0


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("use_erf", [False, True])
@pytest.mark.parametrize("name", sorted(STORAGE))
def test_gelu_span_equals_the_plain_loop(name, use_erf, stream):
    rng = np.random.default_rng(7)
    kind = dtypes.KERNEL[name]
    for n in (1, 7, 31, 33, 517):
        for skip in (0, 1, 3):  # outputs starting off a line
            x = dtypes.kernel_view(_values(3 * n, name, rng))
            a, _ = tile.aligned_empty((3 * n + 64,), name)
            out_ir = dtypes.kernel_view(a)[skip: skip + 3 * n]
            out_plain = np.empty(3 * n, kind)
            _gelu_both(x, out_ir, out_plain, n, use_erf, stream)
            np.testing.assert_array_equal(out_ir, out_plain)


# ---- streaming copies: stream_gather_rows against gather_rows_plain -----------------------------


@numba.njit(cache=True)
def _gather_both(dst, ref, src, ids, r0, row, off, nbytes, joins):
    tile.stream_gather_rows(dst, src, ids, r0, row, off, nbytes, joins)
    tile.store_fence()
    tile.gather_rows_plain(ref, src, ids, r0, row, off, nbytes, joins)


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16])
@pytest.mark.parametrize("off, joins", [(0, 0), (1, 3), (5, 8), (3, 0)])
def test_stream_gather_rows_equals_the_plain_loops(dtype, off, joins):
    rng = np.random.default_rng(off + joins)
    item = np.dtype(dtype).itemsize
    L = tile.LINE // item
    row = 5 * L
    nsrc, r0 = 31, 1
    src = rng.integers(0, np.iinfo(dtype).max, size=nsrc * row, dtype=dtype)
    ids = rng.integers(0, nsrc, size=r0 + tile.GATHER_ROWS + 1).astype(np.int64)
    buf = rng.integers(0, np.iinfo(dtype).max, size=ids.size * row + 2 * L, dtype=dtype)
    first = (-buf.ctypes.data % tile.LINE) // item + (L - off) % L  # dst rows + off on lines
    dst = buf[first: first + ids.size * row]
    ref = dst.copy()
    n = (row - (L if off else 0)) * item
    u = np.uint64
    _gather_both(dst, ref, src, ids, u(r0), u(row), u(off), u(n), u(joins))
    np.testing.assert_array_equal(dst, ref)


# ---- embedding: the streamed gather kernel against its plain row copies ------------------------


@pytest.mark.parametrize("h_tile", [None, 16])
@pytest.mark.parametrize("H", [3, 37, 64, 100])
@pytest.mark.parametrize("name", sorted(STORAGE))
def test_embedding_streamed_equals_plain(name, H, h_tile):
    rng = np.random.default_rng(H)
    w = _values(60 * H, name, rng).reshape(60, H)
    view = embedding._COPY_VIEW[name]
    ids = rng.integers(0, 60, size=29).astype(np.int32)
    p = embedding.plan_gather(w.shape, ids.shape, name, row_tile=8, h_tile=h_tile)
    lines = tile.scratch(tile.LINE // np.dtype(view).itemsize, view)
    outs = []
    for stream in (True, False):
        buf = np.zeros(ids.size * H + 64, view)
        out = buf[3: 3 + ids.size * H].reshape(ids.size, H)  # off a line
        embedding._gather_kernel(w.view(view), ids, out, p.params["row_tile"], p.params["h_tile"], stream, lines)
        outs.append(out)
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[1], w.view(view)[ids])


def test_load_widen_fp16_by_hardware_equals_the_integer_code():
    """load_widen's two fp16 forms give the same float32 for every 16-bit pattern (NaN: both NaN)."""

    @intrinsic
    def widen_both(typingctx, h, a, b):
        def codegen(context, builder, sig, args):
            ha, aa, ba = (context.make_array(t)(context, builder, v) for t, v in zip(sig.args, args))
            vf = ir.VectorType(ir.FloatType(), 16)

            def body(j):
                for out, hw in ((aa, False), (ba, True)):
                    v = irb.load_widen(builder, ha.data, j, types.int16, 16, align=2, fp16_hw=hw)
                    builder.store(v, irb.ptr(builder, out.data, j, vf), align=4)

            irb.steps(builder, ir.Constant(ir.IntType(64), 0), ir.Constant(ir.IntType(64), (1 << 16) // 16), 16, body)
            return context.get_dummy_value()

        return types.void(h, a, b), codegen

    @numba.njit
    def run(h, a, b):
        widen_both(h, a, b)

    h = np.arange(1 << 16, dtype=np.uint16).view(np.int16)
    a, b = np.empty(1 << 16, np.float32), np.empty(1 << 16, np.float32)
    run(h, a, b)
    nan = np.isnan(a)
    assert np.array_equal(nan, np.isnan(b))
    np.testing.assert_array_equal(a[~nan].view(np.uint32), b[~nan].view(np.uint32))
