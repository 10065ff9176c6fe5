"""What compare, advise and report need to know about rmsnorm (pypto_numba/lab/spec.py)."""

from __future__ import annotations

import numpy as np

from .calls import fused_add, plain
from .plans import plan_fused_add, plan_plain


def reference(x, weight, eps=1e-6, offset=0.0, residual=None):
    """Float64 RMSNorm; with ``residual``: ``(normed, residual + x)``, the sum exact in float64
    (the kernel normalises its rounded sum: compare within a rounding of the residual dtype)."""
    from ..reference import f64

    h = f64(x) if residual is None else f64(residual) + f64(x)
    y = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + float(eps)) * (f64(weight) + float(offset))
    return y if residual is None else (y, h)


def _advise(profile, shape=(16, 2048), dtype="bf16", residual=False):
    from ..lab import Candidate

    if residual:
        cands = [Candidate("fused_add", lambda: (plan_fused_add(shape, dtype, residual_dtype="fp32", profile=profile),))]
        notes = [("a residual add precedes the norm: fused_add saves the add kernel and the re-read of the new "
                  "residual (plain alone does not include the add: its row prices the norm only)")]
        return cands, "fused_add", notes
    cands = [Candidate("plain", lambda: (plan_plain(shape, dtype, profile=profile),))]
    notes = ["no residual add before the norm: plain (pass residual=True when one precedes it)"]
    return cands, "plain", notes


def _make(shape, dtype, rng):
    """x, an fp32 residual (production carries it in fp32) and an fp32 weight near 1."""
    from ..lab import normal

    D = shape[-1]
    return normal(shape, dtype, rng), normal(shape, "fp32", rng, 4.0), normal((D,), "fp32", rng, 0.1, 1.0)


def _add_then_plain(x, r, w, **o):
    """The unfused pair: an add (fp32, rounded to the residual's dtype), then plain. The add runs
    in NumPy, so the row's counted cost is plain's alone (an add kernel would add its launch and
    N*D*(bx + 2*br) bytes). The last cast to x's dtype rounds by the call's cast mode."""
    from ..machine import dtypes
    from ..machine.profile import resolve_cast_mode

    new = (r.astype(np.float32) + x.astype(np.float32)).astype(r.dtype)
    mode = resolve_cast_mode(o.get("cast_mode"), o.get("profile"), "rmsnorm.numpy_add+plain")
    return dtypes.from_float32(plain(new, w, **o), dtypes.storage_name(x.dtype), mode)


def _variants():
    """The compared rows. ``deferred`` is not one: it returns the ``[N]`` fp32 scales, not the normed
    rows, and its saving (the normed rows never written, ``N*D*bx`` read back) shows only with the
    next Linear, ``linear.fused_bias(x, fold(weight, W), row_scale=deferred(x))``: a row applying
    the scales in NumPy would price a norm that writes nothing and compare bits no kernel writes."""
    from ..lab import Variant

    return [
        Variant("plain", lambda x, r, w, **o: plain(x, w, **o), lambda x, r, w, **o: reference(x, w)),
        Variant("numpy_add+plain", _add_then_plain, lambda x, r, w, **o: reference(x, w, residual=r)[0]),
        Variant("fused_add", lambda x, r, w, **o: fused_add(x, r, w, **o)[0],
                lambda x, r, w, **o: reference(x, w, residual=r)[0], True),
    ]


def _rmsnorm_tiles(profile, shape, dtype, residual):
    """tune.search's space: 1 to 64 rows per task."""
    from ..lab import Candidate
    from ..lab.spec import pow2

    for t in pow2(1, 64):
        yield Candidate("plain", lambda t=t: (plan_plain(shape, dtype, profile=profile, token_tile=t),),
                        tiles={"token_tile": t}, shape=tuple(shape))
        yield Candidate("fused_add", lambda t=t: (plan_fused_add(shape, dtype, residual_dtype="fp32", profile=profile,
                                                                 token_tile=t),),
                        tiles={"token_tile": t}, shape=tuple(shape))


def _lab_spec():
    from ..lab import Inputs, OpSpec, Seed

    return OpSpec(
        name="rmsnorm",
        # the seed has no rmsnorm rule: plain is the norm it has (rope.rmsnorm's math); fused_add
        # is what production runs (vLLM, the Qwen3 decode layer) when a residual add precedes it
        seed=Seed("plain", "fused_add",
                  "the seed has no rmsnorm rule: plain, its only norm; fused_add when a residual add precedes it"),
        inputs=Inputs(make=_make, default_shape=(16, 2048), help="x shape [..., D], e.g. 16,2048"),
        variants=_variants,
        advise=_advise,
        oracles={"rmsnorm_plain": reference, "rmsnorm_fused_add": reference},
        tiles=_rmsnorm_tiles,
    )


OP = _lab_spec()
