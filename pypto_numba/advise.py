"""``advise``: pick a strategy for a scenario from plans alone (no data, instant for any shape).

The seed's four principles, applied in order:

1. constraints first: a strategy whose plan does not fit the profile's buffers (TileError) or
   breaks a PyPTO rule (ConstraintError) is rejected, with the plan's message;
2. kernel count and GM traffic: the survivors are ranked by the roofline NPU-time estimate of
   their plans (launches + max(GM bytes / bandwidth, FLOPs / throughput), see machine/cost.py);
3. decode vs prefill: the scenario's shapes (q_len, kv_len, tokens) drive the plans, so the
   decision changes with them where the numbers say so;
4. a fused kernel over a composition: when two candidates are within ``TIE`` of each other, the
   one with fewer kernels (then fewer GM bytes, then the fused one) wins; a complete tie keeps
   the seed's choice.

Semantic choices that are not the advisor's to make (the model's router, RoPE layout, tanh vs
erf when exact GELU is required) are scenario arguments; the advice still prices the alternative.
Where the numbers contradict the seed's recommendation, the advice says so.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

from .errors import ConstraintError, PyptoNumbaError, TileError
from .machine.cost import Cost
from .machine.profile import load_profile
from .strategy import SEED

TIE = 0.05  # candidates within 5 % of estimated NPU time are a tie, decided by principle 4


@dataclasses.dataclass(frozen=True)
class Candidate:
    label: str
    plans: Callable  # () -> tuple of Plans (several for a composition)
    fused: bool = True


@dataclasses.dataclass
class Advice:
    op: str
    scenario: dict
    profile: str
    chosen: str
    reasons: list
    rejected: dict  # label -> reason
    ranking: list  # (label, estimated seconds, bound, kernels, GM bytes, workspace)
    seed: str
    agrees_with_seed: bool

    def __str__(self):
        lines = [f"advise {self.op} {self.scenario} on {self.profile}: use {self.chosen}"]
        lines += [f"  - {r}" for r in self.reasons]
        for label, reason in self.rejected.items():
            lines.append(f"  x {label}: {reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def total(plans) -> tuple:
    cost = sum((p.cost for p in plans), Cost())
    seconds = 0.0
    bound = None
    worst = -1.0
    for p in plans:
        est = p.estimate()
        seconds += est.seconds
        if est.seconds > worst:
            worst, bound = est.seconds, est.bound
    return cost, seconds, bound


def _decide(op: str, scenario: dict, profile, candidates, seed_choice: str = None, notes=()) -> Advice:
    prof = load_profile(profile)
    rejected, ranked = {}, []
    for cand in candidates:
        try:
            plans = tuple(cand.plans())
        except (TileError, ConstraintError) as exc:
            rejected[cand.label] = f"{type(exc).__name__}: {exc}"
            continue
        cost, seconds, bound = total(plans)
        ranked.append((cand, cost, seconds, bound))
    if not ranked:
        # every candidate broke a PyPTO constraint (e.g. top_k out of range): that is the error;
        # any buffer that does not fit makes it a TileError
        kind = ConstraintError if all(v.startswith("ConstraintError") for v in rejected.values()) else TileError
        raise kind(f"advise {op}: no strategy fits {prof.name} for {scenario}: "
                   + "; ".join(f"{k}: {v}" for k, v in rejected.items()))
    ranked.sort(key=lambda r: r[2])
    best_time = ranked[0][2]
    ties = [r for r in ranked if r[2] <= best_time * (1 + TIE)]
    seed = seed_choice or SEED[op][0]
    # full ties (same time, kernels, GM bytes, fusion) keep the seed's choice
    ties.sort(key=lambda r: (r[1].kernels, r[1].gm_bytes, not r[0].fused, r[0].label != seed, r[2]))
    chosen = ties[0]
    cand, cost, seconds, bound = chosen
    reasons = [
        f"fits {prof.name}: UB peak {cost.ub_peak_bytes} B of {prof.ub_bytes} B, L1 peak "
        f"{cost.l1_peak_bytes} B, L0C peak {cost.l0c_peak_bytes} B",
        f"estimated NPU time {seconds * 1e6:.1f} us ({bound}-bound): {cost.kernels} kernel(s), "
        f"GM {cost.gm_read_bytes} B read + {cost.gm_write_bytes} B written, workspace {cost.workspace_bytes} B",
    ]
    for other in ranked:
        if other is chosen:
            continue
        o_cand, o_cost, o_sec, o_bound = other
        rel = o_sec / seconds if seconds else float("inf")
        why = (f"{o_cand.label}: {o_sec * 1e6:.1f} us ({rel:.2f}x), {o_cost.kernels} kernel(s), "
               f"GM {o_cost.gm_bytes} B, workspace {o_cost.workspace_bytes} B")
        if other in ties:
            why += " -- a tie on time, decided by kernel count / GM traffic / fusion"
        reasons.append(why)
    reasons += list(notes)
    agrees = cand.label == seed
    if not agrees:
        reasons.append(f"the seed recommends {seed} here; the plans' numbers above favour {cand.label}")
    ranking = [(c.label, s, b, co.kernels, co.gm_bytes, co.workspace_bytes) for c, co, s, b in ranked]
    return Advice(op=op, scenario=dict(scenario), profile=prof.name, chosen=cand.label, reasons=reasons,
                  rejected=rejected, ranking=ranking, seed=seed, agrees_with_seed=agrees)


# --- per-op scenarios ---------------------------------------------------------------------------

def _gelu(profile, shape=(8, 11008), dtype="bf16", exact=False):
    from . import gelu

    cands = [Candidate("erf", lambda: (gelu.plan_erf(shape, dtype, profile=profile),))]
    if not exact:
        cands.insert(0, Candidate("tanh", lambda: (gelu.plan_tanh(shape, dtype, profile=profile),)))
    notes = ["exact=True (precision first) leaves only erf"] if exact else [
        "tanh and erf differ by at most ~3e-4 absolute (the tanh approximation's error), below one bf16 ulp "
        "for |GELU(x)| > 0.08; pass exact=True when erf itself is required"]
    return cands, None, notes


def _mean(profile, shape=(8, 4096), dim=-1, dtype="bf16"):
    from . import mean

    return [Candidate("sum_div", lambda: (mean.plan_sum_div(shape, dtype, dim=dim, profile=profile),))], None, ()


def _rope(profile, tokens=128, heads=16, head_dim=128, rot_dim=None, dtype="bf16", adjacent_rmsnorm=True,
          layout="split_half"):
    from . import rope

    x = (tokens, heads, head_dim)
    cs = (tokens, rot_dim or head_dim)
    if layout == "interleaved":
        return [Candidate("interleaved", lambda: (rope.plan_interleaved(x, cs, dtype, profile=profile),))], "interleaved", ()
    if not adjacent_rmsnorm:
        return [Candidate("standard", lambda: (rope.plan_standard(x, cs, dtype, profile=profile),))], "standard", ()
    cands = [
        Candidate("rmsnorm+standard", lambda: (rope.plan_rmsnorm(x, dtype, profile=profile),
                                               rope.plan_standard(x, cs, dtype, profile=profile)), fused=False),
        Candidate("fused_rmsnorm", lambda: (rope.plan_fused_rmsnorm(x, cs, dtype, profile=profile),)),
    ]
    return cands, "fused_rmsnorm", ("RMSNorm directly precedes RoPE (adjacent_rmsnorm=True): the seed's case for fusion",)


def _attention_shapes(batch, q_heads, kv_heads, q_len, kv_len, head_dim):
    return (batch, q_heads, q_len, head_dim), (batch, kv_heads, kv_len, head_dim)


def _attention(profile, batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128, dtype="bf16",
               causal=False, gqa="head_loop"):
    from .attention import plan_flash, plan_online, plan_standard

    q, k = _attention_shapes(batch, q_heads, kv_heads, q_len, kv_len, head_dim)
    kw = dict(profile=profile, causal=causal, gqa=gqa)
    cands = [
        Candidate("standard", lambda: (plan_standard(q, k, None, dtype, **kw),), fused=False),
        Candidate("online", lambda: (plan_online(q, k, None, dtype, **kw),), fused=False),
        Candidate("flash", lambda: (plan_flash(q, k, None, dtype, **kw),)),
    ]
    phase = "decode" if q_len == 1 else "prefill"
    return cands, ("online" if phase == "decode" else "flash"), (f"{phase} scenario (q_len={q_len}, kv_len={kv_len})",)


def _repeat_kv(profile, batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=4096, head_dim=128, dtype="bf16",
               strategy="online"):
    from .attention import plan_flash, plan_online

    q, k = _attention_shapes(batch, q_heads, kv_heads, q_len, kv_len, head_dim)
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


def _moe(profile, tokens=4096, experts=256, top_k=8, n_group=8, topk_group=4, dtype="fp32", router="sigmoid"):
    from . import moe

    shape = (tokens, experts)
    sig = Candidate("sigmoid_gating", lambda: (moe.plan_sigmoid_gating(
        shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group, bias_dtype="fp32", profile=profile),))
    soft = Candidate("softmax_gating", lambda: (moe.plan_softmax_gating(shape, dtype, top_k=top_k, profile=profile),))
    if router == "softmax":
        return [soft], "softmax_gating", ("the model's router is softmax (router='softmax')",)
    note = ("the router is the model's choice (router='sigmoid'); softmax gating is priced for reference: "
            + _price(soft))
    return [sig], "sigmoid_gating", (note,)


def _price(cand) -> str:
    try:
        cost, seconds, bound = total(cand.plans())
    except (TileError, ConstraintError) as exc:
        return f"{cand.label} would be ruled out: {exc}"
    return f"{cand.label} {seconds * 1e6:.1f} us ({bound}-bound), GM {cost.gm_bytes} B"


def _linear(profile, tokens=16, in_features=4096, out_features=4096, dtype="bf16", bias=True):
    from . import linear

    x, w = (tokens, in_features), (out_features, in_features)
    cands = [
        Candidate("matmul_add", lambda: (linear.plan_matmul_add(x, w, dtype, bias=bias, profile=profile),), fused=False),
        Candidate("fused_bias", lambda: (linear.plan_fused_bias(x, w, dtype, bias=bias, profile=profile),)),
    ]
    return cands, None, ()


def _embedding(profile, vocab=151936, hidden=2048, ids_shape=(8, 2048), dtype="bf16", ids_dtype="int32"):
    from . import embedding

    cands = [
        Candidate("gather", lambda: (embedding.plan_gather((vocab, hidden), ids_shape, dtype, ids_dtype, profile=profile),)),
        Candidate("index_select", lambda: (embedding.plan_index_select((vocab, hidden), ids_shape, dtype, ids_dtype,
                                                                       profile=profile),)),
    ]
    return cands, None, ()


SCENARIOS = {
    "gelu": _gelu,
    "mean": _mean,
    "rope": _rope,
    "attention": _attention,
    "repeat_kv": _repeat_kv,
    "moe": _moe,
    "linear": _linear,
    "embedding": _embedding,
}


def advise(op: str, profile=None, **scenario) -> Advice:
    """Advice for ``op`` in ``scenario`` (keywords of the op's scenario; see :data:`SCENARIOS`)."""
    if op not in SCENARIOS:
        raise PyptoNumbaError(f"advise: unknown op {op!r}; known: {', '.join(SCENARIOS)}")
    try:
        cands, seed, notes = SCENARIOS[op](profile, **scenario)
    except TypeError as exc:
        import inspect

        params = [p for p in inspect.signature(SCENARIOS[op]).parameters if p != "profile"]
        raise PyptoNumbaError(f"advise {op}: {exc}; scenario keywords are {', '.join(params)}") from None
    return _decide(op, scenario, profile, cands, seed, notes)
