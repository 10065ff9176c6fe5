"""cast_mode= on the vector strategies: the 16-bit result is the mode's rounding (the integer model
of tests/machine/test_cast_modes.py) of the fp32 value the kernel computes before its cast, which
is what the same strategy computes on the widened inputs in fp32 storage. Odd shapes (vector
steps and scalar tails), bf16 and fp16. Strategies that do not narrow accept the option.
Attention rounds twice (P and the output): against its mirror with the mode, and by the model
where one of the two roundings is exact."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from pypto_numba import attention, embedding, gelu, linear, mean, moe, precision, repeat_kv, rmsnorm, rope, softmax, swiglu
from pypto_numba.attention import _reference_attention
from pypto_numba.machine import dtypes
from pypto_numba.machine.profile import use_cast_mode
from pypto_numba.strategy import spec

pytestmark = pytest.mark.slow(on="3.13")  # heavy compiles: once per tox run (tests/conftest.py)

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
    q = make((1, 2, 3, 8), "fp32", rng)  # attention refuses a bad name for fp32 inputs too
    with pytest.raises(dtypes.CastModeError, match="attention.flash: unknown cast mode 'nearest'.*rint, round"):
        attention.flash(q, q, q, cast_mode="nearest")


# --- attention: P (every strategy) and the output (online, flash; standard's is the FIXPIPE's: rint)
# One odd shape, decode loops: G = 2, R = 10 rows, Skv = 37 keys in KV tiles of 16 (a tail; flash
# splits the 3 tiles and combines). Each mode is its own compiled kernel and the modes share their
# code, so every strategy runs bf16 floor and ceil (the bracket test) and one fp16 mode, and every
# mode runs somewhere: round (flash), trunc (standard), odd (online).
ATT = {"standard": {}, "online": {"kv_tile": 16}, "flash": {"kv_tile": 16}}
ATT_FP16 = {"standard": "trunc", "online": "odd", "flash": "round"}
ATT_CASES = [(s, "bf16", m) for s in ATT for m in ("floor", "ceil")] + [(s, "fp16", m) for s, m in ATT_FP16.items()]


def att_inputs(fmt, rng, skv=37, dv=24, positive_v=False):
    q, k = make((1, 4, 5, 24), fmt, rng, 1.0), make((1, 2, skv, 24), fmt, rng, 1.0)
    v = make((1, 2, skv, dv), fmt, rng, 1.0)
    return q, k, (np.abs(wide(v)) + 0.125).astype(v.dtype) if positive_v else v


def att_mirror(strategy, q, k, v, **options):
    return spec("attention").reference(q, k, v, strategy=strategy, mirror=True, **options)


def _p_near_a_boundary(q, k, fmt, mode, kv_tile):
    """Whether some P of the mirror (per KV tile ``exp(s - m_t)``, or standard's ``exp(s - m) / l``)
    lies within 2^-12 of a storage step of where ``mode`` rounds differently (a representable value
    for the directed modes, a midpoint for rint and round). There the kernel's fp32 scores, one ulp from float64
    in the order the host's vector width gives their sums, can tip P by one step, and a tipped P
    near 1 moves its row's outputs by several ulps: the data would test the host's summation
    order, not the cast mode's plumbing."""
    G = q.shape[1] // k.shape[1]
    s = np.einsum("bhqd,bhkd->bhqk", wide(q).astype(np.float64),
                  np.repeat(wide(k).astype(np.float64), G, axis=1)) / np.sqrt(q.shape[-1])
    n = s.shape[-1]
    ps = []
    for j0 in range(0, n, kv_tile or n):
        st = s[..., j0:j0 + (kv_tile or n)]
        top = st == st.max(axis=-1, keepdims=True)
        e = np.exp(st - st.max(axis=-1, keepdims=True))
        # a tile's max gives exp(0) = 1 exactly, in fp32 too: no boundary to tip there
        ps.append(e[~top] if kv_tile else (e / e.sum(axis=-1, keepdims=True)).ravel())
    p = np.concatenate(ps)
    frac = (p / precision.ulp(p, fmt)) % 1.0
    gap = np.abs(frac - 0.5) if mode in ("rint", "round") else np.minimum(frac, 1.0 - frac)
    return bool(np.any(gap < 2.0**-12))


@pytest.mark.parametrize("strategy, fmt, mode", ATT_CASES)
def test_attention_within_its_mirror(strategy, fmt, mode, rng):
    q, k, v = att_inputs(fmt, rng)
    draws = 1
    while _p_near_a_boundary(q, k, fmt, mode, ATT[strategy].get("kv_tile")):  # see there
        q, k, v = att_inputs(fmt, rng)
        draws += 1
    assert draws <= 20
    fn, kw = getattr(attention, strategy), ATT[strategy]
    got = precision.mirror_check(fn(q, k, v, cast_mode=mode, **kw), att_mirror(strategy, q, k, v, cast_mode=mode, **kw),
                                 fmt)
    assert got.ok, f"{strategy} {fmt} {mode}: {got}"
    if strategy == "online" and mode == "floor":  # P_hi + P_lo, both rounded by the mode: about P unrounded
        got = precision.mirror_check(fn(q, k, v, cast_mode=mode, pv="compensated", **kw),
                                     att_mirror(strategy, q, k, v, cast_mode=mode, pv="compensated", **kw), fmt)
        assert got.ok, f"online compensated {fmt} {mode}: {got}"


@pytest.mark.parametrize("strategy", list(ATT))
def test_attention_floor_and_ceil_bracket_the_truth(strategy, rng):
    """V > 0: P rounded down (floor) gives a smaller output than P rounded up (ceil) everywhere;
    online and flash also round the output the same way, so floor <= float64 truth <= ceil."""
    q, k, v = att_inputs("bf16", rng, positive_v=True)
    fn, kw = getattr(attention, strategy), ATT[strategy]
    lo, hi = (wide(fn(q, k, v, cast_mode=m, **kw)).astype(np.float64) for m in ("floor", "ceil"))
    truth = _reference_attention(q, k, v)
    assert (lo <= hi).all() and np.count_nonzero(lo < hi) > lo.size // 2
    assert lo.mean() < truth.mean() < hi.mean()
    if strategy != "standard":
        assert (lo <= truth).all() and (truth <= hi).all()
    # the mode is what moved them: each is within its own mode's mirror, not the other's
    assert not precision.mirror_check(lo, att_mirror(strategy, q, k, v, cast_mode="ceil", **kw), "bf16").ok


@pytest.mark.parametrize("strategy", list(ATT))
def test_attention_output_cast_by_the_model(strategy, rng):
    """q = 0: every score is 0, so p = 1 (online/flash) or 1/32 (standard, 32 keys) is exact in every
    mode and the output is the fp32 mean of V, which the fp32 call computes the same way: its
    16-bit cast is the mode's (online, flash: the vector unit) or rint (standard: the FIXPIPE)."""
    skv = 32 if strategy == "standard" else 37
    q, k, v = att_inputs("bf16", rng, skv=skv)
    q = np.zeros_like(q)
    fn, kw = getattr(attention, strategy), ATT[strategy]
    y32 = fn(wide(q), wide(k), wide(v), **kw)
    same(fn(q, k, v, cast_mode="floor", **kw), y32, "bf16", "rint" if strategy == "standard" else "floor")
    if strategy == "standard":  # V = one-hot rows: the output is P itself, rounded by the mode
        eye = np.zeros((1, 2, skv, skv), np.float32)
        eye[..., np.arange(skv), np.arange(skv)] = 1
        q, k, _ = att_inputs("bf16", rng, skv=skv)
        same(fn(q, k, eye.astype(q.dtype), cast_mode="floor"), fn(wide(q), wide(k), eye), "bf16", "floor")


@pytest.mark.parametrize("strategy", list(ATT))
def test_attention_rint_is_the_default(strategy, rng, monkeypatch):
    monkeypatch.delenv("PYPTO_NUMBA_CAST_MODE", raising=False)
    q, k, v = att_inputs("bf16", rng)
    fn, kw = getattr(attention, strategy), ATT[strategy]
    assert np.array_equal(bits(fn(q, k, v, cast_mode="rint", **kw)), bits(fn(q, k, v, **kw)))
    with use_cast_mode("floor"):  # the call and its mirror both follow the context
        floor = fn(q, k, v, **kw)
        mirror = att_mirror(strategy, q, k, v, **kw)
    assert np.array_equal(bits(floor), bits(fn(q, k, v, cast_mode="floor", **kw)))
    assert np.array_equal(mirror, att_mirror(strategy, q, k, v, cast_mode="floor", **kw))
    q32, k32, v32 = wide(q), wide(k), wide(v)  # fp32 never narrows
    assert np.array_equal(fn(q32, k32, v32, cast_mode="floor", **kw), fn(q32, k32, v32, **kw))


@pytest.mark.parametrize("strategy", ["online", "flash"])
def test_attention_paged_follows_the_mode(strategy, rng):
    """A paged call (pages shuffled) gives the dense call's bits in a mode too; write_kv copies bits."""
    q, k, v = att_inputs("bf16", rng, skv=48)
    pages = rng.permutation(5)[:3].astype(np.int32)  # 3 pages of 16 keys in a cache of 5
    kc = np.zeros((5, 16, 2, 24), k.dtype)
    vc = np.zeros((5, 16, 2, 24), v.dtype)
    lens = np.array([37])
    slots = (pages[np.arange(37) // 16] * 16 + np.arange(37) % 16).astype(np.int64)
    attention.write_kv(kc, vc, k[0, :, :37].transpose(1, 0, 2), v[0, :, :37].transpose(1, 0, 2), slots, cast_mode="floor")
    fn, kw = getattr(attention, strategy), ATT[strategy]
    paged = fn(q, kc, vc, block_table=pages[None], kv_len=lens, cast_mode="floor", **kw)
    assert np.array_equal(bits(paged), bits(fn(q, k, v, kv_len=lens, cast_mode="floor", **kw)))
