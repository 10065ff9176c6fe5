"""RoPE shapes and plans: geometry checks, the UB tiles of one task, the token tile, the counted cost."""

from __future__ import annotations

import functools
import math as _math
import numbers

import numpy as np

from .. import inputs
from ..errors import ShapeError
from ..machine import dtypes
from ..machine.memo import memo_plan
from ..machine.plan import KernelPlan, Plan, align_elems, reduce_tile, vector_tile
from ..machine.profile import load_profile
from .kernels import NORM_OPS, ROPE_OPS, ROW_OPS, SPLIT_OPS



def _geometry(where, x_shape, cos_shape=None, *, rope=True, norm_only=False):
    """(n_lead, S, H, D, R) of ``x[..., S, H, D]`` (and of the tables ``cos[..., S, R]``).

    ``norm_only`` (rmsnorm) also reads x[S, D] as H=1 and x[D] as S=H=1.
    """
    x_shape = tuple(int(d) for d in x_shape)
    if norm_only:
        inputs.check_rank(x_shape, "x", where, min_rank=1)
        full = (1,) * max(0, 3 - len(x_shape)) + x_shape
        if len(x_shape) == 2:  # x[S, D]: one head per token
            full = (x_shape[0], 1, x_shape[1])
    else:
        if len(x_shape) < 3:
            raise ShapeError(
                f"{where}: x must be x[..., S, H, D] (at least 3 dims), got shape {x_shape}; "
                f"for one head use x[:, None, :]"
            )
        full = x_shape
    inputs.check_size(x_shape, "x", where)
    S, H, D = full[-3:]
    n_lead = _math.prod(full[:-3])
    R = 0
    if rope:
        R = D if cos_shape is None else int(cos_shape[-1])
        if cos_shape is not None:
            _check_tables(where, x_shape, tuple(int(d) for d in cos_shape))
    return n_lead, S, H, D, R


def _check_tables(where, x_shape, c_shape):
    if len(c_shape) < 2:
        raise ShapeError(f"{where}: cos/sin must be [S, R] or [..., S, R], got shape {c_shape}")
    inputs.check_size(c_shape, "cos", where)
    S, D = x_shape[-3], x_shape[-1]
    R = c_shape[-1]
    if R % 2:
        raise ShapeError(f"{where}: rotary dim R = cos.shape[-1] = {R} must be even")
    if R > D:
        raise ShapeError(f"{where}: rotary dim R = cos.shape[-1] = {R} exceeds head dim D = {D}")
    if c_shape[-2] != S:
        raise ShapeError(
            f"{where}: cos/sin have {c_shape[-2]} positions (shape {c_shape}) but x has S = {S} "
            f"(x shape {x_shape}, layout x[..., S, H, D]); slice the tables to cos[:S]"
        )
    lead, clead = x_shape[:-3], c_shape[:-2]
    extra = len(clead) - len(lead)
    ok = extra <= 0 or all(d == 1 for d in clead[:extra])
    clead = clead[max(extra, 0):]
    aligned = lead[len(lead) - len(clead):]
    if not ok or any(c not in (1, d) for c, d in zip(clead, aligned)):
        raise ShapeError(
            f"{where}: cos/sin leading dims {c_shape[:-2]} do not broadcast to x's leading dims "
            f"{lead} (cos/sin {c_shape}, x {x_shape})"
        )


@functools.lru_cache(maxsize=64)
def _table_rows(x_shape, c_shape, S):
    """cbase[l]: first table row used by leading index l of x (int64, one per leading index).

    Kept per shape (the kernels only read it): building it per call is NumPy work on the
    per-call path (docs/performance.md)."""
    lead, clead = x_shape[:-3], c_shape[:-2]
    n_c = _math.prod(clead)
    clead = clead[max(len(clead) - len(lead), 0):]
    idx = np.arange(n_c, dtype=np.int64).reshape(clead) if clead else np.zeros((), np.int64)
    return np.ascontiguousarray(np.broadcast_to(idx, lead).reshape(-1) * S)


