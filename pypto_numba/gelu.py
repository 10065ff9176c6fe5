"""GELU: tanh approximation vs exact erf.

Math (x of any shape; storage dtype fp32, bf16 or fp16; result in the same dtype)::

    tanh:  0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))
    erf:   0.5*x*(1 + erf(x/sqrt(2)))

Strategies (n = x.size, b = itemsize of the storage dtype)::

    gelu.tanh   1 vector kernel, GM read n*b, GM write n*b, 9 vector ops per element
    gelu.erf    1 vector kernel, GM read n*b, GM write n*b, 5 vector ops per element

(+2 vector ops per element, the casts in and out, for bf16/fp16.) Both walk the flattened tensor
in UB tiles of ``tile`` elements (the last tile is a valid-shape tail), widen the tile to fp32,
compute in fp32 and cast once on the way out. ``math="storage"`` instead rounds every
intermediate to the storage dtype, as a kernel written entirely in the input dtype does (the PyPTO
gelu_tanh skeleton, npu-facts 1.7): it lets you test the seed's claim that in bf16/fp16 the tanh
approximation's error is far below the quantisation error.

UB per task: the input and output tiles in the storage dtype plus fp32 work tiles -- 2 for tanh
on fp32 (4 on bf16/fp16: the cast needs its own), 5 for erf (npu-facts 4.2: ``erf: 5*tile*4 B``).
So erf hits the UB limit at a smaller tile than tanh.
"""

from __future__ import annotations

import math as _math

import numpy as np
from numba import prange, types
from numba.extending import intrinsic

from . import inputs
from .errors import ConstraintError
from .machine import dtypes, vmath
from .machine import ir as irb
from .machine.jit import device, kernel
from .machine.memo import memo_plan
from .machine.plan import KernelPlan, Plan, vector_tile
from .machine.profile import load_profile, resolve_cast_mode
from .machine.tile import LINE, STREAM_MIN_BYTES, empty_apart, store_fence, stream_from, streamable
from .strategy import Launch, register

SQRT_2_OVER_PI = _math.sqrt(2.0 / _math.pi)
INV_SQRT2 = 1.0 / _math.sqrt(2.0)
CUBIC = 0.044715
NEG_INF = -np.inf  # GELU(-inf) = 0 (the limit); the formula alone gives -inf * 0 = nan

# vector element-ops per element: tanh: x*x, *x, *0.044715, +x, *sqrt(2/pi), tanh, +1, *x, *0.5
# erf: *1/sqrt(2), erf, +1, *x, *0.5; each 16-bit storage dtype adds a cast in and a cast out
OPS = {"tanh": 9, "erf": 5}
CAST_OPS = 2
# the same steps as instructions of the vector ISA (machine/isa.py; "tanh" and "erf" are sequences
# whose expansion depends on the ISA variant), per element; + 2 TCVT for bf16/fp16
MIX = {
    "tanh": (("TMUL", 3), ("TMULS", 3), ("TADD", 1), ("tanh", 1), ("TADDS", 1)),
    "erf": (("TMULS", 2), ("erf", 1), ("TADDS", 1), ("TMUL", 1)),
}
MATHS = ("fp32", "storage")


# ---------------------------------------------------------------------------------------------
# kernels: one prange iteration = one UB tile (a pypto.loop iteration on an AI vector core)
#
# Each tile is widened to fp32, computed and cast straight into the GM output in LLVM IR
# (_gelu_span: the line_span template of machine/ir/lines.py around the math), with streaming
# stores from registers for large outputs; the storage-math mode stays a numba loop. Offsets are
# uint64 (machine/jit.py).

TANH = 0  # the kernels' ``variant`` codes
ERF = 1
VARIANT = {"tanh": TANH, "erf": ERF}


def _gelu_ir(builder, v, use_erf):
    """GELU of a float32 scalar or ``<L x float>`` vector ``v`` in IR, in this order::

        tanh: (0.5*v) * (1 + tanh((((v*v)*0.044715)*v + v) * sqrt(2/pi)))
        erf:  (0.5*v) * (1 + erf(v * (1/sqrt(2))))

    with :func:`vmath.tanh_ir` / :func:`vmath.erf_ir`, multiply-adds fused (``contract``), and
    GELU(-inf) = 0 (the formula gives -inf * 0 = nan). This is the order LLVM gave the first
    (numba loop) version of the kernel, ``0.5*v*(1 + tanh(c*(v + 0.044715*v**3)))``
    reassociated: the results are bit-identical to it."""
    o = irb.FOps(builder, v.type)
    if use_erf:
        t = vmath.erf_ir(builder, o.mul(v, INV_SQRT2))
    else:
        t = vmath.tanh_ir(builder, o.mul(o.add(o.mul(o.mul(o.mul(v, v), CUBIC), v), v), SQRT_2_OVER_PI))
    y = o.mul(o.mul(0.5, v), o.add(1.0, t))
    return o.select(o.eq(v, NEG_INF), 0.0, y)


