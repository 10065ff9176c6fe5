"""rope.cos_sin with Hugging Face rope_scaling (linear, dynamic, llama3, yarn) and the interleaved
layout, against float64 formulas written here per frequency from the papers / reference code
(position interpolation; NTK-aware dynamic base; Meta's llama3 apply_scaling; YaRN's ramp over
the dimension index, as transformers computes it), and rope.interleaved's refusal of split-half
tables."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pypto_numba import rope
from pypto_numba.errors import ConstraintError

POS = np.concatenate([np.arange(0, 40), [1000, 8191, 30000, 131071]]).astype(np.int64)


def plain_inv(R, theta):
    return [theta ** (-(2 * i) / R) for i in range(R // 2)]


def tables(pos, inv, att=1.0, layout="half"):
    f = np.array([[p * w for w in inv] for p in pos], np.float64)
    c, s = att * np.cos(f), att * np.sin(f)
    if layout == "half":
        return np.concatenate([c, c], -1), np.concatenate([s, s], -1)
    return np.repeat(c, 2, axis=-1), np.repeat(s, 2, axis=-1)


def check(scaling, want_inv, att=1.0, R=128, theta=1e6, layout="half", dtype=np.float32, **kw):
    cos, sin = rope.cos_sin(POS, R, theta=theta, dtype=dtype, scaling=scaling, layout=layout, **kw)
    wc, ws = tables(POS, want_inv, att, layout)
    tol = 2e-7 if dtype == np.float32 else 8e-3
    np.testing.assert_allclose(cos.astype(np.float64), wc, rtol=tol, atol=tol * max(att, 1))
    np.testing.assert_allclose(sin.astype(np.float64), ws, rtol=tol, atol=tol * max(att, 1))
    return cos, sin


def test_linear_interpolates_positions():
    # position interpolation: angle = (p / factor) * theta^(-2i/R)
    for key in ("rope_type", "type"):
        check({key: "linear", "factor": 4.0}, [w / 4.0 for w in plain_inv(128, 1e6)])


def test_default_and_none_are_plain_rope():
    check(None, plain_inv(128, 1e6))
    check({"rope_type": "default"}, plain_inv(128, 1e6))


def test_dynamic_ntk_base():
    R, theta, L0, factor = 64, 10000.0, 2048, 2.0
    for seq in (1000, 5000):  # below L0: the plain base; above: the NTK-aware base
        L = max(seq, L0)
        base = theta * (factor * L / L0 - (factor - 1)) ** (R / (R - 2))
        check({"type": "dynamic", "factor": factor}, plain_inv(R, base), R=R, theta=theta,
              max_position=seq, max_position_embeddings=L0)
    # default sequence length: positions.max() + 1 (131072 here)
    base = theta * (factor * 131072 / L0 - (factor - 1)) ** (R / (R - 2))
    check({"rope_type": "dynamic", "factor": factor, "original_max_position_embeddings": L0}, plain_inv(R, base),
          R=R, theta=theta)


def llama3_inv(R, theta, factor, low, high, old):
    out = []
    for w in plain_inv(R, theta):  # Meta's apply_scaling, one frequency at a time
        wavelen = 2 * math.pi / w
        if wavelen < old / high:
            out.append(w)
        elif wavelen > old / low:
            out.append(w / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * w / factor + smooth * w)
    return out


def test_llama3_smooths_per_frequency():
    cfg = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}  # Llama 3.1's
    want = llama3_inv(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    check(cfg, want, theta=500000.0)
    w0 = plain_inv(128, 500000.0)
    assert want[0] == w0[0] and want[-1] == w0[-1] / 8  # high frequencies kept, low ones divided
    assert any(w0[i] / 8 < want[i] < w0[i] for i in range(64))  # and some smoothed


def yarn_inv(R, theta, factor, L0, fast=32.0, slow=1.0, truncate=True):
    def dim(rot):
        return R * math.log(L0 / (rot * 2 * math.pi)) / (2 * math.log(theta))

    lo, hi = dim(fast), dim(slow)
    if truncate:
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, R - 1)
    out = []
    for i, w in enumerate(plain_inv(R, theta)):
        ramp = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # 0: extrapolate (keep), 1: interpolate (/factor)
        out.append(w * (1 - ramp) + (w / factor) * ramp)
    return out


def test_yarn_frequencies_and_attention_factor():
    cfg = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}  # Qwen3's long context
    att = 0.1 * math.log(4.0) + 1.0
    cos, sin = check(cfg, yarn_inv(128, 1e6, 4.0, 32768), att=att)
    np.testing.assert_allclose(cos.astype(np.float64) ** 2 + sin.astype(np.float64) ** 2, att**2, rtol=1e-6)
    check(dict(cfg, truncate=False, beta_fast=16.0), yarn_inv(128, 1e6, 4.0, 32768, fast=16.0, truncate=False), att=att)
    check(dict(cfg, attention_factor=1.5), yarn_inv(128, 1e6, 4.0, 32768), att=1.5)
    # DeepSeek-V3: mscale == mscale_all_dim -> attention factor 1; original length from the config
    ds = {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
    check(ds, yarn_inv(64, 10000.0, 40.0, 4096), att=1.0, R=64, theta=10000.0, max_position_embeddings=4096)
    # no factor: max_position_embeddings / original_max_position_embeddings
    check({"rope_type": "yarn", "original_max_position_embeddings": 4096}, yarn_inv(64, 10000.0, 4.0, 4096),
          att=0.1 * math.log(4.0) + 1.0, R=64, theta=10000.0, max_position_embeddings=16384)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_interleaved_layout_drives_rope_interleaved(dtype):
    import ml_dtypes

    np_dtype = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16, "float16": np.float16}[dtype]
    S, H, R = 9, 3, 24
    cos, sin = check({"rope_type": "linear", "factor": 2.0}, [w / 2 for w in plain_inv(R, 1e4)], R=R,
                     theta=1e4, layout="interleaved", dtype=np_dtype)
    half_c, half_s = rope.cos_sin(POS, R, theta=1e4, dtype=np_dtype, scaling={"rope_type": "linear", "factor": 2.0})
    # the same values, moved: pair layout [c0 c0 c1 c1 ...] vs halves [c0 c1 ... c0 c1 ...]
    np.testing.assert_array_equal(cos.view(np.uint8), np.repeat(half_c[:, :R // 2], 2, -1).view(np.uint8))
    rng = np.random.default_rng(3)
    x = rng.standard_normal((S, H, R)).astype(np_dtype)
    # GPT-J rotation of pair (2k, 2k+1) by angle f_k, in float64
    xf = x.astype(np.float64)
    f = np.arctan2(sin[:S, 0::2].astype(np.float64), cos[:S, 0::2].astype(np.float64))[:, None, :]
    want = np.empty_like(xf)
    want[..., 0::2] = xf[..., 0::2] * np.cos(f) - xf[..., 1::2] * np.sin(f)
    want[..., 1::2] = xf[..., 1::2] * np.cos(f) + xf[..., 0::2] * np.sin(f)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(rope.interleaved(x, cos[:S], sin[:S]).astype(np.float64), want, rtol=tol, atol=tol)
    with pytest.raises(ConstraintError, match=r"layout='interleaved'"):
        rope.interleaved(x, half_c[:S], half_s[:S])


def test_interleaved_accepts_tables_it_cannot_tell_apart():
    x = np.ones((1, 1, 2), np.float32)
    c, s = rope.cos_sin(np.arange(1), 2)  # R = 2 (and position 0): both layouts are the same
    rope.interleaved(x, c, s)
    c, s = rope.cos_sin(np.zeros(3, np.int64), 8)  # position 0 only: all ones / zeros
    rope.interleaved(np.ones((3, 1, 8), np.float32), c, s)


@pytest.mark.parametrize("scaling, kw, match", [
    ({"rope_type": "ntk-by-parts", "factor": 2.0}, {}, "unknown rope_scaling type 'ntk-by-parts'.*linear, dynamic, llama3, yarn"),
    ({"factor": 2.0}, {}, "names no type.*rope_type"),
    ({"rope_type": "linear"}, {}, "lacks factor"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0}, {}, "lacks high_freq_factor, original_max_position_embeddings"),
    ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 1.0,
      "original_max_position_embeddings": 8192}, {}, "high_freq_factor > low_freq_factor"),
    ({"rope_type": "dynamic", "factor": 2.0}, {}, "original context length"),
    ({"rope_type": "yarn"}, {}, "original context length"),
    ({"rope_type": "yarn", "original_max_position_embeddings": 4096}, {}, "lacks factor"),
    ({"rope_type": "linear", "factor": -1.0}, {}, r"rope_scaling\['factor'\] must be a finite number > 0"),
    ({"rope_type": "linear", "factor": "2"}, {}, "must be a finite number"),
    ([("rope_type", "linear")], {}, "rope_scaling dict"),
    (None, {"layout": "gptj"}, "layout must be 'half'.*'interleaved'"),
])
def test_bad_scaling_is_refused(scaling, kw, match):
    with pytest.raises(ConstraintError, match=match):
        rope.cos_sin(np.arange(8), 16, scaling=scaling, **kw)
