"""``compare``: run every strategy of an op on the same inputs, side by side.

One row per strategy: precision against the float64 reference (max abs, max rel, ulps),
PASS/FAIL under a named tolerance policy, the counted Cost (kernels, tasks, GM bytes, workspace,
buffer peaks), CPU time (median of warm runs) and the NPU estimate with its bound. A strategy that
the plan rules out (TileError, ConstraintError) stays in the table with the reason.

How to build inputs for an op, call its reference and read its outputs is described once per op
in :data:`CASES`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import numbers
import statistics
import time
from typing import Callable

import numpy as np

from . import precision, reference
from .errors import ConstraintError, DTypeError, PyptoNumbaError, ShapeError, TileError
from .machine import dtypes
from .machine.cost import Cost
from .strategy import strategies as registry
from .strategy import trace


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row of a comparison: how to call it and its float64 reference."""

    label: str
    call: Callable  # (*inputs, **options) -> result
    reference: Callable  # (*inputs, **options) -> float64 array, or a tuple matching ``outputs``
    recommended: bool = False


@dataclasses.dataclass(frozen=True)
class OpCase:
    """How ``compare`` drives one op."""

    make: Callable  # (shape tuple, dtype name, rng) -> tuple of inputs
    default_shape: tuple
    shape_help: str
    reference: Callable = None  # (*inputs, strategy=name, **options) -> reference, for registry rows
    variants: Callable = None  # () -> [Variant]; default: one row per registered strategy
    outputs: Callable = staticmethod(lambda result: (result,))  # result -> tuple of arrays to score
    policy: str = precision.DEFAULT_POLICY
    tolerances: Callable = staticmethod(lambda dtype: (None, None))  # dtype -> (rtol, atol)


def _normal(shape, dtype, rng, scale=1.0, loc=0.0):
    return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(dtypes.STORAGE[dtype])


def _need(shape, n, help_text):
    if len(shape) != n:
        raise ShapeError(f"compare: --shape must have {n} numbers ({help_text}), got {shape}")
    return shape


def _rope_inputs(shape, dtype, rng):
    S, H, D = shape[-3:]
    from .reference import cos_sin

    cos, sin = cos_sin(np.arange(S), D, theta=1e6)  # Qwen3
    store = dtypes.STORAGE[dtype]
    return (_normal(shape, dtype, rng), _normal((D,), dtype, rng, 0.1, 1.0),
            cos.astype(np.float32).astype(store), sin.astype(np.float32).astype(store))


def _rope_variants():
    from . import rope

    return [
        Variant("standard", lambda x, w, c, s, **o: rope.standard(x, c, s, **o),
                lambda x, w, c, s, **o: reference.rope_standard(x, c, s), True),
        Variant("interleaved", lambda x, w, c, s, **o: rope.interleaved(x, c, s, **o),
                lambda x, w, c, s, **o: reference.rope_interleaved(x, c, s)),
        Variant("rmsnorm+standard", lambda x, w, c, s, **o: rope.standard(rope.rmsnorm(x, w, **o), c, s, **o),
                lambda x, w, c, s, **o: reference.rope_fused_rmsnorm(x, w, c, s)),
        Variant("fused_rmsnorm", lambda x, w, c, s, **o: rope.fused_rmsnorm(x, w, c, s, **o),
                lambda x, w, c, s, **o: reference.rope_fused_rmsnorm(x, w, c, s)),
    ]


# DeepSeek-V3 routing and a Qwen3-MoE style softmax router on the same logits
_DSV3 = dict(top_k=8, n_group=8, topk_group=4, routed_scaling_factor=2.5)
_SOFTMAX = dict(top_k=8, renormalize=True)


def _moe_inputs(shape, dtype, rng):
    T, E = _need(shape, 2, "T,E")
    bias = (rng.standard_normal(E) * 0.1).astype(np.float32)
    return _normal((T, E), dtype, rng), bias


