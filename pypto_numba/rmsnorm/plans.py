"""The plans of the rmsnorm strategies, their tiles and the checks of their options."""

from __future__ import annotations

import math as _math
import numbers

import numpy as np

from .. import inputs
from ..errors import ConstraintError, DTypeError
from ..machine import dtypes
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from ..machine.profile import load_profile
from .kernels import ADD_OPS, CAST_OPS, INVS, NORM_OPS, ROW_OPS, SUMSQ_OPS, WIDEN_OPS

# ---------------------------------------------------------------------------------------------
# plans


def _buffers(kind, T, D, dtype, rdtype, wdtype, offset, prof):
    """The UB tiles of one task (last dims padded to 32 B)."""
    add = kind == "fused_add"
    Df = align_elems(D, "fp32", prof)
    out = [("x_ub", (T, align_elems(D, dtype, prof)), dtype)]
    if kind == "deferred":  # the row, widened, its squares and the scales out: no weight
        if dtype != "fp32":
            out.append(("xf_ub", (T, Df), "fp32"))
        return out + [("sq_ub", (T, Df), "fp32"), ("rstd_ub", (align_elems(T, "fp32", prof),), "fp32")]
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


def _max_rows(kind, D, dtype, rdtype, wdtype, offset, prof):
    """Largest row tile whose buffers fit UB and whose square tile fits the reduction limit."""
    one, two = (_nbytes(_buffers(kind, t, D, dtype, rdtype, wdtype, offset, prof)) for t in (1, 2))
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
    t_max = _max_rows(kind, D, name, rname, wname, offset, prof)
    hint = (f"use token_tile <= {t_max}" if t_max else
            f"one row of D={D} does not fit the {prof.reduce_tile_max_bytes} B reduction tile; split the last dim")
    if token_tile is None:
        T = max(1, min(int(prof.tile("rmsnorm_row_tile")), t_max))
    else:
        T = inputs.positive_int(token_tile, "token_tile", where)
    bufs = [vector_tile(n, s, dt, prof, where, hint) for n, s, dt in _buffers(kind, T, D, name, rname, wname, offset, prof)]
    reduce_tile(next(b for b in bufs if b.name == "sq_ub"), prof, where, hint)
    bx, br, bw = (dtypes.itemsize(n) for n in (name, rname, wname))
    tasks = -(-N // T)
    elems = N * D
    if kind == "deferred":
        return _plan_deferred(name, N, D, T, tasks, bufs, inv, prof, hint)
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




def _plan_deferred(name, N, D, T, tasks, bufs, inv, prof, hint) -> Plan:
    """deferred: read the rows once, write one fp32 scale per row; x*x and the row sum per element."""
    elems = N * D
    bx = dtypes.itemsize(name)
    mix = [("TMUL", "fp32", elems), ("TROWSUM", "fp32", elems), ("TMULS", "fp32", N), ("TADDS", "fp32", N),
           (inv, "fp32", N)]
    if name != "fp32":
        mix.append(("TCVT", name, elems * WIDEN_OPS))
    ops = elems * SUMSQ_OPS + N * ROW_OPS[inv] + int(name != "fp32") * elems * WIDEN_OPS
    k = KernelPlan(name="rmsnorm_deferred", unit="vector", tasks=tasks, buffers=tuple(bufs),
                   gm_read_bytes=elems * bx, gm_write_bytes=N * 4, vector_ops=ops, gm_unique_bytes=elems * bx,
                   vector_mix=tuple(mix), vector_tile_elems=min(T, N) * D, vector_cols=D)
    return Plan(op="rmsnorm", strategy="deferred", dtype=name, profile=prof, kernels=(k,),
                params={"token_tile": T, "inv": inv, "offset": 0.0, "weight_dtype": None, "residual_dtype": None},
                hint=hint)


def plan_deferred(x_shape, dtype="fp32", *, inv="rsqrt", profile=None, token_tile=None) -> Plan:
    """Plan of :func:`deferred` for ``x_shape``: GM read ``N*D*bx``, write ``N*4`` (one fp32 scale per row)."""
    return _plan("deferred", x_shape, dtype, None, None, 0.0, inv, profile, token_tile)
