"""Bit-exactness of pypto_numba.machine.dtypes against ml_dtypes.bfloat16 and numpy.float16.

16 -> 32 bit is checked on all 65,536 patterns; 32 -> 16 bit on a dense sample of the 2^32
float32 patterns (a stride-513 sweep of the whole space) plus every pattern near the rounding
ties, the overflow thresholds and the subnormal boundaries, +-0, +-Inf and NaNs with payloads.
All conversions run inside parallel njit kernels (rank 1 and rank 2) through the generic
``widen`` / ``narrow`` / ``round_as``.

Throughput is not timed here (the machine is shared and timings are noisy; measured figures
are in the dtypes module docstring); ``test_convert_loops_vectorise`` checks that the
convert loops compile to SIMD code, which is what makes them fast.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from pypto_numba.machine import dtypes as D
from pypto_numba.machine.jit import kernel

BF16 = np.dtype(ml_dtypes.bfloat16)
FP16 = np.dtype(np.float16)
REF = {"bf16": BF16, "fp16": FP16}
ALL16 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)


# ---- kernels under test ------------------------------------------------------------------------


@kernel
def convert(x, out):
    """out[i] = narrow(out, widen(x[i])): widen, narrow, or both, depending on the dtypes."""
    for i in prange(x.shape[0]):
        out[i] = D.narrow(out, D.widen(x[i]))


@kernel
def convert2(x, out, rounded):
    """Rank-2 version, also exercising round_as on the output array's storage format."""
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            v = D.widen(x[i, j])
            out[i, j] = D.narrow(out, v)
            rounded[i, j] = D.round_as(out, v)


@kernel
def scalar_converters(f, bf_bits, h_bits, bf_back, h_back):
    """The explicit scalar converters, in a parallel loop."""
    for i in prange(f.shape[0]):
        b = D.f32_to_bf16_bits(f[i])
        h = D.f32_to_fp16_bits(f[i])
        bf_bits[i] = b
        h_bits[i] = h
        bf_back[i] = D.bf16_bits_to_f32(b)
        h_back[i] = D.fp16_bits_to_f32(h)


def _bits(a):
    a = np.ascontiguousarray(a)
    return a.view({2: np.uint16, 4: np.uint32}[a.dtype.itemsize])