def _moe_variants():
    from . import moe

    groups = lambda E: dict(_DSV3) if E % 8 == 0 and E // 8 * 4 >= 8 else dict(top_k=min(8, E))  # noqa: E731
    return [
        Variant("sigmoid_gating", lambda x, b, **o: moe.sigmoid_gating(x, bias=b, **groups(x.shape[1]), **o),
                lambda x, b, **o: reference.moe_sigmoid_gating(x, bias=b, **groups(x.shape[1])), True),
        Variant("softmax_gating", lambda x, b, **o: moe.softmax_gating(x, **dict(_SOFTMAX, top_k=min(8, x.shape[1])), **o),
                lambda x, b, **o: reference.moe_softmax_gating(x, **dict(_SOFTMAX, top_k=min(8, x.shape[1])))),
    ]


def _attention_inputs(shape, dtype, rng):
    B, Hq, Hkv, Sq, Skv, D = _need(shape, 6, "B,Hq,Hkv,Sq,Skv,D")
    return (_normal((B, Hq, Sq, D), dtype, rng), _normal((B, Hkv, Skv, D), dtype, rng),
            _normal((B, Hkv, Skv, D), dtype, rng))


def _linear_inputs(shape, dtype, rng):
    M, K, N = _need(shape, 3, "M,K,N")
    return (_normal((M, K), dtype, rng), _normal((N, K), dtype, rng, K**-0.5), _normal((N,), dtype, rng))


def _embedding_inputs(shape, dtype, rng):
    V, H, B, S = _need(shape, 4, "V,H,B,S")
    return _normal((V, H), dtype, rng), rng.integers(0, V, size=(B, S), dtype=np.int32)


def _repeat_kv_inputs(shape, dtype, rng):
    B, Hkv, S, D, n_rep = _need(shape, 5, "B,Hkv,S,D,n_rep")
    return _normal((B, Hkv, S, D), dtype, rng), n_rep


CASES = {
    "gelu": OpCase(
        make=lambda shape, dtype, rng: (_normal(shape, dtype, rng, 2.0),),
        reference=lambda x, strategy, **o: (reference.gelu_erf(x) if strategy == "erf" else reference.gelu_tanh(x)),
        default_shape=(8, 11008),
        shape_help="x shape, e.g. 8,11008",
    ),
    "mean": OpCase(
        make=lambda shape, dtype, rng: (_normal(shape, dtype, rng, 1.0, 0.5),),
        reference=lambda x, strategy, dim=-1, keepdim=False, **o: reference.mean(x, dim, keepdim),
        default_shape=(8, 4096),
        shape_help="x shape, e.g. 8,4096 (reduced over --dim, default -1)",
    ),
    "rope": OpCase(
        make=_rope_inputs,
        variants=_rope_variants,
        default_shape=(128, 16, 128),
        shape_help="x shape [..., S, H, D], e.g. 128,16,128 (Qwen3 q, theta 1e6)",
        tolerances=lambda dtype: (1e-2, 1e-2) if dtype != "fp32" else (None, None),  # npu-facts 3
    ),
    "attention": OpCase(
        make=_attention_inputs,
        # the oracle takes the math options only; tiling and GQA options do not change the result
        reference=lambda q, k, v, strategy, gqa=None, pv=None, kv_tile=None, q_tile=None, num_splits=None,
        **o: reference.attention(q, k, v, **o),
        default_shape=(1, 16, 8, 1, 4096, 128),
        shape_help="B,Hq,Hkv,Sq,Skv,D, e.g. 1,16,8,1,4096,128 (Qwen3 decode)",
        tolerances=lambda dtype: (5e-3, 5e-3) if dtype != "fp32" else (None, None),  # npu-facts 2.1
    ),
    "repeat_kv": OpCase(
        make=_repeat_kv_inputs,
        reference=lambda kv, n_rep, strategy, **o: reference.repeat_kv(kv, n_rep),
        default_shape=(1, 8, 4096, 128, 2),
        shape_help="B,Hkv,S,D,n_rep, e.g. 1,8,4096,128,2",
    ),
    "moe": OpCase(
        make=_moe_inputs,
        variants=_moe_variants,
        outputs=lambda result: result,
        default_shape=(512, 256),
        shape_help="T,E, e.g. 512,256 (DeepSeek-V3 grouped routing vs a softmax router)",
        tolerances=lambda dtype: (5e-3, 5e-3),  # npu-facts 1.3
    ),
    "linear": OpCase(
        make=_linear_inputs,
        reference=lambda x, w, b, strategy, **o: reference.linear(x, w, b),
        default_shape=(16, 2048, 2048),
        shape_help="M,K,N, e.g. 16,2048,2048",
        policy="outlier",
        tolerances=lambda dtype: (2.0**-7, 1e-3) if dtype != "fp32" else (1e-4, 1e-5),
    ),
    "embedding": OpCase(
        make=_embedding_inputs,
        reference=lambda w, ids, strategy, **o: reference.embedding(w, ids),
        default_shape=(32000, 1024, 4, 512),
        shape_help="V,H,B,S, e.g. 32000,1024,4,512",
    ),
}


