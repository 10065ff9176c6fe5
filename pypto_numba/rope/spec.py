"""What compare, advise and report need to know about rope: its OP spec (pypto_numba/lab/spec.py),
the float64 oracles, compare's inputs and variants, and the advise rule."""

import numpy as np

from .plans import plan_fused_rmsnorm, plan_interleaved, plan_rmsnorm, plan_standard
from .public import fused_rmsnorm, interleaved, rmsnorm, standard


def _reference_rmsnorm(x, weight, eps: float = 1e-6):
    """``x * rsqrt(mean(x**2, -1) + eps) * weight``."""
    from ..reference import f64

    x = f64(x)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * f64(weight)


def _reference_tables(cos, sin):
    """cos/sin ``[..., S, R]`` -> broadcastable to ``x[..., S, H, R]``."""
    from ..reference import f64

    return f64(cos)[..., :, None, :], f64(sin)[..., :, None, :]


def _reference_standard(x, cos, sin):
    """Split-half (rotate_half) RoPE on the first R = cos.shape[-1] dims of ``x[..., S, H, D]``."""
    from ..reference import f64

    x = f64(x)
    c, s = _reference_tables(cos, sin)
    rot = c.shape[-1]
    half = rot // 2
    out = x.copy()
    x1, x2 = x[..., :half], x[..., half:rot]
    out[..., :rot] = x[..., :rot] * c + np.concatenate([-x2, x1], axis=-1) * s
    return out


def _reference_interleaved(x, cos, sin):
    """GPT-J pairs: ``out[2k] = x[2k]cos[2k] - x[2k+1]sin[2k]``, ``out[2k+1] = x[2k+1]cos[2k+1] + x[2k]sin[2k+1]``."""
    from ..reference import f64

    x = f64(x)
    c, s = _reference_tables(cos, sin)
    rot = c.shape[-1]
    out = x.copy()
    xe, xo = x[..., 0:rot:2], x[..., 1:rot:2]
    out[..., 0:rot:2] = xe * c[..., 0::2] - xo * s[..., 0::2]
    out[..., 1:rot:2] = xo * c[..., 1::2] + xe * s[..., 1::2]
    return out


def _reference_fused_rmsnorm(x, weight, cos, sin, eps: float = 1e-6):
    return _reference_standard(_reference_rmsnorm(x, weight, eps), cos, sin)


def _reference_cos_sin(positions, rot_dim: int, theta: float = 10000.0):
    """HF tables: ``f[p, i] = positions[p] * theta**(-2i/rot_dim)``, ``cos(cat(f, f))``, ``sin(cat(f, f))``."""
    pos = np.asarray(positions, dtype=np.float64)
    inv = theta ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    f = pos[..., None] * inv
    emb = np.concatenate([f, f], axis=-1)
    return np.cos(emb), np.sin(emb)


def _lab_inputs(shape, dtype, rng):
    """x ``[..., S, H, D]``, an RMSNorm weight near 1 and Qwen3's tables (theta 1e6)."""
    from ..lab import normal
    from ..machine import dtypes

    S, H, D = shape[-3:]
    cos, sin = _reference_cos_sin(np.arange(S), D, theta=1e6)
    store = dtypes.STORAGE[dtype]
    return (normal(shape, dtype, rng), normal((D,), dtype, rng, 0.1, 1.0),
            cos.astype(np.float32).astype(store), sin.astype(np.float32).astype(store))


def _mirror_rmsnorm_standard(x, w, c, s, mirror=False, **o):
    """rmsnorm then standard: with ``mirror=True`` the normalized rows are rounded to the storage
    dtype (rmsnorm's output in GM) before the rotation, which rounds again (lab/spec.py mirrors)."""
    from ..lab.spec import storage_of, to_storage

    if not mirror:
        return _reference_fused_rmsnorm(x, w, c, s)
    dt = storage_of(x)
    return to_storage(_reference_standard(to_storage(_reference_rmsnorm(x, w), dt), c, s), dt)


_mirror_rmsnorm_standard.mirrors = True


