"""attention masks beyond the fp32 additive one: bool (True = keep, torch SDPA's convention) and
bf16/fp16 additive masks, read as stored (1 or 2 B per element, counted) by all three strategies
and the paged path; fully masked rows (zeros for -inf or all-False, the uniform average for a
finite minimum that absorbs the scores)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from pypto_numba import reference
from pypto_numba.attention import flash, online, plan_flash, plan_online, plan_standard, standard, validation

from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced

pytestmark = pytest.mark.slow(on="3.12")  # heavy compiles: once per tox run (tests/conftest.py)

STRATEGIES = {"standard": standard, "online": online, "flash": flash}
PLANS = {"standard": plan_standard, "online": plan_online, "flash": plan_flash}
ATOL = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 3e-3}  # test_attention.py's policy
TILES = {"standard": {}, "online": {"kv_tile": 32}, "flash": {"kv_tile": 32}}  # several KV tiles + a tail
MASK_DTYPES = {"bool": np.bool_, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}
# (B, Hq, Hkv, Sq, Skv, D, kv_len): prefill (>= 16 block rows: the GEMM path; Sq, Skv not multiples
# of the tiles) and GQA decode
SHAPES = {"prefill": (2, 4, 2, 19, 75, 16, [75, 40]), "decode": (3, 8, 2, 1, 90, 24, [90, 1, 61])}


def inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype):
    return (make((B, Hq, Sq, D), dtype, rng), make((B, Hkv, Skv, D), dtype, rng),
            make((B, Hkv, Skv, D), dtype, rng))


def make_mask(kind, shape, rng):
    """A mask of ``kind`` with one fully masked row (bool: all False; additive: all -inf)."""
    if kind == "bool":
        m = rng.random(shape) > 0.3
        m[(0,) * (len(shape) - 1)] = False
        return m
    m = (rng.standard_normal(shape) * 2).astype(np.float32)
    m[rng.random(shape) < 0.2] = -np.inf
    m[(0,) * (len(shape) - 1)] = -np.inf
    return m.astype(MASK_DTYPES[kind])


def additive(mask):
    """The mask as the float64 additive term it means, written independently of the kernels."""
    if mask.dtype == np.bool_:
        return np.where(mask, 0.0, -np.inf)
    return mask.astype(np.float64)


def check(out, ref, dtype):
    assert out.dtype == NP_DTYPE[dtype]
    got = out.astype(np.float64)
    assert np.all(np.isfinite(got))
    np.testing.assert_allclose(got, ref, rtol=0, atol=ATOL[dtype])


def same_bits(x, y):
    assert x.shape == y.shape and x.dtype == y.dtype
    assert np.array_equal(x.view(np.uint8), y.view(np.uint8))


EPS = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10}


def within_an_ulp(x, y, dtype):
    """x and y agree to a few storage ulps of the output's scale: two kernel specialisations may
    round a vectorised fp32 sum differently (one compiled fresh, one from the cache:
    machine/jit.py), which moves a result by about an ulp of the sum's terms."""
    a, b = x.astype(np.float64), y.astype(np.float64)
    assert x.shape == y.shape and x.dtype == y.dtype
    np.testing.assert_allclose(a, b, rtol=EPS[dtype], atol=4 * EPS[dtype] * np.abs(b).max())


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("phase", SHAPES)
@pytest.mark.parametrize("kind", MASK_DTYPES)
def test_mask_forms_against_oracle(name, phase, kind, dtype, rng):
    """Each mask form against the float64 oracle of its meaning, counted == planned; the result
    is the same mask's as an fp32 additive one (bool: 0 / -inf; 16-bit: widened exactly), the
    same operations, within one storage ulp (:func:`within_an_ulp`)."""
    B, Hq, Hkv, Sq, Skv, D, kv_len = SHAPES[phase]
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype)
    mask = make_mask(kind, (B, 1, Sq, Skv), rng)
    opts = dict(kv_len=np.array(kv_len), causal=phase == "prefill")
    out, rec = run_traced(STRATEGIES[name], q, k, v, mask=mask, **opts, **TILES[name])
    check(out, reference.attention(q, k, v, mask=additive(mask), **opts), dtype)
    assert_cost_matches_plan(rec)
    as_fp32 = STRATEGIES[name](q, k, v, mask=additive(mask).astype(np.float32), **opts, **TILES[name])
    within_an_ulp(out, as_fp32, dtype)
    assert not out[0, :, 0].astype(np.float32).any()  # the fully masked row: zeros


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("kind", MASK_DTYPES)
def test_mask_bytes_counted_at_their_itemsize(name, kind, rng):
    """A mask costs its itemsize per element read: the plans' mask reads are 4 : 2 : 1 for fp32 :
    16-bit : bool, and a call counts what its plan says."""
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 5, 70, 16
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, "bf16")
    shapes = (q.shape, k.shape, None, "bf16")
    reads = {mdt: PLANS[name](*shapes, has_mask=True, mask_dtype=mdt, **TILES[name]).cost.gm_read_bytes
             for mdt in ("fp32", "bf16", "bool")}
    none = PLANS[name](*shapes, **TILES[name]).cost.gm_read_bytes
    fp32 = reads["fp32"] - none
    assert fp32 > 0 and reads["bf16"] - none == fp32 // 2 and reads["bool"] - none == fp32 // 4
    mask = make_mask(kind, (B, Hq, Sq, Skv), rng)
    _, rec = run_traced(STRATEGIES[name], q, k, v, mask=mask, **TILES[name])
    assert_cost_matches_plan(rec)
    assert rec.cost.gm_read_bytes == reads["bool" if kind == "bool" else "bf16"]