@dataclasses.dataclass
class Row:
    strategy: str
    recommended: bool
    ruled_out: str = ""  # the TileError/ConstraintError message when the plan refuses
    precision: list = dataclasses.field(default_factory=list)  # precision.Result per output
    cost: object = None
    seconds: float = float("nan")
    estimate: object = None

    @property
    def verdict(self) -> str:
        if self.ruled_out:
            return "RULED OUT"
        return "PASS" if all(r.passed for r in self.precision) else "FAIL"

    def as_dict(self) -> dict:
        d = {"strategy": self.strategy, "recommended": self.recommended, "verdict": self.verdict}
        if self.ruled_out:
            d["ruled_out"] = self.ruled_out
            return d
        d["precision"] = [dataclasses.asdict(r) for r in self.precision]
        d["cost"] = self.cost.as_dict()
        d["cpu_seconds"] = self.seconds
        d["npu_estimate_seconds"] = self.estimate.seconds
        d["npu_bound"] = self.estimate.bound
        return d


@dataclasses.dataclass
class Comparison:
    op: str
    shapes: tuple
    dtype: str
    policy: str
    profile: str
    rows: list

    def _table(self):
        head = ["strategy", "verdict", "max_abs", "max_rel", "ulps", "kernels", "tasks", "GM read",
                "GM write", "workspace", "UB peak", "CPU ms", "NPU us (bound)"]
        body = []
        for r in self.rows:
            name = r.strategy + (" *" if r.recommended else "")
            if r.ruled_out:
                body.append([name, "RULED OUT", r.ruled_out] + [""] * (len(head) - 3))
                continue
            worst = max(r.precision, key=lambda p: p.max_abs)
            c = r.cost
            body.append([
                name, r.verdict, f"{worst.max_abs:.3g}", f"{worst.max_rel:.3g}", f"{worst.max_ulps:.3g}",
                str(c.kernels), str(c.tasks), _bytes(c.gm_read_bytes), _bytes(c.gm_write_bytes),
                _bytes(c.workspace_bytes), _bytes(c.ub_peak_bytes), f"{r.seconds * 1e3:.3f}",
                f"{r.estimate.seconds * 1e6:.1f} ({r.estimate.bound})",
            ])
        return head, body

    def title(self) -> str:
        shapes = " ".join("x".join(map(str, s)) for s in self.shapes)
        return f"{self.op} [{shapes}] {self.dtype} on {self.profile}, policy {self.policy}"

    def to_markdown(self) -> str:
        head, body = self._table()
        lines = [f"**{self.title()}** (* = the seed's recommendation)", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(cell.replace("|", "/") for cell in row) + " |" for row in body]
        return "\n".join(lines)

    def to_table(self) -> str:
        head, body = self._table()
        wide = [r for r in body if r[1] == "RULED OUT"]
        narrow = [r for r in body if r[1] != "RULED OUT"]
        widths = [max(len(head[i]), *(len(r[i]) for r in narrow)) if narrow else len(head[i]) for i in range(len(head))]
        fmt = lambda row: "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()  # noqa: E731
        out = [self.title() + "  (* = seed's recommendation)", fmt(head), fmt(["-" * w for w in widths])]
        out += [fmt(r) for r in narrow]
        out += [f"{r[0]}  RULED OUT: {r[2]}" for r in wide]
        return "\n".join(out)

    def to_dict(self) -> dict:
        return {"op": self.op, "shapes": [list(s) for s in self.shapes], "dtype": self.dtype,
                "policy": self.policy, "profile": self.profile, "rows": [r.as_dict() for r in self.rows]}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, default=float)

    def __str__(self):
        return self.to_table()