def _pairs(cos, sin):
    """compare's split-half tables as the GPT-J pair tables interleaved expects (same frequencies)."""
    return tuple(np.repeat(t[..., : t.shape[-1] // 2], 2, axis=-1) for t in (cos, sin))


def _lab_variants():
    from ..lab import Variant

    return [
        Variant("standard", lambda x, w, c, s, **o: standard(x, c, s, **o),
                lambda x, w, c, s, **o: _reference_standard(x, c, s), True),
        Variant("interleaved", lambda x, w, c, s, **o: interleaved(x, *_pairs(c, s), **o),
                lambda x, w, c, s, **o: _reference_interleaved(x, *_pairs(c, s))),
        Variant("rmsnorm+standard", lambda x, w, c, s, **o: standard(rmsnorm(x, w, **o), c, s, **o),
                _mirror_rmsnorm_standard),
        Variant("fused_rmsnorm", lambda x, w, c, s, **o: fused_rmsnorm(x, w, c, s, **o),
                lambda x, w, c, s, **o: _reference_fused_rmsnorm(x, w, c, s)),
    ]


def _rope(
    profile,
    tokens=128,
    heads=16,
    head_dim=128,
    rot_dim=None,
    dtype="bf16",
    adjacent_rmsnorm=True,
    layout="split_half",
):
    from ..lab import Candidate

    x = (tokens, heads, head_dim)
    cs = (tokens, rot_dim or head_dim)
    if layout == "interleaved":
        return [Candidate("interleaved", lambda: (plan_interleaved(x, cs, dtype, profile=profile),))], "interleaved", ()
    if not adjacent_rmsnorm:
        return [Candidate("standard", lambda: (plan_standard(x, cs, dtype, profile=profile),))], "standard", ()
    cands = [
        Candidate("rmsnorm+standard", lambda: (plan_rmsnorm(x, dtype, profile=profile),
                                               plan_standard(x, cs, dtype, profile=profile)), fused=False),
        Candidate("fused_rmsnorm", lambda: (plan_fused_rmsnorm(x, cs, dtype, profile=profile),)),
    ]
    return cands, "fused_rmsnorm", ("RMSNorm directly precedes RoPE (adjacent_rmsnorm=True): the seed's case for fusion",)


def _rope_tiles(profile, tokens, heads, head_dim, rot_dim, dtype, adjacent_rmsnorm, layout):
    """tune.search's space: 1 to 64 tokens per task (a composition's kernels share the tile)."""
    from ..lab import Candidate
    from ..lab.spec import pow2

    x, cs = (tokens, heads, head_dim), (tokens, rot_dim or head_dim)
    plans = {
        "interleaved": lambda t: (plan_interleaved(x, cs, dtype, profile=profile, token_tile=t),),
        "standard": lambda t: (plan_standard(x, cs, dtype, profile=profile, token_tile=t),),
        "rmsnorm+standard": lambda t: (plan_rmsnorm(x, dtype, profile=profile, token_tile=t),
                                       plan_standard(x, cs, dtype, profile=profile, token_tile=t)),
        "fused_rmsnorm": lambda t: (plan_fused_rmsnorm(x, cs, dtype, profile=profile, token_tile=t),),
    }
    for t in pow2(1, 64):
        for label, plan in plans.items():
            yield Candidate(label, lambda plan=plan, t=t: plan(t), fused=label != "rmsnorm+standard",
                            tiles={"token_tile": t}, shape=x)


def _lab_spec():
    from ..lab import Inputs, OpSpec, Seed, Tolerance

    return OpSpec(
        name="rope",
        seed=Seed("standard", "fused_rmsnorm", "fuse RMSNorm+RoPE when the two are adjacent: saves GM traffic"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(128, 16, 128),
                      help="x shape [..., S, H, D], e.g. 128,16,128 (Qwen3 q, theta 1e6)"),
        variants=_lab_variants,
        tolerance=Tolerance(half=(1e-2, 1e-2)),  # npu-facts 3
        advise=_rope,  # named as advise's old rule: its TypeError names it
        tiles=_rope_tiles,
        oracles={
            "rmsnorm": _reference_rmsnorm,
            "rope_standard": _reference_standard,
            "rope_interleaved": _reference_interleaved,
            "rope_fused_rmsnorm": _reference_fused_rmsnorm,
            "cos_sin": _reference_cos_sin,
        },
    )


OP = _lab_spec()
