"""repeat_kv: materialise the GQA head expansion (HF ``repeat_kv``) as a copy kernel.

Math: ``kv[B, Hkv, S, D] -> out[B, Hkv*n_rep, S, D]``, ``out[:, h] = kv[:, h // n_rep]``.

Strategy (b = itemsize)::

    repeat_kv.expand_clone   1 vector kernel, tasks B*Hkv*n_rep, GM read B*Hkv*n_rep*S*D*b
                             (each output head reads its source head), GM write the same;
                             the output is new GM memory (workspace when attention uses it)

The alternative that copies nothing is ``attention.*(gqa="head_loop")``: each KV head is loaded
once per tile and reused by its G query heads. At decode (S = 1 per step but the cache is long)
the copy costs ``n_rep`` times the KV cache in GM traffic per call; the attention module counts it.
"""

from __future__ import annotations

import numpy as np
from numba import prange

from . import inputs
from .errors import ConstraintError
from .machine import dtypes
from .machine.jit import kernel
from .machine.memo import memo_plan
from .machine.plan import KernelPlan, Plan, align_elems, vector_tile
from .machine.profile import load_profile, resolve_cast_mode
from .strategy import Launch, register

# one UB staging tile of the copy: 32 KiB (estimate: 2 such buffers double-buffered stay far
# below the 192 KiB UB; the copy is GM-bound, larger tiles buy nothing)
_TILE_BYTES = 32768


@kernel
def _expand_kernel(kv, out, n_rep):
    B, Hkv, S, D = kv.shape
    itemsize = kv.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    for task in prange(B * Hkv * n_rep):
        b = task // (Hkv * n_rep)
        h = task - b * (Hkv * n_rep)
        src = h // n_rep
        for s in range(S):
            for d in range(D):
                out[b, h, s, d] = kv[b, src, s, d]
        tasks += 1
        gm_read += S * D * itemsize
        gm_write += S * D * itemsize
    return tasks, gm_read, gm_write, 0, 0


def expand_kernel_plan(shape, n_rep: int, dtype: str, prof, name: str = "expand_clone") -> KernelPlan:
    """The KernelPlan of one expand_clone launch (also used by attention's gqa="expand_clone")."""
    B, Hkv, S, D = (int(x) for x in shape)
    b = dtypes.itemsize(dtype)
    cols = align_elems(D, dtype, prof)
    rows = max(1, min(S, _TILE_BYTES // (cols * b)))
    buf = vector_tile("kv_ub", (rows, cols), dtype, prof, "repeat_kv.expand_clone")
    nbytes = B * Hkv * n_rep * S * D * b
    return KernelPlan(
        name=name,
        unit="vector",
        tasks=B * Hkv * n_rep,
        buffers=(buf,),
        gm_read_bytes=nbytes,
        gm_write_bytes=nbytes,
        workspace_bytes=nbytes,
    )


@memo_plan
def plan_expand_clone(shape, n_rep, dtype="fp32", *, profile=None) -> Plan:
    """Plan of :func:`expand_clone` for ``kv`` of ``shape`` [B, Hkv, S, D] (no data needed)."""
    where = "repeat_kv.expand_clone"
    prof = load_profile(profile)
    dtype = inputs.storage_dtype(dtype, where)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "kv", where, min_rank=4, max_rank=4)
    inputs.check_size(shape, "kv", where)
    n_rep = inputs.positive_int(n_rep, "n_rep", where, error=ConstraintError)
    B, Hkv, S, D = shape
    # the copy is n_rep times the input: checked here, before anything is allocated
    inputs.check_size((B, Hkv * n_rep, S, D), "output [B, Hkv*n_rep, S, D]", where)
    k = expand_kernel_plan(shape, n_rep, dtype, prof)
    # the public function returns the copy: it is the result, not workspace
    k = KernelPlan(k.name, k.unit, k.tasks, k.buffers, k.gm_read_bytes, k.gm_write_bytes, 0)
    return Plan(op="repeat_kv", strategy="expand_clone", dtype=dtype, profile=prof, kernels=(k,),
                params={"n_rep": n_rep})


def run_expand(kv_kview, n_rep, out_kview):
    """Run the copy kernel (kernel views); returns its counters."""
    return _expand_kernel(kv_kview, out_kview, np.int64(n_rep))


@register("repeat_kv", "expand_clone", plan=plan_expand_clone,
          summary="materialise [B, Hkv*n_rep, S, D] with a copy kernel")
def expand_clone(kv, n_rep, *, profile=None, cast_mode=None):
    """HF ``repeat_kv``: ``[B, Hkv, S, D] -> [B, Hkv*n_rep, S, D]``, head h is input head h // n_rep.
    ``cast_mode`` is accepted and has no effect: the kernel copies bits, it never narrows (a bad mode name is still an error)."""
    where = "repeat_kv.expand_clone"
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, where)
    t = inputs.tensor(kv, "kv", where, min_rank=4, max_rank=4)
    p = plan_expand_clone(t.shape, n_rep, t.dtype, profile=profile)
    n_rep = p.params["n_rep"]
    B, Hkv, S, D = t.shape
    out, out_k = dtypes.empty((B, Hkv * n_rep, S, D), t.dtype)
    with Launch(p, [t.shape]) as run:
        run.count(run_expand(t.kview, n_rep, out_k))
        run.workspace(t.copied_bytes)
    return out


