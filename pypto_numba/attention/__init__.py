"""Attention: whole-row (standard), online-softmax tiled (online) and fused flash (flash).

Math: ``q[B, Hq, Sq, D]``, ``k[B, Hkv, Skv, D]``, ``v[B, Hkv, Skv, Dv]``, ``G = Hq // Hkv`` (query
head h uses KV head h // G)::

    out[b, h, i] = softmax_j(scale * q[b, h, i] . k[b, h//G, j] + mask[b, h, i, j]) @ v[b, h//G]

over the allowed keys ``j < kv_len[b]`` (and ``j <= i' = i + kv_len[b] - Sq`` when ``causal``, bottom-right
aligned; ``-right <= i' - j <= left`` with ``window=(left, right)``, ``window=W`` being ``(W-1, 0)``
and causal); a row with no allowed key returns zeros. ``softcap=c`` caps the scaled scores to
``c * tanh(s / c)`` before the mask; ``sinks[Hq]`` add one logit per head to every row's softmax
(in the max, the sum and the lse, with no value).

Masks (broadcastable to ``[B, Hq, Sq, Skv]``, read as stored, 1 or 2 or 4 B per element read):
additive float32, bfloat16 or float16 (added after the scale and the cap), or bool with True =
keep (torch SDPA's convention: False is an additive -inf). A row whose keys are all masked by
-inf or False returns zeros (torch SDPA's result); an additive finite minimum adds one constant
to the row: float32's or bfloat16's (~-3.4e38) absorbs the fp32 scores, so the row is the uniform
average of V over its allowed keys (Hugging Face eager's result), float16's (-65504) does not.

``layout="bshd"``: q ``[B, Sq, Hq, D]``, k/v ``[B, Skv, Hkv, D]`` and the result ``[B, Sq, Hq, Dv]``
(Hugging Face's and flash-attn's layout), read in place through transposed views (strided.py;
same counted cost as "bhsd", no copy; the last bits may differ from the "bhsd" call's where the
CPU vectorises a strided load differently); the lse stays ``[B, Hq, Sq]``, the mask as above.

Rounding points as on the NPU: S in fp32 from
storage-dtype operands, softmax in fp32, P rounded to the storage dtype before P@V, fp32
accumulation, one cast at the end. ``cast_mode=`` (``machine/dtypes.py``) rounds the vector unit's
casts: P in every strategy, and online's and flash's output (O / l, or the split-KV combine);
standard's output is its pv cube kernel's FIXPIPE cast, always rint (npu-facts 8.3), as
``linear.matmul_add``'s product. ``write_kv`` copies bits: it accepts the mode with no effect.

Strategies (b = itemsize, rows = B*Hq*Sq)::

    standard  3 kernels (scores, softmax, pv); GM: K/V once per query tile, scores rows*Skv*4
              written and read, P rows*Skv*b written and read; TileError when a score row does
              not fit UB
    online    1 kernel, task per (b, KV head, query tile); K/V read once per task; running
              state (Dv+2)*4 B per row read+written per KV tile in GM workspace
    flash     1 kernel (+1 combine with split-KV); K/V read once per task for the tiles that are
              not fully masked; no state traffic; split partials (Dv+2)*4 B per row and split

With a window, online and flash skip the KV tiles wholly outside it (a sliding-window decode
reads about W keys whatever the cache length); standard masks whole rows.

Paged KV cache (online and flash, paged.py): ``k``, ``v`` as vLLM's ``[num_blocks, block_size,
Hkv, D]`` pages with ``block_table=`` int32 ``[B, max_blocks_per_seq]`` and ``kv_len=``; each KV
tile is loaded through the table. ``write_kv`` writes new tokens to their slots (one counted copy
kernel, ``plan_write_kv``).

``gqa="expand_clone"`` prepends two ``repeat_kv.expand_clone`` copy kernels (K and V, G times
their size in GM traffic and workspace) and runs as multi-head attention.
"""

from .flash import flash, plan_flash
from .online import online, plan_online
from .kv_cache import plan_write_kv, write_kv
from .paged import plan_paged
from .standard import plan_standard, standard

__all__ = ["standard", "online", "flash", "plan_standard", "plan_online", "plan_flash", "plan_paged", "plan_write_kv",
           "write_kv"]


# --- lab spec ---
# What compare, advise and report need to know about attention (pypto_numba/lab/spec.py).

