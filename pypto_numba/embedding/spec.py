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


def _embedding_tiles(profile, vocab, hidden, ids_shape, dtype, ids_dtype):
    """tune.search's space: 1 to 64 ids per task x the whole row or a half or quarter of it."""
    from ..lab import Candidate
    from ..lab.spec import grid, pow2

    w = (vocab, hidden)
    h_tiles = (None,) + tuple(hidden // d for d in (2, 4) if hidden % d == 0)
    for kw in grid(row_tile=pow2(1, 64), h_tile=h_tiles):
        for label, plan in (("gather", plan_gather), ("index_select", plan_index_select)):
            yield Candidate(label, lambda plan=plan, kw=kw: (plan(w, ids_shape, dtype, ids_dtype, profile=profile,
                                                                  **kw),),
                            tiles=kw, shape=(vocab, hidden) + tuple(ids_shape))


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
        tiles=_embedding_tiles,
    )


OP = _lab_spec()
