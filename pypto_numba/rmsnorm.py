"""RMSNorm over the last dim: plain, and fused with the residual add that precedes it.

Math (``x[..., D]`` read as rows ``[N, D]``; ``weight[D]`` fp32 or x's dtype; all math fp32)::

    plain      y = x * inv(mean(x**2) + eps) * (weight + offset)
    fused_add  h = round_r(residual + x);  y = h * inv(mean(h**2) + eps) * (weight + offset)
               -> (y in x's dtype, h in the residual's dtype)

``offset`` (fp32; 1.0 is Gemma's ``(1 + w)``) is added to the widened weight once per task.
``inv`` is the normaliser: ``"rsqrt"`` (one vector rsqrt) or ``"recip_sqrt"`` (sqrt, then a
reciprocal). On the CPU both evaluate the same fp32 expression, so they give the same IEEE bits;
only their counted vector instructions differ (3 or 4 per row). On the device they are different
instructions with different rounding: switching a kernel from ``recip(sqrt(x))`` to ``rsqrt``
changed a mismatch rate from 0.0031 % to 20.7 % (npu-facts 8.3, pypto-lib PR #361), and the
device rsqrt has a ``high_precision=`` variant. The option lets a plan count what a device
kernel would run; it does not emulate the device's rounding of either.

``fused_add`` normalises the *rounded* new residual (what a separate add kernel would write and
the norm read back), so its results are exactly ``new = (residual + x)`` rounded to the residual's
dtype and ``normed = plain(new, weight).astype(x.dtype)`` (one rounding from fp32 either way).

Strategies (N rows, bx, br, bw = itemsizes of x, residual, weight, T = rows per task,
tasks = ceil(N/T))::

    plain      1 vector kernel, GM read N*D*bx + tasks*D*bw, write N*D*bx
    fused_add  1 vector kernel, GM read N*D*(bx + br) + tasks*D*bw, write N*D*(bx + br)

An add kernel then ``plain`` reads the new residual back: ``fused_add`` saves one kernel and
N*D*br bytes of GM reads (plus, with an fp32 residual and bf16 x, the cast kernel of the normed
rows: N*D*(br + bx) more). Qwen3, Llama and DeepSeek run it before every attention and MLP block.

Vector ops: 4 per element (square, sum, *inv, *w) + 3 per row (/D, +eps, rsqrt; recip_sqrt 4)
+ 2 per element for a 16-bit x (widen, narrow); weight: D per task to widen a 16-bit one, D per
task for a nonzero offset; fused_add: 1 per element (the add) + 2 per element for a 16-bit
residual.

Tiling: one task = T rows of D, T from the profile's ``rmsnorm_row_tile`` lowered until the
``[T, D]`` fp32 square tile fits the 64 KiB reduction limit and the tiles fit UB. The row loop is
written as ``rope.rmsnorm``'s, but LLVM vectorises each kernel's fp32 sum of squares on its own
(``reassoc``, machine/jit.py): the two agree within one storage ulp, not bit for bit, so
``rope.rmsnorm`` keeps its own kernel (and bits) for now.
"""

from __future__ import annotations

import math as _math
import numbers

import numba
import numpy as np
from numba import prange

from . import inputs
from .errors import ConstraintError, DTypeError, ShapeError
from .machine import dtypes
from .machine.jit import device, kernel
from .machine.memo import CallMemo, memo_plan
from .machine.plan import KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from .machine.profile import load_profile, resolve_cast_mode
from .machine.tile import ScratchPool, aligned_empty
from .strategy import Launch, register

NORM_OPS = 4  # per element: x*x, sum, *inv, *w
ROW_OPS = {"rsqrt": 3, "recip_sqrt": 4}  # per row: *1/D, +eps, then rsqrt | sqrt + reciprocal
ADD_OPS = 1  # fused_add, per element: residual + x
CAST_OPS = 2  # per element of a 16-bit tensor: widen in, narrow out
INVS = tuple(ROW_OPS)


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = T rows (a pypto.loop iteration on an AI vector core)


