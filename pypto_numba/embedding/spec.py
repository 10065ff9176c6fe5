"""What compare, advise and report need to know about embedding: its OP spec
(pypto_numba/lab/spec.py), the float64 oracle, compare's inputs and the advise rule."""

import numpy as np

from . import plan_gather, plan_index_select


def _reference_embedding(weight, ids):
    """``weight[ids]`` in float64."""
    from ..reference import f64

    return f64(weight)[np.asarray(ids)]


def _lab_inputs(shape, dtype, rng):
    from ..lab import need, normal

    V, H, B, S = need(shape, 4, "V,H,B,S")
    return normal((V, H), dtype, rng), rng.integers(0, V, size=(B, S), dtype=np.int32)


def _embedding(
    profile,
    vocab=151936,
    hidden=2048,
    ids_shape=(8, 2048),
    dtype="bf16",
    ids_dtype="int32",
):
    from ..lab import Candidate

    cands = [
        Candidate("gather", lambda: (plan_gather((vocab, hidden), ids_shape, dtype, ids_dtype, profile=profile),)),
        Candidate("index_select",
                  lambda: (plan_index_select((vocab, hidden), ids_shape, dtype, ids_dtype, profile=profile),)),
    ]
    return cands, None, ()


def _lab_spec():
    from ..lab import Inputs, OpSpec, Seed

    return OpSpec(
        name="embedding",
        seed=Seed("gather", "index_select", "gather takes [B, S] ids without flatten; index_select for 1-D ids"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(32000, 1024, 4, 512),
                      help="V,H,B,S, e.g. 32000,1024,4,512"),
        reference=lambda w, ids, strategy, **o: _reference_embedding(w, ids),
        advise=_embedding,  # named as advise's old rule: its TypeError names it
        oracles={"embedding": _reference_embedding},
    )


OP = _lab_spec()