def _ref_narrow(f32, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy warns on NaN / overflow casts
        return f32.astype(REF[name])


def _assert_same_bits(got, want, inputs):
    got, want = _bits(got), _bits(want)
    bad = np.nonzero(got != want)[0]
    if bad.size:
        i = bad[:8]
        raise AssertionError(
            f"{bad.size} mismatches; inputs {[hex(v) for v in _bits(inputs)[i]]} "
            f"got {[hex(v) for v in got[i]]} want {[hex(v) for v in want[i]]}"
        )


# ---- 16 -> 32 and round trips: every pattern ---------------------------------------------------


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_widen_all_patterns(name):
    k = ALL16.view(D.KERNEL[name])
    out = np.empty(k.size, np.float32)
    convert(k, out)
    _assert_same_bits(out, ALL16.view(REF[name]).astype(np.float32), ALL16)  # NaN payloads too


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_round_trip_all_patterns(name):
    k = ALL16.view(D.KERNEL[name])
    f = np.empty(k.size, np.float32)
    back = np.empty_like(k)
    convert(k, f)
    convert(f, back)
    inf_bits = 0x7F80 if name == "bf16" else 0x7C00
    nan = (ALL16 & 0x7FFF) > inf_bits
    assert nan.sum() == (254 if name == "bf16" else 2046)
    _assert_same_bits(back[~nan], k[~nan], ALL16[~nan])  # identity for every non-NaN
    assert ((_bits(back)[nan] & 0x7FFF) > inf_bits).all()  # NaN maps to NaN
    _assert_same_bits(back, _ref_narrow(f, name), f)  # and to the reference's NaN bits


# ---- 32 -> 16: dense sample of the float32 space -------------------------------------------------


def _signed(u32):
    u32 = np.asarray(u32, dtype=np.uint32)
    return np.concatenate([u32, u32 | np.uint32(0x80000000)])


def _f32_sample(name) -> np.ndarray:
    """Float32 bit patterns that exercise every rounding path of a 32 -> 16 bit conversion."""
    parts = []
    specials = [0, 1, 0x7F800000, 0x7F800001, 0x7F801FFF, 0x7F802000, 0x7FA00000, 0x7FBFFFFF,
                0x7FC00000, 0x7FC00001, 0x7FE00000, 0x7FFFE000, 0x7FFFFFFF, 0x7F7FFFFF]
    parts.append(np.array(specials, np.uint32))
    if name == "bf16":
        hi = np.arange(1 << 16, dtype=np.uint32) << 16
        for low in (0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF):  # ties at every exponent
            parts.append(hi | low)
        parts.append(np.arange(0x7F7F0000, 0x7F800001, dtype=np.uint32))  # overflow threshold
        parts.append(np.arange(0x00000000, 0x00020000, dtype=np.uint32))  # subnormals
        parts.append(np.arange(0x007E0000, 0x00810000, dtype=np.uint32))  # subnormal / normal
    else:
        # ties of normal fp16 results: every exponent from below the subnormal range to
        # above the overflow threshold, every 10-bit mantissa, low 13 bits around the tie
        exps = np.arange(100, 146, dtype=np.uint32)
        mant = np.arange(1024, dtype=np.uint32) << 13
        head = ((exps[:, None] << 23) | mant[None, :]).ravel()
        for low in (0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF):
            parts.append(head | low)
        # ties of subnormal fp16 results: value = m * 2^(e-150), m has 24 bits with the
        # implicit one; 126 - e of them are dropped
        for e in range(96, 113):
            s = 126 - e
            kept = np.arange(1 << max(23 - s, 0), dtype=np.uint32) << min(s, 23)
            half = 1 << (s - 1)
            for low in (0, 1, half - 1, half, half + 1, 2 * half - 1):
                if low < (1 << 23):
                    parts.append((np.uint32(e) << 23) | kept | np.uint32(low))
        parts.append(np.arange(0x477FE000, 0x47800001, dtype=np.uint32))  # 65504 .. 65536
        parts.append(np.arange(0x387F0000, 0x38810000, dtype=np.uint32))  # around 2^-14
        # 2^-25 .. 2^-24: rounding to 0 or to the smallest subnormal
        parts.append(np.arange(0x33000000 - 4096, 0x33800000 + 4096, dtype=np.uint32))
        parts.append(np.arange(0x00000000, 0x00010000, dtype=np.uint32))  # float32 subnormals
    sweep = np.arange(0, 1 << 32, 513, dtype=np.uint64).astype(np.uint32)  # whole space
    return np.concatenate([sweep, _signed(np.concatenate(parts))]).view(np.float32)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_narrow_dense_float32_sample(name):
    f = _f32_sample(name)
    assert f.size > 9_000_000
    out = np.empty(f.size, D.KERNEL[name])
    convert(f, out)
    _assert_same_bits(out, _ref_narrow(f, name), f)


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_nan_inf_zero(name):
    f = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e38, -1e38, 3e-39],
                 np.float32)
    out = np.empty(f.size, D.KERNEL[name])
    convert(f, out)
    s = out.view(REF[name])
    assert _bits(s)[1] == 0x8000  # -0.0 keeps its sign
    assert np.isposinf(s[2]) and np.isneginf(s[3])
    assert np.isnan(s[4]) and np.isnan(s[5]) and np.signbit(s[5])
    assert (np.isinf(s[6]) and np.isinf(s[7])) == (name == "fp16")
    _assert_same_bits(out, _ref_narrow(f, name), f)


