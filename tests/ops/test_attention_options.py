"""attention window / softcap / sinks against the float64 oracle, a dense band mask, hand-computed
cases and the counted cost of the skipped tiles."""

from __future__ import annotations

import numpy as np
import pytest

from pypto_numba import reference
from pypto_numba.attention import flash, online, plan_flash, plan_online, standard

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

STRATEGIES = {"standard": standard, "online": online, "flash": flash}
ATOL = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 3e-3}  # test_attention.py's policy
TILES = {"standard": {}, "online": {"kv_tile": 64}, "flash": {"kv_tile": 64}}  # several KV tiles + a tail


def inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype, Dv=None):
    return (make((B, Hq, Sq, D), dtype, rng), make((B, Hkv, Skv, D), dtype, rng),
            make((B, Hkv, Skv, Dv or D), dtype, rng))


def check(out, ref, dtype):
    assert out.dtype == NP_DTYPE[dtype]
    got = out.astype(np.float64)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL[dtype])


def band_mask(B, Sq, Skv, kv_len, left, right):
    """The additive mask of the window, written out key by key: 0 inside, -inf outside."""
    m = np.full((B, 1, Sq, Skv), -np.inf, np.float32)
    for b in range(B):
        for i in range(Sq):
            ip = i + int(kv_len[b]) - Sq
            for j in range(int(kv_len[b])):
                if -right <= ip - j <= left:
                    m[b, 0, i, j] = 0.0
    return m


# (B, Hq, Hkv, Sq, Skv, D, kv_len): prefill with odd Sq/Skv (tails of the 64-key tiles, a batch
# whose Sq > kv_len leaves rows without keys) and decode (GQA G = 4, a batch with one key)
SHAPES = {
    "prefill": (2, 4, 2, 37, 101, 32, [101, 23]),
    "decode": (3, 8, 2, 1, 300, 48, [300, 1, 177]),
}
OPTIONS = {
    "window": dict(window=16),
    "window-pair": dict(window=(5, 3)),
    "window-pair-causal": dict(window=(20, 7), causal=True),
    "softcap": dict(softcap=2.0, scale=0.9),
    "sinks": dict(sinks=True),
    "all": dict(window=(9, 0), softcap=3.0, sinks=True, scale=0.7),
}


def _sinks(Hq, rng):
    return (rng.standard_normal(Hq) * 2).astype(np.float32)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("phase", SHAPES)
@pytest.mark.parametrize("opt", OPTIONS)
def test_options_against_oracle(name, phase, opt, dtype, rng):
    B, Hq, Hkv, Sq, Skv, D, kv_len = SHAPES[phase]
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype)
    opts = dict(OPTIONS[opt], kv_len=np.array(kv_len))
    if opts.get("sinks"):
        opts["sinks"] = _sinks(Hq, rng)
    out, rec = run_traced(STRATEGIES[name], q, k, v, **opts, **TILES[name])
    check(out, reference.attention(q, k, v, **opts), dtype)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("window, causal", [(7, False), ((4, 9), False), ((4, 9), True), ((0, 0), False)])
def test_window_equals_dense_band_mask(name, window, causal, dtype, rng):
    """The window gives what the same strategy gives with the band as an additive -inf mask."""
    B, Hq, Hkv, Sq, Skv, D = 2, 6, 3, 19, 150, 32
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype)
    kv_len = np.array([150, 70])
    left, right = (window - 1, 0) if isinstance(window, int) else window
    if causal:  # j <= i' as well: the band's right side is 0
        right = 0
    mask = band_mask(B, Sq, Skv, kv_len, left, right)
    fn = STRATEGIES[name]
    got, rec = run_traced(fn, q, k, v, window=window, causal=causal, kv_len=kv_len, **TILES[name])
    dense = fn(q, k, v, mask=mask, kv_len=kv_len, **TILES[name])
    np.testing.assert_allclose(got.astype(np.float64), dense.astype(np.float64), rtol=0, atol=ATOL[dtype])
    check(got, reference.attention(q, k, v, window=window, causal=causal, kv_len=kv_len), dtype)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("name", ["online", "flash"])
