"""MoE's public functions: sigmoid_gating, softmax_gating and combine."""

from __future__ import annotations

import numba
import numpy as np

from .. import inputs
from ..errors import ConstraintError, ShapeError
from ..machine import dtypes
from ..machine.profile import resolve_cast_mode
from ..strategy import Launch, register
from .kernels import _combine_kernel, _gating_kernel
from .options import _real_option
from .plans import _plan_gating, plan_combine, plan_sigmoid_gating, plan_softmax_gating


def _scratch(*shape, dtype=np.float32):
    """Per-thread scratch: one slab per numba thread (indexed by numba.get_thread_id())."""
    return np.empty((numba.config.NUMBA_NUM_THREADS,) + shape, dtype)


def _run_gating(variant, logits, top_k, bias, n_group, topk_group, group_score, renormalize,
                routed_scaling_factor, eps, profile, token_tile):
    where = f"moe.{variant}_gating"
    lt = inputs.tensor(logits, "logits", where, min_rank=2, max_rank=2)
    T, E = lt.shape
    bt = None
    if bias is not None:
        bt = inputs.tensor(bias, "bias", where, min_rank=1, max_rank=1)
        if bt.shape != (E,):
            raise ShapeError(f"{where}: bias must have shape ({E},) (one value per expert), got {bt.shape}")
        if not np.all(np.isfinite(dtypes.to_float32(bt.array))):
            raise ConstraintError(f"{where}: bias has non-finite values; the correction bias must be finite")
    scale = _real_option(routed_scaling_factor, "routed_scaling_factor", where)
    eps = _real_option(eps, "eps", where, non_negative=True)
    p = _plan_gating(variant, lt.shape, lt.dtype, top_k=top_k, n_group=n_group, topk_group=topk_group,
                     group_score=group_score, renormalize=renormalize,
                     bias_dtype=None if bt is None else bt.dtype, profile=profile, token_tile=token_tile)
    prm = p.params
    k, g, kg = prm["top_k"], prm["n_group"], prm["topk_group"]
    bias32 = np.zeros(1, np.float32) if bt is None else dtypes.to_float32(bt.array)
    weights = np.empty((T, k), np.float32)
    ids = np.empty((T, k), np.int32)
    with Launch(p, [lt.shape] + ([bt.shape] if bt is not None else [])) as run:
        run.count(
            _gating_kernel(
                lt.kview, bias32, bt is not None, 0 if bt is None else dtypes.itemsize(bt.dtype),
                variant == "softmax", g, kg, group_score == "top2_sum", k, prm["renormalize"],
                np.float32(eps), np.float32(scale), prm["token_tile"], weights, ids,
                _scratch(E), _scratch(E), _scratch(g), _scratch(2 * g), _scratch(kg),
                _scratch(kg, dtype=np.int32), _scratch(g, dtype=np.bool_), _scratch(k),
                _scratch(k, dtype=np.int32), _scratch(E, dtype=np.int32),
            )
        )
        run.workspace(lt.copied_bytes + (bt.copied_bytes if bt is not None else 0))
        bad = np.flatnonzero(ids[:, 0] < 0)
        if bad.size:
            what = "NaN or infinite" if variant == "softmax" else "NaN"
            raise ConstraintError(
                f"{where}: logits row {bad[0]} (of {bad.size} such rows) has {what} values, so its "
                f"experts cannot be ranked; clean the router logits first"
            )
    return weights, ids


@register("moe", "sigmoid_gating", plan=plan_sigmoid_gating,
          summary="sigmoid scores, bias for selection only, grouped top-k (DeepSeek-V3, GLM-4.5)")