def test_scalar_converters_in_parallel_kernel():
    f = np.concatenate([_f32_sample("fp16")[::5], _f32_sample("bf16")[::5]])
    bf = np.empty(f.size, np.uint16)
    h = np.empty(f.size, np.int16)
    bf_back = np.empty(f.size, np.float32)
    h_back = np.empty(f.size, np.float32)
    scalar_converters(f, bf, h, bf_back, h_back)
    _assert_same_bits(bf, _ref_narrow(f, "bf16"), f)
    _assert_same_bits(h, _ref_narrow(f, "fp16"), f)
    _assert_same_bits(bf_back, _ref_narrow(f, "bf16").astype(np.float32), f)
    _assert_same_bits(h_back, _ref_narrow(f, "fp16").astype(np.float32), f)


def test_scalar_converters_from_python():
    # the converters are njit functions: callable from Python too
    assert D.f32_to_bf16_bits(np.float32(1.0)) == 0x3F80
    assert D.bf16_bits_to_f32(np.uint16(0xC040)) == np.float32(-3.0)
    assert D.f32_to_fp16_bits(np.float32(-2.0)) == np.int16(-16384)  # 0xC000
    assert D.fp16_bits_to_f32(np.int16(0x3C00)) == np.float32(1.0)
    assert D.fp16_bits_to_f32(np.int16(1)) == np.float32(2.0**-24)
    assert D.f32_to_fp16_bits(np.float32(65520.0)) == np.int16(0x7C00)


# ---- rank 2, round_as ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("src", ["fp32", "bf16", "fp16"])
def test_rank2_widen_narrow_round_as(src, name):
    rng = np.random.default_rng(7)
    scale = 10.0 ** rng.integers(-8, 6, (37, 53))
    vals = (rng.standard_normal((37, 53)) * scale).astype(np.float32)
    vals[0, :6] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 70000.0]
    x = D.kernel_view(_ref_narrow(vals, src) if src != "fp32" else vals)
    a, out = D.empty(vals.shape, name)
    rounded = np.empty(vals.shape, np.float32)
    convert2(x, out, rounded)
    w = D.storage_view(x, src).astype(np.float32)  # what widen(x) is
    want = _ref_narrow(w, name) if name != "fp32" else w
    _assert_same_bits(a.ravel(), want.ravel(), w.ravel())
    _assert_same_bits(rounded.ravel(), want.astype(np.float32).ravel(), w.ravel())


def test_round_as_identity_for_float32():
    @njit
    def f(a, v):
        return D.round_as(a, v)

    v = np.float32(1.0000001)
    assert f(np.zeros(1, np.float32), v) == v
    assert f(np.zeros(1, np.uint16), v) == np.float32(1.0)


# ---- Python-side API ----------------------------------------------------------------------------


def test_tables():
    assert D.STORAGE == {"fp32": np.dtype(np.float32), "bf16": BF16, "fp16": FP16}
    assert D.KERNEL == {"fp32": np.dtype(np.float32), "bf16": np.dtype(np.uint16),
                        "fp16": np.dtype(np.int16)}


@pytest.mark.parametrize(
    "arg, want",
    [("fp32", "fp32"), ("bf16", "bf16"), ("fp16", "fp16"), (np.float32, "fp32"),
     (np.dtype(np.float32), "fp32"), ("float32", "fp32"), ("f4", "fp32"),
     (ml_dtypes.bfloat16, "bf16"), (BF16, "bf16"), ("bfloat16", "bf16"),
     (np.float16, "fp16"), ("float16", "fp16"), (np.dtype("<f2"), "fp16")],
)
def test_storage_name(arg, want):
    assert D.storage_name(arg) == want


@pytest.mark.parametrize(
    "arg",
    [None, "fp64", "int8", "", "FP32", np.float64, np.uint16, np.int16, np.dtype(">f4"),
     ml_dtypes.float8_e4m3fn, object(), 3.5, [1, 2], np.zeros(3, np.float32)],
)
def test_storage_name_bad_input_returns_none(arg):
    assert D.storage_name(arg) is None