@pytest.mark.parametrize("dtype_", ["fp32", "bf16"])
def test_window_decode_reads_only_the_band(name, dtype_, rng):
    """Decode with W = 1000 over a 32K cache, kv_tile 256: batch 0 (kv_len 32768) runs tiles
    [31768 // 256, 128) = 124..127 (1024 keys), batch 1 (kv_len 5000) tiles [4000 // 256,
    ceil(5000 / 256)) = 15..19 (1280 keys); keys outside them are never read (NaN there)."""
    B, Hq, Hkv, Skv, D, W, kvt = 2, 4, 2, 32768, 32, 1000, 256
    q, k, v = inputs(rng, B, Hq, Hkv, 1, Skv, D, dtype_)
    kv_len = np.array([32768, 5000])
    clean_k, clean_v = k.copy(), v.copy()
    k[0, :, :124 * kvt] = np.nan  # tiles wholly outside the band hold garbage
    v[0, :, :124 * kvt] = np.inf
    k[1, :, :15 * kvt] = np.nan
    v[1, :, :15 * kvt] = np.nan
    extra = {"num_splits": 1} if name == "flash" else {}
    out, rec = run_traced(STRATEGIES[name], q, k, v, window=W, kv_len=kv_len, kv_tile=kvt, **extra)
    check(out, reference.attention(q, clean_k, clean_v, window=W, kv_len=kv_len), dtype_)
    assert_cost_matches_plan(rec)
    b = 4 if dtype_ == "fp32" else 2
    keys = 1024 + 1280  # per KV head, over the batch
    kv_bytes = Hkv * keys * 2 * D * b
    q_bytes = B * Hq * D * b
    G = Hq // Hkv
    state = 0 if name == "flash" else Hkv * G * (D + 2) * 4 * ((4 - 1) + (5 - 1))  # online: state per later tile
    assert rec.cost.gm_read_bytes == kv_bytes + q_bytes + state
    assert rec.cost.cube_flops == Hkv * keys * 2 * G * 2 * D
    # the same decode over the whole cache reads 32768 + 5000 keys per head (flash) / 2 * 32768 (online)
    full = (plan_flash if name == "flash" else plan_online)(q.shape, k.shape, None, dtype_, kv_len=kv_len,
                                                            kv_tile=kvt, **extra).cost
    assert full.gm_read_bytes > 10 * rec.cost.gm_read_bytes


def test_window_decode_cost_is_flat_in_the_cache_length():
    """W = 4096 over 32K costs what a 4K-context decode costs (the plans: same tiles read)."""
    q = (4, 32, 1, 128)
    for plan in (plan_online, plan_flash):
        w = plan(q, (4, 8, 32768, 128), None, "bf16", window=4096, kv_tile=512).cost
        ctx = plan(q, (4, 8, 4096, 128), None, "bf16", kv_tile=512).cost
        assert w.gm_read_bytes == ctx.gm_read_bytes and w.cube_flops == ctx.cube_flops
        assert w.vector_ops == ctx.vector_ops


@pytest.mark.parametrize("name", ["online", "flash"])
def test_window_split_kv_and_groups(name, dtype, rng):
    """Split-KV (flash, default num_splits for a decode) and prefill query groups with a window:
    counted == planned and the oracle's result; the skipped tiles show in the cube work."""
    q, k, v = inputs(rng, 1, 4, 2, 1, 700, 32, dtype)
    opts = dict(window=100, kv_len=np.array([650]), kv_tile=32)
    out, rec = run_traced(STRATEGIES[name], q, k, v, **opts)
    if name == "flash":
        assert rec.params["num_splits"] > 1
    check(out, reference.attention(q, k, v, window=100, kv_len=np.array([650])), dtype)
    assert_cost_matches_plan(rec)
    # keys 550..649: tiles 17..20 (4 tiles of 32 keys), for 2 KV heads of G = 2 rows
    assert rec.cost.cube_flops == 2 * 4 * 32 * 2 * 2 * (32 + 32)
    q, k, v = inputs(rng, 2, 4, 2, 150, 170, 32, dtype)
    opts = dict(window=(30, 5), causal=True, kv_len=np.array([170, 101]), q_tile=8, kv_tile=32)
    out, rec = run_traced(STRATEGIES[name], q, k, v, **opts)
    check(out, reference.attention(q, k, v, window=(30, 5), causal=True, kv_len=np.array([170, 101])), dtype)
    assert_cost_matches_plan(rec)