# --- lab spec ---
# What compare, advise and report need to know about repeat_kv (pypto_numba/lab/spec.py).

def _reference_repeat_kv(kv, n_rep: int):
    """``[B, Hkv, S, D] -> [B, Hkv*n_rep, S, D]``; output head h is input head h // n_rep."""
    from .reference import f64

    return np.repeat(f64(kv), n_rep, axis=1)


def _lab_inputs(shape, dtype, rng):
    from .lab import need, normal

    B, Hkv, S, D, n_rep = need(shape, 5, "B,Hkv,S,D,n_rep")
    return normal((B, Hkv, S, D), dtype, rng), n_rep


def _repeat_kv(
    profile,
    batch=1,
    q_heads=32,
    kv_heads=8,
    q_len=1,
    kv_len=4096,
    head_dim=128,
    dtype="bf16",
    strategy="online",
):
    """GQA for an attention strategy: the K/V copy (expand_clone) against the head loop."""
    from .attention import plan_flash, plan_online
    from .errors import PyptoNumbaError
    from .lab import Candidate

    q, k = (batch, q_heads, q_len, head_dim), (batch, kv_heads, kv_len, head_dim)
    plans = {"online": plan_online, "flash": plan_flash}
    if strategy not in plans:
        raise PyptoNumbaError(f"advise repeat_kv: strategy must be one of {tuple(plans)}, got {strategy!r}")
    plan = plans[strategy]
    cands = [
        Candidate("expand_clone", lambda: (plan(q, k, None, dtype, profile=profile, gqa="expand_clone"),), fused=False),
        Candidate("head_loop", lambda: (plan(q, k, None, dtype, profile=profile, gqa="head_loop"),)),
    ]
    seed = "expand_clone" if q_len == 1 else "head_loop"
    return cands, seed, (f"GQA for attention.{strategy}: G = {q_heads // max(kv_heads, 1)} query heads per KV head",)


def _repeat_kv_tiles(profile, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, strategy):
    """tune.search's space: lab.spec.attention_grid's kv x query tiles, for either GQA."""
    from .attention import plan_flash, plan_online
    from .lab import Candidate
    from .lab.spec import attention_grid

    q, k = (batch, q_heads, q_len, head_dim), (batch, kv_heads, kv_len, head_dim)
    plan = {"online": plan_online, "flash": plan_flash}.get(strategy)
    if plan is None:
        return
    for t in attention_grid(q_len, kv_len):
        for gqa in ("expand_clone", "head_loop"):
            yield Candidate(gqa, lambda gqa=gqa, t=t: (plan(q, k, None, dtype, profile=profile, gqa=gqa, **t),),
                            fused=gqa == "head_loop", tiles=t)


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed

    return OpSpec(
        name="repeat_kv",
        seed=Seed("expand_clone", None,
                  "expand_clone at decode (S=1 makes the copy negligible); head-loop reuse for long prefill"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(1, 8, 4096, 128, 2),
                      help="B,Hkv,S,D,n_rep, e.g. 1,8,4096,128,2"),
        reference=lambda kv, n_rep, strategy, **o: _reference_repeat_kv(kv, n_rep),
        advise=_repeat_kv,  # named as advise's old rule: its TypeError names it
        oracles={"repeat_kv": _reference_repeat_kv},
        tiles=_repeat_kv_tiles,
    )


OP = _lab_spec()
