"""The public rmsnorm strategies: plain, fused_add, deferred (and fold, its weight helper)."""

from __future__ import annotations

import functools

import numpy as np

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError
from ..interop import torch_aware
from ..machine import dtypes, tile
from ..machine.memo import CallMemo
from ..machine.profile import resolve_cast_mode
from ..machine.tile import ScratchPool, aligned_empty
from ..strategy import Launch, register
from .kernels import ROW_OPS, _rmsnorm_kernel
from .plans import (
    _check_eps,
    _check_offset,
    _check_residual_dtype,
    _check_weight_dtype,
    _plan,
    plan_deferred,
    plan_fused_add,
    plan_plain,
)

# ---------------------------------------------------------------------------------------------
# plain and fused_add


class _Call:
    """What a call derives from its signature (kept per signature in ``_CALLS``)."""

    __slots__ = ("D", "dtype", "eps", "offset", "plan", "rdtype", "row_ops", "scratch", "shapes", "where")

    def __init__(self, where, plan, D, dtype, rdtype, eps, shapes):
        self.where, self.plan, self.D = where, plan, D
        self.dtype, self.rdtype = dtype, rdtype
        self.eps, self.offset = eps, plan.params["offset"]
        self.row_ops = ROW_OPS[plan.params["inv"]]
        self.shapes = shapes
        self.scratch = ScratchPool((D, np.float32, 2))


_NO_SCALE = np.zeros(1, np.float32)  # the kernel's scale argument when it writes no scales


_CALLS = CallMemo()


def _prepare(kind, x, residual, weight, eps, offset, inv, profile, token_tile, out, residual_out=None):
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
    if residual_out is not None:
        _check_residual_out(where, rt, residual_out)
    shapes = [a.shape for a in (xt, rt, wt) if a is not None]
    c = _Call(where, p, D, xt.dtype, rt.dtype if add else None, eps, shapes)
    copied = sum(a.copied_bytes for a in (xt, rt, wt) if a is not None)
    return c, (xt.array, None if rt is None else rt.array, wt.array), copied


def _launch(c, x, residual, weight, out, copied, cm, residual_out=None):
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
        if residual_out is not None:
            _check_residual_out_memory(c.where, x, residual, out, residual_out)
            new, new_k = residual_out, dtypes.kernel_view(residual_out)
        else:
            new, new_k = aligned_empty(x.shape, c.rdtype)
        rk, nk = dtypes.kernel_view(residual).reshape(-1, D), new_k.reshape(-1, D)
    else:
        rk, nk = xk, ok
    stream_out = tile.stream_from(ok, xk, rk)
    stream_res = add and tile.stream_from(nk, xk, rk)
    slabs = c.scratch.take()
    with Launch(c.plan, c.shapes) as run:
        run.count(_rmsnorm_kernel(xk, rk, dtypes.kernel_view(weight), ok, nk, c.plan.params["token_tile"],
                                  c.eps, c.offset, add, False, _NO_SCALE, c.row_ops, *slabs, cm, stream_out, stream_res))
        run.workspace(copied)
    c.scratch.give(slabs)
    return (result, new) if add else result


def _call(kind, x, residual, weight, eps, offset, inv, profile, token_tile, out, cast_mode, residual_out=None):
    key = _CALLS.key(profile, (x, residual, weight, out, residual_out), (kind, eps, offset, inv, token_tile))
    c, arrays, copied = _CALLS.through(key, _prepare, kind, x, residual, weight, eps, offset, inv, profile,
                                       token_tile, out, residual_out)
    narrows = c.dtype != "fp32" or c.rdtype not in (None, "fp32")
    cm = resolve_cast_mode(cast_mode, profile, c.where, narrows)
    return _launch(c, *(arrays or (x, residual, weight)), out, copied, cm, residual_out)


def _check_residual_out(where, rt, residual_out):
    """``residual_out=`` by its signature: a C-contiguous numpy array of the residual's dtype and shape."""
    if not isinstance(residual_out, np.ndarray) or dtypes.storage_name(residual_out.dtype) != rt.dtype:
        got = residual_out.dtype if isinstance(residual_out, np.ndarray) else type(residual_out).__name__
        raise DTypeError(f"{where}: residual_out must be a numpy array of the residual's dtype ({rt.dtype}), "
                         f"got {got}")
    if residual_out.shape != rt.shape:
        raise ShapeError(f"{where}: residual_out must have the residual's shape {rt.shape}, got {residual_out.shape}")
    if not residual_out.flags.c_contiguous:
        raise ConstraintError(f"{where}: residual_out must be a writeable C-contiguous array")


def _check_residual_out_memory(where, x, residual, out, residual_out):
    """``residual_out`` is the residual itself (in place) or apart from x, the residual and ``out``."""
    if not residual_out.flags.writeable:
        raise ConstraintError(f"{where}: residual_out must be a writeable C-contiguous array")
    if tile.address(residual_out) == tile.address(residual) and residual_out.shape == residual.shape:
        return
    for name, a in (("x", x), ("residual", residual), ("out", out)):
        if a is not None and np.may_share_memory(residual_out, a):
            raise ConstraintError(f"{where}: residual_out overlaps {name}; pass residual_out=residual (in place) "
                                  f"or a separate array")


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
              residual_out=None, cast_mode=None):
    """``new = residual + x`` (fp32 add, rounded to the residual's dtype, fp32 or x's) and
    ``normed = plain(new, weight, eps, offset)`` in x's dtype, in one kernel -> ``(normed, new)``.

    Saves the GM re-read of ``new`` and a kernel over an add followed by :func:`plain`. ``out=``
    receives ``normed``; ``residual_out=`` receives ``new`` (the residual's shape and dtype;
    ``residual_out=residual`` updates it in place, as vLLM's fused_add_rms_norm does). Options as
    :func:`plain` (``cast_mode`` rounds both casts, normed and new).
    """
    return _call("fused_add", x, residual, weight, eps, offset, inv, profile, token_tile, out, cast_mode,
                 residual_out)




