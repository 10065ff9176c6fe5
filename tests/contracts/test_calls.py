"""Calls kept per signature (machine/memo.py ``CallMemo``, tile.py ``ScratchPool``) and the ops
that use them (rope, embedding): a call that repeats an earlier call's signature skips the
validation its signature decides, and must still check everything that depends on the data."""

from __future__ import annotations

import concurrent.futures

import numba
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import attention, embedding, linear, reference as ref, rope
from pypto_numba.attention import validation as attention_common
from pypto_numba.errors import ConstraintError, ShapeError
from pypto_numba.machine import tile
from pypto_numba.machine.memo import CallMemo

from helpers import DTYPES, assert_cost_matches_plan, make, pair_tables, run_traced

STORAGE_RTOL = {"fp32": 2.0**-21, "bf16": 2.0**-8, "fp16": 2.0**-10}  # a few roundings in the storage dtype


# ---------------------------------------------------------------------------------------------
# CallMemo and ScratchPool


def test_key_is_the_signature_of_arrays_and_options():
    a = np.zeros((4, 6), np.float32)
    key = CallMemo.key(None, (a, None), ("standard", 0.0))
    assert key == CallMemo.key(None, (np.ones((4, 6), np.float32), None), ("standard", 0.0))
    others = [
        ((np.zeros((4, 7), np.float32), None), ("standard", 0.0)),  # shape
        ((np.zeros((4, 6), np.float16), None), ("standard", 0.0)),  # dtype
        ((np.zeros((4, 12), np.float32)[:, ::2], None), ("standard", 0.0)),  # strides
        ((np.zeros((6, 4), np.float32).T, None), ("standard", 0.0)),  # strides (F order)
        ((a, a), ("standard", 0.0)),  # an optional array given
        ((a, None), ("standard", 1e-6)),  # an option
        ((a, None), ("standard", 0)),  # 0 and 0.0 are different options
        ((a, None), ("interleaved", 0.0)),
    ]
    assert len({key} | {CallMemo.key(None, arrays, options) for arrays, options in others}) == len(others) + 1
    with pn.use_profile("ascend950"):
        assert CallMemo.key(None, (a, None), ("standard", 0.0)) != key
    assert CallMemo.key("ascend950", (a, None), ("standard", 0.0)) != key


def test_no_key_for_what_has_no_signature():
    a = np.zeros(8, np.float32)
    assert CallMemo.key(None, (np.ma.masked_array(a),)) is None  # a subclass
    assert CallMemo.key(None, ([1.0, 2.0],)) is None
    assert CallMemo.key(None, (np.float32(1.0),)) is None
    assert CallMemo.key(None, (a,), ({"a": 1},)) is None  # an unhashable option
    assert CallMemo.key("no-such-profile", (a,)) is None


def test_memo_keeps_the_newest_entries():
    memo = CallMemo(maxsize=3)
    keys = [CallMemo.key(None, (np.zeros(n, np.float32),)) for n in range(1, 6)]
    for i, k in enumerate(keys):
        memo.put(k, i)
    assert len(memo) == 3
    assert [memo.get(k) for k in keys] == [None, None, 2, 3, 4]
    assert memo.get(None) is None and memo.put(None, 7) == 7 and len(memo) == 3
    memo.clear()
    assert len(memo) == 0


def test_scratch_pool_never_hands_out_one_set_twice():
    pool = tile.ScratchPool((10, np.float32, 2), (24, np.uint16))
    a, b = pool.take(), pool.take()  # two calls at once: two sets
    assert [s.shape[1:] for s in a] == [(2, 16 + 16), (32 + 32,)]
    assert not any(np.may_share_memory(x, y) for x in a for y in b)
    pool.give(a)
    assert pool.take() is a  # reused after its call
    assert pool.take() is not a


# ---------------------------------------------------------------------------------------------
# rope


