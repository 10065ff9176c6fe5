"""SwiGLU, the gated MLP's activation ``silu(gate) * up``: two kernels, or one.

Math (gate and up of one shape ``[..., I]`` and one storage dtype fp32, bf16 or fp16; all math
fp32, as the NPU's exp is fp32-only, npu-facts 1.6; result ``[..., I]`` in the storage dtype)::

    limit given:  gate = min(gate, limit),  up = min(max(up, -limit), limit)
    y = cast(silu(gate) * up),   silu(g) = g * sigmoid(g),   sigmoid(g) = 1 / (1 + exp(-g))

``silu`` is the seed's plan A, ``mul(x, sigmoid(x))`` (npu-facts 1.2), with the sigmoid of the MoE
ops (``vmath.sigmoid``); ``silu(-inf) = 0``, its limit (the formula gives ``-inf * 0 = nan``). NaN
in gate or up gives NaN, also through the clamp (as torch's ``clamp``). ``silu`` and the clamps
are written once, in ``machine/cube/epilogue.py``, for these kernels and the cube epilogue.

The clamp (``limit=``, a finite number > 0, held in fp32) is the one of DeepSeek-V4's experts
(npu-facts 8.4: "SwiGLU clamped at 10"; its public model code computes ``gate.clamp(max=limit)``,
``up.clamp(-limit, limit)``, then ``silu(gate) * up`` in fp32, with ``swiglu_limit = 10``): the
gate is clamped from above only, the up both ways. gpt-oss's ``swiglu`` clamps the same two ways
(limit 7) but also scales the sigmoid's argument (alpha 1.702), adds 1 to up and takes gate and up
from interleaved columns; none of that is emulated here.

Inputs of separate and fused::

    swiglu.fused(x)          x[..., 2*I] = [gate | up] along the last dim: gate = x[..., :I],
                             up = x[..., I:] (torch ``x.chunk(2, -1)``, vLLM's ``SiluAndMul``)
    swiglu.fused(gate, up)   gate[..., I], up[..., I]

Both forms read the same bytes and have the same plan, priced from the result's shape ``[..., I]``.

Strategies (n = N*I result elements, b = itemsize of the storage dtype)::

    swiglu.separate  2 vector kernels (silu, then mul), GM read 3*n*b, write 2*n*b, workspace n*b
    swiglu.fused     1 vector kernel,                   GM read 2*n*b, write n*b
    swiglu.epilogue  = linear.gate_up_swiglu(x, w_gate, w_up): the gate and up projections in one
                     mixed cube kernel, the activation in its epilogue; gate and up never reach
                     GM (its own inputs: x[..., K] and the two [I, K] weights; see linear.py)

``separate`` is the two-kernel pipeline: the silu kernel writes ``h = cast(silu(gate))`` to GM (a
workspace of the storage dtype), the mul kernel reads it back: ``y = cast(h * up)``, two roundings
in bf16/fp16. In fp32 the cast is exact and both strategies give the same bits; in bf16/fp16
``fused`` rounds once and ``separate``'s rounding of h adds up to ``ulp(h)/2 * |up|`` (below one
ulp of the result while h is a normal number).
The clamp of the gate runs in the silu kernel, the clamp of up in the mul kernel.

Tiling: a task is a ``[rows, cols]`` UB tile, ``cols = min(tile, I aligned to 32 B)`` columns of
``rows = tile // cols`` rows (at most N), so that one tile holds about ``tile`` elements; the last
tile of a row and of the rows is a valid-shape tail. ``tile`` defaults to the profile's
``swiglu_tile``, else to its elementwise ``gelu_tile``.

UB per task, per tile element: the storage tiles read and written (b B each) and fp32 work tiles
(4 B each): fused 3 tiles + 1 fp32 (the sigmoid) on fp32 storage, 3 + 3 fp32 (widened gate and
up, the sigmoid) on bf16/fp16; silu 2 + 1 fp32 (2 + 2 fp32 on bf16/fp16); mul 3 (3 + 2 fp32 on
bf16/fp16).

Vector element-ops per element (the ISA has no sigmoid instruction, npu-facts 8.6): silu 5 (neg,
exp, +1, reciprocal as MoE's sigmoid, then the mul by gate), mul 1; with ``limit`` 1 (gate) and 2
(up); 1 per 16-bit tensor read (widen) and per 16-bit tensor written (narrow).
"""

