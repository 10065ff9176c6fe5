"""The cube's epilogue (L0C -> GM, the fixpipe): the fused bias and the one rounding.

This is the epilogue of ``linear.fused_bias``: the bias is added to the fp32 accumulator here
and the sum is rounded once to the output dtype. Every path of the walk (:mod:`.walk`) ends here.
"""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..jit import device


@device(boundscheck=False)
def epilogue(
    c,
    rows,
    cols,
    bias,
    has_bias,
    out,
    r0,
    c0,
):
    """L0C -> GM: ``out[r0+i, c0+j] = round_out(c[i, j] (+ widen(bias[c0+j])))``, one rounding.

    Parameters
    ----------
    c : fp32 L0C tiles of the block, ``c[:rows, :cols]`` valid
    bias, has_bias : the bias kernel view ``[N]`` (storage dtype), read only when ``has_bias``
    out : the output kernel view ``[M, N]``; its dtype is the one rounded to
    r0, c0 : the block's first row and column in ``out``
    """
    oc = np.uint64(c0)  # unsigned indices: see machine/jit.py
    if has_bias:
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
