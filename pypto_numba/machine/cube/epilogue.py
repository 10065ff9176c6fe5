"""The cube's epilogue (L0C -> GM, the fixpipe): the fused bias and the one rounding."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..jit import device


@device(boundscheck=False)
def epilogue(c, rows, cols, bias, has_bias, out, r0, c0):
    """L0C -> GM: ``out[r0+i, c0+j] = round_out(c[i, j] (+ widen(bias[c0+j])))``, one rounding."""
    oc = np.uint64(c0)  # unsigned indices: see the module docstring
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