def _gelu_span(use_erf):
    @intrinsic
    def span(typingctx, x, x_off, dst, d_off, n, stream, mode=None):
        """``dst[d_off + i] = gelu(x[x_off + i])`` for ``i < n`` (flat kernel views of one dtype,
        uint64 offsets), fp32 math and one rounding to the storage dtype, in LLVM IR: the
        elements up to ``dst``'s first 64-byte line boundary one at a time, then one whole line
        per step (16 fp32 or 32 16-bit lanes in 512-bit vectors), then the rest one at a time.
        ``stream``: the whole lines are written with streaming stores (the caller fences, and
        checks that ``dst`` is a whole number of elements off a line and is not just past ``x``
        within a page: :func:`tile.streams_apart`). Explicit 512-bit vectors: the plain loop
        (:func:`_span_plain`, same bits) gets LLVM's choice (``machine/jit.py``), compute-bound.
        ``mode``: the cast mode (a ``dtypes.CastMode``; omitted or rint: ``ir.store_narrow``).
        """
        if not (isinstance(x, types.Array) and isinstance(dst, types.Array) and x.dtype == dst.dtype
                and x.dtype in (types.float32, types.uint16, types.int16)
                and (mode is None or isinstance(mode, (types.NoneType, types.Omitted, dtypes.CastModeType)))):
            return None
        if not isinstance(mode, dtypes.CastModeType):
            mode = None
        cast = "rint" if mode is None else mode.mode

        def codegen(context, builder, sig, args):
            x_arr = context.make_array(sig.args[0])(context, builder, args[0])
            d_arr = context.make_array(sig.args[2])(context, builder, args[2])
            xo, do, cnt, stream_ = args[1], args[3], args[4], args[5]  # args[6]: the mode (no data)
            kind = sig.args[0].dtype

            def step(start, count, lanes, nt):
                def body(j):
                    v = irb.load_widen(builder, x_arr.data, builder.add(xo, j), kind, lanes)
                    y, at = _gelu_ir(builder, v, use_erf), builder.add(do, j)
                    if cast == "rint":
                        irb.store_narrow(builder, y, d_arr.data, at, kind, lanes, align=LINE if nt else 1, nontemporal=nt)
                    else:
                        dtypes.store_narrow_mode(builder, y, d_arr.data, at, kind, lanes, cast,
                                                 align=LINE if nt else 1, nontemporal=nt)

                irb.steps(builder, start, count, lanes, body)

            size = context.get_abi_sizeof(context.get_data_type(kind))
            irb.line_span(builder, builder.gep(d_arr.data, [do]), cnt, size, step, stream_)
            return context.get_dummy_value()

        # an omitted mode is typed None (numba folds the default into the call's arguments)
        return types.void(x, types.uint64, dst, types.uint64, types.uint64, types.boolean,
                          types.none if mode is None else mode), codegen

    return span


_span_tanh = _gelu_span(False)
_span_erf = _gelu_span(True)


@device(fastmath=set(vmath.VMATH_FASTMATH))
def _span_plain(x, x_off, dst, d_off, n, use_erf, mode=None):
    """:func:`_gelu_span` as a plain numba loop, the readable reference: the same operations in
    the same order (``contract`` only, as the IR), so the same bits (``tests/machine/test_ir.py``); it
    has no streaming stores and LLVM picks its vector width."""
    for i in range(n):
        v = dtypes.widen(x[x_off + i])
        if use_erf:
            t = vmath.erf(v * np.float32(INV_SQRT2))
        else:
            t = vmath.tanh((v * v * np.float32(CUBIC) * v + v) * np.float32(SQRT_2_OVER_PI))
        y = (np.float32(0.5) * v) * (np.float32(1.0) + t)
        dst[d_off + i] = dtypes.narrow(dst, np.float32(0.0) if v == NEG_INF else y, mode)