def test_itemsize():
    assert [D.itemsize(n) for n in ("fp32", "bf16", "fp16")] == [4, 2, 2]
    assert D.itemsize(np.float16) == 2
    with pytest.raises(KeyError):
        D.itemsize("fp64")


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_kernel_view_round_trip_shares_memory(name):
    a = np.arange(12, dtype=np.float32).reshape(3, 4).astype(D.STORAGE[name])
    k = D.kernel_view(a)
    assert k.dtype == D.KERNEL[name] and k.shape == a.shape
    assert np.shares_memory(a, k)
    s = D.storage_view(k, name)
    assert s.dtype == D.STORAGE[name] and np.shares_memory(s, a)
    k[1, 2] = D.narrow(k, np.float32(-7.0))  # write through the kernel view
    assert a[1, 2] == -7.0
    t = D.kernel_view(a.T)  # non-contiguous views work too
    assert np.shares_memory(t, a) and t.shape == (4, 3)


def test_views_reject_wrong_dtypes():
    with pytest.raises(TypeError):
        D.kernel_view(np.zeros(3, np.float64))
    with pytest.raises(TypeError):
        D.storage_view(np.zeros(3, np.uint16), "fp16")  # fp16 views are int16
    with pytest.raises(TypeError):
        D.storage_view(np.zeros(3, np.uint16), "fp64")


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_empty(name):
    a, k = D.empty((2, 3, 4), name)
    assert a.shape == k.shape == (2, 3, 4)
    assert a.dtype == D.STORAGE[name] and k.dtype == D.KERNEL[name]
    assert np.shares_memory(a, k) and a.flags.c_contiguous


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_to_from_float32(name):
    rng = np.random.default_rng(3)
    f = rng.standard_normal((64, 33)).astype(np.float32)[:, ::2]  # non-contiguous
    s = D.from_float32(f, name)
    assert s.dtype == D.STORAGE[name] and s.shape == f.shape
    _assert_same_bits(s.ravel(), (_ref_narrow(f, name) if name != "fp32" else f).ravel(), f.ravel())
    back = D.to_float32(s)
    assert back.dtype == np.float32 and back.shape == f.shape
    _assert_same_bits(back.ravel(), s.astype(np.float32).ravel(), s.ravel())
    assert not np.shares_memory(back, s)
    if name != "fp32":  # kernel views are accepted as well
        _assert_same_bits(D.to_float32(D.kernel_view(s)).ravel(), back.ravel(), s.ravel())
    with pytest.raises(TypeError):
        D.from_float32(f, "int8")
    z = D.from_float32(np.float32(1.5), name)  # 0-d stays 0-d
    assert z.shape == () and D.to_float32(z).shape == () and D.to_float32(z) == 1.5
    assert D.from_float32(np.zeros((0, 3), np.float32), name).shape == (0, 3)


def test_python_bodies_of_generic_helpers():
    v = np.array([1.0, 1.00390625, 1.01171875, np.inf, -0.0], np.float32)
    bf = np.zeros(1, np.uint16)
    assert D.widen(np.float32(2.5)) == np.float32(2.5)
    assert D.widen(np.uint16(0x3F80)) == np.float32(1.0)
    assert D.widen(np.int16(0x3C00)) == np.float32(1.0)
    _assert_same_bits(D.narrow(bf, v), v.astype(BF16), v)
    _assert_same_bits(D.round_as(bf, v), v.astype(BF16).astype(np.float32), v)
    _assert_same_bits(D.round_as(np.zeros(1, np.float32), v), v, v)
    _assert_same_bits(D.narrow(np.zeros(1, np.int16), v), v.astype(FP16), v)


# ---- vectorisation -------------------------------------------------------------------------------


@pytest.mark.parametrize("src, dst", [("bf16", "fp32"), ("fp32", "bf16"), ("fp16", "fp32"),
                                      ("fp32", "fp16")])
