"""What compare, advise and report need to know about swiglu: its OP spec (pypto_numba/lab/spec.py),
the float64 oracle and the mirrors, compare's inputs, the advise rule and tune.search's space."""

import numpy as np

from . import fused, plan_epilogue, plan_fused, plan_separate, separate


def reference(x, up=None, limit=None):
    """Float64 ``silu(gate) * up`` (gate and up the halves of ``x`` when ``up`` is None), the clamp
    at the limit as the kernels hold it (fp32); ``silu(-inf) = 0``."""
    from scipy import special

    from ..reference import f64

    v = f64(x)
    if up is None:
        half = v.shape[-1] // 2
        g, u = v[..., :half], v[..., half:]
    else:
        g, u = v, f64(up)
    if limit is not None:
        lim = float(np.float32(limit))
        g = np.minimum(g, lim)  # NaN stays NaN
        u = np.clip(u, -lim, lim)
    with np.errstate(invalid="ignore", over="ignore"):
        h = np.where(g == -np.inf, 0.0, g * special.expit(g))
        return h * u


def _mirror(gate, up, limit=None, separate=False):
    """The mirror of a strategy on (gate, up): ``separate`` rounds silu(gate) to the storage dtype
    (its GM intermediate) before the product; the others round once (lab/spec.py mirrors)."""
    from ..lab.spec import storage_of, to_storage

    dt = storage_of(gate)
    if not separate:
        return to_storage(reference(gate, up, limit), dt)
    lim = None if limit is None else float(np.float32(limit))
    h = to_storage(reference(gate, np.ones(np.shape(gate)), None if lim is None else lim), dt)
    from ..reference import f64

    u = f64(up) if lim is None else np.clip(f64(up), -lim, lim)
    return to_storage(h * u, dt)


def _advise(profile, tokens=16, intermediate=6144, dtype="bf16", limit=None, hidden=None):
    from ..lab import Candidate
    from ..linear import plan_fused_bias

    shape = (tokens, intermediate)
    sep = lambda: (plan_separate(shape, dtype, limit=limit, profile=profile),)
    fus = lambda: (plan_fused(shape, dtype, limit=limit, profile=profile),)
    notes = ["separate writes silu(gate) to GM and reads it back: one kernel and 2*tokens*intermediate*b GM bytes "
             "more than fused, and in bf16/fp16 one more rounding"]
    if hidden is None:
        notes.append("the activation alone (pass hidden= to price the gate/up projections and swiglu.epilogue)")
        return [Candidate("separate", sep, fused=False), Candidate("fused", fus)], "fused", notes
    xs, ws = (tokens, hidden), (intermediate, hidden)
    proj = lambda: 2 * (plan_fused_bias(xs, ws, dtype, bias=False, profile=profile),)
    cands = [Candidate("separate", lambda: proj() + sep(), fused=False),
             Candidate("fused", lambda: proj() + fus(), fused=False),
             Candidate("epilogue", lambda: (plan_epilogue(xs, ws, dtype, limit=limit, profile=profile),))]
    notes.append(f"with hidden={hidden}: separate and fused include the two projections (linear.fused_bias, "
                 "gate and up written to GM); epilogue keeps both in L0C and writes only the result")
    return cands, "fused", notes


def _make(shape, dtype, rng):
    """gate (spread over the sigmoid's range) and up, of one shape."""
    from ..lab import normal

    return normal(shape, dtype, rng, 3.0), normal(shape, dtype, rng)


def _variants():
    """compare's rows on (gate, up): separate and fused (epilogue takes x and the weights instead)."""
    from ..lab import Variant

    from ..lab.spec import mirrors

    ref = lambda gate, up, limit=None, mirror=False, sep=False, **o: (  # noqa: E731
        _mirror(gate, up, limit, sep) if mirror else reference(gate, up, limit))
    return [Variant("separate", separate, mirrors(lambda *a, **o: ref(*a, sep=True, **o))),
            Variant("fused", fused, mirrors(ref), True)]


def _swiglu_tiles(profile, tokens, intermediate, dtype, limit, hidden):
    """tune.search's space: vector tiles of 512 to 32768 elements (the projections, with hidden=,
    keep linear's default tiles); epilogue's cube L1 tiles as linear's search."""
    from ..lab import Candidate
    from ..lab.spec import elems, pow2
    from ..linear import plan_fused_bias

    shape = (tokens, intermediate)
    xs, ws = (tokens, hidden), (intermediate, hidden)
    proj = lambda: () if hidden is None else 2 * (plan_fused_bias(xs, ws, dtype, bias=False, profile=profile),)  # noqa: E731
    for tile in elems(512, 32768):
        for label, plan in (("separate", plan_separate), ("fused", plan_fused)):
            yield Candidate(label, lambda plan=plan, tile=tile: proj() + (plan(shape, dtype, limit=limit,
                                                                               profile=profile, tile=tile),),
                            fused=label == "fused" and hidden is None, tiles={"tile": tile}, shape=shape)
    if hidden is None:
        return
    for m1 in pow2(16, 256):
        for n1 in pow2(32, 256):
            for k1 in pow2(64, 256):
                t = ((min(m1, 128), m1), (min(k1, 128 if m1 <= 32 else 64), k1), (min(n1, 128), n1))
                yield Candidate("epilogue", lambda t=t: (plan_epilogue(xs, ws, dtype, limit=limit, profile=profile,
                                                                       cube_tiles=t),),
                                tiles={"cube_tiles": t})


def _lab_spec():
    from ..lab import Inputs, OpSpec, Seed

    return OpSpec(
        name="swiglu",
        seed=Seed("fused", "separate",
                  "the seed's SwiGLU row: silu(gate) * up as one expression, mul(mul(gate, sigmoid(gate)), up) "
                  "(npu-facts 1.2); fused runs it as one vector kernel, separate as a silu and a mul kernel"),
        inputs=Inputs(make=_make, default_shape=(64, 6144), help="gate/up shape [..., I], e.g. 64,6144"),
        variants=_variants,
        advise=_advise,
        oracles={"swiglu": reference},
        tiles=_swiglu_tiles,
    )


OP = _lab_spec()