@device(forceinline=True)
def _widen_weight(weight, wf, uD, offset):
    """``wf[:D] = weight + offset`` in fp32 (the offset only when nonzero: ``w + 0`` would turn -0 to +0)."""
    for j in range(uD):
        wf[j] = dtypes.widen(weight[j])
    if offset != 0.0:
        off32 = np.float32(offset)
        for j in range(uD):
            wf[j] = wf[j] + off32


@device(forceinline=True)
def norm_row(y, wf, dst, d_off, uD, ss, inv_d, eps32, cm=None):
    """``dst[d_off:][:D] = y * 1/sqrt(ss/D + eps) * wf`` for the fp32 row ``y`` and its sum of
    squares ``ss`` (summed by the caller in the loop that fills ``y``, as rope.rmsnorm does);
    ``cm``: the cast mode of the narrowing (a ``dtypes.CastMode``; omitted: rint)."""
    rstd = np.float32(1.0) / np.sqrt(ss * inv_d + eps32)
    for j in range(uD):
        dst[d_off + j] = dtypes.narrow(dst, y[j] * rstd * wf[j], cm)


@kernel
def _rmsnorm_kernel(
    x,
    residual,
    weight,
    out,
    new_res,
    T,
    eps,
    offset,
    add,
    row_ops,
    fscratch,
    cm,
):
    """plain (``add`` False) or fused_add RMSNorm of ``[N, D]`` rows -> the cost counters.

    Parameters
    ----------
    x, out : [N, D] kernel views (x's dtype)
    residual, new_res : [N, D] kernel views (the residual's dtype); x and out when not ``add``
    weight : [D] kernel view (fp32 or x's dtype)
    T : rows per task
    eps, offset : the norm's epsilon; added to the widened weight
    add : fused_add: ``new_res = residual + x`` (rounded), normalised in place of x
    row_ops : vector ops counted per row (3 rsqrt, 4 recip_sqrt)
    fscratch : [threads, 2, D] fp32 rows (the widened row, the weight)
    cm : the cast mode of both narrowings (normed, new residual; a ``dtypes.CastMode``)
    """
    N, D = x.shape
    uD = np.uint64(D)
    n_tiles = (N + T - 1) // T
    bx = x.itemsize
    br = residual.itemsize
    bw = weight.itemsize
    cx = int(bx != 4)
    cr = int(br != 4)
    cw = int(bw != 4)
    co = int(offset != 0.0)
    inv_d = np.float32(1.0 / D)
    eps32 = np.float32(eps)
    xf = x.reshape(-1)
    rf = residual.reshape(-1)
    of = out.reshape(-1)
    nf = new_res.reshape(-1)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for task in prange(n_tiles):
        r0 = task * T
        valid = min(T, N - r0)  # valid shape of the tail tile
        tid = numba.get_thread_id()
        y = fscratch[tid, 0]
        wf = fscratch[tid, 1]
        _widen_weight(weight, wf, uD, offset)
        for t in range(valid):
            off = np.uint64(r0 + t) * uD
            ss = np.float32(0.0)
            if add:
                for j in range(uD):
                    q = dtypes.narrow(nf, dtypes.widen(rf[off + j]) + dtypes.widen(xf[off + j]), cm)
                    nf[off + j] = q
                    v = dtypes.widen(q)
                    y[j] = v
                    ss += v * v
            else:
                for j in range(uD):
                    v = dtypes.widen(xf[off + j])
                    y[j] = v
                    ss += v * v
            norm_row(y, wf, of, off, uD, ss, inv_d, eps32, cm)
        elems = valid * D
        tasks += 1
        gm_read += elems * bx + D * bw
        gm_write += elems * bx
        ops = elems * NORM_OPS + valid * row_ops + cx * elems * CAST_OPS + (cw + co) * D
        if add:
            gm_read += elems * br
            gm_write += elems * br
            ops += elems * ADD_OPS + cr * elems * CAST_OPS
        vector_ops += ops
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# plans


def _buffers(add, T, D, dtype, rdtype, wdtype, offset, prof):
    """The UB tiles of one task (last dims padded to 32 B)."""
    Df = align_elems(D, "fp32", prof)
    out = [("x_ub", (T, align_elems(D, dtype, prof)), dtype)]
    if add:
        out.append(("r_ub", (T, align_elems(D, rdtype, prof)), rdtype))
    if dtype != "fp32" or add:
        out.append(("xf_ub", (T, Df), "fp32"))  # the widened row (fused_add: the fp32 sum)
    out += [("sq_ub", (T, Df), "fp32"), ("rstd_ub", (T, align_elems(1, "fp32", prof)), "fp32"),
            ("w_ub", (align_elems(D, wdtype, prof),), wdtype)]
    if wdtype != "fp32" or offset != 0.0:
        out.append(("wf_ub", (Df,), "fp32"))
    return out