def _masked_scores(q, k, v, scale, causal, kv_len, mask, window, softcap, sinks, layout):
    """The float64 scores [B, Hq, Sq, Skv (+1 with sinks)], -inf where a key is not allowed, and
    V [B, Hq, Skv (+1), Dv] (GQA repeated, zero past kv_len and at the sink), as the oracle's
    definitions say (:func:`_reference_attention`)."""
    import numbers

    import numpy as np

    from ..reference import f64

    q, k, v = f64(q), f64(k), f64(v)
    if layout == "bshd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1.0 / np.sqrt(D) if scale is None else float(scale)
    k, v = np.repeat(k, Hq // Hkv, axis=1), np.repeat(v, Hq // Hkv, axis=1)
    s = np.einsum("bhqd,bhkd->bhqk", q, k) * scale
    if softcap is not None:
        s = float(softcap) * np.tanh(s / float(softcap))
    if mask is not None:
        add = np.where(mask, 0.0, -np.inf) if np.asarray(mask).dtype == bool else f64(mask)
        s = s + np.broadcast_to(add, s.shape)
    lens = np.full(B, Skv) if kv_len is None else np.asarray(kv_len).astype(np.int64)
    j = np.arange(Skv)
    diag = np.arange(Sq)[None, :, None] + (lens[:, None, None] - Sq)  # i' [B, Sq, 1]
    keep = np.broadcast_to(j[None, None, :] < lens[:, None, None], (B, Sq, Skv))  # [B, Sq, Skv]
    if window is not None:
        if isinstance(window, numbers.Integral):
            left, right, causal = int(window) - 1, 0, True
        else:
            left, right = (int(x) for x in window)
        dist = diag - j[None, None, :]
        keep = keep & (dist >= -right) & (dist <= left)
    if causal:
        keep = keep & (j[None, None, :] <= diag)
    allowed = np.broadcast_to(keep[:, None, :, :], s.shape)
    # keys past kv_len are ignored: whatever V holds there (NaN, inf) must not reach 0 * V
    v = np.where((j[None, :] < lens[:, None])[:, None, :, None], v, 0.0)
    if sinks is not None:  # one more key: logit sinks[h], always allowed, value 0
        col = np.broadcast_to(f64(sinks)[None, :, None, None], (B, Hq, Sq, 1))
        s = np.concatenate([s, col], axis=-1)
        allowed = np.concatenate([allowed, np.ones((B, Hq, Sq, 1), bool)], axis=-1)
        v = np.concatenate([v, np.zeros((B, Hq, 1, v.shape[3]))], axis=2)
    s = np.where(allowed, s, -np.inf)
    return s, v


def _reference_attention(
    q,
    k,
    v,
    scale=None,
    causal=False,
    kv_len=None,
    mask=None,
    return_lse=False,
    window=None,
    softcap=None,
    sinks=None,
    layout="bhsd",
):
    """Softmax attention with GQA, bottom-right causal alignment, kv_len, an additive mask, a
    sliding window, soft-capping and sinks, from their definitions, densely in float64.

    ``window=(left, right)`` keeps key j of query i iff ``-right <= i' - j <= left`` with
    ``i' = i + kv_len - Sq``; ``window=W`` is ``(W - 1, 0)`` and causal. ``softcap=c``: the scaled
    scores become ``c * tanh(s / c)``, then the mask is added. ``sinks[Hq]``: one more key per
    row whose logit is the sink (not scaled or capped) and whose value is zero.
    Fully masked query rows return zeros (and lse = -inf, or the sink). A bool mask keeps its
    True keys (an additive 0 / -inf). ``layout="bshd"``: q, k, v and the result are [B, S, H, D].
    """
    import numpy as np

    s, v = _masked_scores(q, k, v, scale, causal, kv_len, mask, window, softcap, sinks, layout)
    m = s.max(axis=-1, keepdims=True)  # NaN when an allowed score is NaN: the row is NaN
    dead = m == -np.inf  # no allowed key: zeros
    p = np.exp(s - np.where(dead, 0.0, m))
    p = np.where(s == -np.inf, 0.0, p)  # keys not allowed (their scores are -inf)
    l = p.sum(axis=-1, keepdims=True)
    out = np.einsum("bhqk,bhkd->bhqd", p / np.where(l > 0, l, 1.0), v)
    out = np.where((l > 0) | np.isnan(l), out, 0.0)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    if return_lse:
        with np.errstate(divide="ignore"):
            lse = np.where(l[..., 0] > 0,
                           np.log(np.where(l[..., 0] > 0, l[..., 0], 1.0)) + np.where(dead[..., 0], 0.0, m[..., 0]),
                           -np.inf)
            lse = np.where(np.isnan(l[..., 0]), np.nan, lse)
        return out, lse
    return out


def _lab_inputs(shape, dtype, rng):
    from ..lab import need, normal

    B, Hq, Hkv, Sq, Skv, D = need(shape, 6, "B,Hq,Hkv,Sq,Skv,D")
    return (normal((B, Hq, Sq, D), dtype, rng), normal((B, Hkv, Skv, D), dtype, rng),
            normal((B, Hkv, Skv, D), dtype, rng))


def _lab_reference(
    q,
    k,
    v,
    strategy,
    gqa=None,
    pv=None,
    kv_tile=None,
    q_tile=None,
    num_splits=None,
    **o,
):
    """The oracle takes the math options only; tiling, GQA and cast-mode options do not change the
    result. ``mirror=True``: :func:`_mirror_attention` with the strategy's kv tile (its plan's params)
    and cast mode (``cast_mode``, else ``use_cast_mode`` / the profile's, as the call resolves it)."""
    from ..machine.profile import resolve_cast_mode

    mirror, profile, cast_mode = o.pop("mirror", False), o.pop("profile", None), o.pop("cast_mode", None)
    if not mirror:
        return _reference_attention(q, k, v, **o)
    o["cast_mode"] = resolve_cast_mode(cast_mode, profile, f"attention.{strategy}").name
    if strategy == "standard":
        return _mirror_attention(q, k, v, None, "storage", **o)
    plan = {"online": plan_online, "flash": plan_flash}[strategy]
    kw = {n: x for n, x in dict(kv_tile=kv_tile, q_tile=q_tile, gqa=gqa, causal=o.get("causal", False),
                                  window=o.get("window"), softcap=o.get("softcap")).items() if x is not None}
    if strategy == "online" and pv is not None:
        kw["pv"] = pv
    shapes = [x.shape if o.get("layout", "bhsd") == "bhsd" else (x.shape[0], x.shape[2], x.shape[1], x.shape[3])
              for x in (q, k, v)]  # the plans take [B, H, S, D]
    p = plan(*shapes, _storage(q), profile=profile, **kw)
    return _mirror_attention(q, k, v, p.params["kv_tile"], p.params.get("pv", "storage"), **o)


_lab_reference.mirrors = True


def _storage(a):
    from ..machine import dtypes

    return dtypes.storage_name(a.dtype)


def _mirror_attention(q, k, v, kv_tile, pv="storage", scale=None, causal=False, kv_len=None, mask=None,
                      return_lse=False, window=None, softcap=None, sinks=None, layout="bhsd", cast_mode=None):
    """The kernel-faithful golden: float64, rounded where the strategy narrows. ``kv_tile=None``
    (standard): P = exp(s - m) / l rounded to the storage dtype before P@V. Otherwise per KV tile
    of ``kv_tile`` keys: P_t = exp(s - m_t) rounded against the tile's max m_t (unless ``pv`` keeps
    it in fp32 or compensates it), l_t the sum of the unrounded exps, merged by the running max;
    the sinks join as one last tile. The output rounded once; lse to fp32. ``cast_mode`` (None:
    rint) rounds P and, with a kv tile, the output (standard's is the FIXPIPE's: rint)."""
    import numpy as np

    from ..lab.spec import to_storage

    dt = _storage(q)
    s, vv = _masked_scores(q, k, v, scale, causal, kv_len, mask, window, softcap, sinks, layout)
    rnd = (lambda x: to_storage(x, dt, cast_mode)) if pv == "storage" else (lambda x: x)  # noqa: E731
    B, H, Sq, n = s.shape
    keys = n - (sinks is not None)
    bounds = [(0, keys)] if kv_tile is None else [(j, min(j + kv_tile, keys)) for j in range(0, keys, kv_tile)]
    if sinks is not None:
        bounds.append((keys, n))
    if kv_tile is None and sinks is not None:
        bounds = [(0, n)]
    with np.errstate(invalid="ignore", over="ignore"):
        ms, ls, os = [], [], []
        for j0, j1 in bounds:
            st = s[..., j0:j1]
            mt = st.max(axis=-1, keepdims=True)
            e = np.where(st == -np.inf, 0.0, np.exp(st - np.where(mt == -np.inf, 0.0, mt)))
            lt = e.sum(axis=-1, keepdims=True)
            pt = rnd(e / np.where(lt > 0, lt, 1.0)) if kv_tile is None else rnd(e)
            ms.append(mt)
            ls.append(lt)
            os.append(np.einsum("bhqk,bhkd->bhqd", pt, vv[:, :, j0:j1]))
        m = np.max(np.concatenate(ms, axis=-1), axis=-1, keepdims=True)  # NaN propagates
        live = m != -np.inf
        c = [np.where(live, np.exp(mt - np.where(live, m, 0.0)), 0.0) for mt in ms]
        c = [np.where(mt == -np.inf, 0.0, x) for mt, x in zip(ms, c)]
        l = sum(ci * li for ci, li in zip(c, ls))
        o = sum(ci * oi for ci, oi in zip(c, os))
        out = o if kv_tile is None else o / np.where(l > 0, l, 1.0)
        out = np.where((l > 0) | np.isnan(l), out, 0.0)
    if layout == "bshd":
        out = out.transpose(0, 2, 1, 3)
    out = to_storage(out, dt, "rint" if kv_tile is None else cast_mode)  # standard: FIXPIPE
    if return_lse:
        _, lse = _reference_attention(q, k, v, scale, causal, kv_len, mask, True, window, softcap, sinks, layout)
        return out, to_storage(lse, "fp32")
    return out


def _attention(
    profile,
    batch=1,
    q_heads=32,
    kv_heads=8,
    q_len=1,
    kv_len=4096,
    head_dim=128,
    dtype="bf16",
    causal=False,
    gqa="head_loop",
    window=None,
    softcap=None,
    sinks=False,
    block_size=None,
):
    from ..lab import Candidate

    q, k = (batch, q_heads, q_len, head_dim), (batch, kv_heads, kv_len, head_dim)
    kw = dict(profile=profile, causal=causal, gqa=gqa, window=window, softcap=softcap, has_sinks=sinks)
    phase = "decode" if q_len == 1 else "prefill"
    if block_size is not None:  # a paged cache (vLLM layout): online and flash only
        pages = -(-kv_len // block_size)
        shapes = (q, (batch * pages, block_size, kv_heads, head_dim), (batch, pages))
        lens = [kv_len] * batch
        cands = [Candidate(s, lambda s=s: (plan_paged(s, *shapes, None, dtype, kv_len=lens, **kw),),
                           fused=s == "flash") for s in ("online", "flash")]
        notes = (f"paged {phase} scenario (block_size={block_size}, q_len={q_len}, kv_len={kv_len}): "
                 f"K/V tiles read through the block table; standard takes no paged cache",)
        return cands, ("online" if phase == "decode" else "flash"), notes
    cands = [
        Candidate("standard", lambda: (plan_standard(q, k, None, dtype, **kw),), fused=False),
        Candidate("online", lambda: (plan_online(q, k, None, dtype, **kw),), fused=False),
        Candidate("flash", lambda: (plan_flash(q, k, None, dtype, **kw),)),
    ]
    notes = (f"{phase} scenario (q_len={q_len}, kv_len={kv_len})",)
    if window is not None:
        notes += (f"sliding window {window!r}: online and flash read only the KV tiles inside it",)
    return cands, ("online" if phase == "decode" else "flash"), notes


def _attention_tiles(profile, batch, q_heads, kv_heads, q_len, kv_len, head_dim, dtype, causal, gqa, window,
                     softcap, sinks, block_size):
    """tune.search's space: lab.spec.attention_grid's kv x query tiles for online and flash;
    standard has no tile keyword (its default plans only)."""
    from ..lab import Candidate
    from ..lab.spec import attention_grid

    q, k = (batch, q_heads, q_len, head_dim), (batch, kv_heads, kv_len, head_dim)
    kw = dict(profile=profile, causal=causal, gqa=gqa, window=window, softcap=softcap, has_sinks=sinks)
    shape = (batch, q_heads, kv_heads, q_len, kv_len, head_dim)
    if block_size is not None:
        pages = -(-kv_len // block_size)
        shapes = (q, (batch * pages, block_size, kv_heads, head_dim), (batch, pages))
        plan = lambda s, t: (plan_paged(s, *shapes, None, dtype, kv_len=[kv_len] * batch, **kw, **t),)  # noqa: E731
        shape = None  # compare takes a dense cache
    else:
        plans = {"online": plan_online, "flash": plan_flash}
        plan = lambda s, t: (plans[s](q, k, None, dtype, **kw, **t),)  # noqa: E731
    for t in attention_grid(q_len, kv_len):
        for s in ("online", "flash"):
            yield Candidate(s, lambda s=s, t=t: plan(s, t), fused=s == "flash", tiles=t, shape=shape)


def _lab_spec():
    from ..lab import Inputs, OpSpec, Seed, Tolerance

    return OpSpec(
        name="attention",
        seed=Seed("online", "flash",
                  "decode long sequences must be tiled (online); reuse a mature fused kernel (flash) in production; "
                  "whole-row (standard) FAILs"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(1, 16, 8, 1, 4096, 128),
                      help="B,Hq,Hkv,Sq,Skv,D, e.g. 1,16,8,1,4096,128 (Qwen3 decode)"),
        reference=_lab_reference,
        tolerance=Tolerance(half=(5e-3, 5e-3)),  # npu-facts 2.1
        advise=_attention,  # named as advise's old rule: its TypeError names it
        oracles={"attention": _reference_attention},
        tiles=_attention_tiles,
    )


OP = _lab_spec()
