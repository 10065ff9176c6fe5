"""MoE plans: the UB tiles of a gating or combine task and the counted cost."""

from __future__ import annotations

from .. import inputs
from ..errors import TileError
from ..machine import dtypes
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from ..machine.profile import load_profile
from .kernels import COMBINE_OPS, SIGMOID_OPS, SOFTMAX_OPS
from .options import _bool_option, _dtype_name, _routing_options


def _gating_ops_per_row(softmax, E, dtype, use_bias, n_group, top2, top_k, renormalize):
    ops = (E if dtypes.itemsize(dtype) == 2 else 0) + (SOFTMAX_OPS if softmax else SIGMOID_OPS) * E
    ops += E if use_bias else 0
    if n_group > 1:
        ops += (2 * E + n_group if top2 else E) + n_group + E  # group score, group top-k, mask
    ops += E + 2 * top_k + (2 * top_k + 1 if renormalize else 0)  # top-k, gather, scale, renorm
    return ops


def _gating_mix(softmax, T, E, dtype, use_bias, n_group, top2, top_k, renormalize):
    """The gating's vector work by op kind (machine/isa.py): the sigmoid as its exp / add / div
    sequence or the softmax as max, sub, exp, sum, div per logit; the rest (bias, groups, top-k,
    gather, renormalisation) as generic element-ops."""
    n = T * E
    if softmax:
        main = (("TROWMAX", "fp32", n), ("TSUB", "fp32", n), ("TEXP", "fp32", n), ("TROWSUM", "fp32", n),
                ("TDIV", "fp32", n))
    else:
        main = (("sigmoid", "fp32", n),)
    main_ops = (SOFTMAX_OPS if softmax else SIGMOID_OPS) * n
    cast = n if dtypes.itemsize(dtype) == 2 else 0
    rest = T * _gating_ops_per_row(softmax, E, dtype, use_bias, n_group, top2, top_k, renormalize) - main_ops - cast
    return main + ((("TCVT", dtype, cast),) if cast else ()) + (("TMUL", "fp32", rest),)