def _bytes(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def case(op: str) -> OpCase:
    if op not in CASES:
        raise PyptoNumbaError(f"compare: unknown op {op!r}; known: {', '.join(CASES)}")
    return CASES[op]


def make_inputs(op: str, shape=None, dtype: str = "fp32", seed: int = 0) -> tuple:
    """Deterministic random inputs for ``op`` (shape defaults to the op's default scenario)."""
    c = case(op)
    if dtype not in dtypes.STORAGE:
        raise PyptoNumbaError(f"compare: dtype must be one of {', '.join(dtypes.STORAGE)}, got {dtype!r}")
    return c.make(tuple(shape or c.default_shape), dtype, np.random.default_rng(seed))


def compare(op: str, *inputs, strategies=None, policy=None, repeats: int = 5, profile=None, **options) -> Comparison:
    """Run every strategy of ``op`` (or those named) on ``inputs`` and score each one."""
    c = case(op)
    if c.variants is not None:
        variants = c.variants()
    else:
        variants = [
            Variant(e.name, e.fn, functools.partial(c.reference, strategy=e.name), e.recommended)
            for e in registry(op)
        ]
    if strategies is not None:
        names = [strategies] if isinstance(strategies, str) else list(strategies)
        unknown = set(names) - {v.label for v in variants}
        if unknown:
            raise PyptoNumbaError(
                f"compare: {op} has no strategy {sorted(unknown)}; it has {[v.label for v in variants]}")
        variants = [v for v in variants if v.label in names]
    if isinstance(repeats, (bool, np.bool_)) or not isinstance(repeats, numbers.Integral):
        raise PyptoNumbaError(f"compare: repeats must be a positive int, got {repeats!r}")
    policy = policy or c.policy
    precision.tolerances(policy, "fp32")  # an unknown policy fails before anything runs
    if not inputs:
        inputs = make_inputs(op)
    arrays = [i for i in inputs if isinstance(i, np.ndarray)]
    if not arrays:
        raise DTypeError(
            f"compare: {op} inputs must include numpy arrays, got {[type(i).__name__ for i in inputs]}; "
            f"use numpy.asarray(x, dtype=numpy.float32)"
        )
    dtype = dtypes.storage_name(arrays[0].dtype) or str(arrays[0].dtype)
    rtol, atol = c.tolerances(dtype)
    rows = []
    timed = []
    prof_name = None
    for variant in variants:
        row = Row(strategy=variant.label, recommended=variant.recommended)
        try:
            with trace() as t:
                result = variant.call(*inputs, profile=profile, **options)
        except (TileError, ConstraintError) as exc:
            row.ruled_out = str(exc)
            rows.append(row)
            continue
        prof_name = t.records[-1].profile
        ref = variant.reference(*inputs, **options)
        refs = ref if isinstance(ref, tuple) else (ref,)
        outs = c.outputs(result)
        row.precision = [precision.evaluate(o, r, dtype, policy, rtol, atol) for o, r in zip(outs, refs)]
        row.cost = sum((r.cost for r in t.records), Cost())
        row.estimate = row.cost.estimate(prof_name, dtype)
        rows.append(row)
        timed.append((row, variant))
    # CPU times last, the strategies' warm runs interleaved. Timed right after its float64
    # reference, a strategy shared the cores with what that left running (NumPy's BLAS threads
    # spin for a while after a call): a 0.6 ms decode call was once reported at 7.7 ms.
    # Interleaving also spreads a shared host's noise over every strategy alike.
    times = [[] for _ in timed]
    for _ in range(max(1, repeats)):
        for (_, variant), ts in zip(timed, times):
            t0 = time.perf_counter()
            variant.call(*inputs, profile=profile, **options)
            ts.append(time.perf_counter() - t0)
    for (row, _), ts in zip(timed, times):
        row.seconds = statistics.median(ts)
    from .machine.profile import load_profile

    return Comparison(op=op, shapes=tuple(a.shape for a in arrays),
                      dtype=dtype, policy=policy, profile=prof_name or load_profile(profile).name, rows=rows)


def parse_shape(text: str) -> tuple:
    """``"8,11008"`` -> (8, 11008); a clear ShapeError otherwise."""
    try:
        shape = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ShapeError(f"--shape must be comma-separated integers like 8,11008, got {text!r}") from None
    if not shape or any(d <= 0 for d in shape):
        raise ShapeError(f"--shape must be positive integers like 8,11008, got {text!r}")
    return shape
