"""MoE routing: sigmoid gating (grouped top-k, correction bias), softmax gating, and combine.

Math (``logits[T, E]`` router logits in fp32, bf16 or fp16; everything computed in fp32, as the
NPU's sigmoid/exp are fp32-only, npu-facts 1.6)::

    sigmoid_gating:  s = sigmoid(logits)                    unbiased scores (give the weights)
                     sel = s + bias                         selection scores (bias[E], optional)
                     n_group > 1: group score = max(sel over the group)  ("max")
                                         or sum of its top two sel      ("top2_sum");
                                  experts outside the best topk_group groups are not eligible
                     ids = top_k eligible experts by sel, descending, ties -> lower expert index
                     w = s[ids];  renormalize: w / (sum(w) + eps);  w *= routed_scaling_factor
    softmax_gating:  p = softmax(logits);  ids = top_k of p;  w = p[ids]
                     renormalize: w / sum(w);  w *= routed_scaling_factor
                     (extra options n_group / topk_group / group_score: the same group filter on
                     p, which is PyPTO's moe_gating_topk with norm_type softmax, npu-facts 1.3)
    combine:         out[t, :] = sum_j weights[t, j] * expert_out[t, j, :] in fp32, one cast

Gating returns ``(weights float32[T, k], ids int32[T, k])``, ordered by descending selection
score. The selection is done on the fp32 scores the kernel computed (like the NPU's fp32 topk), so
two experts whose scores differ by less than fp32 rounding may come out in either order compared
to a float64 oracle; exactly equal fp32 scores always go to the lower expert index.

Strategies (T tokens, E experts, k = top_k, b = logits itemsize, bb = bias itemsize, H hidden,
n_tt = ceil(T / token_tile), n_ht = ceil(H / h_tile))::

    moe.sigmoid_gating  1 vector kernel, n_tt tasks, GM read T*E*b (+ n_tt*E*bb with a bias),
                        GM write T*k*8 (fp32 weights + int32 ids)
    moe.softmax_gating  1 vector kernel, n_tt tasks, GM read T*E*b, GM write T*k*8
    moe.combine         1 vector kernel, n_tt*n_ht tasks, GM read T*k*H*b + n_ht*T*k*wb,
                        GM write T*H*b

Tiling (npu-facts 1.3: PyPTO's moe_gating_topk loops over blocks of 32 rows with the tile
``(bs_block, E)``): one tile task = ``token_tile`` tokens with the whole expert axis in UB
(logits tile, fp32 scores, masked selection scores, group scores, top-k values/ids). Two rules
bound E: the UB capacity (and the 64 KiB reduction tile for the softmax max/sum and the group
scores), and the MERGE_SORT top-k tile rule ``align(E)*4 < 22 KiB`` (npu-facts 4.2; strict),
which no token tile can fix: E <= 5624 on A2/A3.

CPU execution of a task: row by row in per-thread scratch; the top-k is a sorted list of k
filled in expert order by a branch-free insertion (ties stay with the lower index); with groups,
a floor (the smallest second-best score of the chosen groups, valid when 2*topk_group >= top_k)
discards most experts before any insertion. The counted Cost models the NPU's tile ops, not these
CPU shortcuts.

Per-row vector element-ops counted (E experts, G groups, k picks): cast in E (16-bit logits only);
sigmoid 4E (neg, exp, +1, reciprocal) + bias add E, or softmax 5E (max, sub, exp, sum, div);
groups: score E ("max") or 2E + G ("top2_sum"), group top-k G, mask E; expert top-k E; gather k;
renormalize 2k + 1 (sum, + eps, div); routed scaling k.

The package: ``topk`` (the sorted-list and max helpers), ``kernels`` (gating and combine),
``options`` (option checks), ``plans`` (tiles and counted cost), ``public`` (the strategies).
"""

from .options import GROUP_SCORES
from .plans import plan_combine, plan_sigmoid_gating, plan_softmax_gating
from .public import combine, sigmoid_gating, softmax_gating

__all__ = ["sigmoid_gating", "softmax_gating", "combine", "plan_sigmoid_gating", "plan_softmax_gating",
           "plan_combine"]

from .spec import OP  # noqa: E402  (the lab's view of the op; after the strategies it names)
