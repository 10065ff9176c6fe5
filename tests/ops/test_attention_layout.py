"""attention layout="bshd": q/k/v and the result as [B, S, H, D] (Hugging Face's, flash-attn's),
read in place through transposed views: the float64 oracle, torch SDPA, the same counted cost
as the "bhsd" call (no copy), the paged path's queries."""

from __future__ import annotations

import numpy as np
import pytest

from pypto_numba import reference
from pypto_numba.attention import flash, online, standard

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

pytestmark = pytest.mark.slow(on="3.10")  # heavy compiles: once per tox run (tests/conftest.py)

STRATEGIES = {"standard": standard, "online": online, "flash": flash}
ATOL = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 3e-3}  # test_attention.py's policy
TILES = {"standard": {}, "online": {"kv_tile": 32}, "flash": {"kv_tile": 32}}  # several KV tiles + a tail
# (B, Hq, Hkv, Sq, Skv, D, Dv, kv_len): prefill (>= 16 block rows: the GEMM path, packed K^T;
# Sq, Skv not multiples of the tiles; Dv != D with a column tail past 16) and GQA decode
SHAPES = {"prefill": (2, 4, 2, 19, 75, 16, 24, [75, 40]), "decode": (3, 8, 2, 1, 90, 24, 24, [90, 1, 61])}


def T(x):
    """[B, S, H, D] <-> [B, H, S, D], a contiguous copy (the tests' own transposition)."""
    return np.ascontiguousarray(x.transpose(0, 2, 1, 3))


def bshd_inputs(rng, B, Hq, Hkv, Sq, Skv, D, Dv, dtype):
    return (make((B, Sq, Hq, D), dtype, rng), make((B, Skv, Hkv, D), dtype, rng),
            make((B, Skv, Hkv, Dv), dtype, rng))


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("phase", SHAPES)
def test_bshd_against_oracle_at_the_bhsd_cost(name, phase, dtype, rng):
    """bshd in, bshd out, against the oracle on the tests' own transposes; counted == planned, and
    the counted cost is the bhsd call's (nothing copied or transposed in GM)."""
    B, Hq, Hkv, Sq, Skv, D, Dv, kv_len = SHAPES[phase]
    q, k, v = bshd_inputs(rng, B, Hq, Hkv, Sq, Skv, D, Dv, dtype)
    opts = dict(kv_len=np.array(kv_len), causal=phase == "prefill", scale=0.6)
    out, rec = run_traced(STRATEGIES[name], q, k, v, layout="bshd", **opts, **TILES[name])
    assert out.shape == (B, Sq, Hq, Dv) and out.dtype == NP_DTYPE[dtype] and out.flags.c_contiguous
    want = reference.attention(T(q), T(k), T(v), **opts)
    np.testing.assert_allclose(T(out).astype(np.float64), want, rtol=0, atol=ATOL[dtype])
    np.testing.assert_allclose(out.astype(np.float64), reference.attention(q, k, v, layout="bshd", **opts),
                               rtol=0, atol=ATOL[dtype])
    assert_cost_matches_plan(rec)
    dense, rec_bhsd = run_traced(STRATEGIES[name], T(q), T(k), T(v), **opts, **TILES[name])
    assert rec.cost == rec_bhsd.cost
    np.testing.assert_allclose(T(out).astype(np.float64), dense.astype(np.float64), rtol=0, atol=ATOL[dtype])


@pytest.mark.parametrize("name", STRATEGIES)
def test_bshd_with_every_option(name, rng):
    """A mask (bool, [B, 1, Sq, Skv] as HF passes it), window, softcap, sinks and gqa expand_clone."""
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 17, 50, 16
    q, k, v = bshd_inputs(rng, B, Hq, Hkv, Sq, Skv, D, D, "bf16")
    mask = rng.random((B, 1, Sq, Skv)) > 0.2
    sinks = rng.standard_normal(Hq).astype(np.float32)
    opts = dict(window=(12, 2), softcap=3.0, sinks=sinks, kv_len=np.array([50, 33]))
    want = reference.attention(T(q), T(k), T(v), mask=np.where(mask, 0.0, -np.inf), **opts)
    for gqa in ("head_loop", "expand_clone"):
        out, rec = run_traced(STRATEGIES[name], q, k, v, layout="bshd", mask=mask, gqa=gqa, **opts, **TILES[name])
        np.testing.assert_allclose(T(out).astype(np.float64), want, rtol=0, atol=ATOL["bf16"])
        assert_cost_matches_plan(rec)


