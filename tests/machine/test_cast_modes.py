"""The six fp32 -> bf16/fp16 cast modes (machine/dtypes.py) against an independent model.

The model decodes a float32 into an exact integer significand and exponent, counts the target
format's quanta with integer division and applies each mode's rule to the remainder, then encodes
the result again (IEEE's overflow rule per mode). It shares no code or trick with the IR
converters, and its rint agrees with ml_dtypes / NumPy (checked first).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from pypto_numba.machine import dtypes
from pypto_numba.machine import ir as irb
from pypto_numba.machine.profile import CAST_MODE_ENV_VAR, resolve_cast_mode, use_cast_mode, use_profile

MODES = dtypes.CAST_MODES
# (mantissa bits, minimum normal exponent, maximum exponent, bias) of the 16-bit formats
FORMATS = {"bf16": (7, -126, 127, 127), "fp16": (10, -14, 15, 15)}


def model(bits, fmt, mode):
    """Bits (int64 array) of the 16-bit result of rounding float32 ``bits`` by ``mode``."""
    mb, emin, emax, bias = FORMATS[fmt]
    b = bits.astype(np.int64) & 0xFFFFFFFF
    neg = (b >> 31) == 1
    e8 = (b >> 23) & 0xFF
    frac = b & 0x7FFFFF
    M = np.where(e8 == 0, frac, frac | (1 << 23))  # |x| = M * 2^E exactly
    E = np.where(e8 == 0, -149, e8 - 150)
    bitlen = np.frexp(M.astype(np.float64))[1]  # M < 2^24: exact; 0 for M = 0
    qE = np.maximum(E + bitlen - 1 - mb, emin - mb)  # exponent of the target's quantum
    shift = np.minimum(qE - E, 40)  # >= 13 here; 40 drops every bit of M < 2^24
    q = M >> shift
    r = M - (q << shift)
    half = np.int64(1) << (shift - 1)
    up = {
        "rint": (r > half) | ((r == half) & (q % 2 == 1)),
        "round": r >= half,
        "floor": (r > 0) & neg,
        "ceil": (r > 0) & ~neg,
        "trunc": np.zeros_like(neg),
        "odd": (r > 0) & (q % 2 == 0),
    }[mode]
    n = q + up  # the result is n * 2^qE
    k = np.frexp(n.astype(np.float64))[1] - 1
    normal = n >= (1 << mb)
    kk = np.where(normal, k, mb)
    mant = (n - (np.int64(1) << kk)) >> (kk - mb)
    expo = qE + kk  # the result's exponent (normal results)
    out = np.where(normal, ((expo + bias) << mb) | mant, n)
    inf = ((2 * bias + 1) << mb)
    top = inf - 1  # largest finite magnitude
    toward_inf = {"rint": True, "round": True, "trunc": False, "odd": False}
    if mode in toward_inf:
        ovf = np.full_like(out, inf if toward_inf[mode] else top)
    else:
        ovf = np.where(neg == (mode == "floor"), inf, top)
    out = np.where(normal & (expo > emax), ovf, out)
    out = np.where((e8 == 255) & (frac == 0), inf, out)
    if fmt == "bf16":
        nan = np.full_like(out, 0x7FC0)
    else:
        payload = frac >> 13
        nan = np.where(payload == 0, 1, payload) | 0x7C00
    out = np.where((e8 == 255) & (frac != 0), nan, out)
    return out | np.where(neg, 1 << 15, 0)


def _lower_halves(fmt):
    if fmt == "bf16":  # the 16 dropped bits: zero, one below / at / above the tie, all ones
        return [0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF]
    return [(k << 13) | low for k in range(8) for low in (0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF)]


def sweep(fmt):
    """All 2^16 upper halves, each with the chosen lower halves, as float32 bits (uint32)."""
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    return (upper[:, None] | np.array(_lower_halves(fmt), np.uint32)[None, :]).reshape(-1)


def special(fmt):
    """NaN/Inf/zero/overflow/subnormal edges, and fp16's subnormal ties (n + 1/2) * 2^-24."""
    v = [0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 65504.0, 65519.99, 65520.0, 65535.99, 65536.0, 1e6,
         3.3895314e38, 3.4028235e38, 1e-45, 2.0**-14, 2.0**-24, 2.0**-25, 2.0**-26, 2.0**-126, 2.0**-133,
         2.0**-134, 1.5 * 2.0**-133]
    ties = ((np.arange(1025) + 0.5) * 2.0**-24).astype(np.float32)
    f = np.concatenate([np.array(v, np.float32), ties, np.nextafter(ties, 0), np.nextafter(ties, 1)])
    f = np.concatenate([f, -f])
    return f.view(np.uint32)


