"""cast_mode= on the vector strategies: the 16-bit result is the mode's rounding (the integer model
of tests/machine/test_cast_modes.py) of the fp32 value the kernel computes before its cast, which
is what the same strategy computes on the widened inputs in fp32 storage. Odd shapes (vector
steps and scalar tails), bf16 and fp16. Strategies that do not narrow accept the option."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pypto_numba import embedding, gelu, linear, mean, moe, repeat_kv, rmsnorm, rope, softmax, swiglu
from pypto_numba.machine import dtypes
from pypto_numba.machine.profile import use_cast_mode

_spec = importlib.util.spec_from_file_location("cast_model", Path(__file__).parents[1] / "machine" / "test_cast_modes.py")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
model = _mod.model

# every mode on gelu (its IR span), a tie-sensitive and a directed mode on the others
GELU_CASES = [(fmt, m) for fmt in ("bf16", "fp16") for m in dtypes.CAST_MODES]
CASES = [("bf16", "rint"), ("bf16", "round"), ("bf16", "floor"), ("fp16", "odd"), ("fp16", "ceil")]


def make(shape, fmt, rng, scale=2.0):
    return (rng.standard_normal(shape) * scale).astype(dtypes.STORAGE[fmt])


def wide(a):
    return np.asarray(a).astype(np.float32)


def expect(y32, fmt, mode):
    return model(np.ascontiguousarray(y32, np.float32).view(np.uint32), fmt, mode).astype(np.uint16)


def bits(a):
    return np.asarray(a).view(np.uint16)


def same(got, y32, fmt, mode):
    want = expect(y32, fmt, mode)
    bad = np.flatnonzero(bits(got).reshape(-1) != want.reshape(-1))
    assert bad.size == 0, f"{bad.size} of {want.size} differ, first at {bad[:4]}"


@pytest.mark.parametrize("fmt, mode", GELU_CASES)
@pytest.mark.parametrize("fn", [gelu.tanh, gelu.erf], ids=["tanh", "erf"])
def test_gelu(fn, fmt, mode, rng):
    if fn is gelu.erf and mode not in ("round", "trunc"):
        pytest.skip("erf: two modes (the same span as tanh)")
    x = make((37, 301), fmt, rng)
    same(fn(x, cast_mode=mode), fn(wide(x)), fmt, mode)


def test_gelu_storage_math_and_fp32_ignore_the_mode(rng):
    x = make((5, 67), "bf16", rng)
    ref = gelu.tanh(x, math="storage")
    assert np.array_equal(bits(gelu.tanh(x, math="storage", cast_mode="floor")), bits(ref))
    x32 = wide(x)
    assert np.array_equal(gelu.tanh(x32, cast_mode="floor"), gelu.tanh(x32))


@pytest.mark.parametrize("fmt, mode", CASES)
def test_swiglu(fmt, mode, rng):
    g, u = make((9, 133), fmt, rng), make((9, 133), fmt, rng)
    same(swiglu.fused(g, u, cast_mode=mode), swiglu.fused(wide(g), wide(u)), fmt, mode)
    # separate rounds twice: h = cast(silu(g)), then cast(h * up)
    h = swiglu.fused(g, np.ones_like(g), cast_mode=mode)  # silu(g) * 1: the silu kernel's value
    same(h, swiglu.fused(wide(g), np.ones(g.shape, np.float32)), fmt, mode)
    same(swiglu.separate(g, u, cast_mode=mode), wide(h) * wide(u), fmt, mode)


@pytest.mark.parametrize("fmt, mode", CASES)
def test_softmax(fmt, mode, rng):
    x = make((7, 515), fmt, rng)
    same(softmax.whole_row(x, cast_mode=mode), softmax.whole_row(wide(x)), fmt, mode)
    same(softmax.online(x, col_tile=128, cast_mode=mode), softmax.online(wide(x), col_tile=128), fmt, mode)


@pytest.mark.parametrize("fmt, mode", CASES)
def test_mean(fmt, mode, rng):
    x = make((6, 5, 333), fmt, rng)
    for dim in (-1, 1):
        same(mean.sum_div(x, dim=dim, cast_mode=mode), mean.sum_div(wide(x), dim=dim), fmt, mode)


@pytest.mark.parametrize("fmt, mode", CASES)
def test_rmsnorm(fmt, mode, rng):
    x, r, w = make((11, 96), fmt, rng), make((11, 96), fmt, rng), make((96,), fmt, rng, 0.5)
    same(rmsnorm.plain(x, w, cast_mode=mode), rmsnorm.plain(wide(x), wide(w)), fmt, mode)
    normed, new = rmsnorm.fused_add(x, r, w, cast_mode=mode)
    same(new, wide(x) + wide(r), fmt, mode)
    same(normed, rmsnorm.plain(wide(new), wide(w)), fmt, mode)


@pytest.mark.parametrize("fmt, mode", CASES)
def test_rope(fmt, mode, rng):
    S, H, D = 7, 3, 40
    x, w = make((S, H, D), fmt, rng), make((D,), fmt, rng, 0.5)
    c, s = rope.cos_sin(np.arange(S), 24, dtype=dtypes.STORAGE[fmt])
    ci, si = rope.cos_sin(np.arange(S), 24, dtype=dtypes.STORAGE[fmt], layout="interleaved")
    x32, w32, c32, s32 = wide(x), wide(w), wide(c), wide(s)
    same(rope.standard(x, c, s, cast_mode=mode), rope.standard(x32, c32, s32), fmt, mode)
    same(rope.interleaved(x, ci, si, cast_mode=mode), rope.interleaved(x32, wide(ci), wide(si)), fmt, mode)
    same(rope.rmsnorm(x, w, cast_mode=mode), rope.rmsnorm(x32, w32), fmt, mode)
    same(rope.fused_rmsnorm(x, w, c, s, cast_mode=mode), rope.fused_rmsnorm(x32, w32, c32, s32), fmt, mode)


def test_the_context_and_the_argument(rng, monkeypatch):
    monkeypatch.delenv("PYPTO_NUMBA_CAST_MODE", raising=False)
    x = make((3, 77), "bf16", rng)
    y32 = gelu.tanh(wide(x))
    with use_cast_mode("trunc"):
        same(gelu.tanh(x), y32, "bf16", "trunc")
        same(gelu.tanh(x, cast_mode="rint"), y32, "bf16", "rint")  # the argument wins
    monkeypatch.setenv("PYPTO_NUMBA_CAST_MODE", "trunc")
    same(gelu.tanh(x), y32, "bf16", "trunc")


def test_copies_accept_the_mode_and_keep_bits(rng):
    table = make((50, 32), "bf16", rng)
    ids = np.array([3, 0, 49, 7], np.int64)
    for fn in (embedding.gather, embedding.index_select):
        assert np.array_equal(bits(fn(table, ids, cast_mode="floor")), bits(fn(table, ids)))
    kv = make((2, 2, 5, 16), "fp16", rng)
    assert np.array_equal(bits(repeat_kv.expand_clone(kv, 3, cast_mode="ceil")), bits(repeat_kv.expand_clone(kv, 3)))
    logits = rng.standard_normal((5, 16)).astype(np.float32)
    for fn in (moe.sigmoid_gating, moe.softmax_gating):
        w, i = fn(logits, 4, cast_mode="trunc")
        w0, i0 = fn(logits, 4)
        assert np.array_equal(w, w0) and np.array_equal(i, i0)


@pytest.mark.parametrize("fmt, mode", [("bf16", "round"), ("fp16", "floor")])
def test_moe_combine(fmt, mode, rng):
    e, w = make((7, 3, 133), fmt, rng), rng.random((7, 3)).astype(np.float32)
    same(moe.combine(e, w, cast_mode=mode), moe.combine(wide(e), w), fmt, mode)


@pytest.mark.parametrize("fmt, mode", [("bf16", "round"), ("fp16", "trunc")])
def test_linear_fixpipe_is_rint(fmt, mode, rng):
    x, wt, b = make((5, 48), fmt, rng, 0.5), make((40, 48), fmt, rng, 0.5), make((40,), fmt, rng)
    # the cube's FIXPIPE rounds with rint whatever the mode; matmul_add's vector add uses the mode
    assert np.array_equal(bits(linear.fused_bias(x, wt, b, cast_mode=mode)), bits(linear.fused_bias(x, wt, b)))
    prod = linear.fused_bias(x, wt)  # the product, rounded by the cube (rint)
    same(linear.matmul_add(x, wt, b, cast_mode=mode), wide(prod) + wide(b), fmt, mode)


def test_bad_mode_is_a_clear_error(rng):
    x = make((3, 5), "bf16", rng)
    with pytest.raises(dtypes.CastModeError, match="gelu.tanh: unknown cast mode 'nearest'.*rint, round"):
        gelu.tanh(x, cast_mode="nearest")
    with pytest.raises(dtypes.CastModeError, match="softmax.online"):
        softmax.online(x, cast_mode=1)
