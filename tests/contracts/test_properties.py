"""Property tests (hypothesis) for every strategy: random shapes with tails, storage dtypes and tiles.

For each strategy: the result agrees with the float64 oracle (pypto_numba/reference.py) under the
storage dtype's tolerance (pypto_numba/precision.py, or the op's error bound where the op's own
tests use one), the strategies of an op agree with each other, and NaN in gives NaN out where the
math says so. Shapes stay small and every example reuses the kernels' compiled signatures (the
kernels see the same array ranks and scalar types whatever the shape or tile), so an example costs
microseconds to milliseconds. ``derandomize=True``: CI runs the same examples every time.
"""

from __future__ import annotations

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pypto_numba import attention, embedding, gelu, linear, mean, moe, precision, reference, repeat_kv, rope

from helpers import DTYPES, NP_DTYPE

# 30 examples per strategy in CI (reproducible: derandomize). PYPTO_NUMBA_HYPOTHESIS_EXAMPLES=500
# runs a longer, randomised bug hunt locally.
EXAMPLES = int(os.environ.get("PYPTO_NUMBA_HYPOTHESIS_EXAMPLES", "30"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize="PYPTO_NUMBA_HYPOTHESIS_EXAMPLES" not in os.environ,
                    database=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

dtypes_ = st.sampled_from(DTYPES)
seeds = st.integers(0, 2**32 - 1)
# one relative ulp of each storage dtype (twice its rounding error)
ULP = {"fp32": 2.0**-23, "bf16": 2.0**-7, "fp16": 2.0**-10}


def make(shape, dtype, rng, scale=1.0, loc=0.0):
    return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(NP_DTYPE[dtype])


def f64(a):
    return np.asarray(a).astype(np.float64)


def assert_policy(actual, ref, dtype, rtol=None, atol=None):
    """precision.evaluate under the default (allclose) policy for ``dtype``; NaN must match NaN."""
    res = precision.evaluate(actual, ref, dtype, rtol=rtol, atol=atol)
    assert res.passed, str(res)
    np.testing.assert_array_equal(np.isnan(f64(actual)), np.isnan(f64(ref)))


def shapes(min_rank=1, max_rank=3, max_side=40, max_size=600):
    return st.lists(st.integers(1, max_side), min_size=min_rank, max_size=max_rank).filter(
        lambda s: np.prod(s) <= max_size).map(tuple)


def tile_elems(max_blocks):
    """Tile sizes that are 32-byte aligned for every storage dtype (multiples of 16 elements)."""
    return st.integers(1, max_blocks).map(lambda b: 16 * b)


# ---------------------------------------------------------------------------------------------
# gelu


@SETTINGS
@given(shape=shapes(), dtype=dtypes_, tile=st.one_of(st.none(), tile_elems(64)), seed=seeds, nan=st.booleans())
def test_gelu(shape, dtype, tile, seed, nan):
    rng = np.random.default_rng(seed)
    x = make(shape, dtype, rng, scale=3.0)
    if nan:
        x.reshape(-1)[rng.integers(x.size)] = np.nan
    outs = {}
    for name, fn, ref in (("tanh", gelu.tanh, reference.gelu_tanh), ("erf", gelu.erf, reference.gelu_erf)):
        out = fn(x, tile=tile)
        assert out.dtype == x.dtype and out.shape == x.shape
        assert_policy(out, ref(x), dtype)
        outs[name] = f64(out)
    # the two strategies agree within the tanh approximation's error (|tanh form - erf form| < 5e-4) plus
    # one rounding of each result
    diff = np.abs(outs["tanh"] - outs["erf"])
    bound = 1e-3 + 2 * ULP[dtype] * np.abs(outs["erf"])
    assert np.all((diff <= bound) | np.isnan(diff)), diff.max()


# ---------------------------------------------------------------------------------------------
# mean


@SETTINGS
@given(shape=shapes(max_side=60, max_size=3000), dtype=dtypes_, data=st.data(), seed=seeds, nan=st.booleans())
def test_mean(shape, dtype, data, seed, nan):
    rng = np.random.default_rng(seed)
    x = make(shape, dtype, rng, loc=0.5)
    if nan:
        x.reshape(-1)[rng.integers(x.size)] = np.nan
    dim = data.draw(st.integers(-len(shape), len(shape) - 1), label="dim")
    keepdim = data.draw(st.booleans(), label="keepdim")
    tiles = dict(row_tile=data.draw(st.one_of(st.none(), tile_elems(8)), label="row_tile"),
                 rows_per_task=data.draw(st.one_of(st.none(), st.integers(1, 8)), label="rows_per_task"),
                 inner_tile=data.draw(st.one_of(st.none(), tile_elems(8)), label="inner_tile"))
    ref = reference.mean(x, dim, keepdim)
    outs = []
    for split in ("ub", "gm", "auto"):
        out = mean.sum_div(x, dim, keepdim, split=split, **tiles)
        assert out.dtype == x.dtype and out.shape == ref.shape
        assert_policy(out, ref, dtype)
        outs.append(f64(out))
    # one fp32 sum in two orders, each rounded once to the storage dtype: within 1 ulp
    np.testing.assert_allclose(outs[0], outs[1], rtol=ULP[dtype] + 2e-6, atol=1e-6, equal_nan=True)


# ---------------------------------------------------------------------------------------------
# rope

RTOL_ROPE = {"fp32": 2.0**-21, "bf16": 2.0**-8, "fp16": 2.0**-10}  # tests/ops/test_rope.py


@st.composite
def rope_case(draw):
    lead = draw(st.lists(st.integers(1, 3), max_size=1).map(tuple))
    S, H = draw(st.integers(1, 9)), draw(st.integers(1, 4))
    D = 2 * draw(st.integers(1, 24))
    R = 2 * draw(st.integers(1, D // 2))
    return lead + (S, H, D), R


@SETTINGS
@given(case=rope_case(), dtype=dtypes_, token_tile=st.one_of(st.none(), st.integers(1, 16)), seed=seeds,
       nan=st.booleans())
def test_rope(case, dtype, token_tile, seed, nan):
    shape, R = case
    rng = np.random.default_rng(seed)
    x = make(shape, dtype, rng)
    if nan:
        x.reshape(-1)[rng.integers(x.size)] = np.nan
    S = shape[-3]
    cos, sin = make((S, R), dtype, rng), make((S, R), dtype, rng)
    w = make((shape[-1],), dtype, rng, 0.1, 1.0)
    kw = dict(token_tile=token_tile)
    tol = dict(rtol=RTOL_ROPE[dtype], atol=1e-5)
    std = rope.standard(x, cos, sin, **kw)
    assert_policy(std, reference.rope_standard(x, cos, sin), dtype, **tol)
    assert_policy(rope.interleaved(x, cos, sin, **kw), reference.rope_interleaved(x, cos, sin), dtype, **tol)
    normed = rope.rmsnorm(x, w, **kw)
    assert_policy(normed, reference.rmsnorm(x, w), dtype, rtol=RTOL_ROPE[dtype] + 1e-5, atol=1e-5)
    fused = rope.fused_rmsnorm(x, w, cos, sin, **kw)
    assert_policy(fused, reference.rope_fused_rmsnorm(x, w, cos, sin), dtype, rtol=RTOL_ROPE[dtype] + 1e-5, atol=1e-4)
    # fused == rmsnorm then standard, up to the extra rounding of the composition (one more ulp)
    two = rope.standard(normed, cos, sin, **kw)
    finite = np.abs(f64(normed))[np.isfinite(f64(normed))]
    scale = (finite.max() if finite.size else 1.0) * np.abs(f64(cos)).max() * 2 + 1e-30
    np.testing.assert_allclose(f64(fused), f64(two), rtol=0, atol=4 * ULP[dtype] * scale + 1e-5, equal_nan=True)


@SETTINGS
@given(n=st.integers(1, 50), half=st.integers(1, 32), dtype=dtypes_, theta=st.sampled_from([1e4, 5e5, 1e6]),
       token_tile=st.one_of(st.none(), st.integers(1, 64)), seed=seeds)
def test_rope_cos_sin(n, half, dtype, theta, token_tile, seed):
    pos = np.random.default_rng(seed).integers(0, 32768, n)
    c, s = rope.cos_sin(pos, 2 * half, theta, NP_DTYPE[dtype], token_tile=token_tile)
    rc, rs = reference.cos_sin(pos, 2 * half, theta)
    # float64 angles rounded once to fp32 (then to the 16-bit dtype): a few ulps
    assert_policy(c, rc, dtype, rtol=ULP[dtype], atol=ULP[dtype])
    assert_policy(s, rs, dtype, rtol=ULP[dtype], atol=ULP[dtype])


# ---------------------------------------------------------------------------------------------
# attention

ATOL_ATT = {"fp32": 2e-5, "bf16": 2e-2, "fp16": 3e-3}  # tests/ops/test_attention.py


@st.composite
def attention_case(draw):
    B, Hkv, G = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    Sq, Skv = draw(st.integers(1, 9)), draw(st.integers(1, 40))
    D = draw(st.sampled_from([8, 16, 24, 40]))
    causal = draw(st.booleans())
    kv_len = draw(st.one_of(st.none(), st.lists(st.integers(0, Skv), min_size=B, max_size=B)))
    opts = dict(kv_tile=draw(st.one_of(st.none(), st.integers(1, 48))),
                q_tile=draw(st.one_of(st.none(), st.integers(1, 8))),
                num_splits=draw(st.one_of(st.none(), st.integers(1, 4))),
                pv=draw(st.sampled_from(["storage", "compensated", "fp32"])),
                gqa=draw(st.sampled_from(["head_loop", "expand_clone"])),
                mask=draw(st.booleans()))
    return (B, Hkv * G, Hkv, Sq, Skv, D), causal, kv_len, opts


@SETTINGS
@given(case=attention_case(), dtype=dtypes_, seed=seeds, nan=st.booleans())
def test_attention(case, dtype, seed, nan):
    (B, Hq, Hkv, Sq, Skv, D), causal, kv_len, o = case
    rng = np.random.default_rng(seed)
    q, k, v = make((B, Hq, Sq, D), dtype, rng), make((B, Hkv, Skv, D), dtype, rng), make((B, Hkv, Skv, D), dtype, rng)
    mask = (rng.standard_normal((Sq, Skv)) * 0.5).astype(np.float32) if o["mask"] else None
    kvl = None if kv_len is None else np.array(kv_len)
    if nan:
        # NaN in V at a key every query row of batch 0 attends -> NaN in that column of every
        # query row of its KV head's G query heads (0 * NaN is NaN: even a rounded-to-0 weight)
        kv_len = [Skv] * B
        kvl, causal = None, False
        v[0, 0, 0, 0] = np.nan
    common = dict(causal=causal, kv_len=kvl, mask=mask, gqa=o["gqa"])
    ref = reference.attention(q, k, v, causal=causal, kv_len=kvl, mask=mask)
    outs = {
        "standard": attention.standard(q, k, v, **common),
        "online": attention.online(q, k, v, kv_tile=o["kv_tile"], q_tile=o["q_tile"], pv=o["pv"], **common),
        "flash": attention.flash(q, k, v, kv_tile=o["kv_tile"], q_tile=o["q_tile"], num_splits=o["num_splits"], **common),
    }
    G = Hq // Hkv
    for name, out in outs.items():
        assert out.dtype == q.dtype and out.shape == (B, Hq, Sq, D), name
        got = f64(out)
        if nan:
            assert np.isnan(got[0, :G, :, 0]).all(), name
            got, want = got[..., 1:], ref[..., 1:]
            got = np.where(np.isnan(got) & np.isnan(want), 0.0, got)
            want = np.nan_to_num(want)
        else:
            want = ref
        assert np.all(np.isfinite(got)), name
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL_ATT[dtype], err_msg=name)
    # the three strategies agree with each other as closely as each agrees with the oracle
    np.testing.assert_allclose(f64(outs["online"]), f64(outs["flash"]), rtol=0, atol=2 * ATOL_ATT[dtype], equal_nan=True)
    np.testing.assert_allclose(f64(outs["standard"]), f64(outs["flash"]), rtol=0, atol=2 * ATOL_ATT[dtype], equal_nan=True)


# ---------------------------------------------------------------------------------------------
# repeat_kv


@SETTINGS
@given(shape=shapes(4, 4, max_side=9, max_size=2000), n_rep=st.integers(1, 5), dtype=dtypes_, seed=seeds)
def test_repeat_kv(shape, n_rep, dtype, seed):
    kv = make(shape, dtype, np.random.default_rng(seed))
    kv.reshape(-1)[0] = np.nan  # copied bit for bit
    out = repeat_kv.expand_clone(kv, n_rep)
    want = np.repeat(kv, n_rep, axis=1)
    assert out.dtype == kv.dtype
    np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))


# ---------------------------------------------------------------------------------------------
# moe


@st.composite
def gating_case(draw):
    n_group = draw(st.sampled_from([1, 2, 4, 8]))
    E = n_group * draw(st.integers(1 if n_group == 1 else 2, 12))
    E = max(E, 2)
    topk_group = draw(st.integers(1, n_group))
    eligible = E if n_group == 1 else topk_group * (E // n_group)
    top_k = draw(st.integers(1, min(eligible, 9)))
    return dict(T=draw(st.integers(1, 20)), E=E, top_k=top_k, n_group=n_group, topk_group=topk_group,
                group_score=draw(st.sampled_from(["max", "top2_sum"])), renormalize=draw(st.booleans()),
                scale=draw(st.sampled_from([1.0, 2.5])), bias=draw(st.booleans()),
                token_tile=draw(st.one_of(st.none(), st.integers(1, 8))))


def _distinct_logits(T, E, rng, dtype):
    """Logits whose scores differ by far more than fp32 rounding (a random permutation of a grid),
    so the float64 oracle's ranking is the kernel's ranking."""
    grid = (np.arange(E) - E / 2) * (6.0 / E)
    x = np.stack([rng.permutation(grid) for _ in range(T)]).astype(np.float32)
    return x.astype(NP_DTYPE[dtype])


@SETTINGS
@given(c=gating_case(), dtype=dtypes_, seed=seeds)
def test_moe_gating(c, dtype, seed):
    rng = np.random.default_rng(seed)
    T, E, k = c["T"], c["E"], c["top_k"]
    logits = _distinct_logits(T, E, rng, dtype)
    bias = (rng.permutation(E) * (0.5 / E)).astype(np.float32) if c["bias"] else None
    group = dict(n_group=c["n_group"], topk_group=c["topk_group"], group_score=c["group_score"])
    if c["group_score"] == "top2_sum" and c["n_group"] > 1 and E // c["n_group"] < 2:
        group["group_score"] = "max"
    common = dict(renormalize=c["renormalize"], routed_scaling_factor=c["scale"], token_tile=c["token_tile"], **group)
    for name, fn, ref in (("sigmoid", moe.sigmoid_gating, reference.moe_sigmoid_gating),
                          ("softmax", moe.softmax_gating, reference.moe_softmax_gating)):
        extra = dict(bias=bias) if name == "sigmoid" else {}
        w, ids = fn(logits, k, **extra, **common)
        assert w.dtype == np.float32 and ids.dtype == np.int32 and w.shape == ids.shape == (T, k)
        if name == "sigmoid":
            rw, rids = ref(logits, k, bias=bias, renormalize=c["renormalize"], routed_scaling_factor=c["scale"], **group)
        else:
            rw, rids = ref(logits, k, c["renormalize"], c["scale"], **group)
        np.testing.assert_array_equal(ids, rids, err_msg=name)
        np.testing.assert_allclose(w, rw, rtol=1e-5, atol=1e-7, err_msg=name)
    # both routers rank by a monotonic function of the logits: without bias and groups they pick
    # the same experts in the same order
    _, ids_sig = moe.sigmoid_gating(logits, k, token_tile=c["token_tile"])
    _, ids_soft = moe.softmax_gating(logits, k, token_tile=c["token_tile"])
    np.testing.assert_array_equal(ids_sig, ids_soft)


@SETTINGS
@given(T=st.integers(1, 20), K=st.integers(1, 8), H=st.integers(1, 80), dtype=dtypes_, wdtype=dtypes_,
       token_tile=st.one_of(st.none(), st.integers(1, 8)), h_tile=st.one_of(st.none(), tile_elems(4)),
       seed=seeds, nan=st.booleans())
def test_moe_combine(T, K, H, dtype, wdtype, token_tile, h_tile, seed, nan):
    rng = np.random.default_rng(seed)
    x = make((T, K, H), dtype, rng)
    w = np.abs(make((T, K), wdtype, rng))
    if nan:
        w[rng.integers(T), rng.integers(K)] = np.nan
    out = moe.combine(x, w, token_tile=token_tile, h_tile=h_tile)
    ref = reference.moe_combine(x, w)
    assert out.dtype == x.dtype and out.shape == (T, H)
    # an fp32 sum of K products rounded once: bound by the magnitudes summed
    bound = ULP[dtype] * np.einsum("tkh,tk->th", np.abs(f64(x)), np.abs(f64(w))) + 1e-6
    got = f64(out)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    ok = ~np.isnan(ref)
    assert np.all(np.abs(got - ref)[ok] <= bound[ok])


# ---------------------------------------------------------------------------------------------
# linear


@st.composite
def cube_tiles(draw):
    def axis():
        l0 = 16 * draw(st.integers(1, 4))
        return (l0, l0 * draw(st.integers(1, 3)))

    return (axis(), axis(), axis())


@SETTINGS
@given(M=st.integers(1, 40), K=st.integers(1, 70), N=st.integers(1, 50), lead=st.booleans(), dtype=dtypes_,
       tiles=st.one_of(st.none(), cube_tiles()), has_bias=st.booleans(), seed=seeds, nan=st.booleans())
def test_linear(M, K, N, lead, dtype, tiles, has_bias, seed, nan):
    rng = np.random.default_rng(seed)
    x = make(((2, M) if lead else (M,)) + (K,), dtype, rng)
    w = make((N, K), dtype, rng, K**-0.5)
    b = make((N,), dtype, rng) if has_bias else None
    if nan:
        x.reshape(-1, K)[0, rng.integers(K)] = np.nan
    ref = reference.linear(x, w, b)
    # error bound of an fp32-accumulated product and the storage roundings (two for matmul_add)
    mag = f64(np.abs(x)) @ f64(np.abs(w)).T + (np.abs(f64(b)) if b is not None else 0.0)
    bound = (2 * ULP[dtype] + K * 2.0**-23) * mag + 1e-6
    outs = {}
    for name, fn in (("matmul_add", linear.matmul_add), ("fused_bias", linear.fused_bias)):
        out = fn(x, w, b, cube_tiles=tiles)
        assert out.dtype == x.dtype and out.shape == x.shape[:-1] + (N,), name
        got = f64(out)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(ref), err_msg=name)
        ok = ~np.isnan(ref)
        assert np.all(np.abs(got - ref)[ok] <= bound[ok]), name
        outs[name] = out
    if b is None:  # no bias: both run the same cube walk, bit for bit
        np.testing.assert_array_equal(outs["matmul_add"].view(np.uint8), outs["fused_bias"].view(np.uint8))


# ---------------------------------------------------------------------------------------------
# embedding


@SETTINGS
@given(V=st.integers(1, 50), H=st.integers(1, 70), ids_shape=shapes(1, 2, max_side=12, max_size=100),
       dtype=dtypes_, ids_dtype=st.sampled_from([np.int32, np.int64]),
       row_tile=st.one_of(st.none(), st.integers(1, 4).map(lambda b: 8 * b)),
       h_tile=st.one_of(st.none(), tile_elems(4)), seed=seeds)
def test_embedding(V, H, ids_shape, dtype, ids_dtype, row_tile, h_tile, seed):
    rng = np.random.default_rng(seed)
    weight = make((V, H), dtype, rng)
    weight[0, 0] = np.nan  # rows are copied bit for bit
    ids = rng.integers(0, V, ids_shape).astype(ids_dtype)
    want = weight[ids]
    for fn in (embedding.gather, embedding.index_select):
        out = fn(weight, ids, row_tile=row_tile, h_tile=h_tile)
        assert out.dtype == weight.dtype
        np.testing.assert_array_equal(out.view(np.uint8), want.view(np.uint8))