@device
def _tile_storage_math(x, x_off, dst, d_off, n, use_erf):
    """Every intermediate rounded to x's storage dtype (a kernel written in the input dtype)."""
    for i in range(n):
        v = dtypes.widen(x[x_off + i])
        if use_erf:
            u = dtypes.round_as(x, v * np.float32(INV_SQRT2))
            u = dtypes.round_as(x, vmath.erf(u))
        else:
            u = dtypes.round_as(x, v * v)
            u = dtypes.round_as(x, u * v)
            u = dtypes.round_as(x, u * np.float32(CUBIC))
            u = dtypes.round_as(x, u + v)
            u = dtypes.round_as(x, u * np.float32(SQRT_2_OVER_PI))
            u = dtypes.round_as(x, vmath.tanh(u))
        u = dtypes.round_as(x, u + np.float32(1.0))
        u = dtypes.round_as(x, u * v)
        dst[d_off + i] = dtypes.narrow(dst, np.float32(0.0) if v == NEG_INF else u * np.float32(0.5))


@device(forceinline=True)
def _tile(
    x,
    x_off,
    dst,
    d_off,
    n,
    variant,
    storage_math,
    stream,
    mode,
):
    """One UB tile ``dst[d_off:][:n] = gelu(x[x_off:][:n])``.

    Parameters
    ----------
    x, dst : flat kernel views of one storage dtype
    x_off, d_off, n : uint64 element offsets and count
    variant : ``TANH`` or ``ERF``
    storage_math : round every intermediate to the storage dtype (a numba loop)
    stream : whole lines with streaming stores (the caller fences)
    mode : the cast mode of the final narrowing (a ``dtypes.CastMode``)
    """
    if storage_math:
        _tile_storage_math(x, x_off, dst, d_off, n, variant == ERF)
    elif variant == ERF:
        _span_erf(x, x_off, dst, d_off, n, stream, mode)
    else:
        _span_tanh(x, x_off, dst, d_off, n, stream, mode)


@kernel
def _gelu_kernel(
    x,
    out,
    tile,
    variant,
    storage_math,
    ops_per_elem,
    mode,
    stream,
):
    """GELU of flat ``x`` into flat ``out``, one prange task per tile -> the cost counters.

    Parameters
    ----------
    x, out : flat kernel views of one storage dtype (``out`` may be ``x``)
    tile : UB tile in elements (the last task is a valid-shape tail)
    variant : ``TANH`` or ``ERF``
    storage_math : round every intermediate to the storage dtype
    ops_per_elem : vector ops counted per element
    mode : the cast mode of the final narrowing (a ``dtypes.CastMode``: one compiled kernel per mode)
    stream : whole lines with streaming stores, fenced at the end of each task
    """
    n = x.size
    n_tiles = (n + tile - 1) // tile
    itemsize = x.itemsize
    tasks = 0
    gm_read = 0
    gm_write = 0
    vector_ops = 0
    for t in prange(n_tiles):
        start = np.uint64(t * tile)
        valid = np.uint64(min(tile, n - t * tile))  # valid shape of the tail tile
        _tile(x, start, out, start, valid, variant, storage_math, stream, mode)
        if stream:
            store_fence()
        tasks += 1
        gm_read += valid * itemsize
        gm_write += valid * itemsize
        vector_ops += valid * ops_per_elem
    return tasks, gm_read, gm_write, vector_ops, 0


# ---------------------------------------------------------------------------------------------
# plans


