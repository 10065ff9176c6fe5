"""Pick a layer's strategy combination from plans alone: every combination is planned and the one
with the smallest estimated NPU time wins; per step, what the choice saves over the other choices.

``rmsnorm`` is not searched: both of the layer's norms follow a residual add, so it is the seed's
``fused_add`` (``plain`` would leave the add to the host, which no op prices)."""

from __future__ import annotations

import itertools

from .config import resolve
from .moe_block import MOE_CHOICES, plan_moe
from .qwen3 import CHOICES, SEED_PICKS, plan_qwen3


def advise_layer(model="qwen3-1.7b", phase="decode", batch=16, context=4096, dtype="bf16", profile=None):
    """-> {"chosen": strategies, "seconds": its estimate, "seed_seconds": the seed's picks' estimate,
    "steps": [{"step", "choice", "seconds", "alternatives": {choice: seconds}}]}."""
    cfg = resolve(model)
    moe = cfg.is_moe
    choices = MOE_CHOICES if moe else CHOICES

    def plan(s):
        if moe:
            return plan_moe(cfg, phase, batch, context, dtype, s, profile)
        return plan_qwen3(cfg, phase, batch, context, dtype, s, profile)

    keys = [k for k in choices if k != "rmsnorm"]
    timed = {}
    for combo in itertools.product(*(choices[k][1] for k in keys)):
        s = dict(zip(keys, combo)) | ({} if moe else {"rmsnorm": SEED_PICKS["rmsnorm"]})
        timed[combo] = plan(s).estimate(profile).seconds
    best = min(timed, key=timed.get)
    chosen = dict(zip(keys, best))
    if not moe:
        chosen["rmsnorm"] = SEED_PICKS["rmsnorm"]
    seed = tuple(SEED_PICKS[k] for k in keys)
    steps = []
    for i, k in enumerate(keys):
        alts = {c: timed[best[:i] + (c,) + best[i + 1:]] for c in choices[k][1]}
        steps.append({"step": k, "choice": chosen[k], "seconds": timed[best], "alternatives": alts})
    return {"model": cfg.name, "phase": phase, "chosen": chosen, "seconds": timed[best],
            "seed": dict(zip(keys, seed)), "seed_seconds": timed[seed], "steps": steps}


def advice_text(a) -> str:
    lines = [f"{a['model']} {a['phase']}: chosen {a['chosen']} -> {a['seconds'] * 1e6:.1f} us "
             f"(seed's picks {a['seed_seconds'] * 1e6:.1f} us)"]
    for row in a["steps"]:
        others = ", ".join(f"{c} +{(t - row['seconds']) * 1e6:.1f} us" for c, t in row["alternatives"].items()
                           if c != row["choice"])
        lines.append(f"  {row['step']}: {row['choice']}" + (f" (saves over {others})" if others else ""))
    return "\n".join(lines)
