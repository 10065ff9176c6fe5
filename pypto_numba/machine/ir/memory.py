"""IR on memory: typed loads and stores at element offsets, the widening load and narrowing store
of the storage formats, the streaming (non-temporal) store, masked loads, prefetch and the fence.

Streaming stores skip the read-for-ownership of the destination line; they are weakly ordered, so
a task that issued them ends with :func:`fence`, and they fault on a misaligned address (a 64-byte
``<16 x i32>`` store needs a 64-byte aligned destination). Prefetches and fences change no value.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .convert import fp16_value_hw, narrow_ir, widen_ir
from .vector import I32

# ``llvm.prefetch`` locality: into every level (prefetcht0) or into L2, not L1 (prefetcht1)
PREFETCH_L1 = 3
PREFETCH_L2 = 2


def raw_type(kind):
    """The IR element type of a kernel-view dtype (float32, or i16 for the 16-bit formats)."""
    return ir.FloatType() if kind == types.float32 else ir.IntType(16)


def ptr(builder, data, off, ty):
    """A ``ty*`` to flat element ``off`` of ``data`` (an array's element pointer)."""
    return builder.bitcast(builder.gep(data, [off]), ty.as_pointer())


def load(builder, data, off, ty, align):
    """The ``ty`` (scalar or vector) at flat element ``off`` of ``data``."""
    return builder.load(ptr(builder, data, off, ty), align=align)


def load_widen(builder, data, off, kind, lanes, align=1, fp16_hw=False):
    """``lanes`` kernel-view elements of ``kind`` at flat element ``off`` -> float32 (a scalar for
    ``lanes == 1``, else ``<lanes x float>``), exactly widened; ``fp16_hw``: fp16 by the hardware
    conversion (:func:`~.convert.fp16_value_hw`, the same values) instead of integer code."""
    raw = raw_type(kind)
    rty = raw if lanes == 1 else ir.VectorType(raw, lanes)
    v = builder.load(ptr(builder, data, off, rty), align=align)
    if fp16_hw and kind == types.int16:
        return fp16_value_hw(builder, v, lanes)
    return widen_ir(builder, v, kind, lanes)


def store_narrow(builder, v, data, off, kind, lanes, align=1, nontemporal=False):
    """Store float32 ``v`` (``lanes`` of them) at flat element ``off`` of ``data`` as ``kind``
    (round to nearest even); ``nontemporal``: a streaming store (``align`` must be the line)."""
    raw = raw_type(kind)
    rty = raw if lanes == 1 else ir.VectorType(raw, lanes)
    p = ptr(builder, data, off, rty)  # before the rounding: the order rope's kernels were built in
    y = narrow_ir(builder, v, kind, lanes)
    if nontemporal:
        stream_store(builder, y, p, align)
    else:
        builder.store(y, p, align=align)


def stream_store(builder, value, p, align):
    """A streaming (non-temporal) store of ``value`` to ``p`` (``align``-byte aligned)."""
    store = builder.store(value, p, align=align)
    store.set_metadata("nontemporal", builder.module.add_metadata([ir.Constant(I32, 1)]))


def masked_load(builder, p, mask, passthru, align):
    """``llvm.masked.load``: the lanes of ``*p`` where ``mask`` is set, ``passthru``'s elsewhere;
    lanes off the mask are never read (no fault past an array's end)."""
    vty = passthru.type
    el = vty.element
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vty, [vty.as_pointer(), I32, mask.type, vty]),
        f"llvm.masked.load.v{vty.count}i{el.width}.p0")
    return builder.call(fn, [builder.bitcast(p, vty.as_pointer()), ir.Constant(I32, align), mask, passthru])


def prefetch(builder, p, locality=PREFETCH_L1):
    """Hint a load of the line holding ``p`` (read, data cache): ``PREFETCH_L1`` (3,
    ``prefetcht0``, all levels) or ``PREFETCH_L2`` (2, ``prefetcht1``, into L2, not L1). Never
    faults, changes no result."""
    i8p = ir.IntType(8).as_pointer()
    fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(ir.VoidType(), [i8p, I32, I32, I32]))
    builder.call(fn, [builder.bitcast(p, i8p), ir.Constant(I32, 0), ir.Constant(I32, locality), ir.Constant(I32, 1)])


def fence(builder):
    """A full memory fence (``mfence``): orders the task's streaming stores before it ends."""
    builder.fence("seq_cst")
