"""Linear layer: ``y = x @ weight^T + bias``, with the bias added after or inside the cube.

Math and shapes: ``x[..., K]``, ``weight[N, K]`` (the ``torch.nn.functional.linear`` layout,
``b_trans=True``), ``bias[N]`` or None -> ``y[..., N]``; one storage dtype (fp32, bf16, fp16)
for all three; products accumulated in fp32 (the L0C accumulator, npu-facts 4.4). With
``M = prod(x.shape[:-1])``, ``b`` = itemsize, and the cube walk of
:mod:`pypto_numba.machine.cube` with tiles ``((mL0, mL1), (kL0, kL1), (nL0, nL1))``
(``tm = ceil(M/mL1)``, ``tn = ceil(N/nL1)``)::

    walk reads  R = M*K*b*tn + N*K*b*tm           (x and weight, GM -> L1)

Strategies (npu-facts 1.2 "Linear (+bias)")::

    linear.matmul_add  2 kernels: cube  y0 = round(x @ w^T)        read R,          write M*N*b
                                  vector y = round(y0 + bias)      read M*N*b + tm*N*b, write M*N*b
                       (the vector kernel's tasks are the cube's [mL1, nL1] blocks: the bias tile
                       stays in UB per task, rows stream through UB in sub-tiles)
                       two roundings; y0 is a GM intermediate (workspace M*N*b)
    linear.fused_bias  1 kernel:  cube  y = round(x @ w^T + bias)  read R + tm*N*b, write M*N*b
                       bias added to the fp32 accumulator in the epilogue (bias table, BT);
                       one rounding

So the counted Cost of ``fused_bias`` has exactly one kernel, one GM write and one GM read of
the output (``M*N*b`` each) and the ``M*N*b`` workspace fewer than ``matmul_add`` (the vector
kernel walks the same [mL1, nL1] blocks as the cube, so both read the bias ``tm`` times), and it
is never less precise: it rounds once. With ``bias=None`` both are the single cube kernel.

Default tiles: the profile's ``linear_cube_tiles``, or ``linear_decode_cube_tiles`` when
``M < 16`` (decode: one 16-row fractal, so L1/L0A/L0C hold no dead rows).

On the CPU, M >= 16 runs BLAS sgemm on fp32 (16-bit operands widened exactly); M < 16 runs the
cube's decode loops, streaming the weight once. bf16 decode multiplies x and the weight as stored,
in pairs of elements (``VDPBF16PS`` where the CPU has AVX512_BF16, else the same sums by FMAs:
the same bits, except that ``VDPBF16PS`` flushes subnormal inputs and sums to zero).

Where the code is: this module plans a call and runs it (:func:`_run`: checks, plan, launch);
the cube kernel is :func:`pypto_numba.machine.cube.walk.matmul_nt_kernel` (one task per output
block, ``walk.py``), the decode loops are in ``machine/cube/decode.py``, and the fused bias is
added, and the sum rounded once, in the epilogue, ``machine/cube/epilogue.py``.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numba
import numpy as np
from numba import prange

from . import inputs
from .errors import DTypeError, ShapeError
from .interop import torch_aware
from .machine import cube, dtypes
from .machine.cube import amx
from .machine.cube.epilogue import epilogue_swiglu
from .machine.jit import kernel
from .machine.memo import CallMemo, memo_plan
from .machine.plan import KernelPlan, Plan, vector_tile
from .machine.profile import ProfileError, load_profile, resolve_cast_mode
from .strategy import Launch, register

CAST_OPS = 2  # widen in + narrow out per element for bf16/fp16 (as in gelu)


# ---------------------------------------------------------------------------------------------
# the vector kernel of matmul_add: one prange iteration = one [mL1, nL1] block of the product


@kernel(boundscheck=False)
def _bias_add_kernel(prod, bias, out, m1, n1, ops_per_elem, cm):
    M, N = prod.shape
    tm = (M + m1 - 1) // m1
    tn = (N + n1 - 1) // n1
    item = prod.itemsize
    prod_flat = prod.reshape(-1)
    out_flat = out.reshape(-1)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(tm * tn):
        mb = (t // tn) * m1
        nb = (t % tn) * n1
        vm = min(m1, M - mb)
        vn = min(n1, N - nb)
        ob = np.uint64(nb)
        for i in range(mb, mb + vm):
            # flat views, uint64 indices (see machine/jit.py)
            row = np.uint64(i) * np.uint64(N) + ob
            for j in range(np.uint64(vn)):
                out_flat[row + j] = dtypes.narrow(out, dtypes.widen(prod_flat[row + j]) + dtypes.widen(bias[ob + j]), cm)
        tasks += 1
        gm_read += vm * vn * item + vn * item  # product tile + bias tile
        gm_write += vm * vn * item
        vector_ops += vm * vn * ops_per_elem
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# plans


DECODE_M = 16  # fewer rows than one cube fractal: decode-shaped tiles


def _default_tiles(prof, m: int):
    if m < DECODE_M:
        try:
            return prof.tile("linear_decode_cube_tiles")
        except ProfileError:
            pass
    return prof.tile("linear_cube_tiles")


def _dims(x_shape, weight_shape, where: str):
    x_shape = tuple(int(d) for d in x_shape)
    weight_shape = tuple(int(d) for d in weight_shape)
    if len(x_shape) < 1 or len(weight_shape) != 2:
        raise ShapeError(f"{where}: need x[..., K] and weight[N, K], got {x_shape} and {weight_shape}")
    inputs.check_size(x_shape, "x", where)  # plans answer advise() too: same limits as the data path
    inputs.check_size(weight_shape, "weight", where)
    k = x_shape[-1]
    n, kw = weight_shape
    if kw != k:
        raise ShapeError(
            f"{where}: x has K = {k} (last dim of {x_shape}) but weight {weight_shape} has K = {kw}; "
            f"weight must be [N, K] (torch.nn.functional.linear layout; transpose a [K, N] weight)"
        )
    inputs.check_size(x_shape[:-1] + (n,), "the output [..., N]", where)
    return math.prod(x_shape[:-1]), k, n


@memo_plan
def _plan(strategy, x_shape, weight_shape, dtype, bias, profile, cube_tiles, row_scale=False) -> Plan:
    prof = load_profile(profile)
    where = f"linear.{strategy}"
    dtype = inputs.storage_dtype(dtype, where)
    m, k, n = _dims(x_shape, weight_shape, where)
    tiles = _default_tiles(prof, m) if cube_tiles is None else cube_tiles
    fused = strategy == "fused_bias" and bias
    walk = cube.plan_walk(m, k, n, tiles, dtype, bias_dtype=dtype if fused else None,
                          row_scale=bool(row_scale), profile=prof, where=where)
    b = dtypes.itemsize(dtype)
    kernels = []
    if strategy == "matmul_add" and bias:
        kernels.append(dataclasses.replace(walk.kernel_plan("linear_cube"), workspace_bytes=m * n * b))
        (_, m1), _, (_, n1) = walk.tiles
        hint = "use smaller cube_tiles nL1 (the bias kernel walks the cube's [mL1, nL1] blocks)"
        ops = 1 + (CAST_OPS if dtype != "fp32" else 0)
        # one task per cube block; the bias tile stays in UB for the task, and the block's rows
        # go through UB in sub-tiles of ``rows`` rows (product in, sum out, fp32 work for 16-bit)
        per_row = n1 * (2 * b + (4 if dtype != "fp32" else 0))
        rows = max(1, min(m1, (prof.vec_safe_bytes - n1 * b) // per_row))
        rows = rows // 8 * 8 if rows >= 8 else rows
        buffers = [
            vector_tile("prod_ub", (rows, n1), dtype, prof, where, hint),
            vector_tile("bias_ub", (1, n1), dtype, prof, where, hint),
            vector_tile("y_ub", (rows, n1), dtype, prof, where, hint),
        ]
        if dtype != "fp32":
            buffers.append(vector_tile("acc_ub", (rows, n1), "fp32", prof, where, hint))
        kernels.append(KernelPlan(
            name="linear_bias_add",
            unit="vector",
            tasks=walk.tasks,
            buffers=tuple(buffers),
            gm_read_bytes=m * n * b + -(-m // m1) * n * b,
            gm_write_bytes=m * n * b,
            vector_ops=m * n * ops,
        ))
        params = dict(walk.params, ops_per_elem=ops, bias_rows=rows)
        return Plan(op="linear", strategy=strategy, dtype=dtype, profile=prof, kernels=tuple(kernels),
                    params=params, hint=hint)
    name = ("linear_cube_bias" if fused else "linear_cube") + ("_scaled" if row_scale else "")
    kernels.append(walk.kernel_plan(name))
    return Plan(op="linear", strategy=strategy, dtype=dtype, profile=prof, kernels=tuple(kernels),
                params=dict(walk.params), hint="use smaller cube_tiles")


def plan_matmul_add(x_shape, weight_shape, dtype="fp32", *, bias=True, profile=None, cube_tiles=None) -> Plan:
    """Plan of :func:`matmul_add` for ``x[..., K]`` and ``weight[N, K]`` (no data needed)."""
    return _plan("matmul_add", x_shape, weight_shape, dtype, bias, profile, cube_tiles)


def plan_fused_bias(x_shape, weight_shape, dtype="fp32", *, bias=True, profile=None, cube_tiles=None,
                    row_scale=False) -> Plan:
    """Plan of :func:`fused_bias` for ``x[..., K]`` and ``weight[N, K]`` (no data needed);
    ``row_scale=True``: with an fp32 scale per row of x (each cube block reads its rows' scales,
    ``M*4`` bytes per column of blocks, and one vector op per output element)."""
    return _plan("fused_bias", x_shape, weight_shape, dtype, bias, profile, cube_tiles, bool(row_scale))


# ---------------------------------------------------------------------------------------------
# public strategies


def _row_scale(where, xt, row_scale):
    """The checked fp32 ``[M]`` row scale of a call (``x.shape[:-1]`` or ``(M,)``), or None."""
    if row_scale is None:
        return None
    st = inputs.tensor(row_scale, "row_scale", where, min_rank=0)
    lead = xt.shape[:-1]
    m = math.prod(lead)
    if st.shape not in (lead, (m,)):
        raise ShapeError(f"{where}: row_scale must have shape {(m,)} or x's leading dims {lead} (one fp32 "
                         f"scale per row of x {xt.shape}), got {st.shape}")
    if st.dtype != "fp32":
        raise DTypeError(f"{where}: row_scale must be fp32 (one fp32 scale per row, shape {(m,)}), got "
                         f"{st.dtype}; cast it with row_scale.astype(numpy.float32)")
    return st


def _inputs(where, x, weight, bias):
    xt = inputs.tensor(x, "x", where, min_rank=1)
    wt = inputs.tensor(weight, "weight", where, min_rank=2, max_rank=2)
    named = {"x": xt, "weight": wt}
    bt = None
    if bias is not None:
        bt = inputs.tensor(bias, "bias", where, min_rank=1, max_rank=1)
        named["bias"] = bt
    dtype = inputs.same_dtype(where, **named)
    _dims(xt.shape, wt.shape, where)
    if bt is not None and bt.shape[0] != wt.shape[0]:
        raise ShapeError(
            f"{where}: bias has shape {bt.shape} but weight {wt.shape} has N = {wt.shape[0]}; "
            f"bias must be [N]"
        )
    return xt, wt, bt, dtype


class _Call:
    """What a linear call derives from its signature (kept per signature in ``_CALLS``; see
    :class:`~pypto_numba.machine.memo.CallMemo`)."""

    __slots__ = ("strategy", "plan", "dtype", "kdt", "k", "out_shape", "shapes")

    def __init__(self, strategy, plan, xt, wt, bt, dtype, st=None):
        self.strategy, self.plan, self.dtype, self.kdt = strategy, plan, dtype, dtypes.KERNEL[dtype]
        self.k = xt.shape[-1]
        self.out_shape = xt.shape[:-1] + (wt.shape[0],)
        self.shapes = [xt.shape, wt.shape] + [t.shape for t in (bt, st) if t is not None]


_CALLS = CallMemo()


def _prepare(strategy, x, weight, bias, row_scale, profile, cube_tiles):
    """Validate and plan a call in full -> (its :class:`_Call`, the contiguous (x, weight, bias,
    row_scale), the bytes copied to make them contiguous)."""
    where = f"linear.{strategy}"
    xt, wt, bt, dtype = _inputs(where, x, weight, bias)
    st = _row_scale(where, xt, row_scale)
    p = _plan(strategy, xt.shape, wt.shape, dtype, bt is not None, profile, cube_tiles, st is not None)
    copied = sum(t.copied_bytes for t in (xt, wt, bt, st) if t is not None)
    return (_Call(strategy, p, xt, wt, bt, dtype, st),
            (xt.array, wt.array, None if bt is None else bt.array, None if st is None else st.array), copied)


def _run(strategy, x, weight, bias, profile, cube_tiles, cast_mode=None, row_scale=None):
    """One linear call: the prepared call of its signature (checked and planned on the first
    call, see :class:`~pypto_numba.machine.memo.CallMemo`), then its kernels: the cube walk
    (``cube.run_walk``; with ``fused_bias`` the row scale and the bias are applied in its
    epilogue), and for ``matmul_add`` with a bias the vector kernel that adds it."""
    arrays = (x, weight, bias) if row_scale is None else (x, weight, bias, row_scale)  # the default's key as before
    key = _CALLS.key(profile, arrays, (strategy, cube_tiles))
    c, arrays, copied = _CALLS.through(key, _prepare, strategy, x, weight, bias, row_scale, profile, cube_tiles)
    cm = resolve_cast_mode(cast_mode, profile, f"linear.{strategy}", narrows=c.dtype != "fp32")
    if arrays is not None:
        x, weight, bias, row_scale = arrays
    # the kernels, on contiguous arrays of the call's signature
    p = c.plan
    n = c.out_shape[-1]
    x2 = x.view(c.kdt).reshape(-1, c.k)
    wk = weight.view(c.kdt)
    bk = None if bias is None else bias.view(c.kdt)
    out, out_k = dtypes.empty(c.out_shape, c.dtype)
    out2 = out_k.reshape(-1, n)
    with Launch(p, c.shapes) as run:
        if c.strategy == "matmul_add" and bk is not None:
            prod, prod_k = dtypes.empty(out2.shape, c.dtype)
            run.count(cube.run_walk(x2, wk, None, prod_k, p.params), workspace_bytes=prod.nbytes)
            run.count(_bias_add_kernel(prod_k, bk, out2, p.params["m1"], p.params["n1"],
                                       p.params["ops_per_elem"], cm))
        else:
            sk = None if row_scale is None else row_scale.reshape(-1)
            run.count(cube.run_walk(x2, wk, bk, out2, p.params, scale_k=sk))
        run.workspace(copied)
    return out


@register("linear", "matmul_add", plan=plan_matmul_add,
          summary="cube matmul, then a vector kernel adds the bias (2 kernels, 2 roundings)")
def matmul_add(x, weight, bias=None, *, profile=None, cube_tiles=None, cast_mode=None):
    """``round(round(x @ weight^T) + bias)``: a cube kernel writes the product in the storage dtype,
    a vector kernel adds the bias. ``cube_tiles=((mL0, mL1), (kL0, kL1), (nL0, nL1))``.
    ``cast_mode`` rounds the vector add's cast only; the product's rounding is the cube FIXPIPE's,
    always rint (npu-facts 8.3)."""
    return _run("matmul_add", x, weight, bias, profile, cube_tiles, cast_mode)


@register("linear", "fused_bias", plan=plan_fused_bias,
          summary="bias added to the fp32 accumulator in the cube epilogue (1 kernel, 1 rounding)")
def fused_bias(x, weight, bias=None, cube_tiles=None, *, row_scale=None, profile=None, cast_mode=None):
    """``round(x @ weight^T + bias)`` in one cube kernel, the bias added to the fp32 accumulator.

    ``row_scale``: an fp32 scale per row of x (shape ``x.shape[:-1]`` or ``(M,)``) applied to the
    accumulator first, ``round(row_scale[i] * acc[i, j] + bias[j])``, still one rounding: with
    ``rmsnorm.deferred``'s ``1/rms`` and a weight folded by ``rmsnorm.fold`` this is RMSNorm then
    the Linear without the normed rows in GM.

    ``cube_tiles=((mL0, mL1), (kL0, kL1), (nL0, nL1))`` (default: the profile's
    ``linear_cube_tiles``, or ``linear_decode_cube_tiles`` for fewer than 16 rows).
    ``cast_mode`` is accepted and has no effect: the one rounding is the cube FIXPIPE's, always rint (npu-facts 8.3) (a bad mode name is still an error).
    """
    return _run("fused_bias", x, weight, bias, profile, cube_tiles, cast_mode, row_scale)


# ---------------------------------------------------------------------------------------------
# gate_up_swiglu: the gate and up projections of a gated MLP with SwiGLU in the epilogue


@kernel(boundscheck=False)
def _gate_up_kernel(x, wg, wu, out, lim, m1, k1, n1, acc, x_l1, w_l1, slots, ops_per_elem, use_amx, xv):
    """``out = round(silu(clamp_gate(x @ wg^T)) * clamp_up(x @ wu^T))``, one task per [mL1, nL1]
    block of out: both accumulators stay in L0C, each x tile moved to L1 serves both products, and
    the epilogue combines them (``machine/cube/epilogue.py``) -> the counters. ``acc[t, 0|1]``,
    ``x_l1[t]``, ``w_l1[t, 0|1]``: per-thread fp32 L0C and L1 scratch (16-bit operands widened,
    fp32 copied); ``slots``: the BLAS argument slots (``cube.scratch``). ``use_amx`` (bf16, the
    host's AMX): both products on AMX tiles over the whole of K (``cube.amx.amx_rows``, x packed
    once in ``xv``; the counts stay per kL1 step), the rest of K and of the weight rows in loops."""
    M, K = x.shape
    N = wg.shape[0]
    tm = (M + m1 - 1) // m1
    tn = (N + n1 - 1) // n1
    bx = x.itemsize
    bw = wg.itemsize
    lim32 = np.float32(lim)
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    flops = 0
    slots0 = slots.ctypes.data
    for t in prange(tm * tn):
        tid = numba.get_thread_id()
        mb = (t // tn) * m1
        nb = (t % tn) * n1
        vm = min(m1, M - mb)
        vn = min(n1, N - nb)
        cg = acc[tid, 0]
        cu = acc[tid, 1]
        for i in range(vm):
            for j in range(vn):
                cg[i, j] = 0.0
                cu[i, j] = 0.0
        xa = x_l1[tid]
        ga = w_l1[tid, 0]
        ua = w_l1[tid, 1]
        sl = slots0 + tid * 4 * cube.ARG_SLOTS
        if use_amx:  # the whole 16-row groups of weight rows on AMX tiles, the rows past them below
            ct = xa.reshape(-1)  # the L1 scratch holds the C tiles (x is read packed)
            xf = x.reshape(-1)
            jg = amx.amx_rows(cg, 0, vm, vn, xf, mb * K, K, xv, mb, wg.reshape(-1), nb * K, K, K, ct)
            amx.amx_rows(cu, 0, vm, vn, xf, mb * K, K, xv, mb, wu.reshape(-1), nb * K, K, K, ct)
            for i in range(vm):
                for j in range(jg, vn):
                    sg = np.float32(0.0)
                    su = np.float32(0.0)
                    for q in range(K):
                        xi = dtypes.widen(x[mb + i, q])
                        sg += xi * dtypes.widen(wg[nb + j, q])
                        su += xi * dtypes.widen(wu[nb + j, q])
                    cg[i, j] += sg
                    cu[i, j] += su
        for kk in range(0, K, k1):
            vk1 = min(k1, K - kk)
            gm_read += vm * vk1 * bx + 2 * vn * vk1 * bw  # GM -> L1: the x tile once, both weight tiles
            flops += 4 * vm * vn * vk1
            if use_amx:
                continue
            cube.load_l1(x, mb, kk, vm, vk1, xa)
            cube.load_l1(wg, nb, kk, vn, vk1, ga)
            cube.load_l1(wu, nb, kk, vn, vk1, ua)
            cube.mma_blas(cg.ctypes.data, n1, xa.ctypes.data, k1, ga.ctypes.data, k1, vm, vn, vk1, sl)
            cube.mma_blas(cu.ctypes.data, n1, xa.ctypes.data, k1, ua.ctypes.data, k1, vm, vn, vk1, sl)
        epilogue_swiglu(cg, cu, vm, vn, lim32, out, mb, nb)
        tasks += 1
        gm_write += vm * vn * out.itemsize
        vector_ops += vm * vn * ops_per_elem
    return tasks, gm_read, gm_write, vector_ops, flops


EPILOGUE_ROWS = 16  # rows of the [16, nL0] UB tiles the epilogue moves L0C through (one fractal)


def _gate_up_tiles(prof, m, dtype):
    """The linear tiles for this M, kL1 halved (down to kL0) until x and both weight tiles fit L1."""
    (m0, m1), (k0, k1), (n0, n1) = _default_tiles(prof, m)
    b = dtypes.itemsize(dtype)
    while k1 > k0 and (-(-m1 // 16) * 16 + 2 * -(-n1 // 16) * 16) * k1 * b > prof.l1_bytes:
        k1 //= 2
    return ((m0, m1), (k0, k1), (n0, n1))


@memo_plan
def _plan_gate_up(x_shape, w_shape, dtype, limit, profile, cube_tiles) -> Plan:
    from .swiglu import GATE_CLAMP_OPS, MUL_OPS, SILU_OPS, UP_CLAMP_OPS, _check_limit

    prof = load_profile(profile)
    where = "swiglu.epilogue"
    dtype = inputs.storage_dtype(dtype, where)
    m, k, n = _dims(x_shape, w_shape, where)
    limit = _check_limit(where, limit)
    tiles = _gate_up_tiles(prof, m, dtype) if cube_tiles is None else cube_tiles
    walk = cube.plan_walk(m, k, n, tiles, dtype, profile=prof, where=where)
    (_, m1), _, (n0, n1) = walk.tiles
    by = {b.name: b for b in walk.buffers}
    hint = "use smaller cube_tiles (two L0C accumulators and two weight tiles in L1)"
    buffers = list(walk.buffers) + [
        dataclasses.replace(by["b_l1"], name="b_up_l1"),
        dataclasses.replace(by["c_l0"], name="c_up_l0"),
        vector_tile("gate_ub", (EPILOGUE_ROWS, n0), "fp32", prof, where, hint),
        vector_tile("up_ub", (EPILOGUE_ROWS, n0), "fp32", prof, where, hint),
        vector_tile("sig_ub", (EPILOGUE_ROWS, n0), "fp32", prof, where, hint),
        vector_tile("y_ub", (EPILOGUE_ROWS, n0), dtype, prof, where, hint),
    ]
    ops = SILU_OPS + MUL_OPS + (GATE_CLAMP_OPS + UP_CLAMP_OPS) * (limit is not None) + (dtype != "fp32")
    b = dtypes.itemsize(dtype)
    tm, tn = -(-m // m1), -(-n // n1)
    kp = KernelPlan(name="gate_up_swiglu", unit="mixed", tasks=walk.tasks, buffers=tuple(buffers),
                    gm_read_bytes=m * k * b * tn + 2 * n * k * b * tm, gm_write_bytes=m * n * b,
                    gm_unique_bytes=m * k * b + 2 * n * k * b, cube_flops=2 * walk.cube_flops, vector_ops=m * n * ops,
                    cube_task=(min(m, m1), 2 * min(n, n1), k))  # gate and up: two [rows, nL1] products per task
    return Plan(op="swiglu", strategy="epilogue", dtype=dtype, profile=prof, kernels=(kp,),
                params=dict(walk.params, limit=limit, ops_per_elem=ops), hint=hint)


def plan_gate_up_swiglu(x_shape, w_shape, dtype="fp32", *, limit=None, profile=None, cube_tiles=None) -> Plan:
    """Plan of :func:`gate_up_swiglu` for ``x[..., K]`` and ``w_gate``/``w_up`` ``[I, K]`` (no data)."""
    return _plan_gate_up(x_shape, w_shape, dtype, limit, profile, cube_tiles)


@functools.partial(torch_aware, where="linear.gate_up_swiglu")  # swiglu.epilogue registers it
def gate_up_swiglu(x, w_gate, w_up, *, limit=None, profile=None, cube_tiles=None, cast_mode=None):
    """``silu(x @ w_gate^T) * (x @ w_up^T)`` in one mixed kernel: both products accumulate in fp32
    (L0C) for the same [mL1, nL1] block and the epilogue applies the activation (with ``limit``:
    ``gate <= limit``, ``-limit <= up <= limit``, as swiglu) and rounds once, so the ``[..., 2*I]``
    gate/up intermediate is never written to GM. ``x[..., K]``, ``w_gate``, ``w_up`` ``[I, K]``
    (one dtype) -> ``[..., I]``. Also ``swiglu.epilogue``. ``cube_tiles`` as :func:`fused_bias`
    (default: its tiles with kL1 halved until x and both weight tiles fit L1). On the CPU each
    product is BLAS sgemm on fp32 L1 copies, or in bf16 on AMX tiles where the host has them. ``cast_mode`` is accepted and has no effect: the epilogue is the cube FIXPIPE's, always rint (npu-facts 8.3) (a bad mode name is still an error).
    """
    if cast_mode is not None:
        resolve_cast_mode(cast_mode, profile, "linear.gate_up_swiglu")
    where = "swiglu.epilogue"
    xt = inputs.tensor(x, "x", where, min_rank=1)
    gt = inputs.tensor(w_gate, "w_gate", where, min_rank=2, max_rank=2)
    ut = inputs.tensor(w_up, "w_up", where, min_rank=2, max_rank=2)
    if ut.shape != gt.shape:
        raise ShapeError(f"{where}: w_up must have w_gate's shape {gt.shape}, got {ut.shape}")
    dtype = inputs.same_dtype(where, x=xt, w_gate=gt, w_up=ut)
    p = _plan_gate_up(xt.shape, gt.shape, dtype, limit, profile, cube_tiles)
    prm = p.params
    m1, k1, n1 = prm["m1"], prm["k1"], prm["n1"]
    out, out_k = dtypes.empty(xt.shape[:-1] + (gt.shape[0],), dtype)
    nth = numba.config.NUMBA_NUM_THREADS  # thread ids stay below it (machine/tile.py)
    acc = np.empty((nth, 2, m1, n1), np.float32)
    x_l1 = np.empty((nth, m1, k1), np.float32)
    w_l1 = np.empty((nth, 2, n1, k1), np.float32)
    slots = cube.scratch(1, 1, 1, 1, True, False, threads=nth)[4]
    lim = np.inf if prm["limit"] is None else prm["limit"]
    x2 = xt.kview.reshape(-1, xt.shape[-1])
    K = xt.shape[-1]
    # the C tiles live in the x L1 scratch: it must hold them
    use_amx = m1 * k1 >= amx.GROUP * amx.TILE**2 and amx.applies(x2.shape[0], K, m1, x2.dtype)
    xv = amx.pack_pairs(x2) if use_amx else amx.NO_PACK
    with Launch(p, [xt.shape, gt.shape, ut.shape]) as run:
        with cube.single_thread_blas(), cube.dynamic_tasks():
            run.count(_gate_up_kernel(x2, gt.kview, ut.kview, out_k.reshape(-1, gt.shape[0]), lim, m1, k1, n1, acc,
                                      x_l1, w_l1, slots, prm["ops_per_elem"], use_amx, xv))
        run.workspace(xt.copied_bytes + gt.copied_bytes + ut.copied_bytes)
    return out


# --- lab spec ---
# What compare, advise and report need to know about linear (pypto_numba/lab/spec.py).

def _reference_linear(x, weight, bias=None):
    """``x @ weight.T (+ bias)`` in float64."""
    from .reference import f64

    out = f64(x) @ f64(weight).T
    return out + f64(bias) if bias is not None else out


def _mirror_linear(x, weight, bias=None, strategy="fused_bias", mirror=False):
    """The reference, or with ``mirror=True`` rounded where the strategy narrows: ``matmul_add``
    rounds the product (FIXPIPE: rint), then the sum with the bias (the vector cast: the mode in
    force); ``fused_bias`` once, by FIXPIPE (lab/spec.py mirrors)."""
    from .lab.spec import storage_of, to_storage

    if not mirror:
        return _reference_linear(x, weight, bias)
    dt = storage_of(x)
    if strategy == "matmul_add" and bias is not None:
        from .reference import f64

        return to_storage(to_storage(_reference_linear(x, weight), dt, "rint") + f64(bias), dt)
    return to_storage(_reference_linear(x, weight, bias), dt, "rint")


def _lab_inputs(shape, dtype, rng):
    from .lab import need, normal

    M, K, N = need(shape, 3, "M,K,N")
    return (normal((M, K), dtype, rng), normal((N, K), dtype, rng, K**-0.5), normal((N,), dtype, rng))


def _linear(profile, tokens=16, in_features=4096, out_features=4096, dtype="bf16", bias=True):
    from .lab import Candidate

    x, w = (tokens, in_features), (out_features, in_features)
    cands = [
        Candidate("matmul_add", lambda: (plan_matmul_add(x, w, dtype, bias=bias, profile=profile),), fused=False),
        Candidate("fused_bias", lambda: (plan_fused_bias(x, w, dtype, bias=bias, profile=profile),)),
    ]
    return cands, None, ()


def _linear_tiles(profile, tokens, in_features, out_features, dtype, bias):
    """tune.search's space: L1 tiles mL1 x nL1 x kL1 in powers of two up to the first that
    covers the dim, L0 tiles (mL0, kL0, nL0) = (min(mL1, 128), min(kL1, 64 or 128 for mL0 <= 32),
    min(nL1, 128)); the cube time itself comes from tune.l0_tile (machine/pipes.py)."""
    from .lab import Candidate
    from .lab.spec import pow2

    def upto(lo, hi, dim):
        vals = pow2(lo, hi)
        return tuple(v for i, v in enumerate(vals) if i == 0 or vals[i - 1] < dim)

    x, w = (tokens, in_features), (out_features, in_features)
    plans = {"matmul_add": plan_matmul_add, "fused_bias": plan_fused_bias}
    for m1 in upto(16, 512, tokens):
        m0 = min(m1, 128)
        for n1 in upto(32, 512, out_features):
            for k1 in upto(64, 512, in_features):
                t = ((m0, m1), (min(k1, 128 if m0 <= 32 else 64), k1), (min(n1, 128), n1))
                for label, plan in plans.items():
                    yield Candidate(label, lambda plan=plan, t=t: (plan(x, w, dtype, bias=bias, profile=profile,
                                                                        cube_tiles=t),),
                                    fused=label == "fused_bias", tiles={"cube_tiles": t},
                                    shape=(tokens, in_features, out_features))


def _linear_figures():
    """npu-facts 8.5 / 7: the 6144^3 FP16 matmul on A2/A3 (a plain matmul: no bias)."""
    from .lab.spec import DeviceFigure

    mm = dict(tokens=6144, in_features=6144, out_features=6144, dtype="fp16", bias=False)
    return (
        DeviceFigure("6144^3 fp16 matmul, 128-256 tiles", mm, "fused_bias", 2.1e-3, "npu-facts 8.5, 7",
                     flops=2 * 6144 ** 3, throughput="220 TFLOPS", bound="cube", within=1.3,
                     note="the run used 128-256 tiles, the profile's default linear_cube_tiles; it missed the L2 "
                          "(its tuning gained 1.31x by raising the hit rate), which the model cannot do while the "
                          "operands fit the L2, so the estimate lands below 2.1 ms"),
        DeviceFigure("6144^3 fp16 matmul, tuned (L2 hit rate)", mm, "fused_bias", 1.6e-3, "npu-facts 8.5, 7",
                     tiles="best", flops=2 * 6144 ** 3, throughput="290 TFLOPS", bound="cube",
                     note="the device run raised its L2 hit rate; the model serves every re-read from L2 "
                          "while the operands fit it (here 144 MiB of the 192 MiB), so tune.search's tiles "
                          "are all the tuning it can express"),
    )


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed, Tolerance
    from .lab.spec import mirrors

    return OpSpec(
        name="linear",
        seed=Seed("fused_bias", "matmul_add", "fused bias: one kernel and one GM round trip fewer"),
        inputs=Inputs(make=_lab_inputs,
                      default_shape=(16, 2048, 2048),
                      help="M,K,N, e.g. 16,2048,2048"),
        reference=mirrors(lambda x, w, b, strategy, mirror=False, **o: _mirror_linear(x, w, b, strategy, mirror)),
        tolerance=Tolerance(policy="outlier", fp32=(1e-4, 1e-5), half=(2.0**-7, 1e-3)),
        advise=_linear,  # named as advise's old rule: its TypeError names it
        oracles={"linear": _reference_linear},
        tiles=_linear_tiles,
        figures=_linear_figures(),
    )


OP = _lab_spec()
