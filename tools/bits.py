"""The bits check: digests of every strategy's results on a fixed input set.

A refactor changes no bits. Run this on the old and the new commit, each with its own fresh
``NUMBA_CACHE_DIR`` (a parallel kernel compiled fresh can differ in its last bits from the same
kernel loaded from the cache, ``machine/jit.py``), then compare::

    NUMBA_CACHE_DIR=$(mktemp -d) python tools/bits.py --out old.json     # on the old commit
    NUMBA_CACHE_DIR=$(mktemp -d) python tools/bits.py --out new.json     # on the new commit
    python tools/bits.py --compare old.json new.json

``--only TEXT`` runs (or compares) only the cases whose name contains TEXT, e.g. ``--only gelu.``.

The input set covers every public strategy, every storage dtype, odd shapes (tails that are not a
multiple of any tile or vector width) and the options that select other kernels or code paths.
Each case's inputs come from its own seeded generator, so adding a case changes no other digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import zlib

import ml_dtypes
import numpy as np

DTYPES = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(name.encode()))


def _make(rng, shape, dt, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(DTYPES[dt])


def _digest(result) -> str:
    parts = result if isinstance(result, tuple) else (result,)
    h = hashlib.sha256()
    for a in parts:
        a = np.ascontiguousarray(np.asarray(a))
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.view(np.uint8).tobytes())
    return h.hexdigest()[:24]


def cases():
    """Yield ``(name, thunk)``; each thunk makes its inputs and returns the strategy's result."""
    import pypto_numba as pn

    for dt in DTYPES:
        # gelu: a tail past every vector width, both math modes, a tile option, out=
        for shape in ((1,), (3, 1000), (7, 4099)):
            for fn in ("tanh", "erf"):
                for math in ("fp32", "storage"):
                    name = f"gelu.{fn}/{dt}/{shape}/{math}"
                    yield name, (lambda name=name, shape=shape, fn=fn, math=math, dt=dt:
                                 getattr(pn.gelu, fn)(_make(_rng(name), shape, dt, 3.0), math=math))
        name = f"gelu.tanh/{dt}/out"
        def gelu_out(name=name, dt=dt):
            x = _make(_rng(name), (5, 3333), dt, 3.0)
            out = np.empty_like(x)
            pn.gelu.tanh(x, out=out)
            return out
        yield name, gelu_out
        name = f"gelu.erf/{dt}/tile"
        yield name, (lambda name=name, dt=dt: pn.gelu.erf(_make(_rng(name), (9, 777), dt, 3.0), tile=1024))

        # mean: every dim of a 3-D tensor, keepdim, the two-level split for long rows
        for shape, dim in (((5, 37, 129), -1), ((5, 37, 129), 1), ((5, 37, 129), 0), ((3, 100003), -1),
                           ((1, 70001), -1), ((4099,), 0)):
            name = f"mean.sum_div/{dt}/{shape}/{dim}"
            yield name, (lambda name=name, shape=shape, dim=dim, dt=dt:
                         pn.mean.sum_div(_make(_rng(name), shape, dt, 2.0), dim=dim))
        name = f"mean.sum_div/{dt}/split"
        yield name, (lambda name=name, dt=dt: pn.mean.sum_div(_make(_rng(name), (2, 65539), dt), split="gm"))
        name = f"mean.sum_div/{dt}/ub-keepdim"
        yield name, (lambda name=name, dt=dt: pn.mean.sum_div(_make(_rng(name), (6, 5001), dt), keepdim=True,
                                                              split="ub"))

        # rope: full and partial rotary, decode and prefill shapes, every strategy
        for (S, H, D, R) in ((1, 32, 128, 128), (37, 8, 128, 128), (13, 3, 64, 32), (5, 2, 96, 64)):
            for fn in ("standard", "interleaved"):
                name = f"rope.{fn}/{dt}/{S},{H},{D},{R}"
                def rope_rot(name=name, S=S, H=H, D=D, R=R, fn=fn, dt=dt):
                    rng = _rng(name)
                    x = _make(rng, (2, S, H, D), dt)
                    cos, sin = pn.rope.cos_sin(np.arange(S) + 3, R, dtype=DTYPES[dt])
                    if fn == "interleaved":  # its GPT-J pair tables, built the same way in every tree
                        cos, sin = (np.repeat(t[..., : R // 2], 2, axis=-1) for t in (cos, sin))
                    return getattr(pn.rope, fn)(x, cos, sin)
                yield name, rope_rot
            name = f"rope.rmsnorm/{dt}/{S},{H},{D}"
            def rope_norm(name=name, S=S, H=H, D=D, dt=dt):
                rng = _rng(name)
                return pn.rope.rmsnorm(_make(rng, (2, S, H, D), dt, 2.0), _make(rng, (D,), dt), eps=1e-6)
            yield name, rope_norm
            name = f"rope.fused_rmsnorm/{dt}/{S},{H},{D},{R}"
            def rope_fused(name=name, S=S, H=H, D=D, R=R, dt=dt):
                rng = _rng(name)
                x = _make(rng, (2, S, H, D), dt, 2.0)
                cos, sin = pn.rope.cos_sin(np.arange(S), R, dtype=DTYPES[dt])
                return pn.rope.fused_rmsnorm(x, _make(rng, (D,), dt), cos, sin)
            yield name, rope_fused
        name = f"rope.standard/{dt}/out-tile"
        def rope_out(name=name, dt=dt):
            rng = _rng(name)
            x = _make(rng, (29, 4, 128), dt)
            cos, sin = pn.rope.cos_sin(np.arange(29), 128, dtype=DTYPES[dt])
            out = np.empty_like(x)
            pn.rope.standard(x, cos, sin, out=out, token_tile=4)
            return out
        yield name, rope_out
        name = f"rope.cos_sin/{dt}"
        yield name, (lambda dt=dt: pn.rope.cos_sin(np.arange(1000) * 7, 96, theta=1e6, dtype=DTYPES[dt]))

        # rmsnorm: weight in x's dtype or fp32, Gemma's offset, residual in x's dtype or fp32
        for (T, D) in ((1, 2048), (37, 96), (5, 4099)):
            for wdt in (dt, "fp32"):
                name = f"rmsnorm.plain/{dt}/{T},{D}/w-{wdt}"
                def norm_plain(name=name, T=T, D=D, wdt=wdt, dt=dt):
                    rng = _rng(name)
                    return pn.rmsnorm.plain(_make(rng, (T, D), dt, 2.0), _make(rng, (D,), wdt), offset=1.0)
                yield name, norm_plain
                name = f"rmsnorm.fused_add/{dt}/{T},{D}/r-{wdt}"
                def norm_add(name=name, T=T, D=D, wdt=wdt, dt=dt):
                    rng = _rng(name)
                    return pn.rmsnorm.fused_add(_make(rng, (T, D), dt), _make(rng, (T, D), wdt, 3.0), _make(rng, (D,), dt))
                yield name, norm_add

        # softmax: short and long rows, masks with -inf (a fully masked row), scale, column tiles
        for (R, C) in ((3, 1), (7, 1000), (2, 40000)):
            for fn, extra in (("whole_row", {}), ("online", {}), ("online", {"col_tile": 512})):
                name = f"softmax.{fn}/{dt}/{R},{C}/{sorted(extra.items())}"
                def soft(name=name, R=R, C=C, fn=fn, extra=extra, dt=dt):
                    rng = _rng(name)
                    mask = np.where(rng.random((R, C)) < 0.2, -np.inf, 0.0).astype(np.float32)
                    mask[0] = -np.inf
                    return getattr(pn.softmax, fn)(_make(rng, (R, C), dt, 4.0), mask=mask, scale=0.7, **extra)
                yield name, soft

        # attention: prefill and decode, GQA and MHA, causal, kv_len, mask, every option
        att = (
            ("prefill-gqa", (2, 4, 37, 64), (2, 2, 53, 64), dict(causal=True)),
            ("prefill-mha", (1, 3, 70, 32), (1, 3, 70, 32), dict()),
            ("decode-gqa", (3, 8, 1, 128), (3, 2, 300, 128), dict(kv_len=np.array([300, 1, 177]))),
            ("decode-causal", (2, 4, 3, 128), (2, 1, 129, 128), dict(causal=True, kv_len=np.array([129, 64]))),
            ("odd-dv", (1, 2, 19, 48), (1, 1, 41, 48), dict(causal=True)),
        )
        for label, qs, ks, opt in att:
            for fn, extra in (("standard", {}), ("online", {}), ("online", {"pv": "compensated"}),
                              ("online", {"pv": "fp32"}), ("online", {"kv_tile": 64}),
                              ("flash", {}), ("flash", {"num_splits": 3}), ("flash", {"return_lse": True}),
                              ("flash", {"kv_tile": 64, "q_tile": 16}), ("flash", {"gqa": "expand_clone"}),
                              ("online", {"gqa": "expand_clone"}), ("standard", {"gqa": "expand_clone"})):
                name = f"attention.{fn}/{dt}/{label}/{sorted(extra.items())}"
                def attn(name=name, qs=qs, ks=ks, opt=opt, fn=fn, extra=extra, dt=dt):
                    rng = _rng(name)
                    q, k, v = _make(rng, qs, dt), _make(rng, ks, dt), _make(rng, ks, dt)
                    return getattr(pn.attention, fn)(q, k, v, **opt, **extra)
                yield name, attn
        for fn in ("standard", "online", "flash"):
            name = f"attention.{fn}/{dt}/mask"
            def attn_mask(name=name, fn=fn, dt=dt):
                rng = _rng(name)
                q, k, v = _make(rng, (2, 4, 9, 64), dt), _make(rng, (2, 2, 33, 64), dt), _make(rng, (2, 2, 33, 64), dt)
                mask = np.where(rng.random((2, 1, 9, 33)) < 0.3, -np.inf, rng.standard_normal((2, 1, 9, 33)))
                return getattr(pn.attention, fn)(q, k, v, mask=mask.astype(np.float32), scale=0.2)
            yield name, attn_mask

        # repeat_kv
        name = f"repeat_kv.expand_clone/{dt}"
        yield name, (lambda name=name, dt=dt: pn.repeat_kv.expand_clone(_make(_rng(name), (2, 3, 17, 72), dt), 3))

        # moe: both gatings (groups, bias, options) and combine
        for T, E, k in ((1, 256, 8), (37, 64, 6), (5, 7, 2)):
            name = f"moe.sigmoid_gating/{dt}/{T},{E},{k}"
            def sig(name=name, T=T, E=E, k=k, dt=dt):
                rng = _rng(name)
                groups = 8 if E == 256 else 1
                return pn.moe.sigmoid_gating(_make(rng, (T, E), dt, 2.0), k, bias=rng.standard_normal(E).astype(np.float32) * 0.1,
                                             n_group=groups, topk_group=4 if groups > 1 else 1,
                                             routed_scaling_factor=2.5)
            yield name, sig
            name = f"moe.sigmoid_gating/{dt}/{T},{E},{k}/plain"
            yield name, (lambda name=name, T=T, E=E, k=k, dt=dt:
                         pn.moe.sigmoid_gating(_make(_rng(name), (T, E), dt, 2.0), k, renormalize=False))
            for renorm in (False, True):
                name = f"moe.softmax_gating/{dt}/{T},{E},{k}/{renorm}"
                yield name, (lambda name=name, T=T, E=E, k=k, dt=dt, renorm=renorm:
                             pn.moe.softmax_gating(_make(_rng(name), (T, E), dt, 2.0), k, renormalize=renorm))
        name = f"moe.sigmoid_gating/{dt}/top2_sum"
        yield name, (lambda name=name, dt=dt: pn.moe.sigmoid_gating(_make(_rng(name), (11, 64), dt), 4, n_group=8,
                                                                    topk_group=3, group_score="top2_sum"))
        for T, kk, H in ((1, 8, 7168), (19, 2, 1001)):
            name = f"moe.combine/{dt}/{T},{kk},{H}"
            def comb(name=name, T=T, kk=kk, H=H, dt=dt):
                rng = _rng(name)
                return pn.moe.combine(_make(rng, (T, kk, H), dt), rng.random((T, kk)).astype(np.float32))
            yield name, comb

        # linear: decode rows (every M below 16 takes its own path), prefill, odd N and K, tiles
        for M in (1, 2, 3, 4, 7, 8, 15, 16, 37, 300):
            for N, K in ((67, 131), (256, 512)):
                for fn, bias in (("fused_bias", True), ("matmul_add", True), ("fused_bias", False)):
                    name = f"linear.{fn}/{dt}/{M},{N},{K}/{bias}"
                    def lin(name=name, M=M, N=N, K=K, fn=fn, bias=bias, dt=dt):
                        rng = _rng(name)
                        x, w = _make(rng, (M, K), dt), _make(rng, (N, K), dt, 0.1)
                        b = _make(rng, (N,), dt) if bias else None
                        return getattr(pn.linear, fn)(x, w, b)
                    yield name, lin
        name = f"linear.fused_bias/{dt}/tiles"
        def lin_tiles(name=name, dt=dt):
            rng = _rng(name)
            x, w = _make(rng, (2, 45, 200), dt), _make(rng, (99, 200), dt, 0.1)
            return pn.linear.fused_bias(x, w, _make(rng, (99,), dt), cube_tiles=((16, 32), (64, 128), (32, 64)))
        yield name, lin_tiles

        # embedding: ids of several shapes and dtypes, odd H, wide rows, tiles, out=
        for V, H in ((1000, 1), (1000, 77), (5000, 2048), (300, 4099)):
            for fn, ishape in (("gather", (3, 17)), ("gather", (2, 2, 5)), ("index_select", (41,))):
                for idt in (np.int32, np.int64):
                    name = f"embedding.{fn}/{dt}/{V},{H}/{ishape}/{np.dtype(idt).name}"
                    def emb(name=name, V=V, H=H, fn=fn, ishape=ishape, idt=idt, dt=dt):
                        rng = _rng(name)
                        w = _make(rng, (V, H), dt)
                        return getattr(pn.embedding, fn)(w, rng.integers(0, V, ishape).astype(idt))
                    yield name, emb
        name = f"embedding.gather/{dt}/tiles-out"
        def emb_out(name=name, dt=dt):
            rng = _rng(name)
            w = _make(rng, (500, 300), dt)
            ids = rng.integers(0, 500, (23,)).astype(np.int32)
            out = np.empty((23, 300), w.dtype)
            pn.embedding.gather(w, ids, row_tile=8, h_tile=64, out=out)
            return out
        yield name, emb_out


def run(selected=None) -> dict:
    import torch  # noqa: F401  (imported before the first kernel, as the benchmarks do)

    digests = {}
    for name, thunk in cases():
        if selected and selected not in name:
            continue
        try:
            digests[name] = _digest(thunk())
        except Exception as exc:  # an error is a result too: it must stay the same error
            digests[name] = f"error: {type(exc).__name__}: {exc}"
    return digests


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", help="write the digests as JSON to this file")
    ap.add_argument("--only", help="run only cases whose name contains this")
    ap.add_argument("--compare", nargs=2, metavar=("OLD", "NEW"), help="compare two digest files")
    args = ap.parse_args(argv)
    if args.compare:
        old, new = (json.load(open(p)) for p in args.compare)
        if args.only:
            old = {n: v for n, v in old.items() if args.only in n}
        bad = [n for n in old if new.get(n) != old[n]]
        added = [n for n in new if n not in old]
        for n in bad:
            print(f"DIFFERS  {n}: {old[n]} -> {new.get(n, 'missing')}")
        for n in added:
            print(f"NEW      {n}")
        errors = sum(str(v).startswith("error") for v in new.values())
        print(f"{len(old) - len(bad)} of {len(old)} cases give the same bits ({errors} raise, as before)")
        return 1 if bad else 0
    digests = run(args.only)
    text = json.dumps(digests, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    errors = [n for n, v in digests.items() if str(v).startswith("error")]
    print(f"{len(digests)} cases, {len(errors)} raised", file=sys.stderr)
    for n in errors:
        print(f"  {n}: {digests[n]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