@memo_plan
def _plan(variant: str, shape, dtype: str, *, profile=None, tile=None, math="fp32") -> Plan:
    prof = load_profile(profile)
    where = f"gelu.{variant}"
    if math not in MATHS:
        raise ConstraintError(f"{where}: math must be one of {MATHS}, got {math!r}")
    dtype = inputs.storage_dtype(dtype, where)
    shape = tuple(int(d) for d in shape)
    inputs.check_rank(shape, "x", where)
    inputs.check_size(shape, "x", where)  # plans answer advise() too: same limits as the data path
    n = _math.prod(shape)
    tile = prof.tile("gelu_tile") if tile is None else inputs.positive_int(tile, "tile", where)
    b = dtypes.itemsize(dtype)
    temps = 5 if variant == "erf" else (2 if dtype == "fp32" else 4)
    per_elem = 2 * b + 4 * temps  # UB bytes per tile element: in + out + fp32 temps
    block = prof.align_bytes // b
    hint = f"use tile <= {prof.vec_safe_bytes // per_elem // block * block} (multiple of {block})"
    buffers = [
        vector_tile("x_ub", (tile,), dtype, prof, where, hint),
        vector_tile("y_ub", (tile,), dtype, prof, where, hint),
    ] + [vector_tile(f"tmp{i}_ub", (tile,), "fp32", prof, where, hint) for i in range(temps)]
    ops = OPS[variant] + (CAST_OPS if dtype != "fp32" else 0)
    math_dtype = "fp32" if math == "fp32" else dtype
    mix = tuple((kind, math_dtype, n * count) for kind, count in MIX[variant])
    if dtype != "fp32":
        mix += (("TCVT", dtype, n * CAST_OPS),)
    k = KernelPlan(
        name=f"gelu_{variant}",
        unit="vector",
        tasks=-(-n // tile),
        buffers=tuple(buffers),
        gm_read_bytes=n * b,
        gm_write_bytes=n * b,
        vector_ops=n * ops,
        gm_unique_bytes=n * b,
        tiles_per_task=1,
        load_bytes=min(n, tile) * b,
        store_bytes=min(n, tile) * b,
        vector_mix=mix,
        vector_tile_elems=min(n, tile),
        vector_cols=min(n, tile),
    )
    return Plan(op="gelu", strategy=variant, dtype=dtype, profile=prof, kernels=(k,),
                params={"tile": tile, "math": math, "ops_per_elem": ops}, hint=hint)


def plan_tanh(shape, dtype="fp32", *, profile=None, tile=None, math="fp32") -> Plan:
    """Plan of :func:`tanh` for an input of ``shape`` and storage ``dtype`` (no data needed)."""
    return _plan("tanh", shape, dtype, profile=profile, tile=tile, math=math)


def plan_erf(shape, dtype="fp32", *, profile=None, tile=None, math="fp32") -> Plan:
    """Plan of :func:`erf` for an input of ``shape`` and storage ``dtype`` (no data needed)."""
    return _plan("erf", shape, dtype, profile=profile, tile=tile, math=math)


# ---------------------------------------------------------------------------------------------
# public strategies


def _run(variant: str, x, profile, tile, math, out, cast_mode):
    where = f"gelu.{variant}"
    xt = inputs.tensor(x, "x", where)
    p = _plan(variant, xt.shape, xt.dtype, profile=profile, tile=tile, math=math)
    storage_math = p.params["math"] == "storage"
    mode = resolve_cast_mode(cast_mode, profile, where)
    if xt.dtype == "fp32" or storage_math:
        mode = dtypes.RINT  # no cast: one kernel, whatever the mode
    if out is None and not storage_math and streamable(xt.kview, STREAM_MIN_BYTES):
        result, out_k = empty_apart(xt.shape, xt.dtype, xt.array)  # placed for streaming
    else:
        result, out_k = inputs.output(where, xt, out)
    stream = not storage_math and stream_from(out_k, xt.kview, min_bytes=STREAM_MIN_BYTES)  # no read for ownership
    with Launch(p, [xt.shape]) as run:
        run.count(
            _gelu_kernel(xt.kview.reshape(-1), out_k.reshape(-1), p.params["tile"], VARIANT[variant],
                         storage_math, p.params["ops_per_elem"], mode, stream)
        )
        run.workspace(xt.copied_bytes)
    return result


@register("gelu", "tanh", plan=plan_tanh, summary="tanh approximation, one vector kernel")
def tanh(x, *, profile=None, tile=None, math="fp32", out=None, cast_mode=None):
    """GELU by the tanh approximation: ``0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))``.

    ``tile``: UB tile in elements (default: the profile's ``gelu_tile``); ``math="storage"``
    rounds every intermediate to the storage dtype (default ``"fp32"``: one cast at the end);
    ``out``: write into this array (x's shape and dtype; may be x itself) instead of a new one;
    ``cast_mode``: the rounding of the one fp32 -> bf16/fp16 cast (``machine/dtypes.py``; default
    ``use_cast_mode`` / ``$PYPTO_NUMBA_CAST_MODE`` / the profile's, rint). ``math="storage"`` has
    no cast (its roundings are bf16/fp16 arithmetic, to nearest even): the mode does nothing there.
    """
    return _run("tanh", x, profile, tile, math, out, cast_mode)


@register("gelu", "erf", plan=plan_erf, summary="exact erf form, one vector kernel")
def erf(x, *, profile=None, tile=None, math="fp32", out=None, cast_mode=None):
    """Exact GELU: ``0.5*x*(1 + erf(x/sqrt(2)))``. Options as :func:`tanh`."""
    return _run("erf", x, profile, tile, math, out, cast_mode)


# --- lab spec ---
# What compare, advise and report need to know about gelu (pypto_numba/lab/spec.py).

def _reference_tanh(x):
    """``0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))``, evaluated as ``x*sigmoid(2u)``.

    The two are equal (``(1 + tanh(u))/2 = sigmoid(2u)``); the sigmoid form does not cancel for
    x << 0, where ``1 + tanh(u)`` loses every digit even in float64 (x = -8: true -3.1e-21).
    """
    from scipy import special

    from .reference import f64

    x = f64(x)
    u = np.sqrt(2.0 / np.pi) * (x + 0.044715 * x**3)
    with np.errstate(invalid="ignore", over="ignore"):
        y = x * special.expit(2.0 * u)
    return np.where(x == -np.inf, 0.0, y)  # the limit at -inf


def _reference_erf(x):
    """``0.5*x*(1 + erf(x/sqrt(2)))`` (exact GELU), evaluated as ``0.5*x*erfc(-x/sqrt(2))``."""
    from scipy import special

    from .reference import f64

    x = f64(x)
    with np.errstate(invalid="ignore"):
        y = 0.5 * x * special.erfc(-x / np.sqrt(2.0))
    return np.where(x == -np.inf, 0.0, y)  # the limit at -inf


def _mirror(x, strategy, math="fp32"):
    """The strategy's mirror: the float64 formula rounded once to the storage dtype, or with
    ``math="storage"`` at every step :func:`_tile_storage_math` rounds (lab/spec.py mirrors)."""
    from scipy import special

    from .lab.spec import storage_of, to_storage
    from .reference import f64

    dt = storage_of(x)
    if math != "storage":
        return to_storage(_reference_erf(x) if strategy == "erf" else _reference_tanh(x), dt)
    v = f64(x)
    r = lambda a: to_storage(a, dt, "rint")  # noqa: E731 (bf16/fp16 arithmetic: nearest even)
    with np.errstate(invalid="ignore", over="ignore"):
        if strategy == "erf":
            u = r(special.erf(r(v * np.float32(INV_SQRT2))))
        else:
            u = r(np.tanh(r(r(r(r(r(v * v) * v) * np.float32(CUBIC)) + v) * np.float32(SQRT_2_OVER_PI))))
        u = r(r(u + 1.0) * v)
        return np.where(v == -np.inf, 0.0, r(u * 0.5))


def _gelu(profile, shape=(8, 11008), dtype="bf16", exact=False):
    from .lab import Candidate

    cands = [Candidate("erf", lambda: (plan_erf(shape, dtype, profile=profile),))]
    if not exact:
        cands.insert(0, Candidate("tanh", lambda: (plan_tanh(shape, dtype, profile=profile),)))
    notes = ["exact=True (precision first) leaves only erf"] if exact else [
        "tanh and erf differ by at most ~3e-4 absolute (the tanh approximation's error), below one bf16 ulp "
        "for |GELU(x)| > 0.08; pass exact=True when erf itself is required"]
    return cands, None, notes


def _gelu_tiles(profile, shape, dtype, exact):
    """tune.search's space: element tiles of 512 to 32768 (the plan refuses what overflows UB)."""
    from .lab import Candidate
    from .lab.spec import elems

    for tile in elems(512, 32768):
        for label, plan in (("tanh", plan_tanh), ("erf", plan_erf)):
            yield Candidate(label, lambda plan=plan, tile=tile: (plan(shape, dtype, profile=profile, tile=tile),),
                            tiles={"tile": tile}, shape=tuple(shape))


def _lab_spec():
    from .lab import Inputs, OpSpec, Seed, normal
    from .lab.spec import mirrors

    return OpSpec(
        name="gelu",
        seed=Seed("tanh", "erf",
                  "tanh by default; erf has no verified hardware acceleration and gains nothing in bf16/fp16"),
        inputs=Inputs(make=lambda shape, dtype, rng: (normal(shape, dtype, rng, 2.0),),
                      default_shape=(8, 11008),
                      help="x shape, e.g. 8,11008"),
        reference=mirrors(lambda x, strategy, mirror=False, math="fp32", **o: _mirror(x, strategy, math) if mirror
                          else _reference_erf(x) if strategy == "erf" else _reference_tanh(x)),
        advise=_gelu,  # named as advise's old rule: its TypeError names it
        oracles={"gelu_tanh": _reference_tanh, "gelu_erf": _reference_erf},
        tiles=_gelu_tiles,
    )


OP = _lab_spec()