from __future__ import annotations

import math as _math
import numbers

import numpy as np
from llvmlite import ir
from numba import prange, types
from numba.extending import intrinsic

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError
from ..machine import dtypes, tile as tiles, vmath
from ..machine import ir as irb
from ..machine.cube.epilogue import (
    clamp_gate as _clamp_gate, clamp_gate_ir as _clamp_gate_ir, clamp_up as _clamp_up, clamp_up_ir as _clamp_up_ir,
    silu as _silu, silu_ir as _silu_ir,
)
from ..machine.ir.lines import LINE
from ..machine.jit import device, kernel
from ..machine.memo import CallMemo, memo_plan
from ..machine.plan import KernelPlan, Plan, align_elems, vector_tile
from ..machine.profile import load_profile, resolve_cast_mode
from ..strategy import Launch, register

SILU_OPS = 5  # neg, exp, +1, reciprocal (the sigmoid, as moe's), * gate
MUL_OPS = 1  # silu(gate) * up
GATE_CLAMP_OPS = 1  # min(gate, limit)
UP_CLAMP_OPS = 2  # max(up, -limit), min(., limit)
STRATEGIES = ("separate", "fused")

# Elementwise kernels need no reassociation (no reductions): ``contract`` only, so that the fp32
# multiplications run in the written order and ``fused`` and ``separate`` give the same fp32 bits.
_FASTMATH = set(vmath.VMATH_FASTMATH)
_dev = device(fastmath=_FASTMATH, forceinline=True)

FUSED, SILU, MUL = 0, 1, 2  # the kernel's ``mode``: what one tile task computes
AHEAD_BYTES = 2048  # how far ahead of its loads a span prefetches (docs/performance.md)


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = one [rows, cols] UB tile (a pypto.loop iteration on an AI
# vector core); offsets are uint64 (machine/jit.py)


def _f32(builder, kind, x, u, lim):
    """The kernel ``kind``'s fp32 math on float32 IR values ``x`` (gate or h) and ``u`` (up), ``lim``
    a float32 scalar: ``silu(clamp_gate(x)) * clamp_up(u)``, ``silu(clamp_gate(x))`` or
    ``x * clamp_up(u)``."""
    o = irb.FOps(builder, x.type)
    lv = lim if isinstance(x.type, ir.FloatType) else irb.splat(builder, lim, x.type)
    if kind == MUL:
        return o.mul(x, _clamp_up_ir(builder, u, lv))
    y = _silu_ir(builder, _clamp_gate_ir(builder, x, lv))
    return y if kind == SILU else o.mul(y, _clamp_up_ir(builder, u, lv))


def _span(kind):
    @intrinsic
    def span(typingctx, a, a_off, b, b_off, dst, d_off, n, lim, ahead, stream, cm):
        """``dst[d_off + i] = narrow(f(a[a_off + i], b[b_off + i]))`` for ``i < n``, ``f`` by ``kind``
        (``FUSED``: ``silu(clamp_gate(a)) * clamp_up(b)``; ``SILU``: ``silu(clamp_gate(a))``, ``b``
        unread; ``MUL``: ``a * clamp_up(b)``), fp32 math and one rounding by ``cm`` (a
        ``dtypes.CastMode``), in LLVM IR: the elements up to ``dst``'s first
        64-byte line one at a time, then one whole line per step (16 fp32 or 32 16-bit lanes in
        512-bit vectors), then the rest one at a time. Flat kernel views of one dtype, uint64
        offsets and count, ``lim`` float32 (``+inf``: no clamp). ``ahead`` (uint64, 0: none):
        each whole-line step also prefetches the lines ``ahead`` elements further on in ``a`` and
        ``b`` (the caller keeps them inside the arrays): the next tile's loads overlap this tile's
        exp, the NPU's double buffering. ``stream``: the whole lines go out with streaming stores
        (the caller fences and checks ``tile.streams_apart``).
        Explicit 512-bit vectors: LLVM gives the plain loop (:func:`_span_plain`, same bits)
        256-bit ones, and the exp makes the kernel compute-bound at that width.
        """
        if not (isinstance(a, types.Array) and isinstance(b, types.Array) and isinstance(dst, types.Array)
                and a.dtype == b.dtype == dst.dtype and a.dtype in (types.float32, types.uint16, types.int16)
                and isinstance(cm, dtypes.CastModeType)):
            return None
        cast = cm.mode

        def codegen(context, builder, sig, args):
            a_arr, b_arr, d_arr = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 2, 4))
            ao, bo, do, cnt, lim, ahead_, stream_ = args[1], args[3], args[5], args[6], args[7], args[8], args[9]
            el = sig.args[0].dtype
            zero = ir.Constant(ir.IntType(64), 0)

            def step(start, count, lanes, nt):
                def body(j):
                    if lanes > 1:
                        with builder.if_then(builder.icmp_unsigned("!=", ahead_, zero)):
                            for arr, off in ((a_arr, ao), (b_arr, bo))[: 1 if kind == SILU else 2]:
                                irb.prefetch(builder, builder.gep(arr.data, [builder.add(builder.add(off, j), ahead_)]))
                    x = irb.load_widen(builder, a_arr.data, builder.add(ao, j), el, lanes, fp16_hw=True)
                    u = x if kind == SILU else irb.load_widen(builder, b_arr.data, builder.add(bo, j), el, lanes,
                                                              fp16_hw=True)
                    dtypes.store_narrow_mode(builder, _f32(builder, kind, x, u, lim), d_arr.data, builder.add(do, j), el,
                                             lanes, cast, align=LINE if nt else 1, nontemporal=nt)

                irb.steps(builder, start, count, lanes, body)

            size = context.get_abi_sizeof(context.get_data_type(el))
            irb.line_span(builder, builder.gep(d_arr.data, [do]), cnt, size, step, stream_)
            return context.get_dummy_value()

        u64 = types.uint64
        return types.void(a, u64, b, u64, dst, u64, u64, types.float32, u64, types.boolean, cm), codegen

    return span


