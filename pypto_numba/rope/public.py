"""RoPE's public functions: the four strategies (one call memo for all of them) and cos_sin."""

from __future__ import annotations

import functools
import math as _math
import numbers

import numpy as np

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError
from ..interop import torch_aware
from ..machine import dtypes
from ..machine import tile
from ..machine.memo import CallMemo
from ..machine.profile import resolve_cast_mode
from ..machine.tile import LINE, STREAM_MIN_BYTES, ScratchPool
from ..strategy import Launch, register
from .kernels import _cos_sin_kernel, _interleaved_kernel, _norm_rope_kernel
from .plans import (_geometry, _plan, _table_rows, plan_cos_sin, plan_fused_rmsnorm, plan_interleaved,
                    plan_rmsnorm, plan_standard)



def _eps(eps, where):
    if isinstance(eps, (bool, np.bool_)) or not isinstance(eps, numbers.Real) or not (
        _math.isfinite(float(eps)) and float(eps) >= 0.0
    ):
        raise ConstraintError(f"{where}: eps must be a finite number >= 0, got {eps!r}")
    return float(eps)


def _tables(where, xt, cos, sin):
    ct = inputs.tensor(cos, "cos", where, min_rank=2)
    st = inputs.tensor(sin, "sin", where, min_rank=2)
    if ct.shape != st.shape:
        raise ShapeError(f"{where}: cos and sin must have the same shape, got {ct.shape} and {st.shape}")
    if ct.dtype != xt.dtype or st.dtype != xt.dtype:
        raise DTypeError(
            f"{where}: cos/sin must have x's dtype ({xt.dtype}), got cos={ct.dtype}, sin={st.dtype}; "
            f"cast them, e.g. cos.astype(x.dtype), or build them with rope.cos_sin(..., dtype=x.dtype)"
        )
    return ct, st


def _weight(where, xt, weight):
    wt = inputs.tensor(weight, "weight", where, min_rank=1)
    D = xt.shape[-1]
    if wt.shape != (D,):
        raise ShapeError(f"{where}: weight must have shape ({D},) (the last dim of x {xt.shape}), got {wt.shape}")
    if wt.dtype != xt.dtype:
        raise DTypeError(f"{where}: weight must have x's dtype ({xt.dtype}), got {wt.dtype}; cast it with weight.astype(x.dtype)")
    return wt


def _streamable(out_k):
    """Streaming stores for outputs of at least ``STREAM_MIN_BYTES`` (module attribute: tests lower it)."""
    return tile.streamable(out_k, STREAM_MIN_BYTES)


_DUMMY = {name: np.zeros((1, 2), dt) for name, dt in dtypes.KERNEL.items()}


class _Call:
    """What a rope call derives from its signature: its plan, geometry and kernel constants
    (kept per signature in ``_CALLS``; see :class:`~pypto_numba.machine.memo.CallMemo`)."""

    __slots__ = ("kind", "where", "plan", "S", "H", "D", "R", "T", "cbase", "dtype", "kdt", "eps", "shapes", "scratch")

    def __init__(self, kind, where, plan, geometry, cbase, dtype, eps, shapes, scratch):
        self.kind, self.where, self.plan = kind, where, plan
        _, self.S, self.H, self.D, self.R = geometry
        self.T = plan.params["token_tile"]
        self.cbase, self.dtype, self.kdt = cbase, dtype, dtypes.KERNEL[dtype]
        self.eps, self.shapes, self.scratch = eps, shapes, scratch


_CALLS = CallMemo()


def _call(kind, x, weight, cos, sin, eps, profile, token_tile, out, cast_mode=None):
    """Run one rope call: what its signature determines comes from ``_CALLS`` when an earlier
    call had the same one, else from the full validation (which then keeps it)."""
    key = _CALLS.key(profile, (x, weight, cos, sin, out), (kind, eps, token_tile))
    c, arrays, copied = _CALLS.through(key, _prepare, kind, x, weight, cos, sin, eps, profile, token_tile, out)
    cm = resolve_cast_mode(cast_mode, profile, c.where, narrows=c.dtype != "fp32")
    return _launch(c, *(arrays or (x, weight, cos, sin)), out, copied, cm)


