"""gqa="expand_clone": K and V materialised G times by repeat_kv's copy kernel first (counted),
then the strategies run as multi-head attention."""

from __future__ import annotations

from ..machine import dtypes


def expand_plans(B, Hq, Hkv, Skv, D, Dv, dtype, prof, gqa):
    """KernelPlans of the two copies (k, v) when gqa="expand_clone" and G > 1, else ()."""
    from .. import repeat_kv

    if gqa != "expand_clone" or Hq == Hkv:
        return ()
    G = Hq // Hkv
    return (repeat_kv.expand_kernel_plan((B, Hkv, Skv, D), G, dtype, prof, "expand_clone_k"),
            repeat_kv.expand_kernel_plan((B, Hkv, Skv, Dv), G, dtype, prof, "expand_clone_v"))


def run_expand(a, run):
    """-> (k kview, v kview) to run on (``a``: validation.Args): the inputs, or their expanded
    copies (counted in ``run``)."""
    from .. import repeat_kv

    if a.gqa != "expand_clone" or a.G == 1:
        return a.k.kview, a.v.kview
    outs = []
    for t in (a.k, a.v):
        B, Hkv, S, D = t.shape
        _, kview = dtypes.empty((B, Hkv * a.G, S, D), a.dtype)
        counted = repeat_kv.run_expand(t.kview, a.G, kview)
        run.count(counted, workspace_bytes=kview.nbytes)
        outs.append(kview)
    return outs[0], outs[1]