# ---------------------------------------------------------------------------------------------
# deferred: the 1/rms scale of each row, for the next Linear's epilogue


def _prepare_deferred(x, eps, inv, profile, token_tile, out):
    where = "rmsnorm.deferred"
    xt = inputs.tensor(x, "x", where)
    eps = _check_eps(where, eps)
    p = _plan("deferred", xt.shape, xt.dtype, None, None, 0.0, inv, profile, token_tile)
    lead = xt.shape[:-1]
    if out is not None:
        if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != lead:
            got = f"{out.dtype} {out.shape}" if isinstance(out, np.ndarray) else type(out).__name__
            raise ShapeError(f"{where}: out must be a float32 array of x's leading dims {lead} (one scale per "
                             f"row), got {got}")
        if not out.flags.c_contiguous:
            raise ShapeError(f"{where}: out must be C-contiguous; pass numpy.empty({lead}, numpy.float32)")
    c = _Call(where, p, xt.shape[-1], xt.dtype, None, eps, [xt.shape])
    return c, (xt.array, None, None), xt.copied_bytes


def _launch_deferred(c, x, out, copied):
    D = c.D
    xk = dtypes.kernel_view(x).reshape(-1, D)
    lead = x.shape[:-1]
    result = np.empty(lead, np.float32) if out is None else out
    scale = result.reshape(-1)
    slabs = c.scratch.take()
    with Launch(c.plan, c.shapes) as run:
        run.count(_rmsnorm_kernel(xk, xk, _NO_SCALE, xk, xk, c.plan.params["token_tile"], c.eps, 0.0, False, True,
                                  scale, c.row_ops, *slabs, dtypes.RINT, False, False))
        run.workspace(copied)
    c.scratch.give(slabs)
    return result


@register("rmsnorm", "deferred", plan=plan_deferred,
          summary="only the fp32 1/rms of each row, for the next Linear's epilogue (the normed rows never in GM)")
def deferred(x, eps=1e-6, *, inv="rsqrt", profile=None, token_tile=None, out=None, cast_mode=None):
    """``1/sqrt(mean(x**2) + eps)`` of each row of ``x[..., D]`` in fp32 -> ``[...]`` (x's leading
    dims), the scale :func:`plain` multiplies by, computed by plain's kernel and row loop (within
    2 fp32 ulps of plain's normed row over ``x``: see the module docstring).

    The deferred 1/rms denominator of production Qwen3-14B decode (``inv_rms_states``, npu-facts
    8.4): ``(x * r_i * g) @ W^T = r_i * (x @ (W * g)^T)``, so with the gamma folded into the next
    Linear's weight once (:func:`fold`), ``linear.fused_bias(x, fold(g, W), row_scale=deferred(x))``
    is RMSNorm then the Linear, and the normed tensor is never written to GM (this kernel writes
    ``N*4`` bytes instead of ``N*D*bx``; the Linear reads x in place of the normed rows).
    ``inv``, ``token_tile`` as :func:`plain`; ``out=``: fp32, x's leading dims. ``cast_mode`` is
    accepted and has no effect: the output is fp32, nothing is narrowed (a bad mode name is
    still an error).
    """
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, "rmsnorm.deferred")
    key = _CALLS.key(profile, (x, out), ("deferred", eps, inv, token_tile))
    c, arrays, copied = _CALLS.through(key, _prepare_deferred, x, eps, inv, profile, token_tile, out)
    return _launch_deferred(c, x if arrays is None else arrays[0], out, copied)


@functools.partial(torch_aware, where="rmsnorm.fold")
def fold(weight, linear_weight, offset=0.0):
    """The next Linear's weight with the norm's gamma folded in: ``linear_weight * (weight + offset)``
    along K (``linear_weight[N, K]``, ``weight[K]``), in fp32, rounded once (rint) to
    ``linear_weight``'s storage dtype. NumPy, not a kernel: done once per model load (CPU torch
    tensors in, a torch tensor out, as the strategies).

    With it, :func:`deferred` + ``linear.fused_bias(..., row_scale=)`` differs from :func:`plain`
    + Linear by one rounding of the weight (``W * g`` to the storage dtype) instead of one of the
    normed activations (``x * r * g`` to x's dtype).
    """
    where = "rmsnorm.fold"
    wt = inputs.tensor(linear_weight, "linear_weight", where, min_rank=2, max_rank=2)
    gt = inputs.tensor(weight, "weight", where, max_rank=1)
    K = wt.shape[1]
    if gt.shape != (K,):
        raise ShapeError(f"{where}: weight must have shape ({K},) (K of linear_weight {wt.shape}, the "
                         f"[N, K] torch.nn.functional.linear layout), got {gt.shape}")
    offset = _check_offset(where, offset)
    g = gt.array.astype(np.float32)
    if offset != 0.0:
        g = g + np.float32(offset)
    prod = wt.array.astype(np.float32) * g[None, :]
    return prod.astype(wt.array.dtype)
