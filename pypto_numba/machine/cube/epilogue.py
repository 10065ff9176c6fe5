"""The cube's epilogue (L0C -> GM): the fused bias, a per-row scale, the gated SiLU, and the one
rounding.

:func:`epilogue` is the epilogue of ``linear.fused_bias``: an optional fp32 scale per output row
multiplies the fp32 accumulator and the bias is added to it here, and the result is rounded once
to the output dtype. Every path of the walk
(:mod:`.walk`) ends here. :func:`epilogue_swiglu` ends ``linear.gate_up_swiglu``: two fp32
accumulators (gate and up) combined as ``silu(gate) * up`` by the vector unit (a mixed kernel),
one rounding. :func:`silu`, :func:`clamp_gate`, :func:`clamp_up` are that activation, written once
for the epilogue and for swiglu's vector kernels.
"""

from __future__ import annotations

import numpy as np

from numba import types
from numba.extending import intrinsic

from .. import dtypes, ir as irb, vmath
from ..jit import device

NEG_INF = np.float32(-np.inf)


# The activation in LLVM IR on a float32 scalar or ``<L x float>`` vector (``lim`` a value of the
# same type): written once here, for swiglu's 512-bit spans, and wrapped below for numba code.

def silu_ir(builder, g):
    """``g * sigmoid(g)``; ``silu(-inf) = 0``, the limit (the formula gives -inf * 0 = nan)."""
    o = irb.FOps(builder, g.type)
    return o.select(o.eq(g, float(NEG_INF)), 0.0, o.mul(g, vmath.sigmoid_ir(builder, g)))


def clamp_gate_ir(builder, g, lim):
    """``min(g, lim)``, torch's ``clamp(max=lim)``: NaN stays NaN; ``lim = +inf`` is no clamp."""
    o = irb.FOps(builder, g.type)
    return o.select(o.gt(g, lim), lim, g)


def clamp_up_ir(builder, u, lim):
    """``u`` clamped to ``[-lim, lim]``, torch's ``clamp(-lim, lim)``: NaN stays NaN."""
    o = irb.FOps(builder, u.type)
    u = o.select(o.gt(u, lim), lim, u)
    neg = builder.fneg(lim)
    return o.select(o.lt(u, neg), neg, u)


def _is_num(*args):
    return all(isinstance(a, (types.Float, types.Integer)) for a in args)


@intrinsic
def silu(typingctx, g):
    """:func:`silu_ir` on a float32 scalar (numba casts the argument to float32)."""
    if _is_num(g):
        return types.float32(types.float32), lambda context, builder, sig, a: silu_ir(builder, *a)


@intrinsic
def clamp_gate(typingctx, g, lim):
    """:func:`clamp_gate_ir` on float32 scalars."""
    if _is_num(g, lim):
        return types.float32(types.float32, types.float32), lambda context, builder, sig, a: clamp_gate_ir(builder, *a)


@intrinsic
def clamp_up(typingctx, u, lim):
    """:func:`clamp_up_ir` on float32 scalars."""
    if _is_num(u, lim):
        return types.float32(types.float32, types.float32), lambda context, builder, sig, a: clamp_up_ir(builder, *a)


@device(boundscheck=False)
def epilogue(
    c,
    rows,
    cols,
    bias,
    has_bias,
    scale,
    has_scale,
    out,
    r0,
    c0,
):
    """L0C -> GM: ``out[r0+i, c0+j] = round_out((scale[r0+i] *) c[i, j] (+ widen(bias[c0+j])))``,
    one rounding (the per-row scale and the bias applied to the fp32 accumulator first).

    Parameters
    ----------
    c : fp32 L0C tiles of the block, ``c[:rows, :cols]`` valid
    bias, has_bias : the bias kernel view ``[N]`` (storage dtype), read only when ``has_bias``
    scale, has_scale : an fp32 scale per output row ``[M]``, read only when ``has_scale``
    out : the output kernel view ``[M, N]``; its dtype is the one rounded to
    r0, c0 : the block's first row and column in ``out``
    """
    oc = np.uint64(c0)  # unsigned indices: see machine/jit.py
    if has_scale:
        for i in range(rows):
            ro = np.uint64(r0 + i)
            ri = np.uint64(i)
            s = scale[ro]
            if has_bias:
                for j in range(np.uint64(cols)):
                    out[ro, oc + j] = dtypes.narrow(out, s * c[ri, j] + dtypes.widen(bias[oc + j]))
            else:
                for j in range(np.uint64(cols)):
                    out[ro, oc + j] = dtypes.narrow(out, s * c[ri, j])
    elif has_bias:
        for i in range(rows):
            ro = np.uint64(r0 + i)
            ri = np.uint64(i)
            for j in range(np.uint64(cols)):
                out[ro, oc + j] = dtypes.narrow(out, c[ri, j] + dtypes.widen(bias[oc + j]))
    else:
        for i in range(rows):
            ro = np.uint64(r0 + i)
            ri = np.uint64(i)
            for j in range(np.uint64(cols)):
                out[ro, oc + j] = dtypes.narrow(out, c[ri, j])


@device(boundscheck=False, fastmath=set(vmath.VMATH_FASTMATH))
def epilogue_swiglu(
    cg,
    cu,
    rows,
    cols,
    lim,
    out,
    r0,
    c0,
):
    """L0C -> GM of a gated MLP: ``out[r0+i, c0+j] = round_out(silu(clamp_gate(g)) * clamp_up(u))``
    of the gate and up accumulators ``g = cg[i, j]``, ``u = cu[i, j]`` (fp32), one rounding.

    Parameters
    ----------
    cg, cu : fp32 L0C tiles of the block (gate, up), ``[:rows, :cols]`` valid
    lim : float32 clamp limit (``+inf``: no clamp)
    out : the output kernel view ``[M, N]``; its dtype is the one rounded to
    r0, c0 : the block's first row and column in ``out``
    """
    oc = np.uint64(c0)  # unsigned indices: see machine/jit.py
    for i in range(rows):
        ro = np.uint64(r0 + i)
        ri = np.uint64(i)
        for j in range(np.uint64(cols)):
            g = clamp_gate(cg[ri, j], lim)
            out[ro, oc + j] = dtypes.narrow(out, silu(g) * clamp_up(cu[ri, j], lim))