def _rope_case(dtype, rng, S=19, H=3, D=64, R=48):
    x = make((S, H, D), dtype, rng)
    cos, sin = make((S, R), dtype, rng), make((S, R), dtype, rng)
    return x, cos, sin


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["standard", "interleaved", "rmsnorm", "fused_rmsnorm"])
def test_rope_repeated_signature_same_result_and_cost(kind, dtype, rng):
    rope._CALLS.clear()
    x, cos, sin = _rope_case(dtype, rng)
    w = make(x.shape[-1:], dtype, rng, 0.1, 1.0)
    call = {
        "standard": lambda x, out=None: rope.standard(x, cos, sin, out=out),
        "interleaved": lambda x, out=None: rope.interleaved(x, *pair_tables(cos, sin), out=out),
        "rmsnorm": lambda x, out=None: rope.rmsnorm(x, w, out=out),
        "fused_rmsnorm": lambda x, out=None: rope.fused_rmsnorm(x, w, cos, sin, out=out),
    }[kind]
    oracle = {
        "standard": lambda x: ref.rope_standard(x, cos, sin),
        "interleaved": lambda x: ref.rope_interleaved(x, *pair_tables(cos, sin)),
        "rmsnorm": lambda x: ref.rmsnorm(x, w),
        "fused_rmsnorm": lambda x: ref.rope_fused_rmsnorm(x, w, cos, sin),
    }[kind]
    first = call(x)
    assert len(rope._CALLS) == 1
    for _ in range(2):  # the same signature, other data: from the kept entry
        x2 = make(x.shape, dtype, rng)
        got, record = run_traced(call, x2)
        assert len(rope._CALLS) == 1
        assert_cost_matches_plan(record)
        np.testing.assert_allclose(got.astype(np.float64), oracle(x2), rtol=STORAGE_RTOL[dtype], atol=1e-5)
    again = call(x, out=np.empty_like(x))  # out= given: a new signature, then kept
    assert np.array_equal(again.view(np.uint8), first.view(np.uint8)) and len(rope._CALLS) == 2
    assert np.array_equal(call(x, out=np.empty_like(x)).view(np.uint8), first.view(np.uint8))


