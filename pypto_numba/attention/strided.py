"""K/V/Q/out as strided views: ``layout="bshd"`` inputs reach the kernels as ``[B, H, S, D]``
transposes of their ``[B, S, H, D]`` storage, with no copy (validation.validate).

The kernels index such views as 4-D arrays (numba's strided layout) and take their flat offsets
here: for a C-contiguous array (``layout="bhsd"``) each helper is the formula the kernels used
before (the same code, so the same bits and speed); for a strided view it reads the strides.
The last dim is contiguous in both layouts, so a key row ``a[b, h, j, :]`` is one run of memory.
"""

from __future__ import annotations

import numpy as np
from numba import prange, types
from numba.core import cgutils
from numba.core.imputils import impl_ret_borrowed
from numba.extending import intrinsic, overload

from ..machine import dtypes
from ..machine.jit import kernel
from ..machine.tile import prefetch, prefetch_row


def key_row(a, b, h, j):
    """-> (flat element offset of ``a[b, h, j, 0]``, elements between keys j and j + 1), uint64."""
    s = np.array(a.strides) // a.itemsize
    return np.uint64(b * s[0] + h * s[1] + j * s[2]), np.uint64(s[2])


@overload(key_row, jit_options={"forceinline": True})
def _key_row_impl(a, b, h, j):
    if not isinstance(a, types.Array):
        return None
    if a.layout == "C":
        def contiguous(a, b, h, j):
            uD = np.uint64(a.shape[3])
            return ((np.uint64(b) * np.uint64(a.shape[1]) + np.uint64(h)) * np.uint64(a.shape[2])
                    + np.uint64(j)) * uD, uD
        return contiguous

    def strided(a, b, h, j):
        isz = a.itemsize
        return (np.uint64(b) * np.uint64(a.strides[0] // isz) + np.uint64(h) * np.uint64(a.strides[1] // isz)
                + np.uint64(j) * np.uint64(a.strides[2] // isz)), np.uint64(a.strides[2] // isz)
    return strided


def prefetch_key(a, b, h, j):
    """Prefetch key row ``a[b, h, j, :]`` (no-op past the last key): a hint, no result changes."""


@overload(prefetch_key, jit_options={"forceinline": True})
def _prefetch_key_impl(a, b, h, j):
    if not isinstance(a, types.Array):
        return None
    if a.layout == "C":
        return lambda a, b, h, j: prefetch_row(a, b, h, j)

    def strided(a, b, h, j):
        if j >= a.shape[2]:
            return
        start, _ = key_row(a, b, h, j)
        step = np.uint64(max(64 // a.itemsize, 1))
        for off in range(np.uint64(0), np.uint64(a.shape[3]), step):
            prefetch(a, start + off)
    return strided


@intrinsic
def _storage_flat(typingctx, a):
    """The 1-D C array over the memory of ``a``, a permuted view of a whole C-contiguous array
    (its first element first): ``a.size`` elements from ``a``'s data pointer, sharing its owner."""
    if not isinstance(a, types.Array):
        return None
    ret = types.Array(a.dtype, 1, "C")

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, args[0])
        dst = context.make_array(ret)(context, builder)
        isz = context.get_constant(types.intp, context.get_abi_sizeof(context.get_data_type(a.dtype)))
        context.populate_array(dst, data=src.data, shape=cgutils.pack_array(builder, [src.nitems]),
                               strides=cgutils.pack_array(builder, [isz]), itemsize=isz,
                               meminfo=src.meminfo, parent=src.parent)
        return impl_ret_borrowed(context, builder, ret, dst._getvalue())

    return ret(a), codegen


def flat_rows(a):
    """``a`` as the flat-offset operand of the cube blocks (:func:`key_row` offsets)."""
    return a if a.flags.c_contiguous else np.lib.stride_tricks.as_strided(a, (a.size,), (a.itemsize,))


@overload(flat_rows, jit_options={"forceinline": True})
def _flat_rows_impl(a):
    if not isinstance(a, types.Array):
        return None
    if a.layout == "C":
        return lambda a: a
    return lambda a: _storage_flat(a)


def flat1d(a):
    """``a``'s memory as a 1-D C array (the flat operand of :func:`key_row` offsets)."""
    return np.lib.stride_tricks.as_strided(a, (a.size,), (a.itemsize,))


@overload(flat1d, jit_options={"forceinline": True})
def _flat1d_impl(a):
    if not isinstance(a, types.Array):
        return None
    if a.layout == "C":
        return lambda a: a.reshape(a.size)
    return lambda a: _storage_flat(a)


@kernel(boundscheck=False)
def pack_keys_strided(k, width, kt):
    """tiles.packed_keys for a strided K view: the same K^T tiles, read by 4-D index."""
    B, H, S, D = k.shape
    nt = (S + width - 1) // width
    uw = np.uint64(width)
    for task in prange(B * H * nt):
        bh = task // nt
        t = task - bh * nt
        b = bh // H
        h = bh - b * H
        j0 = t * width
        n = min(width, S - j0)
        base = np.uint64(task) * np.uint64(D) * uw
        for jb in range(0, n, 16):
            je = min(jb + 16, n)
            for d in range(D):
                for j in range(jb, je):
                    kt[base + np.uint64(d) * uw + np.uint64(j)] = dtypes.widen(k[b, h, j0 + j, d])
    return 0
