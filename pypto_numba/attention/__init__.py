"""Attention: whole-row (standard), online-softmax tiled (online) and fused flash (flash).

Math: ``q[B, Hq, Sq, D]``, ``k[B, Hkv, Skv, D]``, ``v[B, Hkv, Skv, Dv]``, ``G = Hq // Hkv`` (query
head h uses KV head h // G)::

    out[b, h, i] = softmax_j(scale * q[b, h, i] . k[b, h//G, j] + mask[b, h, i, j]) @ v[b, h//G]

over the allowed keys ``j < kv_len[b]`` (and ``j <= i + kv_len[b] - Sq`` when ``causal``, bottom-right
aligned); a row with no allowed key returns zeros. Rounding points as on the NPU: S in fp32 from
storage-dtype operands, softmax in fp32, P rounded to the storage dtype before P@V, fp32
accumulation, one cast at the end.

Strategies (b = itemsize, rows = B*Hq*Sq)::

    standard  3 kernels (scores, softmax, pv); GM: K/V once per query tile, scores rows*Skv*4
              written and read, P rows*Skv*b written and read; TileError when a score row does
              not fit UB
    online    1 kernel, task per (b, KV head, query tile); K/V read once per task; running
              state (Dv+2)*4 B per row read+written per KV tile in GM workspace
    flash     1 kernel (+1 combine with split-KV); K/V read once per task for the tiles that are
              not fully masked; no state traffic; split partials (Dv+2)*4 B per row and split

``gqa="expand_clone"`` prepends two ``repeat_kv.expand_clone`` copy kernels (K and V, G times
their size in GM traffic and workspace) and runs as multi-head attention.
"""

from .flash import flash, plan_flash
from .online import online, plan_online
from .standard import plan_standard, standard

__all__ = ["standard", "online", "flash", "plan_standard", "plan_online", "plan_flash"]