def test_online_equals_flash_bitwise_with_options(rng):
    """With window=W both walk the same tiles in the same order and merge the sink the same way."""
    q, k, v = inputs(rng, 2, 6, 3, 5, 150, 32, "bf16")
    opts = dict(window=40, kv_len=np.array([150, 60]), softcap=5.0, sinks=_sinks(6, rng))
    a = online(q, k, v, kv_tile=32, q_tile=5, **opts)
    b = flash(q, k, v, kv_tile=32, q_tile=5, num_splits=1, **opts)
    np.testing.assert_array_equal(a.view(np.uint16), b.view(np.uint16))


# ---------------------------------------------------------------------------------------------
# soft-capping and sinks by hand


@pytest.mark.parametrize("name", STRATEGIES)
def test_softcap_by_hand(name):
    """One query, two keys: weights exp(c * tanh(scale * q.k / c)), scale before the cap."""
    q = np.zeros((1, 1, 1, 16), np.float32)
    k = np.zeros((1, 1, 2, 16), np.float32)
    v = np.zeros((1, 1, 2, 16), np.float32)
    q[..., 0] = 4.0
    k[0, 0, 0, 0], k[0, 0, 1, 0] = 3.0, -1.0
    v[0, 0, 0, :], v[0, 0, 1, :] = 1.0, -2.0
    c, scale = 2.5, 0.5
    s = np.array([c * np.tanh(scale * 12.0 / c), c * np.tanh(scale * -4.0 / c)])
    p = np.exp(s - s.max())
    want = (p[0] * 1.0 + p[1] * -2.0) / p.sum()
    out = STRATEGIES[name](q, k, v, softcap=c, scale=scale)
    np.testing.assert_allclose(out[0, 0, 0], want, rtol=0, atol=1e-5)
    # capping before the scale would give another value
    s2 = scale * np.array([c * np.tanh(12.0 / c), c * np.tanh(-4.0 / c)])
    p2 = np.exp(s2 - s2.max())
    assert abs((p2[0] - 2 * p2[1]) / p2.sum() - want) > 0.1


@pytest.mark.parametrize("name", STRATEGIES)
def test_sinks_by_hand(name):
    """One key of score 0 and value 1, sink logit z: out = 1 / (1 + e^z); unscaled, uncapped."""
    q = np.zeros((1, 2, 1, 16), np.float32)
    k = np.zeros((1, 1, 1, 16), np.float32)
    v = np.ones((1, 1, 1, 16), np.float32)
    z = np.array([0.0, 1.5], np.float32)
    out = STRATEGIES[name](q, k, v, sinks=z, scale=3.0, softcap=1.0)
    np.testing.assert_allclose(out[0, :, 0, 0], 1 / (1 + np.exp(z.astype(np.float64))), rtol=0, atol=1e-6)


@pytest.mark.parametrize("n_split", [1, 3])
def test_lse_includes_the_sink(n_split, rng):
    q, k, v = inputs(rng, 2, 4, 2, 3, 200, 32, "fp32")
    sinks = _sinks(4, rng)
    kv_len = np.array([200, 0])  # batch 1: no keys, the sink alone
    opts = dict(sinks=sinks, kv_len=kv_len, window=(50, 10), causal=True)
    (out, lse), rec = run_traced(flash, q, k, v, return_lse=True, num_splits=n_split, kv_tile=32, **opts)
    ref, ref_lse = reference.attention(q, k, v, return_lse=True, **opts)
    check(out, ref, "fp32")
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-5, atol=1e-5)
    assert_cost_matches_plan(rec)
    assert np.all(out[1] == 0)
    np.testing.assert_array_equal(lse[1], np.broadcast_to(sinks[:, None], (4, 3)))
    # the lse of the sink column alone differs from the lse without it
    _, lse0 = flash(q, k, v, return_lse=True, num_splits=n_split, kv_tile=32, kv_len=kv_len,
                    window=(50, 10), causal=True)
    assert np.all(lse[0] > lse0[0])