def test_flash_bshd_lse_and_splits(rng):
    """flash with split-KV (decode) returns the bshd output; the lse stays [B, Hq, Sq]."""
    B, Hq, Hkv, Skv, D = 1, 4, 2, 200, 16
    q, k, v = bshd_inputs(rng, B, Hq, Hkv, 1, Skv, D, D, "fp32")
    (out, lse), rec = run_traced(flash, q, k, v, layout="bshd", kv_tile=32, num_splits=3, return_lse=True)
    assert rec.plan.kernels[-1].name == "flash_combine"
    want, want_lse = reference.attention(T(q), T(k), T(v), return_lse=True)
    np.testing.assert_allclose(T(out), want, rtol=0, atol=ATOL["fp32"])
    np.testing.assert_allclose(lse, want_lse, rtol=0, atol=1e-5)
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("name", STRATEGIES)
def test_bshd_matches_torch_sdpa(name, rng):
    """torch SDPA on the [B, H, S, D] views of the same arrays (as HF's sdpa_attention_forward
    transposes them), a second independent check."""
    torch = pytest.importorskip("torch")
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 41, 41, 16  # Sq == Skv: torch's top-left causal is our bottom-right
    q, k, v = bshd_inputs(rng, B, Hq, Hkv, Sq, Skv, D, D, "fp32")
    tq, tk, tv = (torch.from_numpy(x).transpose(1, 2) for x in (q, k, v))
    want = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
    got = STRATEGIES[name](q, k, v, layout="bshd", causal=True, **TILES[name])
    np.testing.assert_allclose(got, want.transpose(1, 2).numpy(), rtol=0, atol=2e-5)


def test_bshd_view_input_is_copied_and_counted(rng):
    """A bshd array that is not contiguous is copied once (counted as workspace), as for bhsd."""
    q, k, v = bshd_inputs(rng, 1, 4, 2, 5, 40, 16, 16, "fp32")
    wide = np.zeros((1, 5, 8, 16), np.float32)
    wide[:, :, ::2] = q
    out, rec = run_traced(online, wide[:, :, ::2], k, v, layout="bshd", kv_tile=32)
    same, rec0 = run_traced(online, q, k, v, layout="bshd", kv_tile=32)
    assert np.array_equal(out, same)
    assert rec.cost.workspace_bytes == rec0.cost.workspace_bytes + q.nbytes


@pytest.mark.parametrize("name", ["online", "flash"])
def test_paged_bshd_queries(name, rng):
    """The paged path takes bshd queries (the caches keep vLLM's layout) and returns bshd."""
    from test_attention_paged import paged_case

    B, Hq, Hkv, Sq, D, bs = 2, 4, 2, 3, 16, 16
    kv_len = np.array([37, 20])
    q, kc, vc, table, kd, vd = paged_case(rng, "fp16", B, Hq, Hkv, Sq, D, kv_len, bs, 3)
    fn = STRATEGIES[name]
    out, rec = run_traced(fn, T(q), kc, vc, block_table=table, kv_len=kv_len, causal=True, layout="bshd", kv_tile=16)
    assert out.shape == (B, Sq, Hq, D)
    assert_cost_matches_plan(rec)
    dense = fn(q, kd, vd, kv_len=kv_len, causal=True, kv_tile=16)
    np.testing.assert_allclose(T(out).astype(np.float64), dense.astype(np.float64), rtol=0, atol=ATOL["fp16"])
    np.testing.assert_allclose(T(out).astype(np.float64), reference.attention(q, kd, vd, kv_len=kv_len, causal=True),
                               rtol=0, atol=ATOL["fp16"])


def test_compare_takes_layout_and_bool_masks(rng):
    """compare runs every strategy and the oracle with layout="bshd" and with a bool mask."""
    import pypto_numba as pn

    q, k, v = bshd_inputs(rng, 2, 4, 2, 5, 40, 16, 16, "fp32")
    assert [r.verdict for r in pn.compare("attention", q, k, v, layout="bshd", repeats=1).rows] == ["PASS"] * 3
    mask = rng.random((2, 1, 5, 40)) > 0.3
    cmp = pn.compare("attention", T(q), T(k), T(v), mask=mask, repeats=1)
    assert [r.verdict for r in cmp.rows] == ["PASS"] * 3