def _buffers(kind, T, H, D, R, dtype, prof):
    """The UB tiles of one task (last dims padded to 32 B), as listed in the module docstring."""
    wide = dtype != "fp32"
    Ds, Df = align_elems(D, dtype, prof), align_elems(D, "fp32", prof)
    out = [("x_ub", (T, H, Ds), dtype)]
    if wide:
        out.append(("xf_ub", (T, H, Df), "fp32"))
    if kind in ("rmsnorm", "fused_rmsnorm"):
        out += [
            ("sq_ub", (T, H, Df), "fp32"),
            ("rstd_ub", (T, H, align_elems(1, "fp32", prof)), "fp32"),
            ("w_ub", (Ds,), dtype),
        ]
        if wide:
            out.append(("wf_ub", (Df,), "fp32"))
    if kind != "rmsnorm":
        Rs, Rf = align_elems(R, dtype, prof), align_elems(R, "fp32", prof)
        out += [("cos_ub", (T, Rs), dtype), ("sin_ub", (T, Rs), dtype)]
        if wide:
            out += [("cosf_ub", (T, Rf), "fp32"), ("sinf_ub", (T, Rf), "fp32")]
    if kind == "interleaved":
        Hf = align_elems(R // 2, "fp32", prof)
        out += [("x_even", (T, H, Hf), "fp32"), ("x_odd", (T, H, Hf), "fp32")]
        out += [(n, (T, Hf), "fp32") for n in ("cos_even", "cos_odd", "sin_even", "sin_odd")]
    return out


def _nbytes(specs):
    return sum(_math.prod(shape) * dtypes.itemsize(dt) for _, shape, dt in specs)


def _max_token_tile(kind, H, D, R, dtype, prof):
    """Largest token tile whose buffers fit UB (and, with a norm, the 64 KiB reduction limit)."""
    one, two = (_nbytes(_buffers(kind, t, H, D, R, dtype, prof)) for t in (1, 2))
    per_token = two - one  # every buffer but the weight is linear in T
    t_max = (prof.vec_safe_bytes - (one - per_token)) // per_token
    if kind in ("rmsnorm", "fused_rmsnorm"):  # sq_ub[T, H, D] fp32 is a reduction tile
        t_max = min(t_max, prof.reduce_tile_max_bytes // (H * align_elems(D, "fp32", prof) * 4))
    return max(0, t_max)


@memo_plan
def _plan(kind, x_shape, cos_shape, dtype, profile, token_tile) -> Plan:
    prof = load_profile(profile)
    where = f"rope.{kind}"
    name = inputs.storage_dtype(dtype, where)
    norm = kind in ("rmsnorm", "fused_rmsnorm")
    n_lead, S, H, D, R = _geometry(where, x_shape, cos_shape, rope=kind != "rmsnorm", norm_only=kind == "rmsnorm")
    if kind != "rmsnorm" and cos_shape is None and D % 2:
        raise ShapeError(f"{where}: full rotary needs an even head dim, got D = {D}")
    t_max = _max_token_tile(kind, H, D, R, name, prof)
    if t_max:
        hint = f"use token_tile <= {t_max}"
    else:
        hint = (
            f"one token of H={H} heads x D={D} {name} does not fit; process fewer heads per call "
            f"(slices of the H axis)"
        )
    if token_tile is None:
        T = max(1, min(int(prof.tile("rope_token_tile")), t_max))
    else:
        T = inputs.positive_int(token_tile, "token_tile", where)
    bufs = [vector_tile(n, shape, dt, prof, where, hint) for n, shape, dt in _buffers(kind, T, H, D, R, name, prof)]
    if norm:
        reduce_tile(next(b for b in bufs if b.name == "sq_ub"), prof, where, hint)
    b = dtypes.itemsize(name)
    cast = int(name != "fp32")
    N = n_lead * S
    rows = N * H
    tasks = n_lead * -(-S // T)
    gm_read = rows * D * b
    unique = gm_read
    ops = 0
    if norm:
        gm_read += tasks * D * b
        unique += D * b  # the norm weight row is re-read by every task
        ops += rows * D * NORM_OPS + rows * ROW_OPS + cast * (rows * D * 2 + tasks * D)
    if kind != "rmsnorm":
        gm_read += 2 * N * R * b
        unique += 2 * N * R * b
        ops += rows * R * ROPE_OPS + cast * N * R * 2
        if kind == "interleaved":
            ops += rows * R * SPLIT_OPS + N * 2 * R
        if not norm:
            ops += cast * rows * R * 2
    k = KernelPlan(
        name=f"rope_{kind}",
        unit="vector",
        tasks=tasks,
        buffers=tuple(bufs),
        gm_read_bytes=gm_read,
        gm_write_bytes=rows * D * b,
        vector_ops=ops,
        gm_unique_bytes=unique,
    )
    return Plan(op="rope", strategy=kind, dtype=name, profile=prof, kernels=(k,),
                params={"token_tile": T, "rot_dim": R}, hint=hint)


def plan_standard(x_shape, cos_shape=None, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`standard` for ``x_shape`` and table shape ``cos_shape`` (default ``[S, D]``)."""
    return _plan("standard", x_shape, cos_shape, dtype, profile, token_tile)


def plan_interleaved(x_shape, cos_shape=None, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`interleaved` (shapes as :func:`plan_standard`)."""
    return _plan("interleaved", x_shape, cos_shape, dtype, profile, token_tile)


def plan_rmsnorm(x_shape, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`rmsnorm` for ``x_shape``."""
    return _plan("rmsnorm", x_shape, None, dtype, profile, token_tile)


def plan_fused_rmsnorm(x_shape, cos_shape=None, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`fused_rmsnorm` (shapes as :func:`plan_standard`)."""
    return _plan("fused_rmsnorm", x_shape, cos_shape, dtype, profile, token_tile)


@memo_plan
def plan_cos_sin(positions_shape, rot_dim, dtype="fp32", *, profile=None, token_tile=None) -> Plan:
    """Plan of :func:`cos_sin` for ``positions`` of ``positions_shape``."""
    prof = load_profile(profile)
    where = "rope.cos_sin"
    name = inputs.storage_dtype(dtype, where)
    shape = tuple(int(d) for d in positions_shape)
    inputs.check_rank(shape, "positions", where, min_rank=1)
    inputs.check_size(shape, "positions", where)
    R = _rot_dim(rot_dim, where)
    inputs.check_size(shape + (R,), "each cos/sin output table", where)
    P = _math.prod(shape)
    T = prof.tile("rope_token_tile") if token_tile is None else inputs.positive_int(token_tile, "token_tile", where)
    specs = [("pos_ub", (align_elems(T, "fp32", prof),), "fp32"),
             ("angle_ub", (T, align_elems(R // 2, "fp32", prof)), "fp32"),
             ("cos_ub", (T, align_elems(R, name, prof)), name),
             ("sin_ub", (T, align_elems(R, name, prof)), name)]
    if name != "fp32":
        specs += [("cosf_ub", (T, align_elems(R, "fp32", prof)), "fp32"),
                  ("sinf_ub", (T, align_elems(R, "fp32", prof)), "fp32")]
    per_token = _nbytes(specs) // T
    hint = f"use token_tile <= {max(1, prof.vec_safe_bytes // max(per_token, 1) - 1)}"
    bufs = [vector_tile(n, s, dt, prof, where, hint) for n, s, dt in specs]
    tasks = -(-P // T)
    b = dtypes.itemsize(name)
    k = KernelPlan(
        name="rope_cos_sin",
        unit="vector",
        tasks=tasks,
        buffers=tuple(bufs),
        gm_read_bytes=P * 8 + tasks * (R // 2) * 8,
        gm_write_bytes=2 * P * R * b,
        vector_ops=P * (R // 2) * 3 + P * 2 * R,
        gm_unique_bytes=P * 8 + (R // 2) * 8,  # the frequency row is re-read by every task
    )
    return Plan(op="rope", strategy="cos_sin", dtype=name, profile=prof, kernels=(k,),
                params={"token_tile": T, "rot_dim": R}, hint=hint)


def _rot_dim(rot_dim, where):
    if isinstance(rot_dim, (bool, np.bool_)) or not isinstance(rot_dim, numbers.Integral) or rot_dim <= 0:
        raise ShapeError(f"{where}: rot_dim must be a positive even integer, got {rot_dim!r}")
    if rot_dim % 2:
        raise ShapeError(f"{where}: rot_dim must be even (cos/sin repeat R/2 frequencies), got {rot_dim}")
    return int(rot_dim)