_SPANS = {k: _span(k) for k in (FUSED, SILU, MUL)}
_span_fused, _span_silu, _span_mul = _SPANS[FUSED], _SPANS[SILU], _SPANS[MUL]


@_dev
def _span_plain(a, a_off, b, b_off, dst, d_off, n, lim, kind, cm):
    """:func:`_span` as a plain numba loop, the readable reference (the same operations in the same
    order, so the same bits: ``tests/ops/test_swiglu.py``); no streaming, LLVM's vector width."""
    for j in range(n):
        x = dtypes.widen(a[a_off + j])
        if kind == MUL:
            y = x * _clamp_up(dtypes.widen(b[b_off + j]), lim)
        elif kind == SILU:
            y = _silu(_clamp_gate(x, lim))
        else:
            y = _silu(_clamp_gate(x, lim)) * _clamp_up(dtypes.widen(b[b_off + j]), lim)
        dst[d_off + j] = dtypes.narrow(dst, y, cm)


@kernel(fastmath=_FASTMATH)
def _swiglu_kernel(
    a,
    a_off,
    a_stride,
    b,
    b_off,
    b_stride,
    out,
    n_rows,
    n_cols,
    rows_per_task,
    col_tile,
    mode,
    lim,
    ops_per_elem,
    cm,
    stream,
):
    """One kernel of a strategy over ``[n_rows, n_cols]`` results -> the cost counters.

    Parameters
    ----------
    a, b : flat kernel views of the operands (the same array for a packed gate|up tensor); row r,
        column c of an operand is ``a[a_off + r * a_stride + c]`` (``b`` alike)
    out : flat ``[n_rows, n_cols]`` kernel view of the result (or of the workspace h)
    rows_per_task, col_tile : the ``[rows, cols]`` UB tile of one task (tails are valid shapes)
    mode : ``FUSED`` (a = gate, b = up), ``SILU`` (a = gate, b unused) or ``MUL`` (a = h, b = up)
    lim : the clamp limit (``+inf``: no clamp)
    ops_per_elem : vector ops counted per element
    cm : the cast mode of the narrowing to ``out`` (a ``dtypes.CastMode``: one kernel per mode)
    stream : write ``out`` with streaming stores (``tile.streamable`` and apart from the inputs)
    """
    n_cb = (n_cols + col_tile - 1) // col_tile
    n_tasks = ((n_rows + rows_per_task - 1) // rows_per_task) * n_cb
    read_per_elem = a.itemsize + (0 if mode == SILU else b.itemsize)
    write_per_elem = out.itemsize
    lim32 = np.float32(lim)
    ahead = np.uint64(AHEAD_BYTES // a.itemsize)
    a_size, b_size, zero = np.uint64(a.size), np.uint64(b.size), np.uint64(0)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(n_tasks):
        rb = t // n_cb
        c0 = (t - rb * n_cb) * col_tile
        r0 = rb * rows_per_task
        r1 = min(n_rows, r0 + rows_per_task)
        cols = min(col_tile, n_cols - c0)  # valid shape of the tail tile
        n = np.uint64(cols)
        for r in range(r0, r1):
            ao = np.uint64(a_off + r * a_stride + c0)
            bo = np.uint64(b_off + r * b_stride + c0)
            oo = np.uint64(r * n_cols + c0)
            far = max(ao + n, bo + n) + ahead  # the prefetches stay inside a and b
            pf = ahead if far <= a_size and far <= b_size else zero
            if mode == FUSED:
                _span_fused(a, ao, b, bo, out, oo, n, lim32, pf, stream, cm)
            elif mode == SILU:
                _span_silu(a, ao, a, ao, out, oo, n, lim32, pf, stream, cm)
            else:
                _span_mul(a, ao, b, bo, out, oo, n, lim32, pf, stream, cm)
        if stream:
            tiles.store_fence()
        elems = (r1 - r0) * cols
        tasks += 1
        gm_read += elems * read_per_elem
        gm_write += elems * write_per_elem
        vector_ops += elems * ops_per_elem
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# plans


def _check_limit(where, limit):
    """None (no clamp) or the clamp limit as a float (finite and > 0 in fp32)."""
    if limit is None:
        return None
    ok = not isinstance(limit, (bool, np.bool_)) and isinstance(limit, numbers.Real)
    if ok:
        try:
            with np.errstate(over="ignore"):
                lim32 = np.float32(float(limit))
        except OverflowError:  # an int beyond any float
            lim32 = np.float32(np.inf)
        ok = bool(np.isfinite(lim32) and lim32 > 0)
    if not ok:
        raise ConstraintError(
            f"{where}: limit must be a finite number > 0 in fp32 (the clamp: gate <= limit, "
            f"-limit <= up <= limit; DeepSeek-V4 uses 10.0) or None for no clamp, got {limit!r}")
    return float(limit)


def _default_tile(prof):
    """The profile's ``swiglu_tile``, else its elementwise ``gelu_tile`` (elements per UB tile)."""
    return prof.tiles["swiglu_tile"] if "swiglu_tile" in prof.tiles else prof.tile("gelu_tile")


# UB tiles per kernel: (storage tiles, fp32 tiles on fp32 storage, fp32 tiles on bf16/fp16)
_TILES = {
    "swiglu_fused": (("gate_ub", "up_ub", "y_ub"), ("sig_ub",), ("gate_f_ub", "up_f_ub", "sig_ub")),
    "swiglu_silu": (("gate_ub", "h_ub"), ("sig_ub",), ("gate_f_ub", "sig_ub")),
    "swiglu_mul": (("h_ub", "up_ub", "y_ub"), (), ("h_f_ub", "up_f_ub")),
}


def _ub_per_elem(name, dtype):
    storage, f32, f16 = _TILES[name]
    return len(storage) * dtypes.itemsize(dtype) + 4 * len(f32 if dtype == "fp32" else f16)


def _ops(name, dtype, clamp):
    half = int(dtype != "fp32")
    if name == "swiglu_fused":
        return SILU_OPS + MUL_OPS + clamp * (GATE_CLAMP_OPS + UP_CLAMP_OPS) + 3 * half
    if name == "swiglu_silu":
        return SILU_OPS + clamp * GATE_CLAMP_OPS + 2 * half
    return MUL_OPS + clamp * UP_CLAMP_OPS + 3 * half


@memo_plan
def _plan(kind, shape, dtype, *, limit=None, profile=None, tile=None) -> Plan:
    prof = load_profile(profile)
    where = f"swiglu.{kind}"
    dtype = inputs.storage_dtype(dtype, where)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "gate", where)
    inputs.check_size(shape, "gate", where)  # plans answer advise() too: same limits as the data path
    limit = _check_limit(where, limit)
    tile = _default_tile(prof) if tile is None else inputs.positive_int(tile, "tile", where)
    n_cols = shape[-1]
    n_rows = _math.prod(shape[:-1])
    cols = min(tile, align_elems(n_cols, dtype, prof))
    rows = max(1, min(n_rows, tile // cols))
    tasks = -(-n_rows // rows) * -(-n_cols // cols)
    names = ("swiglu_fused",) if kind == "fused" else ("swiglu_silu", "swiglu_mul")
    b = dtypes.itemsize(dtype)
    block = prof.align_bytes // b
    per_elem = max(_ub_per_elem(name, dtype) for name in names)
    hint = f"use tile <= {prof.limit('UB') // per_elem // block * block} (a multiple of {block})"
    n = n_rows * n_cols
    clamp = int(limit is not None)
    kernels = []
    for name in names:
        storage, f32, f16 = _TILES[name]
        bufs = [vector_tile(t, (rows, cols), dtype, prof, where, hint) for t in storage]
        bufs += [vector_tile(t, (rows, cols), "fp32", prof, where, hint) for t in (f32 if dtype == "fp32" else f16)]
        ops = _ops(name, dtype, clamp)
        reads = 1 if name == "swiglu_silu" else 2
        kernels.append(KernelPlan(name=name, unit="vector", tasks=tasks, buffers=tuple(bufs),
                                  gm_read_bytes=reads * n * b, gm_write_bytes=n * b,
                                  workspace_bytes=n * b if name == "swiglu_silu" else 0, vector_ops=n * ops))
    params = {"tile": tile, "rows_per_task": rows, "col_tile": cols, "n_rows": n_rows, "n_cols": n_cols,
              "limit": limit, "ops_per_elem": tuple(k.vector_ops // n for k in kernels)}
    return Plan(op="swiglu", strategy=kind, dtype=dtype, profile=prof, kernels=tuple(kernels), params=params,
                hint=hint)


def plan_separate(shape, dtype="fp32", *, limit=None, profile=None, tile=None) -> Plan:
    """Plan of :func:`separate` for a result (gate) of ``shape`` ``[..., I]`` and storage ``dtype``."""
    return _plan("separate", shape, dtype, limit=limit, profile=profile, tile=tile)


def plan_fused(shape, dtype="fp32", *, limit=None, profile=None, tile=None) -> Plan:
    """Plan of :func:`fused` for a result (gate) of ``shape`` ``[..., I]`` and storage ``dtype``."""
    return _plan("fused", shape, dtype, limit=limit, profile=profile, tile=tile)


# ---------------------------------------------------------------------------------------------
# public strategies


class _Workspaces:
    """``separate``'s GM intermediate h, reused by the calls of one signature (a fresh multi-MiB
    array per call costs page faults comparable to the kernels, machine/jit.py). Each call takes
    its own (``list.pop``/``append`` are atomic), so two Python threads never share one."""

    def __init__(self, shape, dtype):
        self._shape, self._dtype, self._free = shape, dtype, []

    def take(self):
        try:
            return self._free.pop()
        except IndexError:
            return tiles.aligned_empty(self._shape, self._dtype)[1].reshape(-1)

    def give(self, h):
        self._free.append(h)


class _Call:
    """What a call derives from its signature (kept per signature in ``_CALLS``)."""

    __slots__ = ("where", "kind", "plan", "shape", "dtype", "geometry", "lim", "shapes", "workspaces")

    def __init__(self, where, kind, plan, shape, dtype, geometry, shapes):
        self.where, self.kind, self.plan, self.shape, self.dtype = where, kind, plan, shape, dtype
        self.geometry = geometry  # (gate offset, gate row stride, up offset, up row stride)
        limit = plan.params["limit"]
        self.lim = np.inf if limit is None else limit
        self.shapes = shapes
        rows_cols = (plan.params["n_rows"], plan.params["n_cols"])
        self.workspaces = _Workspaces(rows_cols, dtype) if kind == "separate" else None


_CALLS = CallMemo()


def _check_out_signature(where, out, shape, dtype):
    if not isinstance(out, np.ndarray) or dtypes.storage_name(out.dtype) != dtype:
        got = out.dtype if isinstance(out, np.ndarray) else type(out).__name__
        raise DTypeError(f"{where}: out must be a numpy array of the inputs' dtype ({dtype}), got {got}")
    if out.shape != shape:
        raise ShapeError(f"{where}: out must have the result's shape {shape}, got {out.shape}")
    if not out.flags.c_contiguous:
        raise ConstraintError(f"{where}: out must be a writeable C-contiguous array")


def _check_out_memory(where, out, x, up):
    """Writeable; for two tensors out may be gate or up itself (in place), else apart from both;
    for a packed x, apart from x (the result is half its size)."""
    if not out.flags.writeable:
        raise ConstraintError(f"{where}: out must be a writeable C-contiguous array")
    if up is None:
        if np.may_share_memory(out, x):
            raise ConstraintError(f"{where}: out overlaps x; the [..., I] result cannot be written into "
                                  f"the packed [..., 2*I] x: pass a separate array")
        return
    for name, a in (("gate", x), ("up", up)):
        if tiles.address(out) != tiles.address(a) and np.may_share_memory(out, a):
            raise ConstraintError(f"{where}: out overlaps {name} partially; pass out={name} (in place) or a "
                                  f"separate array")


def _prepare(kind, x, up, limit, profile, tile, out):
    where = f"swiglu.{kind}"
    if up is None:
        xt = inputs.tensor(x, "x", where)
        width = xt.shape[-1]
        if width % 2:
            raise ShapeError(f"{where}: x's last dim {width} is odd; one tensor is x[..., 2*I] = [gate | up] "
                             f"(gate = x[..., :I]); pass gate and up as two tensors instead")
        shape = xt.shape[:-1] + (width // 2,)
        geometry = (0, width, width // 2, width)
        dtype, tensors = xt.dtype, (xt,)
    else:
        gt = inputs.tensor(x, "gate", where)
        ut = inputs.tensor(up, "up", where)
        if ut.shape != gt.shape:
            raise ShapeError(f"{where}: up must have gate's shape {gt.shape}, got {ut.shape}")
        dtype = inputs.same_dtype(where, gate=gt, up=ut)
        shape = gt.shape
        geometry = (0, shape[-1], 0, shape[-1])
        tensors = (gt, ut)
    p = _plan(kind, shape, dtype, limit=limit, profile=profile, tile=tile)
    if out is not None:
        _check_out_signature(where, out, shape, dtype)
    c = _Call(where, kind, p, shape, dtype, geometry, [t.shape for t in tensors])
    arrays = (tensors[0].array, None if up is None else tensors[1].array)
    return c, arrays, sum(t.copied_bytes for t in tensors)


def _launch(c, x, up, out, copied, cm):
    if out is None:
        result, out_k = tiles.empty_apart(c.shape, c.dtype, x)  # placed for streaming from x
    else:
        _check_out_memory(c.where, out, x, up)
        result, out_k = out, dtypes.kernel_view(out)
    xk = dtypes.kernel_view(x).reshape(-1)
    uk = xk if up is None else dtypes.kernel_view(up).reshape(-1)
    ok = out_k.reshape(-1)
    g_off, g_stride, u_off, u_stride = c.geometry
    prm = c.plan.params
    shape = (prm["n_rows"], prm["n_cols"], prm["rows_per_task"], prm["col_tile"])
    ops = prm["ops_per_elem"]
    with Launch(c.plan, c.shapes) as run:
        if c.kind == "fused":
            run.count(_swiglu_kernel(xk, g_off, g_stride, uk, u_off, u_stride, ok, *shape, FUSED, c.lim, ops[0],
                                     cm, tiles.stream_from(ok, xk, uk)))
        else:
            h = c.workspaces.take()  # silu(gate) in GM, the storage dtype
            run.count(_swiglu_kernel(xk, g_off, g_stride, xk, 0, 0, h, *shape, SILU, c.lim, ops[0], cm,
                                     tiles.stream_from(h, xk)), workspace_bytes=h.nbytes)
            run.count(_swiglu_kernel(h, 0, prm["n_cols"], uk, u_off, u_stride, ok, *shape, MUL, c.lim, ops[1], cm,
                                     tiles.stream_from(ok, h, uk)))
            c.workspaces.give(h)
        run.workspace(copied)
    return result


def _call(kind, x, up, limit, profile, tile, out, cast_mode):
    key = _CALLS.key(profile, (x, up, out), (kind, limit, tile))
    c, arrays, copied = _CALLS.through(key, _prepare, kind, x, up, limit, profile, tile, out)
    cm = resolve_cast_mode(cast_mode, profile, c.where, narrows=c.dtype != "fp32")
    return _launch(c, *(arrays or (x, up)), out, copied, cm)


@register("swiglu", "separate", plan=plan_separate,
          summary="silu kernel, then mul kernel: silu(gate) written to GM and read back (2 kernels)")
def separate(x, up=None, *, limit=None, profile=None, tile=None, out=None, cast_mode=None):
    """``silu(gate) * up`` as two vector kernels: ``h = cast(silu(gate))`` to a GM workspace, then
    ``cast(h * up)`` (two roundings in bf16/fp16; the same bits as :func:`fused` in fp32).

    ``separate(x)``: ``x[..., 2*I]`` holds gate (first half) and up (second half);
    ``separate(gate, up)``: two tensors of one shape ``[..., I]`` and dtype. Result ``[..., I]``.
    ``limit``: clamp ``gate <= limit`` and ``-limit <= up <= limit`` first (DeepSeek-V4: 10.0;
    None: no clamp); ``tile``: elements per UB tile (default: the profile's ``swiglu_tile``, else
    ``gelu_tile``); ``out``: write into this array (the result's shape and dtype; with two tensors
    it may be gate or up itself); ``cast_mode``: the rounding of the fp32 -> bf16/fp16 casts (both
    of ``separate``'s; ``machine/dtypes.py``; default from ``use_cast_mode`` / the profile: rint).
    """
    return _call("separate", x, up, limit, profile, tile, out, cast_mode)


@register("swiglu", "fused", plan=plan_fused,
          summary="silu(gate) * up in one vector kernel (fp32 math, one rounding)")
def fused(x, up=None, *, limit=None, profile=None, tile=None, out=None, cast_mode=None):
    """``silu(gate) * up`` in one vector kernel: fp32 math, one cast to the storage dtype.

    ``fused(x)`` with ``x[..., 2*I] = [gate | up]`` (gate = ``x[..., :I]``) or ``fused(gate, up)``;
    options as :func:`separate`. Saves the silu kernel's GM write and the mul kernel's re-read of
    it (2*N*I*b bytes) and a launch.
    """
    return _call("fused", x, up, limit, profile, tile, out, cast_mode)


from ..linear import gate_up_swiglu, plan_gate_up_swiglu as plan_epilogue  # noqa: E402


@register("swiglu", "epilogue", plan=plan_epilogue,
          summary="gate and up projections in one cube kernel, SwiGLU in its epilogue (no gate/up in GM)")
def epilogue(x, w_gate, w_up, *, limit=None, profile=None, cube_tiles=None, cast_mode=None):
    """``silu(x @ w_gate^T) * (x @ w_up^T)`` with the activation in the cube epilogue of the gate/up
    projections: :func:`pypto_numba.linear.gate_up_swiglu` (the cube walk it extends lives there).
    ``cast_mode`` is accepted and has no effect: the cube's FIXPIPE always narrows with rint
    (npu-facts 8.3)."""
    return gate_up_swiglu.__wrapped__(x, w_gate, w_up, limit=limit, profile=profile, cube_tiles=cube_tiles,
                                      cast_mode=cast_mode)


from .spec import OP, reference  # noqa: E402,F401  (the lab's view of the op; after the strategies it names)