def sigmoid_gating(logits, top_k, *, bias=None, n_group=1, topk_group=1, group_score="max",
                   renormalize=True, routed_scaling_factor=1.0, eps=1e-20, profile=None, token_tile=None,
                   cast_mode=None):
    """Sigmoid routing: ``(weights float32[T, top_k], ids int32[T, top_k])``.

    ``s = sigmoid(logits)`` in fp32; experts are picked by ``s + bias`` (``bias[E]`` only steers
    the selection); with ``n_group > 1`` only the experts of the ``topk_group`` best groups (group
    score: ``"max"`` or ``"top2_sum"`` of the selection scores) are eligible. Weights are the
    unbiased ``s`` of the picks, divided by ``sum + eps`` when ``renormalize``, times
    ``routed_scaling_factor``. Ordered by descending selection score, ties to the lower index.
    ``token_tile``: tokens per tile task (default: the profile's ``moe_token_tile``).
    ``cast_mode`` is accepted and has no effect: the weights are fp32 (a bad mode name is still an error).
    """
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, "moe.sigmoid_gating")
    return _run_gating("sigmoid", logits, top_k, bias, n_group, topk_group, group_score, renormalize,
                       routed_scaling_factor, eps, profile, token_tile)


@register("moe", "softmax_gating", plan=plan_softmax_gating,
          summary="softmax scores, top-k, optional renormalise (Mixtral, Qwen-MoE)")
def softmax_gating(logits, top_k, *, renormalize=False, routed_scaling_factor=1.0, n_group=1,
                   topk_group=1, group_score="max", profile=None, token_tile=None, cast_mode=None):
    """Softmax routing: ``(weights float32[T, top_k], ids int32[T, top_k])``.

    ``p = softmax(logits)`` in fp32; the top_k experts by ``p`` (descending, ties to the lower
    index); weights ``p`` of the picks, renormalised to sum 1 when ``renormalize``, times
    ``routed_scaling_factor``. Extra options ``n_group``/``topk_group``/``group_score`` apply the
    group filter of :func:`sigmoid_gating` to ``p`` (PyPTO's moe_gating_topk with softmax).
    ``cast_mode`` is accepted and has no effect: the weights are fp32 (a bad mode name is still an error).
    """
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, "moe.softmax_gating")
    return _run_gating("softmax", logits, top_k, None, n_group, topk_group, group_score, renormalize,
                       routed_scaling_factor, 0.0, profile, token_tile)


@register("moe", "combine", plan=plan_combine, summary="weighted sum of the top-k expert outputs in fp32")
def combine(expert_out, weights, *, profile=None, token_tile=None, h_tile=None, cast_mode=None):
    """``out[t, :] = sum_j weights[t, j] * expert_out[t, j, :]`` in fp32, cast to expert_out's dtype.

    ``expert_out[T, k, H]``, ``weights[T, k]`` (any storage dtype, widened to fp32).
    ``token_tile`` / ``h_tile``: tokens and hidden elements per tile task (profile defaults
    ``moe_token_tile`` / ``moe_combine_h_tile``). ``cast_mode``: the rounding of the one fp32 ->
    bf16/fp16 cast (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint).
    """
    where = "moe.combine"
    xt = inputs.tensor(expert_out, "expert_out", where, min_rank=3, max_rank=3)
    wt = inputs.tensor(weights, "weights", where, min_rank=2, max_rank=2)
    if wt.shape != xt.shape[:2]:
        raise ShapeError(
            f"{where}: weights must have shape {xt.shape[:2]} (expert_out[T, k, H] -> weights[T, k]), "
            f"got {wt.shape}"
        )
    p = plan_combine(xt.shape, xt.dtype, weights_dtype=wt.dtype, profile=profile, token_tile=token_tile,
                     h_tile=h_tile)
    w32 = wt.array if wt.dtype == "fp32" else dtypes.to_float32(wt.array)
    cm = resolve_cast_mode(cast_mode, profile, where, narrows=xt.dtype != "fp32")
    out, out_k = dtypes.empty((xt.shape[0], xt.shape[2]), xt.dtype)
    with Launch(p, [xt.shape, wt.shape]) as run:
        run.count(
            _combine_kernel(xt.kview, w32, dtypes.itemsize(wt.dtype), out_k, p.params["token_tile"],
                            p.params["h_tile"], _scratch(p.params["h_tile"]), cm)
        )
        run.workspace(xt.copied_bytes + wt.copied_bytes)
    return out