def test_convert_loops_vectorise(src, dst):
    """A convert-copy loop compiles to SIMD code (a scalar loop would be ~10x slower)."""
    import re

    from pypto_numba.machine.jit import FASTMATH

    @njit(cache=False, error_model="numpy", fastmath=set(FASTMATH))
    def loop(x, out):
        for i in range(x.size):
            out[i] = D.narrow(out, D.widen(x[i]))

    x = np.zeros(64, D.KERNEL[src])
    out = np.zeros(64, D.KERNEL[dst])
    loop(x, out)
    ir = loop.inspect_llvm(loop.signatures[0])
    assert re.search(r"<(8|16|32) x (float|i32|i16)>", ir)


# ----------------------------------------------------------------------------------------------
# the converters as <16 x> vector IR (widen_ir / narrow_ir): the same bits as the scalar ones


def _vector_converters():
    """(widen_all, narrow_all): njit functions applying widen_ir / narrow_ir in 16-lane vectors."""

    def converter(widen):
        @intrinsic
        def convert(typingctx, src, dst, n16):
            def codegen(context, builder, sig, args):
                s = context.make_array(sig.args[0])(context, builder, args[0])
                d = context.make_array(sig.args[1])(context, builder, args[1])
                kind = sig.args[0 if widen else 1].dtype  # the 16-bit side
                raw = ir.VectorType(context.get_data_type(kind), 16)
                f32 = ir.VectorType(ir.FloatType(), 16)
                src_ty, dst_ty = (raw, f32) if widen else (f32, raw)
                with cgutils.for_range(builder, args[2]) as loop:
                    off = builder.mul(loop.index, ir.Constant(ir.IntType(64), 16))
                    val = builder.load(builder.bitcast(builder.gep(s.data, [off]), src_ty.as_pointer()), align=1)
                    val = (D.widen_ir if widen else D.narrow_ir)(builder, val, kind, 16)
                    builder.store(val, builder.bitcast(builder.gep(d.data, [off]), dst_ty.as_pointer()), align=1)
                return context.get_dummy_value()

            return types.void(src, dst, types.uint64), codegen

        return convert

    vec_widen, vec_narrow = converter(True), converter(False)

    @njit
    def widen_all(src, dst):
        vec_widen(src, dst, np.uint64(src.size // 16))

    @njit
    def narrow_all(src, dst):
        vec_narrow(src, dst, np.uint64(src.size // 16))

    return widen_all, narrow_all


@pytest.mark.parametrize("name", ["bf16", "fp16"])
def test_vector_converters_match_the_scalar_ones(name):
    """widen_ir / narrow_ir on 16-lane vectors (the rope rotation's loads and stores) give the
    bits of the scalar converters: every 16-bit pattern widened (NaN payloads, subnormals, Inf),
    and float32 values narrowed across ties, subnormals, overflow, Inf and NaNs with payloads."""
    widen_all, narrow_all = _vector_converters()
    kview = D.KERNEL[name]
    bits = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(kview)
    wide = np.empty(bits.size, np.float32)
    widen_all(bits, wide)
    np.testing.assert_array_equal(wide.view(np.uint32), D.to_float32(bits).view(np.uint32))
    rng = np.random.default_rng(0)
    f = np.concatenate([
        wide[np.isfinite(wide)],
        (wide[np.isfinite(wide)] * np.float32(1 + 2**-9)).astype(np.float32),  # near ties
        rng.standard_normal(4096).astype(np.float32) * np.float32(1e-6),  # fp16 subnormals
        np.array([65504, 65519.99, 65520, 1e30, -1e30, np.inf, -np.inf, 0.0, -0.0], np.float32),
        np.array([0x7F800001, 0xFFC00000, 0x7FA00000, 0x7F802000], np.uint32).view(np.float32),  # NaNs
    ])
    f = np.concatenate([f, np.zeros(-f.size % 16, np.float32)])
    got = np.empty(f.size, kview)
    narrow_all(f, got)
    want = np.empty(f.size, kview)
    D._narrow_flat(f, want)
    np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