def cast(bits, fmt, mode):
    """The library's kernel cast (``from_float32`` -> ``narrow(out, v, mode)`` in a kernel)."""
    return dtypes.from_float32(bits.view(np.float32), fmt, mode).view(np.uint16).astype(np.int64)


# a 16-lane vector cast, the form the IR kernels (gelu's span, rope's rotation) store with
def _vector_cast(mode, kind):
    @intrinsic
    def cast16(typingctx, src, dst):
        def codegen(context, builder, sig, args):
            s = context.make_array(sig.args[0])(context, builder, args[0])
            d = context.make_array(sig.args[1])(context, builder, args[1])
            v = builder.load(builder.bitcast(s.data, ir.VectorType(ir.FloatType(), 16).as_pointer()), align=4)
            y = dtypes.narrow_mode_ir(builder, v, kind, 16, mode)
            builder.store(y, builder.bitcast(d.data, ir.VectorType(ir.IntType(16), 16).as_pointer()), align=2)
            return context.get_dummy_value()

        return types.void(src, dst), codegen

    @njit
    def run(src, dst):
        for i in range(src.size // 16):
            cast16(src[i * 16:], dst[i * 16:])

    return run


def vector_cast(bits, fmt, mode):
    f = bits.view(np.float32)
    n = f.size // 16 * 16
    out = np.empty(n, dtypes.KERNEL[fmt])
    _vector_cast(mode, types.uint16 if fmt == "bf16" else types.int16)(f[:n], out)
    return out.view(np.uint16).astype(np.int64), n


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
def test_model_rint_is_the_reference_rounding(fmt):
    bits = np.concatenate([sweep(fmt), special(fmt)])
    with np.errstate(all="ignore"):
        ref = bits.view(np.float32).astype(dtypes.STORAGE[fmt]).view(np.uint16).astype(np.int64)
    assert np.array_equal(model(bits, fmt, "rint"), ref)


@pytest.mark.parametrize("fmt", ["bf16", "fp16"])
@pytest.mark.parametrize("mode", MODES)
def test_every_mode_matches_the_model(fmt, mode):
    rng = np.random.default_rng(7)
    dense = rng.integers(0, 1 << 32, size=1 << 21, dtype=np.uint64).astype(np.uint32)
    bits = np.concatenate([sweep(fmt), special(fmt), dense])
    want = model(bits, fmt, mode)
    got = cast(bits, fmt, mode)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(int(bits[i])), hex(int(got[i])), hex(int(want[i]))) for i in bad[:5]]
    vec, n = vector_cast(bits, fmt, mode)
    assert np.array_equal(vec, want[:n])