@pytest.mark.parametrize("name", STRATEGIES)
def test_rows_without_keys_with_sinks_are_zero(name, rng):
    """A window that leaves some rows no key (Sq > kv_len) and inf in V other rows attend."""
    q, k, v = inputs(rng, 1, 4, 2, 20, 150, 16, "fp32")
    v[0, :, 3] = np.inf
    opts = dict(window=4, kv_len=np.array([10]), sinks=_sinks(4, rng))
    out = STRATEGIES[name](q, k, v, **opts, **TILES[name])
    assert np.all(out[0, :, :10] == 0)  # rows i' = i - 10 < 0
    assert not np.all(np.isfinite(out[0, :, 10:14]))  # rows whose window holds key 3


@pytest.mark.parametrize("name", STRATEGIES)
def test_expand_clone_with_options(name, rng):
    q, k, v = inputs(rng, 2, 6, 2, 5, 90, 32, "fp16")
    opts = dict(window=(11, 2), softcap=4.0, sinks=_sinks(6, rng), kv_len=np.array([90, 41]))
    a = STRATEGIES[name](q, k, v, **opts)
    b, rec = run_traced(STRATEGIES[name], q, k, v, gqa="expand_clone", **opts)
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), atol=2e-3)
    check(b, reference.attention(q, k, v, **opts), "fp16")
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("name", STRATEGIES)
def test_options_off_are_the_defaults(name, rng):
    """window/softcap/sinks None are today's call, bit for bit; an unbounded window too."""
    q, k, v = inputs(rng, 1, 4, 2, 9, 100, 32, "bf16")
    base = STRATEGIES[name](q, k, v, causal=True)
    off = STRATEGIES[name](q, k, v, causal=True, window=None, softcap=None, sinks=None)
    wide = STRATEGIES[name](q, k, v, causal=True, window=(2**62, 2**62))
    np.testing.assert_array_equal(base.view(np.uint16), off.view(np.uint16))
    np.testing.assert_array_equal(base.view(np.uint16), wide.view(np.uint16))


def test_kept_calls_see_new_sinks(rng):
    """A repeated call signature with other sink values is not served the first call's sinks."""
    q, k, v = inputs(rng, 1, 4, 2, 1, 64, 32, "fp32")
    s1, s2 = np.zeros(4, np.float32), np.full(4, 3.0, np.float32)
    for fn in STRATEGIES.values():
        a, b = fn(q, k, v, sinks=s1), fn(q, k, v, sinks=s2)
        np.testing.assert_allclose(b, reference.attention(q, k, v, sinks=s2), atol=2e-5)
        assert not np.allclose(a, b)


@pytest.mark.parametrize("name", ["online", "flash"])
def test_query_groups_change_no_bits_with_a_window(name, monkeypatch, rng):
    """Prefill query tiles walked together (tasks.query_group) each keep their own window tiles."""
    import importlib

    strategy = importlib.import_module(f"pypto_numba.attention.{name}")
    q, k, v = inputs(rng, 2, 4, 2, 150, 170, 32, "bf16")
    opts = dict(window=(40, 3), kv_len=np.array([170, 101]), q_tile=8, kv_tile=32, sinks=_sinks(4, rng),
                **({"num_splits": 1} if name == "flash" else {}))
    got = {}
    for g in (1, 3):
        monkeypatch.setattr(strategy, "query_group", lambda *a, g=g: g)
        out, rec = run_traced(STRATEGIES[name], q, k, v, **opts)
        assert_cost_matches_plan(rec)
        got[g] = (out.view(np.uint16), rec.cost)
    np.testing.assert_array_equal(got[3][0], got[1][0])
    assert got[3][1] == got[1][1]


def test_advise_and_compare_know_the_options(rng):
    """advise prices a window from the plans; compare scores the options against the oracle."""
    import pypto_numba as pn

    adv = pn.advise("attention", batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128,
                    dtype="bf16", window=4096, softcap=50.0, sinks=True)
    assert any("sliding window 4096" in n for n in adv.reasons)
    short = pn.advise("attention", batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128,
                      dtype="bf16", softcap=50.0, sinks=True)
    assert adv.chosen == short.chosen
    q, k, v = inputs(rng, 1, 4, 2, 3, 200, 32, "fp32")
    cmp = pn.compare("attention", q, k, v, window=(20, 4), softcap=10.0, sinks=_sinks(4, rng), repeats=1)
    assert [r.verdict for r in cmp.rows] == ["PASS"] * 3