def _prepare(kind, x, weight, cos, sin, eps, profile, token_tile, out):
    """Validate a call in full -> (its :class:`_Call`, the contiguous arrays the kernel reads
    (x, weight, cos, sin; None where unused), the bytes copied to make them contiguous)."""
    where = f"rope.{kind}"
    norm = kind in ("rmsnorm", "fused_rmsnorm")
    rope = kind != "rmsnorm"
    xt = inputs.tensor(x, "x", where)  # rank checked by _geometry (with the layout in the message)
    ct = st = wt = None
    if rope:
        ct, st = _tables(where, xt, cos, sin)
    if norm:
        wt = _weight(where, xt, weight)
        eps = _eps(eps, where)
    p = _plan(kind, xt.shape, ct.shape if rope else None, xt.dtype, profile, token_tile)
    geometry = _geometry(where, xt.shape, ct.shape if rope else None, rope=rope, norm_only=not rope)
    n_lead, S, H, D, R = geometry
    if out is not None:
        inputs.check_out_signature(where, xt, out)  # its memory: every call, in _launch
    cbase = _table_rows(xt.shape, ct.shape, S) if rope else np.zeros(n_lead, np.int64)
    staged = (D + LINE // dtypes.itemsize(xt.dtype), dtypes.KERNEL[xt.dtype])
    if kind == "interleaved":
        # x_even, x_odd, cos_even, cos_odd, sin_even, sin_odd, y_even, y_odd (fp32), and the
        # staged output head row (+ a carried line)
        scratch = ScratchPool((R // 2, np.float32, 8), staged)
    else:  # fp32 row, weight, cos, sin; and the staged output head row (+ a carried line)
        scratch = ScratchPool((max(D, R), np.float32, 4), staged)
    shapes = [a.shape for a in (xt, wt, ct, st) if a is not None]
    c = _Call(kind, where, p, geometry, cbase, xt.dtype, float(eps if norm else 0.0), shapes, scratch)
    copied = xt.copied_bytes + sum(a.copied_bytes for a in (wt, ct, st) if a is not None)
    arrays = [None if a is None else a.array for a in (xt, wt, ct, st)]
    return c, arrays, copied


def _launch(c, x, weight, cos, sin, out, copied, cm):
    """Run the kernel of a prepared call on arrays of its signature (``out=None``: a new result)."""
    H, D, R, kdt = c.H, c.D, c.R, c.kdt
    if out is None:
        result, out_k = tile.aligned_empty(x.shape, c.dtype)
    else:
        inputs.check_out_memory(c.where, x, out)
        result, out_k = out, out.view(kdt)
    rope = c.kind != "rmsnorm"
    dummy = _DUMMY[c.dtype]
    ck = cos.view(kdt).reshape(-1, R) if rope else dummy
    sk = sin.view(kdt).reshape(-1, R) if rope else dummy
    xk = x.view(kdt).reshape(-1, H * D)
    ok = out_k.reshape(-1, H * D)
    stream = _streamable(out_k)
    cast = int(c.dtype != "fp32")
    slabs = c.scratch.take()
    with Launch(c.plan, c.shapes) as run:
        if c.kind == "interleaved":
            counted = _interleaved_kernel(xk, ck, sk, c.cbase, ok, c.S, H, c.T, cast, stream, *slabs, cm)
        else:
            norm = c.kind != "standard"
            # fp32 rope alone, with every head row (and its second rotary half) starting on a line
            line = LINE // out_k.itemsize
            direct = bool(stream and rope and not norm and c.dtype == "fp32" and tile.address(out_k) % LINE == 0
                          and D % line == 0 and (R // 2) % line == 0)
            wk = weight.view(kdt) if norm else dummy[0]
            counted = _norm_rope_kernel(xk, wk, ck, sk, c.cbase, ok, c.S, H, c.T, c.eps, norm, rope, cast,
                                        stream, direct, *slabs, cm)
        run.count(counted)
        run.workspace(copied)
    c.scratch.give(slabs)
    return result


@register("rope", "standard", plan=plan_standard, summary="split-half (rotate_half, NeoX/HF) RoPE, one vector kernel")
def standard(x, cos, sin, *, profile=None, token_tile=None, out=None, cast_mode=None):
    """Split-half RoPE of ``x[..., S, H, D]`` with HF tables ``cos, sin[..., S, R]``.

    ``out[..., :R] = x[..., :R]*cos + cat(-x2, x1)*sin`` with ``x1, x2`` the halves of
    ``x[..., :R]``; dims ``R..D`` are copied. ``token_tile``: tokens per task (default: the
    profile's ``rope_token_tile``, lowered until the tiles fit UB); ``out=``: write the result
    there (x's shape and dtype; ``out=x`` works in place); ``cast_mode``: the rounding of the one
    fp32 -> bf16/fp16 cast (``machine/dtypes.py``; default from ``use_cast_mode`` / the profile:
    rint).
    """
    return _call("standard", x, None, cos, sin, 0.0, profile, token_tile, out, cast_mode)


@register("rope", "rmsnorm", plan=plan_rmsnorm, summary="per-head RMSNorm over D, one vector kernel (then apply a rope strategy)")
def rmsnorm(x, weight, eps=1e-6, *, profile=None, token_tile=None, out=None, cast_mode=None):
    """RMSNorm over the last dim: ``x * rsqrt(mean(x**2) + eps) * weight``, fp32 inside, one cast.

    ``x[..., S, H, D]`` (also ``x[S, D]``, ``x[D]``), ``weight[D]``. Options as :func:`standard`.
    """
    return _call("rmsnorm", x, weight, None, None, eps, profile, token_tile, out, cast_mode)


@register("rope", "fused_rmsnorm", plan=plan_fused_rmsnorm, summary="Qwen3 q/k RMSNorm + split-half RoPE in one kernel, fp32 between")
def fused_rmsnorm(x, weight, cos, sin, eps=1e-6, *, profile=None, token_tile=None, out=None, cast_mode=None):
    """``standard(rmsnorm(x, weight, eps), cos, sin)`` in one kernel, fp32 in between, one cast.

    Saves one kernel and one GM round trip of x (write + read of the normed tensor) over
    :func:`rmsnorm` followed by :func:`standard`. Options as :func:`standard`.
    """
    return _call("fused_rmsnorm", x, weight, cos, sin, eps, profile, token_tile, out, cast_mode)


@register("rope", "interleaved", plan=plan_interleaved, summary="GPT-J pairs via gathermask even/odd split, output interleaved")
def interleaved(x, cos, sin, *, profile=None, token_tile=None, out=None, cast_mode=None):
    """GPT-J RoPE of ``x[..., S, H, D]``: pairs ``(2k, 2k+1)`` rotated, output interleaved.

    ``out[2k] = x[2k]*cos[2k] - x[2k+1]*sin[2k]``, ``out[2k+1] = x[2k+1]*cos[2k+1] + x[2k]*sin[2k+1]``
    for ``k < R/2``; dims ``R..D`` are copied. Like PyPTO's InterleaveRope the kernel splits x,
    cos and sin into even/odd halves (gathermask modes 1/2) in fp32, but it assembles the result
    back into the input's interleaved layout. Options as :func:`standard`.

    **Tables: GPT-J pair layout**, ``cos[..., 2k] == cos[..., 2k+1] == cos(f[k])`` (sin alike), as
    ``rope.cos_sin(..., layout="interleaved")`` builds them. The HF split-half tables of
    ``cos_sin(..., layout="half")`` (``cos(cat(f, f))``, for :func:`standard`) give wrong results
    here; they are refused with a ConstraintError when they can be told apart: every row checked
    (the first and the last 8 table rows) has equal halves and some has unequal pairs. Tables of
    any other content are applied as the formula says (rows at position 0, or R = 2, are both).
    """
    _refuse_half_tables(cos, sin)
    return _call("interleaved", x, None, cos, sin, 0.0, profile, token_tile, out, cast_mode)


def _looks_half(table) -> bool:
    """Whether a table's first and last 8 rows all have equal halves and one has unequal pairs."""
    a = np.asarray(table)
    name = dtypes.storage_name(a.dtype)
    if name is None or a.ndim < 2 or a.shape[-1] < 4 or a.shape[-1] % 2 or a.size == 0:
        return False
    R = a.shape[-1]
    rows = a.reshape(-1, R)
    if rows.shape[0] > 16:
        rows = np.concatenate([rows[:8], rows[-8:]])
    bits = np.ascontiguousarray(rows).view(np.uint32 if name == "fp32" else np.uint16)
    return bool(np.array_equal(bits[:, :R // 2], bits[:, R // 2:]) and not np.array_equal(bits[:, 0::2], bits[:, 1::2]))


def _refuse_half_tables(cos, sin):
    for name, t in (("cos", cos), ("sin", sin)):
        if _looks_half(t):
            raise ConstraintError(
                f"rope.interleaved: {name} is a split-half (HF) table: {name}[..., i] == {name}[..., R/2 + i] in every "
                f"row checked, but {name}[..., 2k] != {name}[..., 2k+1]. rope.interleaved expects GPT-J pair tables "
                f"({name}[..., 2k] == {name}[..., 2k+1]): build them with rope.cos_sin(..., layout='interleaved'), "
                f"or rotate with rope.standard, which these tables are for")


LAYOUTS = ("half", "interleaved")


@functools.partial(torch_aware, where="rope.cos_sin")  # torch positions/dtype in, torch tables out
def cos_sin(positions, rot_dim, theta=10000.0, dtype=np.float32, scaling=None, layout="half", *,
            max_position=None, max_position_embeddings=None, profile=None, token_tile=None):
    """Tables ``(cos, sin)``, each ``[*positions.shape, rot_dim]`` in ``dtype``.

    ``f[p, i] = positions[p] * inv[i]`` (i < rot_dim/2), ``inv[i] = theta**(-2i/rot_dim)`` unless
    ``scaling`` says otherwise. ``layout="half"`` (HF, for :func:`standard` / :func:`fused_rmsnorm`):
    ``cos = cos(cat(f, f))``, ``sin = sin(cat(f, f))``. ``layout="interleaved"`` (GPT-J, for
    :func:`interleaved`): ``cos[..., 2i] = cos[..., 2i+1] = cos(f[i])``, sin alike.

    ``scaling``: a Hugging Face ``rope_scaling`` dict as a config holds it, type under
    ``rope_type`` or ``type``: ``linear``, ``dynamic`` (NTK; scales for the sequence length
    ``max_position``, default ``positions.max() + 1``), ``llama3`` (``factor``,
    ``low_freq_factor``, ``high_freq_factor``, ``original_max_position_embeddings``) or ``yarn``
    (its attention factor multiplies cos and sin). ``max_position_embeddings``: the config's, for
    ``dynamic`` / ``yarn`` dicts without ``original_max_position_embeddings``. The formulas:
    ``rope/scaling.py`` (Hugging Face transformers' ``modeling_rope_utils``).

    Angles and cos/sin are computed in float64 and rounded once to float32 (then to bf16/fp16: a
    double rounding that can differ from a single one only on a 16-bit tie). HF computes the
    angles in fp32, which is off by up to ``|position| * 2**-24`` radians. ``positions``: integer
    or float array (any shape), e.g. ``numpy.arange(S)``.
    """
    from .scaling import frequencies

    where = "rope.cos_sin"
    pos = np.asarray(positions)
    if pos.dtype.kind not in "iuf":
        raise DTypeError(
            f"{where}: positions must be an integer or float array, got dtype {pos.dtype}; "
            f"use numpy.arange(S)"
        )
    if not (isinstance(theta, numbers.Real) and not isinstance(theta, (bool, np.bool_))
            and _math.isfinite(float(theta)) and float(theta) > 0.0):
        raise ConstraintError(f"{where}: theta must be a finite number > 0, got {theta!r}")
    if layout not in LAYOUTS:
        raise ConstraintError(f"{where}: layout must be 'half' (HF cat(f, f), for rope.standard) or 'interleaved' "
                              f"(GPT-J pairs, for rope.interleaved), got {layout!r}")
    p = plan_cos_sin(pos.shape, rot_dim, dtype, profile=profile, token_tile=token_tile)
    pos64 = np.ascontiguousarray(pos, dtype=np.float64).reshape(-1)
    if not np.all(np.isfinite(pos64)):
        raise ConstraintError(f"{where}: positions must be finite")
    R = p.params["rot_dim"]
    if max_position is None and pos64.size:
        max_position = float(pos64.max()) + 1.0
    inv_freq, factor = frequencies(R, float(theta), scaling, max_position=max_position,
                                   max_position_embeddings=max_position_embeddings, where=where)
    shape = pos.shape + (R,)
    c, ck = dtypes.empty(shape, p.dtype)
    s, sk = dtypes.empty(shape, p.dtype)
    with Launch(p, [pos.shape]) as run:
        run.count(_cos_sin_kernel(pos64, np.ascontiguousarray(inv_freq), ck.reshape(-1, R), sk.reshape(-1, R),
                                  p.params["token_tile"], float(factor), layout == "interleaved"))
    return c, s