def test_rope_kept_signature_still_checks_out_memory(rng):
    rope._CALLS.clear()
    x, cos, sin = _rope_case("fp32", rng)
    out = np.empty_like(x)
    rope.standard(x, cos, sin, out=out)
    out.flags.writeable = False  # same signature, now read-only
    with pytest.raises(ConstraintError, match="writeable"):
        rope.standard(x, cos, sin, out=out)
    buf = np.empty(2 * x.size, x.dtype)
    x2, out2 = buf[: x.size].reshape(x.shape), buf[x.size :].reshape(x.shape)
    x2[...] = x
    rope.standard(x2, cos, sin, out=out2)
    shifted = buf[x.size // 2 : x.size // 2 + x.size].reshape(x.shape)  # same signature, overlapping
    with pytest.raises(ConstraintError, match="overlaps x partially"):
        rope.standard(x2, cos, sin, out=shifted)
    expect = rope.standard(x, cos, sin)
    got = rope.standard(x2, cos, sin, out=x2)  # in place is allowed
    assert got is x2 and np.array_equal(got, expect)


def test_rope_copied_inputs_are_not_kept(rng):
    rope._CALLS.clear()
    x, cos, sin = _rope_case("bf16", rng)
    wide = np.concatenate([x, x], axis=-1)[..., : x.shape[-1]]  # a strided view of x's values
    for _ in range(2):
        got, record = run_traced(rope.standard, wide, cos, sin)
        assert record.cost.workspace_bytes == x.nbytes  # copied on every call
        assert np.array_equal(got.view(np.uint16), rope.standard(x, cos, sin).view(np.uint16))
    assert len(rope._CALLS) == 1  # only the contiguous call's


def test_rope_kept_signature_follows_the_profile(rng):
    rope._CALLS.clear()
    x, cos, sin = _rope_case("fp32", rng, S=64, H=32, D=128, R=128)
    _, base = run_traced(rope.standard, x, cos, sin)
    with pn.use_profile("ascend950"):
        _, other = run_traced(rope.standard, x, cos, sin)
    _, again = run_traced(rope.standard, x, cos, sin)
    assert (base.profile, other.profile, again.profile) == ("ascend910b", "ascend950", "ascend910b")
    assert len(rope._CALLS) == 2


def test_rope_concurrent_calls_of_one_signature(rng):
    """Kernels release the GIL: calls of one signature from several threads at once each get
    their own scratch (the bf16 path stages every head row in it)."""
    rope._CALLS.clear()
    x, cos, sin = _rope_case("bf16", rng, S=256, H=16, D=128, R=128)
    rope.standard(x, cos, sin)  # compile and keep the signature in this thread
    if numba.threading_layer() not in ("omp", "tbb"):
        pytest.skip(f"numba's {numba.threading_layer()} layer does not take launches from two threads")
    xs = [make(x.shape, "bf16", rng) for _ in range(8)]
    expect = [rope.standard(v, cos, sin) for v in xs]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda v: rope.standard(v, cos, sin), xs))
            for g, e in zip(got, expect):
                assert np.array_equal(g.view(np.uint16), e.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# embedding


@pytest.mark.parametrize("strategy", ["gather", "index_select"])
def test_embedding_kept_signature_still_checks_ids(strategy, rng):
    embedding._CALLS.clear()
    fn = getattr(embedding, strategy)
    w = make((50, 24), "bf16", rng)
    ids = rng.integers(0, 50, size=(3, 7)).astype(np.int32)
    assert np.array_equal(fn(w, ids), w[ids])
    assert len(embedding._CALLS) == 1
    bad = ids.copy()
    bad[2, 5] = 50  # the same signature, one id out of range
    with pytest.raises(IndexError, match=r"ids\[2, 5\] = 50 is out of range \[0, 50\)"):
        fn(w, bad)
    bad[2, 5] = -1
    with pytest.raises(IndexError, match=r"ids\[2, 5\] = -1"):
        fn(w, bad)
    ids2 = rng.integers(0, 50, size=(3, 7)).astype(np.int32)
    got, record = run_traced(fn, w, ids2)
    assert np.array_equal(got, w[ids2]) and np.array_equal(got, ref.embedding(w, ids2).astype(w.dtype))
    assert_cost_matches_plan(record)


def test_embedding_kept_signature_still_checks_out_memory(rng):
    embedding._CALLS.clear()
    buf = make((64 * 24,), "fp32", rng)
    w = buf[: 40 * 24].reshape(40, 24)
    ids = rng.integers(0, 40, size=8).astype(np.int64)
    out = np.empty((8, 24), np.float32)
    embedding.gather(w, ids, out=out)
    out.flags.writeable = False
    with pytest.raises(ShapeError, match="writeable and not overlapping weight"):
        embedding.gather(w, ids, out=out)
    inside = buf[40 * 24 - 4 * 24 : 40 * 24 + 4 * 24].reshape(8, 24)  # same signature as out
    with pytest.raises(ShapeError, match="writeable and not overlapping weight"):
        embedding.gather(w, ids, out=inside)
    apart = buf[40 * 24 : 48 * 24].reshape(8, 24)
    assert np.array_equal(embedding.gather(w, ids, out=apart), w[ids])


# ---------------------------------------------------------------------------------------------
# linear


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", ["fused_bias", "matmul_add"])
@pytest.mark.parametrize("m", [1, 8, 37])
def test_linear_repeated_signature_same_result_and_cost(m, strategy, dtype, rng):
    linear._CALLS.clear()
    fn = getattr(linear, strategy)
    w, b = make((45, 70), dtype, rng), make((45,), dtype, rng)
    for bias in (b, None):
        x = make((m, 70), dtype, rng)
        first = fn(x, w, bias)
        x2 = make((m, 70), dtype, rng)
        got, record = run_traced(fn, x2, w, bias)  # the kept signature, other data
        assert_cost_matches_plan(record)
        assert linear._CALLS.get(linear._CALLS.key(None, (x2, w, bias), (strategy, None))) is not None
        linear._CALLS.clear()  # the full path on the same data gives the same bits
        assert np.array_equal(fn(x2, w, bias).view(np.uint8), got.view(np.uint8))
        assert np.array_equal(fn(x, w, bias).view(np.uint8), first.view(np.uint8))
        want = ref.linear(x2, w, bias)
        assert np.allclose(got.astype(np.float64), want, rtol=STORAGE_RTOL[dtype] * 4, atol=STORAGE_RTOL[dtype] * 4 * np.abs(want).max())


def test_linear_copied_inputs_are_not_kept(rng):
    linear._CALLS.clear()
    x, w = make((3, 70), "fp32", rng), make((90, 70), "fp32", rng)
    wt = np.asfortranarray(w)  # same values, not C-contiguous
    for _ in range(2):
        got, record = run_traced(linear.fused_bias, x, wt)
        assert record.cost.workspace_bytes == w.nbytes
        assert np.array_equal(got, linear.fused_bias(x, w))
    assert len(linear._CALLS) == 1  # only the contiguous call's


# ---------------------------------------------------------------------------------------------
# attention

ATTENTION_ATOL = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 3e-3}  # as test_attention


