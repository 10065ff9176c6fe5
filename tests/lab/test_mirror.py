"""Kernel-faithful goldens (``mirror=True``, lab/spec.py) and the criterion precision.mirror_check:
every strategy within 1 storage ulp of its mirror at >= 99.9 % of points and 2 everywhere."""

import importlib

import numpy as np
import pytest

import pypto_numba  # noqa: F401  (registers the ops)
from pypto_numba import precision
from pypto_numba.lab.spec import normal, to_storage
from pypto_numba.machine import dtypes
from pypto_numba.strategy import spec

compare = importlib.import_module("pypto_numba.compare")

# small odd shapes (tails everywhere) in each op's --shape order
SHAPES = {"gelu": (7, 203), "mean": (7, 203), "rmsnorm": (7, 203), "softmax": (7, 203), "swiglu": (7, 203),
          "linear": (7, 129, 45), "rope": (13, 3, 64), "embedding": (101, 48, 2, 5), "repeat_kv": (1, 2, 13, 16, 2),
          "moe": (13, 64), "attention": (1, 4, 2, 5, 77, 64)}


def _inputs(op, dtype):
    if op == "gelu":  # N(0, 1): the fp32 form of 1 + tanh(u) / 1 + erf(u) cancels for x < -4.5 (see test below)
        return (normal(SHAPES[op], dtype, np.random.default_rng(1)),)
    return compare.make_inputs(op, SHAPES[op], dtype, seed=1)


def _check(op, dtype, **options):
    ins = _inputs(op, dtype)
    c = compare.compare(op, *ins, repeats=1, **options)
    rows = [r for r in c.rows if not r.ruled_out]
    assert rows
    for r in rows:
        assert r.mirror and len(r.mirror) == len(r.precision)
        for m in r.mirror:
            if m.judged:
                assert m.ok, f"{op}.{r.strategy} {dtype}: {m}"
            else:  # fp32 outputs (MoE weights): vmath's fp32 sigmoid/exp are within 2 ulps, not 1
                assert m.dtype == "fp32" and m.max_ulps <= 2, f"{op}.{r.strategy} {dtype}: {m}"
    return c