def test_hand_cases():
    one_tie = np.array([1.0 + 2.0**-8, -(1.0 + 2.0**-8), 1.0 + 3 * 2.0**-8], np.float32)  # bf16 ties
    bf = lambda m: dtypes.from_float32(one_tie, "bf16", m).view(np.uint16).tolist()  # noqa: E731
    assert bf("rint") == [0x3F80, 0xBF80, 0x3F82]
    assert bf("round") == [0x3F81, 0xBF81, 0x3F82]
    assert bf("odd") == [0x3F81, 0xBF81, 0x3F81]  # round to odd, not nearest: 1 + 3/256 -> 1 + 1/128 (odd)
    big = np.array([70000.0, -70000.0, np.inf, np.nan], np.float32)
    fp = lambda m: dtypes.from_float32(big, "fp16", m).astype(np.float32).tolist()  # noqa: E731
    assert fp("trunc")[:3] == [65504.0, -65504.0, np.inf]
    assert fp("floor")[:3] == [65504.0, -np.inf, np.inf]
    assert fp("ceil")[:3] == [np.inf, -65504.0, np.inf]
    assert fp("round")[:3] == [np.inf, -np.inf, np.inf]
    assert all(np.isnan(fp(m)[3]) for m in MODES)
    # subnormals are kept: 2^-24 * 0.75 floors to 0, ceils to the smallest subnormal
    tiny = np.array([0.75 * 2.0**-24], np.float32)
    assert dtypes.from_float32(tiny, "fp16", "floor").view(np.uint16).tolist() == [0]
    assert dtypes.from_float32(tiny, "fp16", "ceil").view(np.uint16).tolist() == [1]


def test_round_as_and_narrow_in_kernels_take_the_mode():
    @njit
    def both(x, like, mode):
        out = np.empty(x.size, np.float32)
        bits = np.empty(x.size, like.dtype)
        for i in range(x.size):
            out[i] = dtypes.round_as(like, x[i], mode)
            bits[i] = dtypes.narrow(like, x[i], mode)
        return out, bits

    x = np.array([1.0 + 2.0**-8, 1.0 + 2.0**-11, -3.0e-8], np.float32)
    for fmt in ("bf16", "fp16"):
        like = np.empty(0, dtypes.KERNEL[fmt])
        for mode in MODES:
            r, b = both(x, like, dtypes.cast_mode(mode))
            want = dtypes.from_float32(x, fmt, mode)
            assert np.array_equal(b.view(np.uint16), want.view(np.uint16))
            assert np.array_equal(r, want.astype(np.float32))
            assert np.array_equal(dtypes.round_as(like, x, mode), want.astype(np.float32))
    r, b = both(x, np.empty(0, np.float32), dtypes.cast_mode("floor"))
    assert np.array_equal(r, x) and np.array_equal(b, x)  # fp32 storage: no narrowing


def test_bad_mode_names_the_modes():
    with pytest.raises(dtypes.CastModeError, match="rint, round, floor, ceil, trunc, odd"):
        dtypes.cast_mode("nearest")
    with pytest.raises(dtypes.CastModeError, match="use_cast_mode"):
        use_cast_mode("none")
    with pytest.raises(dtypes.CastModeError, match="from_float32"):
        dtypes.from_float32(np.ones(2, np.float32), "bf16", "RINT")
    assert isinstance(dtypes.CastModeError("x"), ValueError)


def test_resolution_order(monkeypatch):
    monkeypatch.delenv(CAST_MODE_ENV_VAR, raising=False)
    assert resolve_cast_mode().name == "rint"  # the hicann lineage's default (npu-facts 4.5)
    with use_profile("ascend950"):
        assert resolve_cast_mode().name == "rint"
    monkeypatch.setenv(CAST_MODE_ENV_VAR, "trunc")
    assert resolve_cast_mode().name == "trunc"
    with use_cast_mode("round"):
        assert resolve_cast_mode().name == "round"
        assert resolve_cast_mode("ceil").name == "ceil"
        with use_cast_mode("odd"):
            assert resolve_cast_mode().name == "odd"
        assert resolve_cast_mode().name == "round"
    assert resolve_cast_mode().name == "trunc"
    monkeypatch.setenv(CAST_MODE_ENV_VAR, "bogus")
    with pytest.raises(dtypes.CastModeError, match=CAST_MODE_ENV_VAR):
        resolve_cast_mode()


def test_profile_field(tmp_path, monkeypatch):
    from pypto_numba.machine import profile as P

    assert P.load_profile("ascend910b").cast_mode == "rint"
    with pytest.raises(P.ProfileError, match="cast_mode"):
        P._cast_mode_field("x", {"cast_mode": "nearest"})
    assert P._cast_mode_field("x", {"cast_mode": "round"}) == "round"