@memo_plan
def _plan_gating(variant, shape, dtype, *, top_k, n_group, topk_group, group_score, renormalize,
                 bias_dtype, profile, token_tile) -> Plan:
    prof = load_profile(profile)
    where = f"moe.{variant}_gating"
    softmax = variant == "softmax"
    dtype = _dtype_name(dtype, where)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "logits", where, min_rank=2, max_rank=2)
    inputs.check_size(shape, "logits", where)
    T, E = shape
    top_k, n_group, topk_group, top2 = _routing_options(where, E, top_k, n_group, topk_group, group_score)
    renormalize = _bool_option(renormalize, "renormalize", where)
    use_bias = bias_dtype is not None
    if use_bias:
        bias_dtype = _dtype_name(bias_dtype, where, "bias dtype")
    tile = prof.tile("moe_token_tile") if token_tile is None else inputs.positive_int(token_tile, "token_tile", where)

    e32 = align_elems(E, "fp32", prof)  # fp32 work rows of the expert axis
    # MERGE_SORT top-k (npu-facts 4.2): the sorted row is the whole (aligned) expert axis in fp32;
    # no token tile changes that, so this is checked first
    if not e32 * 4 < prof.topk_tile_max_bytes:
        raise TileError(
            f"{where}: the top-k tile row of E={E} experts is {e32} x 4 B = {e32 * 4} B, which breaks "
            f"the MERGE_SORT limit tile[-1]*4 < {prof.topk_tile_max_bytes} B of {prof.name}; "
            f"E must be <= {(prof.topk_tile_max_bytes - 1) // 4 // 8 * 8} experts"
        )
    grouped = n_group > 1
    select = use_bias or grouped  # selection scores need their own tile (s stays for the weights)
    reduces = softmax or grouped  # row max/sum or group scores reduce a [tile, E] fp32 tile
    g32 = align_elems(n_group, "fp32", prof)
    k32 = align_elems(top_k, "fp32", prof)
    per_row = (align_elems(E, dtype, prof) * dtypes.itemsize(dtype) + e32 * 4 * (2 if select else 1)
               + (2 * g32 * 4 if grouped else 0) + 3 * k32 * 4)
    fixed = e32 * 4 if use_bias else 0
    max_tile = (prof.vec_safe_bytes - fixed) // per_row
    if reduces:
        max_tile = min(max_tile, prof.reduce_tile_max_bytes // (e32 * 4))
    if max_tile < 1:
        raise TileError(
            f"{where}: E={E} experts do not fit {prof.name}'s compiler-safe Vec limit ({prof.vec_safe_bytes} B of UB) even with "
            f"token_tile=1 ({per_row + fixed} B per token)"
        )
    hint = f"use token_tile <= {max_tile}"
    buffers = [
        vector_tile("logits_ub", (tile, align_elems(E, dtype, prof)), dtype, prof, where, hint),
        vector_tile("scores_ub", (tile, e32), "fp32", prof, where, hint),
    ]
    if select:
        buffers.append(vector_tile("select_ub", (tile, e32), "fp32", prof, where, hint))
    if reduces:
        reduce_tile(buffers[-1], prof, where, hint)
    if use_bias:
        buffers.append(vector_tile("bias_ub", (1, e32), "fp32", prof, where, hint))
    if grouped:
        buffers.append(vector_tile("group_score_ub", (tile, g32), "fp32", prof, where, hint))
        buffers.append(vector_tile("group_mask_ub", (tile, g32), "fp32", prof, where, hint))
    buffers += [
        vector_tile("topk_val_ub", (tile, k32), "fp32", prof, where, hint),
        vector_tile("topk_idx_ub", (tile, k32), "int32", prof, where, hint),
        vector_tile("weights_ub", (tile, k32), "fp32", prof, where, hint),
    ]
    tasks = -(-T // tile)
    bias_bytes = E * dtypes.itemsize(bias_dtype) if use_bias else 0
    k = KernelPlan(
        name=f"moe_{variant}_gating",
        unit="vector",
        tasks=tasks,
        buffers=tuple(buffers),
        gm_read_bytes=T * E * dtypes.itemsize(dtype) + tasks * bias_bytes,
        gm_write_bytes=T * top_k * 8,
        vector_ops=T * _gating_ops_per_row(softmax, E, dtype, use_bias, n_group, top2, top_k, renormalize),
        gm_unique_bytes=T * E * dtypes.itemsize(dtype) + bias_bytes,  # the bias row is re-read per task
        vector_mix=_gating_mix(softmax, T, E, dtype, use_bias, n_group, top2, top_k, renormalize),
        vector_tile_elems=min(tile, T) * e32,
        vector_cols=e32,
    )
    params = {"token_tile": tile, "top_k": top_k, "n_group": n_group, "topk_group": topk_group,
              "group_score": group_score, "renormalize": renormalize, "bias_dtype": bias_dtype}
    return Plan(op="moe", strategy=f"{variant}_gating", dtype=dtype, profile=prof, kernels=(k,),
                params=params, hint=hint)


def plan_sigmoid_gating(shape, dtype="fp32", *, top_k=8, bias_dtype=None, n_group=1, topk_group=1,
                        group_score="max", renormalize=True, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`sigmoid_gating` for logits of ``shape`` = (T, E) (no data needed).

    ``bias_dtype``: storage dtype of the correction bias, or None without one.
    """
    return _plan_gating("sigmoid", shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group,
                        group_score=group_score, renormalize=renormalize, bias_dtype=bias_dtype,
                        profile=profile, token_tile=token_tile)


def plan_softmax_gating(shape, dtype="fp32", *, top_k=8, n_group=1, topk_group=1, group_score="max",
                        renormalize=False, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`softmax_gating` for logits of ``shape`` = (T, E) (no data needed)."""
    return _plan_gating("softmax", shape, dtype, top_k=top_k, n_group=n_group, topk_group=topk_group,
                        group_score=group_score, renormalize=renormalize, bias_dtype=None,
                        profile=profile, token_tile=token_tile)


@memo_plan
def plan_combine(shape, dtype="fp32", *, weights_dtype="fp32", profile=None, token_tile=None,
                 h_tile=None) -> Plan:
    """Plan of :func:`combine` for ``expert_out`` of ``shape`` = (T, k, H) (no data needed)."""
    prof = load_profile(profile)
    where = "moe.combine"
    dtype = _dtype_name(dtype, where)
    weights_dtype = _dtype_name(weights_dtype, where, "weights dtype")
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "expert_out", where, min_rank=3, max_rank=3)
    inputs.check_size(shape, "expert_out", where)
    T, K, H = shape
    tile = prof.tile("moe_token_tile") if token_tile is None else inputs.positive_int(token_tile, "token_tile", where)
    h_tile = prof.tile("moe_combine_h_tile") if h_tile is None else inputs.positive_int(h_tile, "h_tile", where)
    b = dtypes.itemsize(dtype)
    h_ub = min(h_tile, align_elems(H, dtype, prof))  # a short H needs only its aligned length
    h_tile = h_ub  # a larger h_tile is the whole (aligned) H: one task per token tile, scratch of H
    k32 = align_elems(K, "fp32", prof)
    per_h = tile * (K * b + 4 + b)  # expert tile + fp32 accumulator + output, per H element
    block = prof.align_bytes // b
    room = (prof.vec_safe_bytes - tile * k32 * 4) // per_h // block * block
    hint = (f"use h_tile <= {room} (multiple of {block})" if room >= block
            else "use a smaller token_tile")
    buffers = (
        vector_tile("expert_ub", (tile, K, h_ub), dtype, prof, where, hint),
        vector_tile("weights_ub", (tile, k32), "fp32", prof, where, hint),
        vector_tile("acc_ub", (tile, h_ub), "fp32", prof, where, hint),
        vector_tile("out_ub", (tile, h_ub), dtype, prof, where, hint),
    )
    n_tt = -(-T // tile)
    n_ht = -(-H // h_tile)
    cast_in = 1 if b == 2 else 0
    k = KernelPlan(
        name="moe_combine",
        unit="vector",
        tasks=n_tt * n_ht,
        buffers=buffers,
        gm_read_bytes=T * K * H * b + n_ht * T * K * dtypes.itemsize(weights_dtype),
        gm_write_bytes=T * H * b,
        vector_ops=T * H * (K * (COMBINE_OPS + cast_in) + cast_in),
        # the routing weights are re-read by every H tile
        gm_unique_bytes=T * K * H * b + T * K * dtypes.itemsize(weights_dtype),
    )
    return Plan(op="moe", strategy="combine", dtype=dtype, profile=prof, kernels=(k,),
                params={"token_tile": tile, "h_tile": h_tile, "weights_dtype": weights_dtype}, hint=hint)