def _nbytes(specs):
    return sum(_math.prod(shape) * dtypes.itemsize(dt) for _, shape, dt in specs)


def _max_rows(add, D, dtype, rdtype, wdtype, offset, prof):
    """Largest row tile whose buffers fit UB and whose square tile fits the reduction limit."""
    one, two = (_nbytes(_buffers(add, t, D, dtype, rdtype, wdtype, offset, prof)) for t in (1, 2))
    per_row = two - one
    t_max = (prof.limit("UB") - (one - per_row)) // per_row
    t_max = min(t_max, prof.reduce_tile_max_bytes // (align_elems(D, "fp32", prof) * 4))
    return max(0, t_max)


def _storage(dtype, where, name):
    kind = dtypes.storage_name(dtype)
    if kind is None:
        raise DTypeError(f"{where}: {name} {dtype!r} is not a storage dtype; use fp32, bf16 or fp16")
    return kind


def _check_weight_dtype(where, dtype, wdtype):
    if wdtype not in ("fp32", dtype):
        raise DTypeError(
            f"{where}: weight must be fp32 or x's dtype ({dtype}), got {wdtype}; cast it with weight.astype(numpy.float32)"
        )


def _check_residual_dtype(where, dtype, rdtype):
    if rdtype not in ("fp32", dtype):
        raise DTypeError(
            f"{where}: residual must be fp32 or x's dtype ({dtype}), got {rdtype}; cast it with residual.astype(numpy.float32)"
        )


def _check_inv(where, inv):
    if inv not in INVS:
        raise ConstraintError(f"{where}: inv must be one of {INVS}, got {inv!r}")
    return inv


def _check_offset(where, offset):
    if isinstance(offset, (bool, np.bool_)) or not isinstance(offset, numbers.Real) or not _math.isfinite(float(offset)):
        raise ConstraintError(f"{where}: offset must be a finite number, got {offset!r}")
    return float(offset)


def _check_eps(where, eps):
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real) or not (
        _math.isfinite(float(eps)) and float(eps) >= 0.0
    ):
        raise ConstraintError(f"{where}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


@memo_plan
def _plan(kind, x_shape, dtype, rdtype, wdtype, offset, inv, profile, token_tile) -> Plan:
    prof = load_profile(profile)
    where = f"rmsnorm.{kind}"
    add = kind == "fused_add"
    name = _storage(dtype, where, "dtype")
    wname = name if wdtype is None else _storage(wdtype, where, "weight_dtype")
    rname = name if rdtype is None else _storage(rdtype, where, "residual_dtype")
    _check_weight_dtype(where, name, wname)
    if add:
        _check_residual_dtype(where, name, rname)
    inv = _check_inv(where, inv)
    offset = _check_offset(where, offset)
    shape = tuple(int(d) for d in x_shape)
    inputs.check_rank(shape, "x", where)
    inputs.check_size(shape, "x", where)
    D = shape[-1]
    N = _math.prod(shape[:-1])
    t_max = _max_rows(add, D, name, rname, wname, offset, prof)
    hint = (f"use token_tile <= {t_max}" if t_max else
            f"one row of D={D} does not fit the {prof.reduce_tile_max_bytes} B reduction tile; split the last dim")
    if token_tile is None:
        T = max(1, min(int(prof.tile("rmsnorm_row_tile")), t_max))
    else:
        T = inputs.positive_int(token_tile, "token_tile", where)
    bufs = [vector_tile(n, s, dt, prof, where, hint) for n, s, dt in _buffers(add, T, D, name, rname, wname, offset, prof)]
    reduce_tile(next(b for b in bufs if b.name == "sq_ub"), prof, where, hint)
    bx, br, bw = (dtypes.itemsize(n) for n in (name, rname, wname))
    tasks = -(-N // T)
    elems = N * D
    gm_read = elems * bx + tasks * D * bw
    gm_write = elems * bx
    ops = (elems * NORM_OPS + N * ROW_OPS[inv] + int(name != "fp32") * elems * CAST_OPS
           + (int(wname != "fp32") + int(offset != 0.0)) * tasks * D)
    if add:
        gm_read += elems * br
        gm_write += elems * br
        ops += elems * ADD_OPS + int(rname != "fp32") * elems * CAST_OPS
    # the same steps as vector instructions (machine/isa.py): x*x, row sum, *inv, *w per element;
    # *1/D, +eps and rsqrt or sqrt + division per row; casts; the weight's cast / offset per task
    mix = [("TMUL", "fp32", 3 * elems), ("TROWSUM", "fp32", elems), ("TMULS", "fp32", N),
           ("TADDS", "fp32", N), (inv, "fp32", N)]
    if name != "fp32":
        mix.append(("TCVT", name, elems * CAST_OPS))
    if wname != "fp32":
        mix.append(("TCVT", wname, tasks * D))
    if offset != 0.0:
        mix.append(("TADDS", "fp32", tasks * D))
    unique = elems * bx + D * bw  # the weight row is re-read by every task
    if add:
        mix.append(("TADD", "fp32", elems))
        if rname != "fp32":
            mix.append(("TCVT", rname, elems * CAST_OPS))
        unique += elems * br
    k = KernelPlan(name=f"rmsnorm_{kind}", unit="vector", tasks=tasks, buffers=tuple(bufs),
                   gm_read_bytes=gm_read, gm_write_bytes=gm_write, vector_ops=ops,
                   gm_unique_bytes=unique, vector_mix=tuple(mix), vector_tile_elems=min(T, N) * D,
                   vector_cols=D)
    return Plan(op="rmsnorm", strategy=kind, dtype=name, profile=prof, kernels=(k,),
                params={"token_tile": T, "inv": inv, "offset": offset, "weight_dtype": wname,
                        "residual_dtype": rname if add else None}, hint=hint)


def plan_plain(x_shape, dtype="fp32", *, weight_dtype=None, offset=0.0, inv="rsqrt", profile=None,
               token_tile=None) -> Plan:
    """Plan of :func:`plain` for ``x_shape`` (``weight_dtype``: fp32 or x's dtype, default x's)."""
    return _plan("plain", x_shape, dtype, None, weight_dtype, offset, inv, profile, token_tile)


def plan_fused_add(x_shape, dtype="fp32", *, residual_dtype=None, weight_dtype=None, offset=0.0, inv="rsqrt",
                   profile=None, token_tile=None) -> Plan:
    """Plan of :func:`fused_add` (``residual_dtype``: fp32 or x's dtype, default x's)."""
    return _plan("fused_add", x_shape, dtype, residual_dtype, weight_dtype, offset, inv, profile, token_tile)


# ---------------------------------------------------------------------------------------------
# public strategies


class _Call:
    """What a call derives from its signature (kept per signature in ``_CALLS``)."""

    __slots__ = ("where", "plan", "D", "dtype", "rdtype", "eps", "offset", "row_ops", "shapes", "scratch")

    def __init__(self, where, plan, D, dtype, rdtype, eps, shapes):
        self.where, self.plan, self.D = where, plan, D
        self.dtype, self.rdtype = dtype, rdtype
        self.eps, self.offset = eps, plan.params["offset"]
        self.row_ops = ROW_OPS[plan.params["inv"]]
        self.shapes = shapes
        self.scratch = ScratchPool((D, np.float32, 2))


_CALLS = CallMemo()


def _prepare(kind, x, residual, weight, eps, offset, inv, profile, token_tile, out):
    where = f"rmsnorm.{kind}"
    add = kind == "fused_add"
    xt = inputs.tensor(x, "x", where)
    D = xt.shape[-1]
    wt = inputs.tensor(weight, "weight", where)
    if wt.shape != (D,):
        raise ShapeError(f"{where}: weight must have shape ({D},) (the last dim of x {xt.shape}), got {wt.shape}")
    _check_weight_dtype(where, xt.dtype, wt.dtype)
    rt = None
    if add:
        rt = inputs.tensor(residual, "residual", where)
        if rt.shape != xt.shape:
            raise ShapeError(f"{where}: residual must have x's shape {xt.shape}, got {rt.shape}")
        _check_residual_dtype(where, xt.dtype, rt.dtype)
    eps = _check_eps(where, eps)
    p = _plan(kind, xt.shape, xt.dtype, rt.dtype if add else None, wt.dtype, offset, inv, profile, token_tile)
    if out is not None:
        inputs.check_out_signature(where, xt, out)
    shapes = [a.shape for a in (xt, rt, wt) if a is not None]
    c = _Call(where, p, D, xt.dtype, rt.dtype if add else None, eps, shapes)
    copied = sum(a.copied_bytes for a in (xt, rt, wt) if a is not None)
    return c, (xt.array, None if rt is None else rt.array, wt.array), copied


def _launch(c, x, residual, weight, out, copied, cm):
    if out is None:
        result, out_k = aligned_empty(x.shape, c.dtype)
    else:
        inputs.check_out_memory(c.where, x, out)
        result, out_k = out, dtypes.kernel_view(out)
    D = c.D
    xk = dtypes.kernel_view(x).reshape(-1, D)
    ok = out_k.reshape(-1, D)
    add = residual is not None
    if add:
        new, new_k = aligned_empty(x.shape, c.rdtype)
        rk, nk = dtypes.kernel_view(residual).reshape(-1, D), new_k.reshape(-1, D)
    else:
        rk, nk = xk, ok
    slabs = c.scratch.take()
    with Launch(c.plan, c.shapes) as run:
        run.count(_rmsnorm_kernel(xk, rk, dtypes.kernel_view(weight), ok, nk, c.plan.params["token_tile"],
                                  c.eps, c.offset, add, c.row_ops, *slabs, cm))
        run.workspace(copied)
    c.scratch.give(slabs)
    return (result, new) if add else result


def _call(kind, x, residual, weight, eps, offset, inv, profile, token_tile, out, cast_mode):
    key = _CALLS.key(profile, (x, residual, weight, out), (kind, eps, offset, inv, token_tile))
    c, arrays, copied = _CALLS.through(key, _prepare, kind, x, residual, weight, eps, offset, inv, profile,
                                       token_tile, out)
    narrows = c.dtype != "fp32" or c.rdtype not in (None, "fp32")
    cm = resolve_cast_mode(cast_mode, profile, c.where) if narrows else dtypes.RINT
    return _launch(c, *(arrays or (x, residual, weight)), out, copied, cm)


@register("rmsnorm", "plain", plan=plan_plain, summary="RMSNorm over the last dim, one vector kernel")
def plain(x, weight, eps=1e-6, offset=0.0, *, inv="rsqrt", profile=None, token_tile=None, out=None,
          cast_mode=None):
    """RMSNorm over the last dim: ``x * 1/sqrt(mean(x**2) + eps) * (weight + offset)``, fp32
    inside, one cast to x's dtype.

    ``weight[D]``: fp32 or x's dtype; ``offset``: added to the weight in fp32 (1.0: Gemma's
    ``1 + w``); ``inv``: ``"rsqrt"`` or ``"recip_sqrt"`` (same bits on the CPU, different counted
    ops; see the module docstring); ``token_tile``: rows per task (default: the profile's
    ``rmsnorm_row_tile``, lowered until the tiles fit); ``out=``: x's shape and dtype (``out=x``
    works in place); ``cast_mode``: the rounding of the fp32 -> bf16/fp16 casts
    (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint).
    """
    return _call("plain", x, None, weight, eps, offset, inv, profile, token_tile, out, cast_mode)


@register("rmsnorm", "fused_add", plan=plan_fused_add,
          summary="residual add + RMSNorm in one vector kernel -> (normed, new residual)")
def fused_add(x, residual, weight, eps=1e-6, offset=0.0, *, inv="rsqrt", profile=None, token_tile=None, out=None,
              cast_mode=None):
    """``new = residual + x`` (fp32 add, rounded to the residual's dtype, fp32 or x's) and
    ``normed = plain(new, weight, eps, offset)`` in x's dtype, in one kernel -> ``(normed, new)``.

    Saves the GM re-read of ``new`` and a kernel over an add followed by :func:`plain`. ``out=``
    receives ``normed``. Options as :func:`plain` (``cast_mode`` rounds both casts, normed and new).
    """
    return _call("fused_add", x, residual, weight, eps, offset, inv, profile, token_tile, out, cast_mode)


# --- lab spec ---
# What compare, advise and report need to know about rmsnorm (pypto_numba/lab/spec.py).

def reference(x, weight, eps=1e-6, offset=0.0, residual=None):
    """Float64 RMSNorm; with ``residual``: ``(normed, residual + x)``, the sum exact in float64
    (the kernel normalises its rounded sum: compare within a rounding of the residual dtype)."""
    from .reference import f64

    h = f64(x) if residual is None else f64(residual) + f64(x)
    y = h / np.sqrt(np.mean(h * h, axis=-1, keepdims=True) + float(eps)) * (f64(weight) + float(offset))
    return y if residual is None else (y, h)


def _advise(profile, shape=(16, 2048), dtype="bf16", residual=False):
    from .lab import Candidate

    if residual:
        cands = [Candidate("fused_add", lambda: (plan_fused_add(shape, dtype, residual_dtype="fp32", profile=profile),))]
        notes = ["a residual add precedes the norm: fused_add saves the add kernel and the re-read of the new "
                 "residual (plain alone does not include the add: its row prices the norm only)"]
        return cands, "fused_add", notes
    cands = [Candidate("plain", lambda: (plan_plain(shape, dtype, profile=profile),))]
    notes = ["no residual add before the norm: plain (pass residual=True when one precedes it)"]
    return cands, "plain", notes


def _make(shape, dtype, rng):
    """x, an fp32 residual (production carries it in fp32) and an fp32 weight near 1."""
    from .lab import normal

    D = shape[-1]
    return normal(shape, dtype, rng), normal(shape, "fp32", rng, 4.0), normal((D,), "fp32", rng, 0.1, 1.0)


def _add_then_plain(x, r, w, **o):
    """The unfused pair: an add (fp32, rounded to the residual's dtype), then plain. The add runs
    in NumPy, so the row's counted cost is plain's alone (an add kernel would add its launch and
    N*D*(bx + 2*br) bytes)."""
    new = (r.astype(np.float32) + x.astype(np.float32)).astype(r.dtype)
    return plain(new, w, **o).astype(x.dtype)


def _variants():
    from .lab import Variant

    return [
        Variant("plain", lambda x, r, w, **o: plain(x, w, **o), lambda x, r, w, **o: reference(x, w)),
        Variant("numpy_add+plain", _add_then_plain, lambda x, r, w, **o: reference(x, w, residual=r)[0]),
        Variant("fused_add", lambda x, r, w, **o: fused_add(x, r, w, **o)[0],
                lambda x, r, w, **o: reference(x, w, residual=r)[0], True),
    ]


def _rmsnorm_tiles(profile, shape, dtype, residual):
    """tune.search's space: 1 to 64 rows per task."""
    from .lab import Candidate
    from .lab.spec import pow2

    for t in pow2(1, 64):
        yield Candidate("plain", lambda t=t: (plan_plain(shape, dtype, profile=profile, token_tile=t),),
                        tiles={"token_tile": t}, shape=tuple(shape))
        yield Candidate("fused_add", lambda t=t: (plan_fused_add(shape, dtype, residual_dtype="fp32", profile=profile,
                                                                 token_tile=t),),
                        tiles={"token_tile": t}, shape=tuple(shape))


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed

    return OpSpec(
        name="rmsnorm",
        # the seed has no rmsnorm rule: plain is the norm it has (rope.rmsnorm's math); fused_add
        # is what production runs (vLLM, the Qwen3 decode layer) when a residual add precedes it
        seed=Seed("plain", "fused_add",
                  "the seed has no rmsnorm rule: plain, its only norm; fused_add when a residual add precedes it"),
        inputs=Inputs(make=_make, default_shape=(16, 2048), help="x shape [..., D], e.g. 16,2048"),
        variants=_variants,
        advise=_advise,
        oracles={"rmsnorm_plain": reference, "rmsnorm_fused_add": reference},
        tiles=_rmsnorm_tiles,
    )


OP = _lab_spec()