@pytest.mark.slow(on="3.12")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("strategy", ["standard", "online", "flash"])
@pytest.mark.parametrize("B, Hq, Hkv, Sq, Skv, D, causal", [(2, 6, 2, 1, 77, 32, False), (1, 4, 2, 9, 150, 16, True)])
def test_attention_repeated_signature_same_result_and_cost(B, Hq, Hkv, Sq, Skv, D, causal, strategy, dtype, rng):
    """A call with a kept signature (other q, k, v data) gives the bits of the full path and the
    oracle's values, with the planned Cost; kv_len by value is part of the signature."""
    attention_common._CALLS.clear()
    fn = getattr(attention, strategy)
    kv_len = np.array([Skv - 5, Skv][:B])
    call = lambda q, k, v: fn(q, k, v, causal=causal, kv_len=kv_len)  # noqa: E731
    qkv = [make(s, dtype, rng) for s in ((B, Hq, Sq, D), (B, Hkv, Skv, D), (B, Hkv, Skv, D))]
    call(*qkv)
    assert len(attention_common._CALLS) == 1
    for _ in range(2):
        qkv2 = [make(a.shape, dtype, rng) for a in qkv]
        got, record = run_traced(call, *qkv2)
        assert len(attention_common._CALLS) == 1
        assert_cost_matches_plan(record)
        want = ref.attention(*qkv2, causal=causal, kv_len=kv_len)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=ATTENTION_ATOL[dtype])
        attention_common._CALLS.clear()  # the full path on the same data: the same bits
        assert np.array_equal(call(*qkv2).view(np.uint8), got.view(np.uint8))


def test_attention_kv_len_values_are_the_signature(rng):
    """kv_len is data that shapes the plan (flash skips tiles past it): other values are another
    signature, and a kv_len array written to after a call is read anew (the entry keeps a copy)."""
    attention_common._CALLS.clear()
    q, k, v = (make(s, "fp32", rng) for s in ((2, 4, 1, 16), (2, 2, 300, 16), (2, 2, 300, 16)))
    kv_len = np.array([300, 40])
    first = attention.flash(q, k, v, kv_len=kv_len)
    kv_len[:] = [40, 300]  # the same array, other values
    got = attention.flash(q, k, v, kv_len=kv_len)
    assert len(attention_common._CALLS) == 2
    want = ref.attention(q, k, v, kv_len=np.array([40, 300]))
    np.testing.assert_allclose(got, want, rtol=0, atol=ATTENTION_ATOL["fp32"])
    assert not np.allclose(got, first)
    again = attention.flash(q, k, v, kv_len=np.array([300, 40]))  # another array of the first values
    assert np.array_equal(again, first) and len(attention_common._CALLS) == 2


def test_attention_masked_and_copied_calls_are_not_kept(rng):
    attention_common._CALLS.clear()
    q, k, v = (make(s, "bf16", rng) for s in ((1, 4, 3, 32), (1, 2, 50, 32), (1, 2, 50, 32)))
    mask = np.where(rng.random((3, 50)) < 0.2, -np.inf, 0.0).astype(np.float32)
    for _ in range(2):
        got = attention.online(q, k, v, mask=mask)
        want = ref.attention(q, k, v, mask=mask)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=0, atol=ATTENTION_ATOL["bf16"])
    kt = np.ascontiguousarray(k.transpose(0, 1, 3, 2)).transpose(0, 1, 3, 2)  # k's values, not contiguous
    got, record = run_traced(attention.online, q, kt, v)
    assert record.cost.workspace_bytes == k.nbytes
    assert np.array_equal(got.view(np.uint16), attention.online(q, k, v).view(np.uint16))
    assert len(attention_common._CALLS) == 1  # only the last (contiguous, unmasked) call's