def test_criterion():
    x = to_storage(1.0 + np.arange(128) / 128.0, "bf16")  # every bf16 in [1, 2): ulp 2^-7
    assert precision.mirror_check(x, x, "bf16") == precision.MirrorResult(0.0, 0.0, 0.0, True, "bf16")
    one = x + 2.0**-7
    r = precision.mirror_check(one, x, "bf16")
    assert r.ok and r.max_ulps == 1 and r.frac_1ulp == 0
    two = x.copy()
    two[3] += 2 * 2.0**-7
    r = precision.mirror_check(two, x, "bf16")
    assert r.max_ulps == 2 and r.frac_1ulp == 1 / 128 and not r.ok  # 0.8 % of points over 1 ulp
    big = np.tile(x, 8)  # 1024 points: one 2-ulp point is 0.098 % <= 0.1 %
    bad = big.copy()
    bad[5] += 2 * 2.0**-7
    assert precision.mirror_check(bad, big, "bf16").ok
    bad[6] += 3 * 2.0**-7
    assert not precision.mirror_check(bad, big, "bf16").ok  # 3 ulps somewhere
    nan = big.copy()
    nan[0] = np.nan
    assert not precision.mirror_check(nan, big, "bf16").ok
    assert precision.mirror_check(nan, nan, "bf16").ok


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["gelu", "mean", "rmsnorm", "softmax", "swiglu", "linear"])
def test_every_strategy_within_its_mirror(op, dtype):
    _check(op, dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_gelu_storage_math_mirror(dtype):
    c = _check("gelu", dtype, math="storage")
    assert all(r.precision[0].max_ulps > 4 for r in c.rows)  # far from the truth, at its mirror


def test_gelu_fp32_cancellation_is_flagged():
    """At x < -4.5 the kernels' fp32 ``1 + tanh(u)`` loses its digits: against the float64 mirror
    the tiny outputs are many bf16 ulps off (an algorithm limit, not rounding)."""
    x = (-np.linspace(5.0, 7.0, 64)).astype(np.float32).astype(dtypes.STORAGE["bf16"])
    c = compare.compare("gelu", x, strategies="tanh", repeats=1)
    assert not c.rows[0].mirror[0].ok


def test_linear_matmul_add_two_roundings():
    """matmul_add's mirror rounds the product then the sum; the single-rounding mirror is worse."""
    x, w, b = compare.make_inputs("linear", SHAPES["linear"], "bf16", seed=1)
    out = pypto_numba.linear.matmul_add(x, w, b)
    ref = spec("linear").reference
    two = precision.mirror_check(out, ref(x, w, b, strategy="matmul_add", mirror=True), "bf16")
    one = precision.mirror_check(out, ref(x, w, b, strategy="fused_bias", mirror=True), "bf16")
    assert two.ok and two.max_ulps == 0
    assert not one.ok


@pytest.mark.parametrize("op", ["gelu", "mean", "rmsnorm", "softmax", "swiglu", "linear", "rope", "embedding",
                                "repeat_kv", "attention"])
def test_fp32_mirror_is_the_truth(op):
    """In fp32 the mirror is the truth up to fp32 ulps."""
    ins = _inputs(op, "fp32")
    for v in spec(op).rows():
        truth = v.reference(*ins)
        mirror = v.reference(*ins, mirror=True)
        for t, m in zip(truth if isinstance(truth, tuple) else (truth,), mirror if isinstance(mirror, tuple) else (mirror,)):
            # one fp32 rounding per cast point: within fp32 ulps of the output's scale (matmul_add's
            # sum with the bias may cancel the rounded product)
            assert np.allclose(m, t, rtol=2.0**-22, atol=2.0**-22 * np.abs(t).max()), (op, v.label)


def test_broken_kernel_fails(monkeypatch):
    """softmax.whole_row is within its mirror; the same output perturbed (1-2 ulps at 2 % of
    points, 4 ulps at 1 %) is not."""
    x = _inputs("softmax", "bf16")[0]
    good = pypto_numba.softmax.whole_row(x)

    def broken(x, **o):
        y = good.astype(np.float64)
        y.reshape(-1)[::50] *= 1 + 3 * 2.0**-8  # ~3 half-ulps: 1-2 ulps after rounding, at 2 % of points
        y.reshape(-1)[::97] *= 1 + 2.0**-5  # 4 ulps
        return y.astype(np.float32).astype(x.dtype)

    variant = [v for v in spec("softmax").rows() if v.label == "whole_row"][0]
    assert precision.mirror_check(good, variant.reference(x, mirror=True), "bf16").ok
    assert not precision.mirror_check(broken(x), variant.reference(x, mirror=True), "bf16").ok


def test_compare_columns():
    ins = compare.make_inputs("linear", SHAPES["linear"], "bf16", seed=1)
    c = compare.compare("linear", *ins, repeats=1)
    assert "mirror ulps" in c.to_markdown() and ">1ulp %" in c.to_table()
    assert " ok" in c.to_markdown()
    d = c.to_dict()["rows"][0]["mirror"][0]
    assert set(d) == {"frac_1ulp", "frac_2ulp", "max_ulps", "ok", "dtype"}
    fp32 = compare.compare("linear", *compare.make_inputs("linear", SHAPES["linear"], "fp32", seed=1), repeats=1)
    assert " ok" not in fp32.to_table() and " BAD" not in fp32.to_table()  # fp32 is not judged


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("op", ["rope", "embedding", "repeat_kv", "moe", "attention"])
def test_more_ops_within_their_mirror(op, dtype):
    _check(op, dtype)


@pytest.mark.parametrize("op", ["embedding", "repeat_kv"])
def test_copies_mirror_is_the_truth(op):
    ins = _inputs(op, "bf16")
    for v in spec(op).rows():
        assert np.array_equal(v.reference(*ins, mirror=True), v.reference(*ins))


def test_rope_rmsnorm_then_standard_rounds_between():
    """rmsnorm+standard rounds rmsnorm's output before the rotation: the mirror finds it, the
    single-rounding truth does not."""
    c = _check("rope", "bf16")
    row = next(r for r in c.rows if r.strategy == "rmsnorm+standard")
    assert row.mirror[0].max_ulps <= 1 and row.precision[0].max_ulps > 4


@pytest.mark.parametrize("options", [dict(causal=True), dict(window=9), dict(softcap=5.0),
                                     dict(sinks=np.linspace(-1, 1, 4).astype(np.float32))])
def test_attention_options_within_their_mirror(options):
    _check("attention", "bf16", **options)


@pytest.mark.parametrize("strategy", ["online", "flash"])
def test_attention_mirror_walks_the_kv_tiles(strategy):
    """P rounded per KV tile against the tile's max: the mirror that walks the strategy's kv_tile
    matches better than one over the whole row (standard's) or over other tiles."""
    q, k, v = compare.make_inputs("attention", (1, 4, 2, 5, 200, 64), "bf16", seed=3)
    fn = getattr(pypto_numba.attention, strategy)
    ref = spec("attention").reference
    out = fn(q, k, v, kv_tile=32)
    walk = ref(q, k, v, strategy=strategy, kv_tile=32, mirror=True)
    whole = ref(q, k, v, strategy="standard", mirror=True)
    other = ref(q, k, v, strategy=strategy, kv_tile=64, mirror=True)
    good = precision.mirror_check(out, walk, "bf16")
    assert good.ok and good.frac_1ulp == 0
    for m in (whole, other):
        worse = precision.mirror_check(out, m, "bf16")
        assert np.count_nonzero(out.astype(np.float64) != m) > np.count_nonzero(out.astype(np.float64) != walk)
        assert worse.max_ulps >= good.max_ulps


@pytest.mark.slow(on="3.13")
def test_attention_mirror_bshd_and_bool_mask():
    """The attention mirror plans its kv tile with the [B, H, S, D] shapes of a bshd call."""
    q, k, v = compare.make_inputs("attention", (1, 4, 2, 5, 77, 64), "bf16", seed=2)
    T = lambda a: np.ascontiguousarray(a.transpose(0, 2, 1, 3))  # noqa: E731
    for c in (compare.compare("attention", T(q), T(k), T(v), layout="bshd", repeats=1),
              compare.compare("attention", q, k, v, mask=np.random.default_rng(0).random((1, 1, 5, 77)) > 0.3,
                              repeats=1)):
        assert all(m.ok for r in c.rows for m in r.mirror), c.to_table()


def _off(out, ref):
    return np.count_nonzero(np.asarray(out, np.float64) != ref)


@pytest.mark.parametrize("op", ["gelu", "mean", "rmsnorm", "softmax", "swiglu", "rope", "linear"])
def test_mirror_follows_the_cast_mode(op):
    """Under cast_mode="trunc" the mirror truncates where the strategy's vector casts do and keeps
    rint where the cube's FIXPIPE narrows (fused_bias; matmul_add's product): it then matches the
    kernel at far more points than a mirror that rounds to nearest everywhere."""
    from pypto_numba import use_cast_mode

    ins = _inputs(op, "bf16")
    for v in spec(op).rows():
        out = v.call(*ins, cast_mode="trunc")
        outs = out if isinstance(out, tuple) else (out,)
        with use_cast_mode("trunc"):
            follow = v.reference(*ins, mirror=True)
        nearest = v.reference(*ins, mirror=True)
        follow, nearest = (r if isinstance(r, tuple) else (r,) for r in (follow, nearest))
        for o, f, n in zip(outs, follow, nearest):
            assert precision.mirror_check(o, f, "bf16").ok, (op, v.label)
            if (op, v.label) == ("linear", "fused_bias"):
                assert np.array_equal(f, n)  # FIXPIPE rounds to nearest whatever the mode
            else:
                assert _off(o, f) * 4 < _off(o, n), (op, v.label, _off(o, f), _off(o, n))


def test_compare_mirror_runs_under_the_strategy_mode():
    """compare(..., cast_mode=) judges each strategy against a mirror in that same mode."""
    x = _inputs("softmax", "bf16")[0]
    c = compare.compare("softmax", x, repeats=1, cast_mode="trunc")
    assert all(m.ok and m.frac_1ulp == 0 for r in c.rows for m in r.mirror), c.to_table()
    with pytest.raises(dtypes.CastModeError):
        compare.compare("softmax", x, repeats=1, cast_mode="nearest")