@pytest.mark.parametrize("name", STRATEGIES)
def test_fully_masked_rows(name, dtype, rng):
    """Row 0: all False (bool) or all -inf -> zeros, as torch SDPA gives. A finite minimum adds
    one constant to every key of the row: float32's and bfloat16's (~-3.4e38) absorb the fp32
    scores, so the row is the uniform average of V over its keys (Hugging Face eager's result);
    float16's (-65504) does not absorb them, so that row is plain attention over its keys."""
    B, Hq, Hkv, Sq, Skv, D = 1, 2, 1, 3, 40, 16
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, dtype)
    fn = STRATEGIES[name]
    keep = np.ones((Sq, Skv), bool)
    keep[0] = False
    np.testing.assert_array_equal(fn(q, k, v, mask=keep, **TILES[name])[:, :, 0].astype(np.float32), 0)
    for mdt in (np.float32, ml_dtypes.bfloat16, np.float16):
        neg = np.zeros((Sq, Skv), mdt)
        neg[0] = -np.inf
        np.testing.assert_array_equal(fn(q, k, v, mask=neg, **TILES[name])[:, :, 0].astype(np.float32), 0)
        low = np.zeros((Sq, Skv), mdt)
        low[0] = ml_dtypes.finfo(mdt).min
        got = fn(q, k, v, mask=low, **TILES[name]).astype(np.float64)
        if mdt is np.float16:  # the constant cancels in the softmax; fp32 near 65504 keeps the
            want, tol = reference.attention(q, k, v)[:, :, 0], 1e-2  # scores to 2^-8 only
        else:
            want = np.broadcast_to(v.astype(np.float64).mean(axis=2), (B, Hq, D))  # uniform over the keys
            tol = ATOL[dtype]
        np.testing.assert_allclose(got[:, :, 0], want, rtol=0, atol=tol)
        np.testing.assert_allclose(got[:, :, 1:], reference.attention(q, k, v)[:, :, 1:], rtol=0, atol=ATOL[dtype])


@pytest.mark.parametrize("name", STRATEGIES)
def test_bool_mask_with_window_softcap_sinks(name, rng):
    """Gemma 2's order with a bool mask: scale, cap, then the mask (and the window), sinks last."""
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 17, 66, 16
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, "fp32")
    mask = make_mask("bool", (B, Hq, Sq, Skv), rng)
    sinks = rng.standard_normal(Hq).astype(np.float32)
    opts = dict(window=(20, 3), softcap=2.5, sinks=sinks, kv_len=np.array([66, 30]), scale=0.8)
    out, rec = run_traced(STRATEGIES[name], q, k, v, mask=mask, **opts, **TILES[name])
    check(out, reference.attention(q, k, v, mask=additive(mask), **opts), "fp32")
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("kind", MASK_DTYPES)
def test_broadcast_view_mask_is_read_in_place(kind, rng):
    """A stride-0 broadcast of a small mask is kept at its size and read as stored (no widening)."""
    q, k, v = inputs(rng, 2, 4, 2, 3, 40, 16, "fp32")
    small = make_mask(kind, (1, 4, 1, 40), rng)
    a = validation.validate(q, k, v, "test", mask=np.broadcast_to(small, (2, 4, 3, 40)))
    assert a.mask_flat.size == small.size and a.mask_flat.itemsize == small.itemsize
    assert a.mask_strides == (0, 40, 0, 1) and a.mask_dtype == kind


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("kind", MASK_DTYPES)
def test_masks_match_torch_sdpa(name, kind, rng):
    """torch's scaled_dot_product_attention with the same mask (bool: True = take part) as a
    second, independent check, fully masked rows included (torch gives zeros there too)."""
    torch = pytest.importorskip("torch")
    B, Hq, Hkv, Sq, Skv, D = 2, 4, 2, 7, 45, 16
    q, k, v = inputs(rng, B, Hq, Hkv, Sq, Skv, D, "fp32")
    mask = make_mask(kind, (B, 1, Sq, Skv), rng)
    tm = torch.from_numpy(mask) if kind == "bool" else torch.from_numpy(mask.astype(np.float32))
    want = torch.nn.functional.scaled_dot_product_attention(
        torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), attn_mask=tm, enable_gqa=True).numpy()
    got = STRATEGIES[name](q, k, v, mask=mask, **TILES[name])
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("name", ["online", "flash"])
@pytest.mark.parametrize("kind", MASK_DTYPES)
def test_paged_masks_give_the_dense_bits(name, kind, rng):
    """The paged path reads the same mask the same way: the bits of the dense call."""
    from test_attention_paged import paged_case

    B, Hq, Hkv, D, bs = 2, 4, 2, 16, 16
    kv_len = np.array([37, 20])
    q, kc, vc, table, kd, vd = paged_case(rng, "bf16", B, Hq, Hkv, 1, D, kv_len, bs, 3)
    mask = make_mask(kind, (B, 1, 1, 3 * bs), rng)
    fn = STRATEGIES[name]
    extra = {"num_splits": 1} if name == "flash" else {}
    got, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, mask=mask, kv_tile=16, **extra)
    assert_cost_matches_plan(rec)
    same_bits(got, fn(q, kd, vd, kv_len=kv_len, mask=mask, kv_tile=16, **extra))
