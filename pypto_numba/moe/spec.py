"""What compare, advise and report need to know about moe: its OP spec (pypto_numba/lab/spec.py),
the float64 oracles, compare's inputs and variants, and the advise rule."""

import numpy as np

from .plans import plan_sigmoid_gating, plan_softmax_gating
from .public import sigmoid_gating, softmax_gating


def _reference_topk_desc(scores, k: int):
    """Indices of the k largest per row, descending, ties toward the lower index."""
    order = np.argsort(-scores, axis=-1, kind="stable")
    return order[..., :k]


def _reference_group_filter(sel, n_group, topk_group, group_score):
    """Selection scores with the experts outside the best ``topk_group`` groups set to -inf."""
    if n_group <= 1:
        return sel
    T, E = sel.shape
    g = sel.reshape(T, n_group, E // n_group)
    if group_score == "max":
        gs = g.max(axis=-1)
    else:
        gs = np.sort(g, axis=-1)[..., -2:].sum(axis=-1)
    keep = _reference_topk_desc(gs, topk_group)
    eligible = np.zeros((T, n_group), dtype=bool)
    np.put_along_axis(eligible, keep, True, axis=-1)
    eligible = np.repeat(eligible, E // n_group, axis=-1)
    return np.where(eligible, sel, -np.inf)


def _reference_sigmoid_gating(
    logits,
    top_k,
    bias=None,
    n_group=1,
    topk_group=1,
    group_score="max",
    renormalize=True,
    routed_scaling_factor=1.0,
    eps=1e-20,
):
    """DeepSeek-V3 / GLM-4.5 routing. Returns (weights float64[T, k], ids int64[T, k])."""
    from ..reference import f64

    s = 1.0 / (1.0 + np.exp(-f64(logits)))
    sel = s + (f64(bias)[None, :] if bias is not None else 0.0)
    sel = _reference_group_filter(sel, n_group, topk_group, group_score)
    ids = _reference_topk_desc(sel, top_k)
    w = np.take_along_axis(s, ids, axis=-1)
    if renormalize:
        w = w / (w.sum(axis=-1, keepdims=True) + eps)
    return w * routed_scaling_factor, ids


def _reference_softmax_gating(
    logits,
    top_k,
    renormalize=False,
    routed_scaling_factor=1.0,
    n_group=1,
    topk_group=1,
    group_score="max",
):
    """Mixtral / Qwen-MoE routing. Returns (weights float64[T, k], ids int64[T, k]).

    ``n_group``/``topk_group``/``group_score``: the group filter of the sigmoid gating applied to
    the probabilities (PyPTO's moe_gating_topk with norm_type softmax).
    """
    from ..reference import f64

    x = f64(logits)
    p = np.exp(x - x.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    ids = _reference_topk_desc(_reference_group_filter(p, n_group, topk_group, group_score), top_k)
    w = np.take_along_axis(p, ids, axis=-1)
    if renormalize:
        w = w / w.sum(axis=-1, keepdims=True)
    return w * routed_scaling_factor, ids


def _reference_combine(expert_out, weights):
    """``out[t, :] = sum_k weights[t, k] * expert_out[t, k, :]``."""
    from ..reference import f64

    return np.einsum("tkh,tk->th", f64(expert_out), f64(weights))


# compare: DeepSeek-V3 routing and a Qwen3-MoE style softmax router on the same logits
_LAB_DSV3 = dict(top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
_LAB_SOFTMAX = dict(top_k=8, renormalize=True)


def _lab_inputs(shape, dtype, rng):
    from ..lab import need, normal

    T, E = need(shape, 2, "T,E")
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    return normal((T, E), dtype, rng), bias


def _mirror_weights(logits, ids, router, renormalize, scale, eps):
    """The gating kernels' weights rounded where they hold fp32 (lab/spec.py mirrors): the scores
    (sigmoid, or softmax's exps, their sum and quotient), the picks' sum + eps, the quotient and
    the scaled weight; the ids are the reference's."""
    from ..lab.spec import to_storage
    from ..reference import f64

    r = lambda a: to_storage(a, "fp32")  # noqa: E731
    x = f64(logits)
    if router == "softmax":
        p = r(np.exp(x - x.max(axis=-1, keepdims=True)))
        s = r(p / r(p.sum(axis=-1, keepdims=True)))
    else:
        s = r(1.0 / (1.0 + np.exp(-x)))
    w = np.take_along_axis(s, ids, axis=-1)
    if renormalize:
        w = r(w / r(r(w.sum(axis=-1, keepdims=True)) + eps))
    return r(w * np.float32(scale))


def _selection_scores(logits, bias, router):
    """The float64 scores the kernels rank (sigmoid + bias, or softmax), for compare's tie-aware
    id check (precision.py). Not group-filtered: tied group scores pick other groups, and an
    expert of such a group is a legal pick when its score ties the reference's."""
    from ..reference import f64

    x = f64(logits)
    if router == "softmax":
        p = np.exp(x - x.max(axis=-1, keepdims=True))
        sel = p / p.sum(axis=-1, keepdims=True)
    else:
        sel = 1.0 / (1.0 + np.exp(-x)) + (f64(bias)[None, :] if bias is not None else 0.0)
    return sel


def _fp32_weights(reference, router, options):
    """A gating reference that returns ``(weights, ids, selection scores)``: its mirror rounds the
    weights as the kernels do in fp32 (:func:`_mirror_weights`), whatever the scores' storage dtype
    (the weights are fp32), and keeps the ids; the scores make compare's id check tie-aware."""

    def ref(x, b, mirror=False, **o):
        w, ids = reference(x, b)
        kw = options(x.shape[1])
        sel = _selection_scores(x, b if router == "sigmoid" else None, router)
        if not mirror:
            return w, ids, sel
        eps = 1e-20 if router == "sigmoid" else 0.0
        return _mirror_weights(x, ids, router, kw.get("renormalize", router == "sigmoid"),
                               kw.get("routed_scaling_factor", 1.0), eps), ids, sel

    ref.mirrors = True
    return ref


def _lab_variants():
    from ..lab import Variant

    groups = lambda E: dict(_LAB_DSV3) if E % 8 == 0 and E // 8 * 4 >= 8 else dict(top_k=min(8, E))  # noqa: E731
    softmax = lambda E: dict(_LAB_SOFTMAX, top_k=min(8, E))  # noqa: E731
    return [
        Variant("sigmoid_gating", lambda x, b, **o: sigmoid_gating(x, bias=b, **groups(x.shape[1]), **o),
                _fp32_weights(lambda x, b: _reference_sigmoid_gating(x, bias=b, **groups(x.shape[1])), "sigmoid",
                              groups), True),
        Variant("softmax_gating", lambda x, b, **o: softmax_gating(x, **softmax(x.shape[1]), **o),
                _fp32_weights(lambda x, b: _reference_softmax_gating(x, **softmax(x.shape[1])), "softmax", softmax)),
    ]


def _moe(
    profile,
    tokens=4096,
    experts=256,
    top_k=8,
    n_group=8,
    topk_group=4,
    dtype="fp32",
    router="sigmoid",
):
    from ..advise import price
    from ..lab import Candidate

    shape = (tokens, experts)
    sig = Candidate("sigmoid_gating", lambda: (plan_sigmoid_gating(
        shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group, bias_dtype="fp32", profile=profile),))
    soft = Candidate("softmax_gating", lambda: (plan_softmax_gating(shape, dtype, top_k=top_k, profile=profile),))
    if router == "softmax":
        return [soft], "softmax_gating", ("the model's router is softmax (router='softmax')",)
    note = ("the router is the model's choice (router='sigmoid'); softmax gating is priced for reference: "
            + price(soft))
    return [sig], "sigmoid_gating", (note,)


def _moe_tiles(profile, tokens, experts, top_k, n_group, topk_group, dtype, router):
    """tune.search's space: 8 to 256 tokens per task."""
    from ..lab import Candidate
    from ..lab.spec import pow2

    shape = (tokens, experts)
    for t in pow2(8, 256):
        yield Candidate("sigmoid_gating", lambda t=t: (plan_sigmoid_gating(
            shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group, bias_dtype="fp32", profile=profile,
            token_tile=t),), tiles={"token_tile": t}, shape=shape)
        yield Candidate("softmax_gating", lambda t=t: (plan_softmax_gating(
            shape, dtype, top_k=top_k, profile=profile, token_tile=t),), tiles={"token_tile": t}, shape=shape)


def _lab_spec():
    from ..lab import Inputs, OpSpec, Seed, Tolerance

    return OpSpec(
        name="moe",
        seed=Seed("sigmoid_gating", "softmax_gating",
                  "sigmoid gating (GLM, DeepSeek); softmax when the model's router requires it"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(512, 256),
                      help="T,E, e.g. 512,256 (DeepSeek-V3 grouped routing vs a softmax router)"),
        variants=_lab_variants,
        outputs=lambda result: result,
        tolerance=Tolerance(fp32=(5e-3, 5e-3), half=(5e-3, 5e-3)),  # npu-facts 1.3
        advise=_moe,  # named as advise's old rule: its TypeError names it
        tiles=_moe_tiles,
        oracles={
            "moe_sigmoid_gating": _reference_sigmoid_gating,
            "moe_softmax_gating": _reference_softmax_gating,
            "moe_combine": _reference_combine,
            "moe_group_filter": _reference_group_filter,  # the eligible experts of grouped top-k
        },
    )


OP = _lab_spec()
