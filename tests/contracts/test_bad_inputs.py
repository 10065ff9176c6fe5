"""Bad-input matrix over every public function: each case gives a correct result or a specific error.

Every case is either

- ``raises(Exc, pattern)``: the call raises ``Exc`` (or a subclass) and the message matches
  ``pattern`` (which names the offending argument), or
- ``equal(ref)`` / ``close(ref, rtol, atol)`` / ``check(fn)``: the call returns a result equal to
  ``ref()`` (bit for bit; e.g. a non-contiguous view against its contiguous copy), close to it
  (NaN where the reference has NaN), or accepted by ``fn``.

All cases run in ONE subprocess (``python tests/contracts/test_bad_inputs.py OUT.json``) that reports a JSON
result per case: a crash (segfault, abort, runaway allocation) fails the tests instead of killing
pytest, and the kernels' compile cost is paid once. The subprocess caps its address space
(``RLIMIT_AS``) a few GiB above what it uses, so a case that would allocate a huge array fails
with MemoryError instead of swapping the shared machine. Huge (> INT32_MAX elements) inputs are
``np.broadcast_to`` views or plan-only calls: nothing huge is allocated when validation works.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import traceback
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import attention, embedding, gelu, linear, mean, moe, reference, repeat_kv, rmsnorm, rope, softmax, swiglu
from pypto_numba.errors import ConstraintError, DTypeError, PyptoNumbaError, ShapeError, TileError
from pypto_numba.machine.profile import ProfileError

BF16 = ml_dtypes.bfloat16
F32 = np.float32
BIG = 2**31  # one element more than PyPTO's INT32_MAX shape-size limit

# ---------------------------------------------------------------------------------------------
# case kinds


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    call: Callable
    kind: str  # "raises" | "equal" | "close" | "check"
    exc: type = None
    pattern: str = ""
    ref: Callable = None
    rtol: float = 0.0
    atol: float = 0.0
    xfail: str = ""  # reason, when a case documents a known bug (strict xfail: fixing it fails the mark)
    needs_cap: bool = False  # allocates > 4 GiB if validation is missing: run only under RLIMIT_AS


CASES: list = []
_IDS: set = set()


def _add(case):
    assert case.id not in _IDS, case.id
    _IDS.add(case.id)
    CASES.append(case)


def raises(cid, call, exc, pattern, xfail="", needs_cap=False):
    _add(Case(cid, call, "raises", exc=exc, pattern=pattern, xfail=xfail, needs_cap=needs_cap))


def equal(cid, call, ref, xfail=""):
    _add(Case(cid, call, "equal", ref=ref, xfail=xfail))


def close(cid, call, ref, rtol=1e-5, atol=1e-6, xfail=""):
    _add(Case(cid, call, "close", ref=ref, rtol=rtol, atol=atol, xfail=xfail))


def check(cid, call, fn=None, xfail=""):
    _add(Case(cid, call, "check", ref=fn, xfail=xfail))




def expect(condition, detail):
    """For check(): fail with ``detail`` unless ``condition``."""
    if not condition:
        raise AssertionError(detail)

# ---------------------------------------------------------------------------------------------
# inputs (small; created at import in both processes, cheap)

_rng = np.random.default_rng(20261130)


def _normal(shape, dtype=F32, *, scale=1.0):
    return (_rng.standard_normal(shape) * scale).astype(F32).astype(dtype)


X = _normal((4, 37))
XB = X.astype(BF16)
MX = _normal((3, 5, 40)) + F32(0.5)
RX = _normal((5, 2, 8))
_cs = reference.cos_sin(np.arange(5), 8)
COS, SIN = (np.asarray(t, np.float64).astype(F32) for t in _cs)
COS0, SIN0 = COS, SIN


def pair_tables(cos, sin):
    """The GPT-J pair tables rope.interleaved expects, from split-half ones (as tests/helpers.py)."""
    return tuple(np.repeat(t[..., : t.shape[-1] // 2], 2, axis=-1) for t in (cos, sin))


RW = (1.0 + 0.1 * _normal((8,))).astype(F32)
Q = _normal((1, 2, 3, 8))
K = _normal((1, 1, 5, 8))
V = _normal((1, 1, 5, 8))
KV = _normal((1, 2, 3, 8))
LOG = _normal((6, 16))
BIAS = (0.1 * _normal((16,))).astype(F32)
EO = _normal((6, 2, 20))
EW = np.abs(_normal((6, 2))).astype(F32)
LX = _normal((5, 24))
LW = _normal((12, 24), scale=0.2)
LB = _normal((12,))
EMB = _normal((10, 8))
IDS = np.array([[1, 2], [9, 0]], np.int32)


def _strided(a, axis=-1):
    """A non-contiguous view with a's values (every other element of a doubled array)."""
    return np.repeat(a, 2, axis=axis)[(slice(None),) * (a.ndim + axis if axis < 0 else axis) + (slice(None, None, 2),)]


def _reversed(a):
    """A negatively strided view (all axes flipped) and its contiguous copy."""
    v = np.flip(a.copy())
    return v, np.ascontiguousarray(v)


def _fortran(a):
    return np.asfortranarray(a)


def _readonly(a):
    a.setflags(write=False)
    return a


def _huge(shape, dtype=F32):
    """A > INT32_MAX-element array that costs no memory (a zero-stride broadcast view)."""
    return np.broadcast_to(np.ones((1,) * len(shape), dtype), shape)


def _tensor_cases(prefix, name, good, call, *, rank_bad=None, huge_shape=None, noncontig=True,
                  zero_shape=None):
    """The dtype / rank / size / layout cases of one tensor argument; ``call(arr)`` runs the function
    with ``arr`` in place of that argument."""
    arg = re.escape(name)
    raises(f"{prefix}-{name}-float64", lambda: call(good.astype(np.float64)), DTypeError,
           rf"{arg} has dtype float64; accepted: float32, float16 or ml_dtypes.bfloat16")
    raises(f"{prefix}-{name}-int32", lambda: call(good.astype(np.int32)), DTypeError, rf"{arg} has dtype int32")
    raises(f"{prefix}-{name}-bool", lambda: call(good > 0), DTypeError, rf"{arg} has dtype bool")
    raises(f"{prefix}-{name}-object", lambda: call(good.astype(object)), DTypeError, rf"{arg} has dtype object")
    raises(f"{prefix}-{name}-list", lambda: call(good.tolist()), DTypeError, rf"{arg} must be a numpy array")
    raises(f"{prefix}-{name}-masked", lambda: call(np.ma.masked_less(good, 0)), DTypeError, rf"{arg} is a numpy masked array")
    raises(f"{prefix}-{name}-bigendian", lambda: call(good.astype(">f4")), DTypeError, rf"{arg} has dtype >f4")
    if rank_bad is not None:
        raises(f"{prefix}-{name}-rank", lambda: call(rank_bad), ShapeError, rf"{arg} must (have|be) .*dims")
    zshape = zero_shape or (0,) + good.shape[1:]
    raises(f"{prefix}-{name}-zero-size", lambda: call(np.empty(zshape, good.dtype)), ShapeError,
           rf"{arg} has shape \(.*\) with a zero-size dim")
    if huge_shape is not None:
        assert np.prod(huge_shape, dtype=np.int64) > 2**31 - 1
        raises(f"{prefix}-{name}-over-int32", lambda: call(_huge(huge_shape, good.dtype)), ConstraintError,
               rf"{arg} has \d+ elements, more than PyPTO's INT32_MAX")
    if noncontig:
        equal(f"{prefix}-{name}-strided", lambda: call(_strided(good)), lambda: call(good))
        equal(f"{prefix}-{name}-negstride", lambda: call(_reversed(good)[0]), lambda: call(_reversed(good)[1]))
        equal(f"{prefix}-{name}-fortran", lambda: call(_fortran(good)), lambda: call(good))


def _profile_cases(prefix, call):
    raises(f"{prefix}-profile-unknown", lambda: call(profile="nope"), ProfileError,
           r"unknown hardware profile 'nope'; known profiles: \w")
    raises(f"{prefix}-profile-type", lambda: call(profile=3), ProfileError,
           r"profile must be a name or a HardwareProfile, not int")


def _tile_cases(prefix, name, call, *, exc=TileError, too_big=None, unaligned=None, huge=True):
    arg = re.escape(name)
    for label, bad in (("zero", 0), ("negative", -32), ("float", 32.0), ("str", "32"), ("bool", True)):
        raises(f"{prefix}-{name}-{label}", lambda bad=bad: call(**{name: bad}), exc,
               rf"{arg} must be a positive integer, got")
    if too_big is not None:
        raises(f"{prefix}-{name}-too-big", lambda: call(**{name: too_big}), TileError, r"(UB|has \d+ B|exceeds)")
    if huge:  # far past any buffer: a clear error, never an attempt to allocate
        raises(f"{prefix}-{name}-huge", lambda: call(**{name: 2**62}), (TileError, ConstraintError),
               rf"({arg}|UB|L0[ABC]|L1)")
    if unaligned is not None:
        raises(f"{prefix}-{name}-unaligned", lambda: call(**{name: unaligned}), TileError,
               r"is not a multiple of 32 B")


# ---------------------------------------------------------------------------------------------
# gelu

_SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e38, -1e38, 3.0e38, -3.0e38, 1e-40, 20.0, -20.0],
                    np.float32)

for _v, _fn, _ref in (("tanh", gelu.tanh, reference.gelu_tanh), ("erf", gelu.erf, reference.gelu_erf)):
    _p = f"gelu.{_v}"
    _tensor_cases(_p, "x", X, lambda a, f=_fn: f(a), rank_bad=np.float32(1.0), huge_shape=(2**16, 2**15 + 1))
    equal(f"{_p}-x-bf16-strided", lambda f=_fn: f(_strided(XB)), lambda f=_fn: f(XB))
    equal(f"{_p}-x-bf16-negstride", lambda f=_fn: f(XB[::-1, ::-3]), lambda f=_fn: f(np.ascontiguousarray(XB[::-1, ::-3])))
    close(f"{_p}-x-nan-inf", lambda f=_fn: f(_SPECIAL), lambda r=_ref: r(_SPECIAL), rtol=1e-5, atol=1e-6)
    close(f"{_p}-x-nan-inf-bf16", lambda f=_fn: f(_SPECIAL.astype(BF16)),
          lambda r=_ref: r(_SPECIAL.astype(BF16)).astype(np.float32).astype(BF16), rtol=2**-7, atol=1e-6)
    _profile_cases(_p, lambda f=_fn, **kw: f(X, **kw))
    _tile_cases(_p, "tile", lambda f=_fn, **kw: f(X, **kw), too_big=2**20, unaligned=33)
    raises(f"{_p}-tile-unaligned-bf16", lambda f=_fn: f(XB, tile=8), TileError, r"8 x 2 B = 16 B is not a multiple of 32 B")
    raises(f"{_p}-math-unknown", lambda f=_fn: f(X, math="fp64"), ConstraintError, r"math must be one of")
    raises(f"{_p}-out-shape", lambda f=_fn: f(X, out=np.empty((4, 36), F32)), ShapeError, r"out must have x's shape")
    raises(f"{_p}-out-dtype", lambda f=_fn: f(X, out=np.empty((4, 37), np.float64)), DTypeError, r"out must be a numpy array of x's dtype")
    raises(f"{_p}-out-readonly", lambda f=_fn: f(X, out=_readonly(np.zeros((4, 37), F32))), ConstraintError,
           r"out must be a writeable C-contiguous array")
    raises(f"{_p}-out-noncontig", lambda f=_fn: f(X, out=np.zeros((37, 4), F32).T), ConstraintError,
           r"out must be a writeable C-contiguous array")
    equal(f"{_p}-x-readonly", lambda f=_fn: f(_readonly(X.copy())), lambda f=_fn: f(X))
    raises(f"{_p}-out-overlap", lambda f=_fn: (lambda buf: f(buf[:148].reshape(4, 37), out=buf[1:149].reshape(4, 37)))(np.zeros(149, F32)),
           ConstraintError, r"out overlaps x partially")
    equal(f"{_p}-out-inplace", lambda f=_fn: (lambda a: (f(a, out=a), a)[1])(X.copy()), lambda f=_fn: f(X))
    raises(f"{_p}-plan-dtype", lambda v=_v: getattr(gelu, f"plan_{v}")((4, 37), "float64"), DTypeError, r"dtype 'float64'")
    raises(f"{_p}-plan-zero", lambda v=_v: getattr(gelu, f"plan_{v}")((0, 37)), ShapeError, r"x has shape \(0, 37\) with a zero-size dim")
    raises(f"{_p}-plan-over-int32", lambda v=_v: getattr(gelu, f"plan_{v}")((2**16, 2**15 + 1)), ConstraintError,
           r"x has 2147549184 elements, more than PyPTO's INT32_MAX")

# ---------------------------------------------------------------------------------------------
# mean


def _mean_ref(x, dim=-1, keepdim=False):
    return reference.mean(x, dim, keepdim)


_tensor_cases("mean.sum_div", "x", MX, lambda a: mean.sum_div(a, dim=1), rank_bad=np.float32(2.0),
              huge_shape=(2**16, 2**15 + 1))
for _d in (0, 1, 2, -1):
    equal(f"mean.sum_div-x-transposed-dim{_d}", lambda d=_d: mean.sum_div(MX.transpose(2, 0, 1), dim=d),
          lambda d=_d: mean.sum_div(np.ascontiguousarray(MX.transpose(2, 0, 1)), dim=d))
raises("mean.sum_div-dim-range", lambda: mean.sum_div(MX, dim=3), ShapeError, r"dim=3 is out of range for a 3-d input \(valid: -3..2\)")
raises("mean.sum_div-dim-negrange", lambda: mean.sum_div(MX, dim=-4), ShapeError, r"dim=-4 is out of range")
raises("mean.sum_div-dim-float", lambda: mean.sum_div(MX, dim=1.0), ShapeError, r"dim must be an int, got 1.0")
raises("mean.sum_div-dim-none", lambda: mean.sum_div(MX, dim=None), ShapeError, r"dim must be an int, got None")
raises("mean.sum_div-dim-tuple", lambda: mean.sum_div(MX, dim=(0, 1)), ShapeError, r"dim must be an int")
raises("mean.sum_div-keepdim", lambda: mean.sum_div(MX, keepdim="yes"), ConstraintError, r"keepdim must be a bool")
raises("mean.sum_div-split", lambda: mean.sum_div(MX, split="cpu"), ConstraintError, r"split must be one of")
_profile_cases("mean.sum_div", lambda **kw: mean.sum_div(MX, **kw))
_tile_cases("mean.sum_div", "row_tile", lambda **kw: mean.sum_div(_normal((2, 40000)), **kw), too_big=32768, unaligned=100)
_tile_cases("mean.sum_div", "rows_per_task", lambda **kw: mean.sum_div(MX, **kw), huge=False)
_tile_cases("mean.sum_div", "inner_tile", lambda **kw: mean.sum_div(MX, dim=0, **kw), unaligned=12, huge=False)
# options that only cap a count are clamped to the shape: a huge value is the whole axis
close("mean.sum_div-rows_per_task-huge", lambda: mean.sum_div(MX, rows_per_task=2**62), lambda: _mean_ref(MX))
close("mean.sum_div-inner_tile-huge", lambda: mean.sum_div(MX, dim=0, inner_tile=2**62), lambda: _mean_ref(MX, 0))
_MNAN = _normal((6, 3000))
_MNAN[1, 5] = np.nan
_MNAN[2, 7] = np.inf
_MNAN[3, 0] = np.inf
_MNAN[3, 2999] = -np.inf
_MNAN[4, 100] = -np.inf
for _split in ("ub", "gm"):
    for _d in (0, 1):
        close(f"mean.sum_div-x-nan-inf-dim{_d}-{_split}",
              lambda d=_d, s=_split: mean.sum_div(_MNAN, dim=d, split=s, row_tile=1024),
              lambda d=_d: _mean_ref(_MNAN, d), rtol=1e-5, atol=1e-6)
check("mean.sum_div-fp32-sum-overflow-documented",
      lambda: mean.sum_div(np.full((1, 4), 3e38, BF16)),
      lambda y: np.testing.assert_array_equal(y.astype(np.float32), [np.inf]))  # fp32 sum (README)
equal("mean.sum_div-x-1d", lambda: mean.sum_div(X[0]), lambda: mean.sum_div(X[:1])[0:1].reshape(()))
raises("mean.sum_div-plan-dtype", lambda: mean.plan_sum_div((4, 4), "float64"), DTypeError, r"dtype 'float64' is not a storage dtype")

# ---------------------------------------------------------------------------------------------
# softmax

_SNAN = _normal((4, 37))
_SNAN[0, 3] = np.nan  # NaN row -> NaN (as torch)
_SNAN[1, 5] = np.inf  # inf - inf -> NaN row
_SNAN[2, 7] = -np.inf  # exp(-inf) = 0
_SMASK = _normal((4, 37))
_SMASK[1] = -np.inf  # fully masked row -> zeros
_SLONG = _normal((2, 3000))
for _v, _fn in (("whole_row", softmax.whole_row), ("online", softmax.online)):
    _p = f"softmax.{_v}"
    _tensor_cases(_p, "x", X, lambda a, f=_fn: f(a), rank_bad=np.float32(1.0), huge_shape=(2**16, 2**15 + 1))
    equal(f"{_p}-x-bf16-strided", lambda f=_fn: f(_strided(XB)), lambda f=_fn: f(XB))
    close(f"{_p}-x-nan-inf", lambda f=_fn: f(_SNAN), lambda: reference.softmax(_SNAN), rtol=1e-5, atol=1e-7)
    equal(f"{_p}-x-1d", lambda f=_fn: f(X[0]), lambda f=_fn: f(X[:1])[0])
    close(f"{_p}-mask-fully-masked", lambda f=_fn: f(X, mask=_SMASK), lambda: reference.softmax(X, _SMASK),
          rtol=1e-5, atol=0.0)
    equal(f"{_p}-mask-strided", lambda f=_fn: f(X, mask=_strided(_SMASK)), lambda f=_fn: f(X, mask=_SMASK))
    equal(f"{_p}-mask-broadcast-row", lambda f=_fn: f(X, mask=_SMASK[2]),
          lambda f=_fn: f(X, mask=np.ascontiguousarray(np.broadcast_to(_SMASK[2], X.shape))))
    raises(f"{_p}-mask-float64", lambda f=_fn: f(X, mask=_SMASK.astype(np.float64)), DTypeError,
           r"mask has dtype float64; it must be float32")
    raises(f"{_p}-mask-bf16", lambda f=_fn: f(X, mask=_SMASK.astype(BF16)), DTypeError, r"mask has dtype bfloat16")
    raises(f"{_p}-mask-list", lambda f=_fn: f(X, mask=_SMASK.tolist()), DTypeError, r"mask must be a numpy float32 array")
    raises(f"{_p}-mask-masked", lambda f=_fn: f(X, mask=np.ma.masked_less(_SMASK, 0)), DTypeError,
           r"mask must be a numpy float32 array")
    raises(f"{_p}-mask-shape", lambda f=_fn: f(X, mask=_SMASK[:, :36]), ShapeError,
           r"mask shape \(4, 36\) does not broadcast to x's shape \(4, 37\)")
    raises(f"{_p}-mask-rank", lambda f=_fn: f(X, mask=_SMASK[None]), ShapeError, r"mask shape \(1, 4, 37\) does not broadcast")
    for _label, _bad in (("str", "2"), ("bool", True), ("nan", float("nan")), ("inf", np.inf), ("array", np.ones(2))):
        raises(f"{_p}-scale-{_label}", lambda f=_fn, b=_bad: f(X, scale=b), ConstraintError,
               r"scale must be a finite float or None")
    _profile_cases(_p, lambda f=_fn, **kw: f(X, **kw))
    _tile_cases(_p, "row_tile", lambda f=_fn, **kw: f(X, **kw), huge=False)
    close(f"{_p}-row_tile-huge", lambda f=_fn: f(X, row_tile=2**62), lambda: reference.softmax(X), rtol=1e-5, atol=1e-7)
    raises(f"{_p}-plan-dtype", lambda v=_v: getattr(softmax, f"plan_{v}")((4, 37), "float64"), DTypeError,
           r"dtype 'float64' is not a storage dtype; use fp32, bf16 or fp16")
    raises(f"{_p}-plan-zero", lambda v=_v: getattr(softmax, f"plan_{v}")((0, 37)), ShapeError, r"zero-size dim")
    raises(f"{_p}-plan-has_mask", lambda v=_v: getattr(softmax, f"plan_{v}")((4, 37), has_mask="yes"), ConstraintError,
           r"has_mask must be a bool")
raises("softmax.whole_row-row-too-long", lambda: softmax.whole_row(_normal((2, 20000))), TileError,
       r"w_ub \[1, 20000\] = 80000 B exceeds the 65536 B reduction tile limit .*use softmax.online")
_tile_cases("softmax.online", "col_tile", lambda **kw: softmax.online(_SLONG, **kw), unaligned=100, huge=False)
raises("softmax.online-col_tile-too-big", lambda: softmax.online(_normal((2, 40000)), col_tile=32768), TileError,
       r"column tile w_ub \[1, 32768\] fp32 = 131072 B exceeds the 65536 B reduction tile limit")
close("softmax.online-col_tile-huge", lambda: softmax.online(_SLONG, col_tile=2**62), lambda: reference.softmax(_SLONG),
      rtol=1e-5, atol=1e-7)

# ---------------------------------------------------------------------------------------------
# swiglu (x[..., 2*I] = [gate | up] as one tensor, or gate[..., I] and up[..., I])

_GX = _normal((4, 74), scale=3.0)  # packed: gate = [:, :37], up = [:, 37:]
_GG, _GU = _GX[:, :37].copy(), _GX[:, 37:].copy()
_GNG = np.array([[np.nan, np.inf, -np.inf, -np.inf, 0.0, 1e38, -1e38, 20.0, -20.0, 1e-40, 3.0, -0.0]], F32)
_GNU = np.array([[1.0, 2.0, 3.0, np.inf, np.inf, 2.0, 2.0, -np.inf, 1e38, 1.0, np.nan, 5.0]], F32)
_GWIDE = _normal((2, 40000))  # I = 20000: an fp32 [2, 20000] tile set is 640 KB of UB
for _v, _fn in (("separate", swiglu.separate), ("fused", swiglu.fused)):
    _p = f"swiglu.{_v}"
    _tensor_cases(_p, "x", _GX, lambda a, f=_fn: f(a), rank_bad=np.float32(1.0), huge_shape=(2**16, 2**15 + 2))
    _tensor_cases(_p, "gate", _GG, lambda a, f=_fn: f(a, _GU), rank_bad=np.float32(1.0), huge_shape=(2**16, 2**15 + 1))
    _tensor_cases(_p, "up", _GU, lambda a, f=_fn: f(_GG, a), rank_bad=np.float32(1.0))
    equal(f"{_p}-x-bf16-strided", lambda f=_fn: f(_strided(_GX.astype(BF16))), lambda f=_fn: f(_GX.astype(BF16)))
    equal(f"{_p}-packed-equals-two", lambda f=_fn: f(_GX), lambda f=_fn: f(_GG, _GU))
    raises(f"{_p}-x-odd", lambda f=_fn: f(X), ShapeError, r"x's last dim 37 is odd; .*pass gate and up as two tensors")
    raises(f"{_p}-up-shape", lambda f=_fn: f(_GG, _GU[:, :36]), ShapeError, r"up must have gate's shape \(4, 37\), got \(4, 36\)")
    raises(f"{_p}-up-broadcast", lambda f=_fn: f(_GG, _GU[0]), ShapeError, r"up must have gate's shape \(4, 37\), got \(37,\)")
    raises(f"{_p}-up-dtype-mix", lambda f=_fn: f(_GG, _GU.astype(BF16)), DTypeError,
           r"inputs must share one storage dtype, got gate=fp32, up=bf16")
    for _label, _bad in (("zero", 0.0), ("negative", -10.0), ("nan", float("nan")), ("inf", np.inf), ("fp32-inf", 1e39),
                         ("fp32-zero", 1e-50), ("str", "10"), ("bool", True), ("array", np.ones(2))):
        raises(f"{_p}-limit-{_label}", lambda f=_fn, b=_bad: f(_GX, limit=b), ConstraintError,
               r"limit must be a finite number > 0 in fp32 .* or None for no clamp")
    equal(f"{_p}-limit-int", lambda f=_fn: f(_GX, limit=2), lambda f=_fn: f(_GX, limit=2.0))
    close(f"{_p}-x-nan-inf", lambda f=_fn: f(_GNG, _GNU), lambda: reference.swiglu(_GNG, _GNU), rtol=1e-5, atol=1e-30)
    close(f"{_p}-x-nan-inf-limit", lambda f=_fn: f(_GNG, _GNU, limit=10.0), lambda: reference.swiglu(_GNG, _GNU, 10.0),
          rtol=1e-5, atol=1e-30)
    equal(f"{_p}-x-1d", lambda f=_fn: f(_GX[0]), lambda f=_fn: f(_GX[:1])[0])
    _profile_cases(_p, lambda f=_fn, **kw: f(_GX, **kw))
    _tile_cases(_p, "tile", lambda f=_fn, **kw: f(_GWIDE, **kw), too_big=2**20, unaligned=33, huge=False)
    close(f"{_p}-tile-huge", lambda f=_fn: f(_GX, tile=2**62), lambda: reference.swiglu(_GX), rtol=1e-5, atol=1e-7)
    raises(f"{_p}-tile-unaligned-bf16", lambda f=_fn: f(_GWIDE.astype(BF16), tile=8), TileError,
           r"8 x 2 B = 16 B is not a multiple of 32 B")
    raises(f"{_p}-out-shape", lambda f=_fn: f(_GX, out=np.empty((4, 74), F32)), ShapeError,
           r"out must have the result's shape \(4, 37\), got \(4, 74\)")
    raises(f"{_p}-out-dtype", lambda f=_fn: f(_GX, out=np.empty((4, 37), BF16)), DTypeError,
           r"out must be a numpy array of the inputs' dtype \(fp32\)")
    raises(f"{_p}-out-readonly", lambda f=_fn: f(_GX, out=_readonly(np.zeros((4, 37), F32))), ConstraintError,
           r"out must be a writeable C-contiguous array")
    raises(f"{_p}-out-noncontig", lambda f=_fn: f(_GX, out=np.zeros((37, 4), F32).T), ConstraintError,
           r"out must be a writeable C-contiguous array")
    raises(f"{_p}-out-overlap-x", lambda f=_fn: (lambda a: f(a, out=a[:2].reshape(4, 37)))(_GX.copy()), ConstraintError,
           r"out overlaps x; the \[\.\.\., I\] result cannot be written into the packed")
    raises(f"{_p}-out-overlap-gate", lambda f=_fn: (lambda buf: f(buf[:148].reshape(4, 37), _GU, out=buf[1:149].reshape(4, 37)))(
           np.zeros(149, F32)), ConstraintError, r"out overlaps gate partially; pass out=gate")
    equal(f"{_p}-out-inplace-gate", lambda f=_fn: (lambda g: (f(g, _GU, out=g), g)[1])(_GG.copy()), lambda f=_fn: f(_GG, _GU))
    equal(f"{_p}-out-inplace-up", lambda f=_fn: (lambda u: (f(_GG, u, out=u), u)[1])(_GU.copy()), lambda f=_fn: f(_GG, _GU))
    raises(f"{_p}-plan-dtype", lambda v=_v: getattr(swiglu, f"plan_{v}")((4, 37), "float64"), DTypeError, r"dtype 'float64'")
    raises(f"{_p}-plan-zero", lambda v=_v: getattr(swiglu, f"plan_{v}")((0, 37)), ShapeError,
           r"gate has shape \(0, 37\) with a zero-size dim")
    raises(f"{_p}-plan-over-int32", lambda v=_v: getattr(swiglu, f"plan_{v}")((2**16, 2**15 + 1)), ConstraintError,
           r"gate has 2147549184 elements, more than PyPTO's INT32_MAX")
    raises(f"{_p}-plan-limit", lambda v=_v: getattr(swiglu, f"plan_{v}")((4, 37), limit=0), ConstraintError, r"limit must be")

# swiglu.epilogue = linear.gate_up_swiglu(x[..., K], w_gate[I, K], w_up[I, K])
_EX, _EG, _EU = _normal((5, 24)), _normal((12, 24), scale=0.3), _normal((12, 24), scale=0.3)
_p = "swiglu.epilogue"
_tensor_cases(_p, "x", _EX, lambda a: swiglu.epilogue(a, _EG, _EU), rank_bad=np.float32(1.0), zero_shape=(0, 24))
_tensor_cases(_p, "w_gate", _EG, lambda a: swiglu.epilogue(_EX, a, _EU), rank_bad=_EG[0], zero_shape=(0, 24))
_tensor_cases(_p, "w_up", _EU, lambda a: swiglu.epilogue(_EX, _EG, a), rank_bad=_EU[0], zero_shape=(0, 24))
raises(f"{_p}-w_up-shape", lambda: swiglu.epilogue(_EX, _EG, _EU[:11]), ShapeError, r"w_up must have w_gate's shape \(12, 24\)")
raises(f"{_p}-x-K", lambda: swiglu.epilogue(_EX[:, :23].copy(), _EG, _EU), ShapeError, r"x has K = 23 .* weight \(12, 24\) has K = 24")
raises(f"{_p}-dtype-mix", lambda: swiglu.epilogue(_EX, _EG, _EU.astype(BF16)), DTypeError,
       r"inputs must share one storage dtype, got x=fp32, w_gate=fp32, w_up=bf16")
for _label, _bad in (("zero", 0.0), ("negative", -1.0), ("nan", float("nan")), ("str", "10"), ("bool", True)):
    raises(f"{_p}-limit-{_label}", lambda b=_bad: swiglu.epilogue(_EX, _EG, _EU, limit=b), ConstraintError,
           r"limit must be a finite number > 0 in fp32")
close(f"{_p}-limit", lambda: swiglu.epilogue(_EX, _EG, _EU, limit=0.5),
      lambda: reference.swiglu(_EX.astype(np.float64) @ _EG.T.astype(np.float64), _EX.astype(np.float64) @ _EU.T.astype(np.float64), 0.5),
      rtol=1e-5, atol=1e-6)
_profile_cases(_p, lambda **kw: swiglu.epilogue(_EX, _EG, _EU, **kw))
raises(f"{_p}-cube_tiles-shape", lambda: swiglu.epilogue(_EX, _EG, _EU, cube_tiles=(16, 16, 16)), TileError,
       r"cube_tiles must be \(\(mL0, mL1\)")
raises(f"{_p}-plan-dtype", lambda: swiglu.plan_epilogue((5, 24), (12, 24), "float64"), DTypeError, r"dtype 'float64'")
raises(f"{_p}-plan-zero", lambda: swiglu.plan_epilogue((0, 24), (12, 24)), ShapeError, r"zero-size")

# ---------------------------------------------------------------------------------------------
# rope

def _rw_like(x):
    """RMSNorm weight in x's dtype (fp32 for non-arrays: the bad-x cases must fail on x, not on weight)."""
    return RW.astype(x.dtype) if isinstance(x, np.ndarray) and x.dtype in (BF16, np.float16) else RW


_ROPE = {
    "standard": (lambda x, c, s, **kw: rope.standard(x, c, s, **kw), lambda x, c, s: reference.rope_standard(x, c, s)),
    "interleaved": (lambda x, c, s, **kw: rope.interleaved(x, c, s, **kw), lambda x, c, s: reference.rope_interleaved(x, c, s)),
    "fused_rmsnorm": (lambda x, c, s, **kw: rope.fused_rmsnorm(x, _rw_like(x), c, s, **kw),
                      lambda x, c, s: reference.rope_fused_rmsnorm(x, RW, c, s)),
}
_RNAN = RX.copy()
_RNAN[1, 0, 3] = np.nan
_RNAN[2, 1, 6] = np.inf
_RNAN[3, 1, 0] = -np.inf
for _k, (_fn, _ref) in _ROPE.items():
    _p = f"rope.{_k}"
    COS, SIN = pair_tables(COS0, SIN0) if _k == "interleaved" else (COS0, SIN0)
    _tensor_cases(_p, "x", RX, lambda a, f=_fn, COS=COS, SIN=SIN: f(a, COS, SIN), rank_bad=RX[0], huge_shape=(2**21, 2**10, 1, 2),
                  zero_shape=(5, 0, 8))
    _tensor_cases(_p, "cos", COS, lambda a, f=_fn, COS=COS, SIN=SIN: f(RX, a, SIN), rank_bad=COS[0], zero_shape=(0, 8))
    raises(f"{_p}-cos-positions", lambda f=_fn, COS=COS, SIN=SIN: f(RX, COS[:4], SIN[:4]), ShapeError, r"cos/sin have 4 positions")
    raises(f"{_p}-cos-odd-R", lambda f=_fn, COS=COS, SIN=SIN: f(RX, COS[:, :7], SIN[:, :7]), ShapeError, r"R = cos.shape\[-1\] = 7 must be even")
    raises(f"{_p}-cos-R-too-big", lambda f=_fn, COS=COS, SIN=SIN: f(RX, np.tile(COS, 2), np.tile(SIN, 2)), ShapeError,
           r"R = cos.shape\[-1\] = 16 exceeds head dim D = 8")
    raises(f"{_p}-sin-shape", lambda f=_fn, COS=COS, SIN=SIN: f(RX, COS, SIN[:, :6]), ShapeError, r"cos and sin must have the same shape")
    raises(f"{_p}-cos-dtype-mix", lambda f=_fn, COS=COS, SIN=SIN: f(RX, COS.astype(np.float16), SIN.astype(np.float16)), DTypeError,
           r"cos/sin must have x's dtype \(fp32\)")
    raises(f"{_p}-cos-lead-broadcast", lambda f=_fn, COS=COS, SIN=SIN: f(RX[None].repeat(2, 0), COS[None].repeat(3, 0), SIN[None].repeat(3, 0)),
           ShapeError, r"leading dims")
    raises(f"{_p}-sin-float64", lambda f=_fn, COS=COS, SIN=SIN: f(RX, COS, SIN.astype(np.float64)), DTypeError, r"sin has dtype float64")
    close(f"{_p}-x-nan-inf", lambda f=_fn, COS=COS, SIN=SIN: f(_RNAN, COS, SIN), lambda r=_ref, COS=COS, SIN=SIN: r(_RNAN, COS, SIN), rtol=1e-5, atol=1e-5)
    equal(f"{_p}-x-bf16-negstride", lambda f=_fn, COS=COS, SIN=SIN: f(RX.astype(BF16)[::-1], COS.astype(BF16), SIN.astype(BF16)),
          lambda f=_fn, COS=COS, SIN=SIN: f(np.ascontiguousarray(RX.astype(BF16)[::-1]), COS.astype(BF16), SIN.astype(BF16)))
    _profile_cases(_p, lambda f=_fn, COS=COS, SIN=SIN, **kw: f(RX, COS, SIN, **kw))
    _tile_cases(_p, "token_tile", lambda f=_fn, COS=COS, SIN=SIN, **kw: f(RX, COS, SIN, **kw), too_big=10**6)
    raises(f"{_p}-out-shape", lambda f=_fn, COS=COS, SIN=SIN: f(RX, COS, SIN, out=np.empty((5, 2, 9), F32)), ShapeError, r"out must have x's shape")

COS, SIN = COS0, SIN0
_tensor_cases("rope.rmsnorm", "x", RX, lambda a: rope.rmsnorm(a, RW), rank_bad=np.float32(1.0),
              huge_shape=(2**21, 2**10, 1, 2), zero_shape=(5, 0, 8))
_tensor_cases("rope.rmsnorm", "weight", RW, lambda a: rope.rmsnorm(RX, a), rank_bad=np.float32(1.0), zero_shape=(0,))
raises("rope.rmsnorm-weight-shape", lambda: rope.rmsnorm(RX, RW[:7]), ShapeError, r"weight must have shape \(8,\)")
raises("rope.rmsnorm-weight-dtype-mix", lambda: rope.rmsnorm(RX, RW.astype(BF16)), DTypeError, r"weight must have x's dtype")
for _label, _eps in (("negative", -1e-6), ("nan", float("nan")), ("inf", float("inf")), ("str", "1e-6"), ("bool", True)):
    raises(f"rope.rmsnorm-eps-{_label}", lambda e=_eps: rope.rmsnorm(RX, RW, eps=e), ConstraintError, r"eps must be a finite number >= 0")
    raises(f"rope.fused_rmsnorm-eps-{_label}", lambda e=_eps: rope.fused_rmsnorm(RX, RW, COS, SIN, eps=e), ConstraintError,
           r"eps must be a finite number >= 0")
close("rope.rmsnorm-x-nan-inf", lambda: rope.rmsnorm(_RNAN, RW), lambda: reference.rmsnorm(_RNAN, RW), rtol=1e-5, atol=1e-5)
close("rope.rmsnorm-x-zero-row", lambda: rope.rmsnorm(np.zeros((2, 1, 8), F32), RW, eps=0.0),
      lambda: reference.rmsnorm(np.zeros((2, 1, 8), F32), RW, eps=0.0) * np.nan)  # 0 * rsqrt(0) = 0 * inf = NaN
_tile_cases("rope.rmsnorm", "token_tile", lambda **kw: rope.rmsnorm(RX, RW, **kw), too_big=10**6)
_profile_cases("rope.rmsnorm", lambda **kw: rope.rmsnorm(RX, RW, **kw))

# rmsnorm.plain / rmsnorm.fused_add (x[..., D], weight[D] fp32 or x's dtype, residual x's shape)
_NX = RX.reshape(10, 8)
_NR = (4.0 * _normal((10, 8))).astype(F32)
_NRMS = {
    "plain": lambda x=_NX, r=_NR, w=RW, **kw: rmsnorm.plain(x, w, **kw),
    "fused_add": lambda x=_NX, r=_NR, w=RW, **kw: rmsnorm.fused_add(x, r, w, **kw),
}
for _k, _fn in _NRMS.items():
    _p = f"rmsnorm.{_k}"
    _tensor_cases(_p, "x", _NX, lambda a, f=_fn: f(x=a),
                  rank_bad=np.float32(1.0), huge_shape=(2**22, 2**10), zero_shape=(5, 0))
    _tensor_cases(_p, "weight", RW, lambda a, f=_fn: f(w=a), rank_bad=np.float32(1.0), zero_shape=(0,))
    raises(f"{_p}-weight-shape", lambda f=_fn: f(w=RW[:7]), ShapeError, r"weight must have shape \(8,\)")
    raises(f"{_p}-weight-dtype-mix", lambda f=_fn: f(x=_NX.astype(BF16), r=_NR, w=RW.astype(np.float16)), DTypeError,
           r"weight must be fp32 or x's dtype \(bf16\)")
    for _label, _eps in (("negative", -1e-6), ("nan", float("nan")), ("inf", float("inf")), ("str", "1e-6"), ("bool", True)):
        raises(f"{_p}-eps-{_label}", lambda e=_eps, f=_fn: f(eps=e), ConstraintError, r"eps must be a finite number >= 0")
    for _label, _off in (("nan", float("nan")), ("inf", float("inf")), ("str", "1"), ("bool", True)):
        raises(f"{_p}-offset-{_label}", lambda o=_off, f=_fn: f(offset=o), ConstraintError, r"offset must be a finite number")
    raises(f"{_p}-inv-unknown", lambda f=_fn: f(inv="fast"), ConstraintError, r"inv must be one of \('rsqrt', 'recip_sqrt'\)")
    raises(f"{_p}-out-shape", lambda f=_fn: f(out=np.empty((10, 9), F32)), ShapeError, r"out must have x's shape")
    raises(f"{_p}-out-dtype", lambda f=_fn: f(out=np.empty((10, 8), BF16)), DTypeError, r"out must be a numpy array of x's dtype")
    close(f"{_p}-x-zero-row", lambda k=_k, f=_fn: (lambda y: y if k == "plain" else y[0])(
          f(x=np.zeros((2, 8), F32), r=np.zeros((2, 8), F32), eps=0.0)),
          lambda: np.full((2, 8), np.nan))  # 0 * 1/sqrt(0) = 0 * inf = NaN
    _tile_cases(_p, "token_tile", lambda f=_fn, **kw: f(**kw), too_big=10**6)
    _profile_cases(_p, lambda f=_fn, **kw: f(**kw))
close("rmsnorm.plain-x-nan-inf", lambda: rmsnorm.plain(_RNAN.reshape(10, 8), RW),
      lambda: reference.rmsnorm_plain(_RNAN.reshape(10, 8), RW), rtol=1e-5, atol=1e-5)
_tensor_cases("rmsnorm.fused_add", "residual", _NR, lambda a: rmsnorm.fused_add(_NX, a, RW), rank_bad=np.float32(1.0), zero_shape=(5, 0))
raises("rmsnorm.fused_add-residual-shape", lambda: rmsnorm.fused_add(_NX, _NR[:9], RW), ShapeError,
       r"residual must have x's shape \(10, 8\)")
raises("rmsnorm.fused_add-residual-dtype-mix", lambda: rmsnorm.fused_add(_NX.astype(BF16), _NR.astype(np.float16), RW),
       DTypeError, r"residual must be fp32 or x's dtype \(bf16\)")
# rmsnorm.deferred (x[..., D] -> fp32 x.shape[:-1]); rmsnorm.fold (weight[K], linear_weight[N, K])
_tensor_cases("rmsnorm.deferred", "x", _NX, lambda a: rmsnorm.deferred(a), rank_bad=np.float32(1.0),
              huge_shape=(2**22, 2**10), zero_shape=(5, 0))
for _label, _eps in (("negative", -1e-6), ("nan", float("nan")), ("str", "1e-6"), ("bool", True)):
    raises(f"rmsnorm.deferred-eps-{_label}", lambda e=_eps: rmsnorm.deferred(_NX, eps=e), ConstraintError,
           r"eps must be a finite number >= 0")
raises("rmsnorm.deferred-inv-unknown", lambda: rmsnorm.deferred(_NX, inv="fast"), ConstraintError, r"inv must be one of")
raises("rmsnorm.deferred-out-shape", lambda: rmsnorm.deferred(_NX, out=np.empty((10, 8), F32)), ShapeError,
       r"out must be a float32 array of x's leading dims \(10,\)")
raises("rmsnorm.deferred-out-dtype", lambda: rmsnorm.deferred(_NX, out=np.empty(10, BF16)), ShapeError,
       r"out must be a float32 array of x's leading dims \(10,\)")
equal("rmsnorm.deferred-out", lambda: (lambda o: (rmsnorm.deferred(_NX, out=o), o)[1])(np.empty(10, F32)),
      lambda: rmsnorm.deferred(_NX))
# an all-zero row with eps=0: 1/sqrt(0) = inf (IEEE, rmsnorm.kernels.row_rstd); plain's row is 0 * inf = NaN
close("rmsnorm.deferred-x-zero-row", lambda: rmsnorm.deferred(np.zeros((2, 8), F32), eps=0.0), lambda: np.full(2, np.inf))
_tile_cases("rmsnorm.deferred", "token_tile", lambda **kw: rmsnorm.deferred(_NX, **kw), too_big=10**6)
_profile_cases("rmsnorm.deferred", lambda **kw: rmsnorm.deferred(_NX, **kw))
raises("rmsnorm.fold-weight-shape", lambda: rmsnorm.fold(RW[:7], np.ones((3, 8), F32)), ShapeError,
       r"weight must have shape \(8,\) \(K of linear_weight \(3, 8\)")
raises("rmsnorm.fold-linear_weight-rank", lambda: rmsnorm.fold(RW, np.ones(8, F32)), ShapeError, r"linear_weight")
raises("rmsnorm.fold-offset-nan", lambda: rmsnorm.fold(RW, np.ones((3, 8), F32), float("nan")), ConstraintError,
       r"offset must be a finite number")

raises("rope.cos_sin-positions-object", lambda: rope.cos_sin(np.array([object()]), 8), DTypeError,
       r"positions must be an integer or float array, got dtype object")
raises("rope.cos_sin-positions-complex", lambda: rope.cos_sin(np.arange(4) + 0j, 8), DTypeError, r"positions must be")
raises("rope.cos_sin-positions-nan", lambda: rope.cos_sin(np.array([0.0, np.nan]), 8), ConstraintError, r"positions must be finite")
raises("rope.cos_sin-positions-zero", lambda: rope.cos_sin(np.arange(0), 8), ShapeError, r"positions has shape \(0,\) with a zero-size dim")
raises("rope.cos_sin-positions-0d", lambda: rope.cos_sin(np.int64(3), 8), ShapeError, r"positions must have at least 1 dims")
raises("rope.cos_sin-positions-over-int32", lambda: rope.cos_sin(_huge((2**31,), np.int32), 8), ConstraintError,
       r"positions has 2147483648 elements")
raises("rope.cos_sin-output-over-int32", lambda: rope.plan_cos_sin((2**26,), 64), ConstraintError,
       r"(cos|output|tables).*INT32_MAX")
for _label, _r in (("odd", 7), ("zero", 0), ("negative", -2), ("float", 8.0), ("bool", True)):
    raises(f"rope.cos_sin-rot_dim-{_label}", lambda r=_r: rope.cos_sin(np.arange(4), r), ShapeError, r"rot_dim must be")
for _label, _t in (("zero", 0.0), ("negative", -1.0), ("nan", float("nan")), ("str", "1e4")):
    raises(f"rope.cos_sin-theta-{_label}", lambda t=_t: rope.cos_sin(np.arange(4), 8, theta=t), ConstraintError,
           r"theta must be a finite number > 0")
raises("rope.cos_sin-dtype", lambda: rope.cos_sin(np.arange(4), 8, dtype=np.float64), DTypeError, r"dtype .*float64.* is not a storage dtype")
equal("rope.cos_sin-positions-negstride", lambda: rope.cos_sin(np.arange(8)[::-2], 8),
      lambda: rope.cos_sin(np.ascontiguousarray(np.arange(8)[::-2]), 8))
_tile_cases("rope.cos_sin", "token_tile", lambda **kw: rope.cos_sin(np.arange(4), 8, **kw), too_big=10**6)

# ---------------------------------------------------------------------------------------------
# attention

_ATT = {"standard": attention.standard, "online": attention.online, "flash": attention.flash}


def _att_ref(q=Q, k=K, v=V, **kw):
    return reference.attention(q, k, v, **kw)


for _s, _fn in _ATT.items():
    _p = f"attention.{_s}"
    _tensor_cases(_p, "q", Q, lambda a, f=_fn: f(a, K, V), rank_bad=Q[0], huge_shape=(1, 2**10, 2**18, 8))
    _tensor_cases(_p, "k", K, lambda a, f=_fn: f(Q, a, V), rank_bad=K[0], huge_shape=(1, 1, 2**28, 8),
                  zero_shape=(1, 1, 0, 8))
    _tensor_cases(_p, "v", V, lambda a, f=_fn: f(Q, K, a), rank_bad=V[..., 0], noncontig=False, zero_shape=(1, 1, 5, 0))
    equal(f"{_p}-q-bhsd-view", lambda f=_fn: f(Q.transpose(0, 2, 1, 3).copy().transpose(0, 2, 1, 3), K, V), lambda f=_fn: f(Q, K, V))
    equal(f"{_p}-kv-negstride", lambda f=_fn: f(Q, K[:, :, ::-1], V[:, :, ::-1]),
          lambda f=_fn: f(Q, np.ascontiguousarray(K[:, :, ::-1]), np.ascontiguousarray(V[:, :, ::-1])))
    raises(f"{_p}-batch", lambda f=_fn: f(Q, np.concatenate([K, K]), np.concatenate([V, V])), ShapeError, r"batch sizes differ")
    raises(f"{_p}-head-dim", lambda f=_fn: f(Q, K[..., :6], V), ShapeError, r"head dim of k \(6\) differs from q \(8\)")
    raises(f"{_p}-kv-seq", lambda f=_fn: f(Q, K, V[:, :, :4]), ShapeError, r"must share \[B, Hkv, Skv\]")
    raises(f"{_p}-gqa-heads", lambda f=_fn: f(np.concatenate([Q, Q[:, :1]], 1), np.concatenate([K, K], 1),
                                              np.concatenate([V, V], 1)), ShapeError, r"Hq=3 is not a multiple of Hkv=2")
    raises(f"{_p}-dtype-mix", lambda f=_fn: f(Q, K.astype(np.float16), V.astype(np.float16)), DTypeError,
           r"inputs must share one storage dtype, got q=fp32, k=fp16, v=fp16")
    for _label, _sc in (("nan", float("nan")), ("inf", float("inf")), ("str", "0.5"), ("bool", True)):
        raises(f"{_p}-scale-{_label}", lambda f=_fn, sc=_sc: f(Q, K, V, scale=sc), ConstraintError, r"scale must be a finite real number")
    close(f"{_p}-scale-zero", lambda f=_fn: f(Q, K, V, scale=0.0), lambda: _att_ref(scale=0.0))
    raises(f"{_p}-causal", lambda f=_fn: f(Q, K, V, causal="yes"), ConstraintError, r"causal must be True or False")
    raises(f"{_p}-gqa", lambda f=_fn: f(Q, K, V, gqa="repeat"), ConstraintError, r"gqa must be one of")
    raises(f"{_p}-kv_len-too-long", lambda f=_fn: f(Q, K, V, kv_len=np.array([6])), ConstraintError,
           r"kv_len\[0\] = 6 is outside \[0, Skv=5\]")
    raises(f"{_p}-kv_len-negative", lambda f=_fn: f(Q, K, V, kv_len=np.array([-1])), ConstraintError, r"kv_len\[0\] = -1 is outside")
    raises(f"{_p}-kv_len-huge-uint", lambda f=_fn: f(Q, K, V, kv_len=np.array([2**63 + 5], np.uint64)), ConstraintError,
           r"kv_len\[0\] = 9223372036854775813 is outside")
    raises(f"{_p}-kv_len-shape", lambda f=_fn: f(Q, K, V, kv_len=np.array([3, 3])), ShapeError, r"kv_len must have shape \[B\] = \(1,\)")
    raises(f"{_p}-kv_len-scalar", lambda f=_fn: f(Q, K, V, kv_len=3), ShapeError, r"kv_len must have shape \[B\]")
    raises(f"{_p}-kv_len-float", lambda f=_fn: f(Q, K, V, kv_len=np.array([3.0])), DTypeError, r"kv_len must be an integer array")
    raises(f"{_p}-kv_len-bool", lambda f=_fn: f(Q, K, V, kv_len=np.array([True])), DTypeError, r"kv_len must be an integer array")
    close(f"{_p}-kv_len-list", lambda f=_fn: f(Q, K, V, kv_len=[3]), lambda: _att_ref(kv_len=[3]))
    check(f"{_p}-kv_len-zero", lambda f=_fn: f(Q, K, V, kv_len=np.array([0])),
          lambda out: np.testing.assert_array_equal(out, np.zeros_like(Q)))  # API: fully masked rows -> zeros
    check(f"{_p}-kv_len-zero-causal", lambda f=_fn: f(Q, K, V, kv_len=np.array([1]), causal=True),
          lambda out: np.testing.assert_allclose(out, _att_ref(kv_len=[1], causal=True), atol=1e-6))
    raises(f"{_p}-mask-shape", lambda f=_fn: f(Q, K, V, mask=np.zeros((1, 1, 3, 4), F32)), ShapeError,
           r"mask of shape \(1, 1, 3, 4\) does not broadcast to \[B, Hq, Sq, Skv\] = \(1, 2, 3, 5\)")
    raises(f"{_p}-mask-rank", lambda f=_fn: f(Q, K, V, mask=np.zeros((1, 1, 1, 3, 5), F32)), ShapeError, r"mask has 5 dims")
    raises(f"{_p}-mask-empty", lambda f=_fn: f(Q, K, V, mask=np.zeros((0, 5), F32)), ShapeError, r"mask of shape \(0, 5\)")
    _mb = np.ones((3, 5), bool)
    _mb[0, 1] = _mb[2, 4] = False
    _mb16 = F32([[0, -1, 0.5, -np.inf, 2]] * 3)
    close(f"{_p}-mask-float16", lambda f=_fn, m=_mb16: f(Q, K, V, mask=m.astype(np.float16)), lambda m=_mb16: _att_ref(mask=m))
    close(f"{_p}-mask-bfloat16", lambda f=_fn, m=_mb16: f(Q, K, V, mask=m.astype(BF16)), lambda m=_mb16: _att_ref(mask=m))
    close(f"{_p}-mask-bool", lambda f=_fn, m=_mb: f(Q, K, V, mask=m), lambda m=_mb: _att_ref(mask=np.where(m, F32(0), F32(-np.inf))))
    check(f"{_p}-mask-bool-all-false", lambda f=_fn: f(Q, K, V, mask=np.zeros((3, 5), bool)),
          lambda out: np.testing.assert_array_equal(out, np.zeros_like(Q)))  # API: fully masked rows -> zeros (torch too)
    close(f"{_p}-mask-bool-softcap", lambda f=_fn, m=_mb: f(Q, K, V, mask=m, softcap=0.5),  # cap, then the mask
          lambda m=_mb: _att_ref(mask=np.where(m, F32(0), F32(-np.inf)), softcap=0.5))
    close(f"{_p}-mask-float32-finite-min", lambda f=_fn: f(Q, K, V, mask=np.full((3, 5), np.finfo(F32).min, F32)),
          lambda: np.broadcast_to(V.mean(axis=2, keepdims=True), Q.shape))  # absorbs the scores: HF eager's average
    raises(f"{_p}-mask-bool-shape", lambda f=_fn: f(Q, K, V, mask=np.ones((1, 2, 3, 4), bool)), ShapeError,
           r"mask of shape \(1, 2, 3, 4\) does not broadcast to \[B, Hq, Sq, Skv\] = \(1, 2, 3, 5\); each dim must be 1 or the full size")
    raises(f"{_p}-mask-float64", lambda f=_fn: f(Q, K, V, mask=np.zeros((3, 5))), DTypeError,
           r"mask has dtype float64; it must be a .*additive or bool \(True = keep\).*mask.astype\(numpy.float32\) \(additive\) or mask.astype\(bool\)")
    raises(f"{_p}-mask-int8", lambda f=_fn: f(Q, K, V, mask=np.ones((3, 5), np.int8)), DTypeError, r"mask has dtype int8")
    raises(f"{_p}-mask-list", lambda f=_fn: f(Q, K, V, mask=[[0.0] * 5] * 3), DTypeError,
           r"mask must be a .*numpy array broadcastable to \[B, Hq, Sq, Skv\] = \(1, 2, 3, 5\), got list")
    raises(f"{_p}-mask-masked-array", lambda f=_fn: f(Q, K, V, mask=np.ma.zeros((3, 5), F32)), DTypeError,
           r"got MaskedArray")
    for _label, _lay in (("unknown", "bhds"), ("upper", "BSHD"), ("none", None)):
        raises(f"{_p}-layout-{_label}", lambda f=_fn, lay=_lay: f(Q, K, V, layout=lay), ConstraintError,
               r"layout must be 'bhsd' \(q \[B, Hq, Sq, D\], the default.*or 'bshd' \(q \[B, Sq, Hq, D\]")
    close(f"{_p}-layout-bshd", lambda f=_fn: f(*(x.transpose(0, 2, 1, 3).copy() for x in (Q, K, V)), layout="bshd"),
          lambda: _att_ref().transpose(0, 2, 1, 3))
    raises(f"{_p}-layout-bshd-given-bhsd", lambda f=_fn: f(Q, K, V[:, :, :4], layout="bshd"), ShapeError,
           r"layout='bshd': shapes shown as the \[B, H, S, D\] views of the \[B, S, H, D\] inputs")
    check(f"{_p}-mask-all-neginf", lambda f=_fn: f(Q, K, V, mask=np.full((3, 5), -np.inf, F32)),
          lambda out: np.testing.assert_array_equal(out, np.zeros_like(Q)))
    _m = np.zeros((3, 5), F32)
    _m[1, 2] = np.nan
    check(f"{_p}-mask-nan-row", lambda f=_fn, m=_m: f(Q, K, V, mask=m),
          lambda out: (np.testing.assert_array_equal(np.isnan(out[:, :, 1]), True),
                       np.testing.assert_allclose(out[:, :, [0, 2]], _att_ref()[:, :, [0, 2]], atol=1e-5)))
    equal(f"{_p}-mask-broadcast-view", lambda f=_fn: f(Q, K, V, mask=np.broadcast_to(np.float32([0, -1, 0, -np.inf, 2]), (1, 2, 3, 5))),
          lambda f=_fn: f(Q, K, V, mask=np.float32([0, -1, 0, -np.inf, 2])))
    _qn = Q.copy()
    _qn[0, 1, 2, 3] = np.nan
    check(f"{_p}-q-nan", lambda f=_fn, q=_qn: f(q, K, V), fn=
          lambda out: (np.testing.assert_array_equal(np.isnan(out[0, 1, 2]), True),
                       np.testing.assert_allclose(np.delete(out.reshape(6, 8), 5, 0), np.delete(_att_ref().reshape(6, 8), 5, 0), atol=1e-5)))
    _kg = K.copy()
    _vg = V.copy()
    _kg[:, :, 3:] = np.nan  # garbage past kv_len (an uninitialised KV cache) must be ignored
    _vg[:, :, 3:] = np.inf
    close(f"{_p}-kv-garbage-past-kv_len", lambda f=_fn, k=_kg, v=_vg: f(Q, k, v, kv_len=np.array([3])),
          lambda: _att_ref(kv_len=[3]), rtol=1e-5, atol=1e-5)
    _profile_cases(_p, lambda f=_fn, **kw: f(Q, K, V, **kw))

# prefill-shaped blocks (>= 16 rows) take the np.dot path: the same garbage must be ignored there
_qp, _kp, _vp = _normal((1, 4, 16, 8)), _normal((1, 2, 40, 8)), _normal((1, 2, 40, 8))
_kpg, _vpg = _kp.copy(), _vp.copy()
_kpg[:, :, 30:] = np.nan
_vpg[:, :, 30:] = np.inf
for _s, _fn in _ATT.items():
    close(f"attention.{_s}-kv-garbage-past-kv_len-prefill", lambda f=_fn: f(_qp, _kpg, _vpg, kv_len=np.array([30])),
          lambda: reference.attention(_qp, _kp, _vp, kv_len=np.array([30])), rtol=1e-5, atol=1e-5)

# window, softcap, sinks: each bad value names the option, the limit and a way out
_WIN_BAD = (("zero", 0, r"window=0 must be >= 1; use window=W"), ("negative", -3, r"window=-3 must be >= 1"),
            ("float", 4.0, r"window must be an int W >= 1 or a \(left, right\) pair of ints >= 0, got 4.0"),
            ("bool", True, r"window must be an int W >= 1 or a \(left, right\) pair"),
            ("str", "4", r"window must be an int W >= 1 or a \(left, right\) pair"),
            ("triple", (1, 2, 3), r"window must be an int W >= 1 or a \(left, right\) pair"),
            ("pair-float", (2.5, 0), r"window left must be an int >= 0, got 2.5 \(float\)"),
            ("pair-bool", (0, True), r"window right must be an int >= 0, got True \(bool\)"),
            ("pair-none", (None, 0), r"window left must be an int >= 0, got None"),
            ("pair-negative-left", (-1, 0), r"window left = -1 is negative; bounds must be >= 0 \(for no bound"),
            ("pair-negative-right", (2, -1), r"window right = -1 is negative"))
_CAP_BAD = (("zero", 0.0), ("negative", -30.0), ("nan", float("nan")), ("inf", float("inf")), ("str", "50"),
            ("bool", True), ("f32-overflow", 1e300))
_SINK_BAD = (("list", [0.0, 1.0], DTypeError, r"sinks must be a numpy float32 array \[Hq\], got list"),
             ("float64", np.zeros(2), DTypeError, r"sinks must be float32 \[Hq\].*got dtype float64; convert with sinks.astype"),
             ("float16", np.zeros(2, np.float16), DTypeError, r"got dtype float16"),
             ("short", np.zeros(1, F32), ShapeError, r"sinks must have shape \[Hq\] = \(2,\), one logit per query head, got \(1,\)"),
             ("2d", np.zeros((1, 2), F32), ShapeError, r"sinks must have shape \[Hq\] = \(2,\)"),
             ("nan", F32([0.0, np.nan]), ConstraintError, r"sinks\[1\] = nan is not finite.*sinks=None"),
             ("inf", F32([np.inf, 0.0]), ConstraintError, r"sinks\[0\] = inf is not finite"),
             ("neginf", F32([0.0, -np.inf]), ConstraintError, r"sinks\[1\] = -inf is not finite"))
_SINKS = F32([0.5, -1.0])
for _s, _fn in _ATT.items():
    _p = f"attention.{_s}"
    for _label, _w, _pat in _WIN_BAD:
        raises(f"{_p}-window-{_label}", lambda f=_fn, w=_w: f(Q, K, V, window=w), ConstraintError, _pat)
    for _label, _c in _CAP_BAD:
        raises(f"{_p}-softcap-{_label}", lambda f=_fn, c=_c: f(Q, K, V, softcap=c), ConstraintError,
               r"softcap must be a finite number > 0 within float32 \(Gemma 2 uses 50.0\).*softcap=None")
    for _label, _x, _exc, _pat in _SINK_BAD:
        raises(f"{_p}-sinks-{_label}", lambda f=_fn, x=_x: f(Q, K, V, sinks=x), _exc, _pat)
    close(f"{_p}-window-1", lambda f=_fn: f(Q, K, V, window=1), lambda: _att_ref(window=1))  # the diagonal only
    close(f"{_p}-window-np-int", lambda f=_fn: f(Q, K, V, window=np.int64(3), kv_len=np.array([4])),
          lambda: _att_ref(window=3, kv_len=[4]))
    close(f"{_p}-window-huge", lambda f=_fn: f(Q, K, V, window=2**62), lambda: _att_ref(causal=True))
    equal(f"{_p}-window-pair-huge", lambda f=_fn: f(Q, K, V, window=(2**62, 2**70)), lambda f=_fn: f(Q, K, V))
    close(f"{_p}-window-pair-zero", lambda f=_fn: f(Q, K, V, window=(0, 0)), lambda: _att_ref(window=(0, 0)))
    check(f"{_p}-window-kv_len-zero", lambda f=_fn: f(Q, K, V, window=2, kv_len=np.array([0])),
          lambda out: np.testing.assert_array_equal(out, np.zeros_like(Q)))
    close(f"{_p}-softcap-tiny", lambda f=_fn: f(Q, K, V, softcap=1e-3), lambda: _att_ref(softcap=1e-3))
    close(f"{_p}-softcap-np-float32", lambda f=_fn: f(Q, K, V, softcap=np.float32(0.5)), lambda: _att_ref(softcap=0.5))
    close(f"{_p}-sinks-huge-negative", lambda f=_fn: f(Q, K, V, sinks=F32([-1e30, -1e30])), lambda: _att_ref())  # muted
    equal(f"{_p}-sinks-strided-view", lambda f=_fn: f(Q, K, V, sinks=F32([0.5, 7.0, -1.0, 7.0])[::2]),
          lambda f=_fn: f(Q, K, V, sinks=_SINKS))
    check(f"{_p}-sinks-kv_len-zero", lambda f=_fn: f(Q, K, V, sinks=_SINKS, kv_len=np.array([0])),
          lambda out: np.testing.assert_array_equal(out, np.zeros_like(Q)))  # the sink alone: no value
    close(f"{_p}-all-options-with-mask", lambda f=_fn: f(Q, K, V, window=(2, 1), softcap=2.0, sinks=_SINKS,
                                                           mask=np.float32([0, -1, 0, -np.inf, 2])),
          lambda: _att_ref(window=(2, 1), softcap=2.0, sinks=_SINKS, mask=np.float32([0, -1, 0, -np.inf, 2])))

raises("attention.online-pv", lambda: attention.online(Q, K, V, pv="fp64"), ConstraintError, r"pv must be one of")
raises("attention.flash-return_lse", lambda: attention.flash(Q, K, V, return_lse="yes"), ConstraintError,
       r"return_lse must be True or False")
for _s in ("online", "flash"):
    _tile_cases(f"attention.{_s}", "kv_tile", lambda f=_ATT[_s], **kw: f(Q, K, V, **kw), too_big=2**20)
    _tile_cases(f"attention.{_s}", "q_tile", lambda f=_ATT[_s], **kw: f(Q, K, V, **kw), huge=False)
    close(f"attention.{_s}-q_tile-huge", lambda f=_ATT[_s]: f(Q, K, V, q_tile=2**62), lambda: _att_ref())  # clamped to Sq
    close(f"attention.{_s}-kv_tile-odd", lambda f=_ATT[_s]: f(Q, K, V, kv_tile=3), lambda: _att_ref())  # padded to 32 B
_tile_cases("attention.flash", "num_splits", lambda **kw: attention.flash(Q, K, V, **kw), huge=False)
close("attention.flash-num_splits-huge", lambda: attention.flash(Q, K, V, num_splits=2**62), lambda: _att_ref())  # capped
close("attention.flash-num_splits-more-than-tiles", lambda: attention.flash(Q, K, V, num_splits=64, kv_tile=2),
      lambda: _att_ref())
close("attention.flash-num_splits-kv_len-zero", lambda: attention.flash(Q, K, V, num_splits=4, kv_tile=2, kv_len=np.array([0])),
      lambda: np.zeros_like(Q))
raises("attention.standard-row-too-long", lambda: attention.standard(Q, _normal((1, 1, 50000, 8)), _normal((1, 1, 50000, 8))),
       TileError, r"score row of Skv=50000 .* use attention.online or attention.flash")
raises("attention.standard-workspace-over-int32", lambda: attention.plan_standard((1, 16, 16384, 64), (1, 16, 16384, 64)),
       ConstraintError, r"score workspace \[B, Hq, Sq, Skv\] has 4294967296 elements.*INT32_MAX")

# attention: paged KV cache (block_table=, online and flash) and write_kv
_PQ = _normal((1, 2, 1, 8))
_PKC, _PVC = _normal((3, 16, 1, 8)), _normal((3, 16, 1, 8))
_PT = np.array([[2, 0]], np.int32)
_PL = np.array([20])


def _dense_of(kc, table, n):
    return np.ascontiguousarray(np.concatenate([kc[p] for p in table[0]])[None, :n].transpose(0, 2, 1, 3))


_PAGED_BAD = (
    ("block-id-high", dict(block_table=np.array([[2, 3]], np.int32)), ConstraintError,
     r"block_table\[0, 1\] = 3 is outside \[0, num_blocks=3\)"),
    ("block-id-negative", dict(block_table=np.array([[-1, 0]], np.int32)), ConstraintError, r"block_table\[0, 0\] = -1 is outside"),
    ("kv_len-beyond-blocks", dict(kv_len=np.array([33])), ConstraintError,
     r"kv_len\[0\] = 33 is beyond the sequence's blocks.*at least 3 entries"),
    ("table-short", dict(block_table=np.array([[2]], np.int32)), ConstraintError, r"kv_len\[0\] = 20 is beyond.*2 entries"),
    ("no-kv_len", dict(kv_len=None), ConstraintError, r"needs kv_len=\[B\]"),
    ("table-float", dict(block_table=np.array([[2.0, 0.0]])), DTypeError, r"block_table must be int32 \(or int64"),
    ("table-list", dict(block_table=[[2, 0]]), DTypeError, r"block_table must be a numpy int32 array"),
    ("table-1d", dict(block_table=np.array([2, 0], np.int32)), ShapeError, r"shape \[B, max_blocks_per_seq\]"),
    ("expand_clone", dict(gqa="expand_clone"), ConstraintError, r"gqa='head_loop' only"),
)
for _s in ("online", "flash"):
    _p = f"attention.{_s}"
    for _label, _kw, _exc, _pat in _PAGED_BAD:
        raises(f"{_p}-paged-{_label}", lambda f=_ATT[_s], kw=_kw: f(_PQ, _PKC, _PVC, **{"block_table": _PT, "kv_len": _PL, **kw}),
               _exc, _pat)
    raises(f"{_p}-paged-block_size", lambda f=_ATT[_s]: f(_PQ, _PKC[:, :8], _PVC[:, :8], block_table=_PT, kv_len=np.array([4])),
           ConstraintError, r"block_size = 8 \(k_cache.shape\[1\]\) must be a multiple of 16")
    raises(f"{_p}-paged-head-dim", lambda f=_ATT[_s]: f(_PQ, _PKC[..., :4], _PVC[..., :4], block_table=_PT, kv_len=_PL),
           ShapeError, r"head dim of k_cache \(4\) differs from q \(8\)")
    raises(f"{_p}-paged-dtype", lambda f=_ATT[_s]: f(_PQ, _PKC.astype(np.float16), _PVC.astype(np.float16), block_table=_PT,
                                                      kv_len=_PL), DTypeError, r"share one storage dtype")
    equal(f"{_p}-paged-int64-table", lambda f=_ATT[_s]: f(_PQ, _PKC, _PVC, block_table=_PT.astype(np.int64), kv_len=_PL),
          lambda f=_ATT[_s]: f(_PQ, _PKC, _PVC, block_table=_PT, kv_len=_PL))
    equal(f"{_p}-paged-padding-ignored", lambda f=_ATT[_s]: f(_PQ, _PKC, _PVC, block_table=np.array([[2, -7]], np.int32),
                                                               kv_len=np.array([16])),
          lambda f=_ATT[_s]: f(_PQ, _dense_of(_PKC, _PT, 32), _dense_of(_PVC, _PT, 32), kv_len=np.array([16])))
    check(f"{_p}-paged-kv_len-zero", lambda f=_ATT[_s]: f(_PQ, _PKC, _PVC, block_table=_PT, kv_len=np.array([0])),
          lambda out: np.testing.assert_array_equal(out, np.zeros_like(_PQ)))
raises("attention.standard-paged", lambda: attention.standard(_PQ, _PKC, _PVC, block_table=_PT, kv_len=_PL),
       ConstraintError, r"not supported by standard; use attention.flash or attention.online")
_WK = (np.zeros((2, 16, 1, 8), F32), np.zeros((2, 16, 1, 8), F32))
_WN = _normal((2, 1, 8))
for _label, _slots, _exc, _pat in (
        ("slot-high", np.array([0, 32]), ConstraintError, r"slot_mapping\[1\] = 32 is outside \[0, num_blocks \* block_size = 32\)"),
        ("slot-below-minus-one", np.array([-2, 0]), ConstraintError, r"slot_mapping\[0\] = -2 is outside.*-1 to skip"),
        ("slot-duplicate", np.array([7, 7]), ConstraintError, r"slot 7 appears more than once"),
        ("slot-float", np.array([0.0, 1.0]), DTypeError, r"slot_mapping must be a numpy int32 or int64 array"),
        ("slot-short", np.array([0]), ShapeError, r"slot_mapping must have shape \[T\] = \(2,\)")):
    raises(f"attention.write_kv-{_label}", lambda sl=_slots: attention.write_kv(*_WK, _WN, _WN, sl), _exc, _pat)
raises("attention.write_kv-heads", lambda: attention.write_kv(*_WK, _normal((2, 2, 8)), _normal((2, 2, 8)), np.array([0, 1])),
       ShapeError, r"must be \[T, Hkv, D\]")
raises("attention.write_kv-dtype", lambda: attention.write_kv(*_WK, _WN.astype(np.float16), _WN.astype(np.float16),
                                                              np.array([0, 1])), DTypeError, r"share one storage dtype")
raises("attention.write_kv-cache-view", lambda: attention.write_kv(_WK[0][:, ::2], _WK[1][:, ::2], _WN, _WN, np.array([0, 1])),
       ConstraintError, r"writeable C-contiguous")
check("attention.write_kv-all-skipped", lambda: (attention.write_kv(*_WK, _WN, _WN, np.array([-1, -1])), _WK[0])[1],
      lambda out: np.testing.assert_array_equal(out, 0))

# ---------------------------------------------------------------------------------------------
# repeat_kv

_tensor_cases("repeat_kv.expand_clone", "kv", KV, lambda a: repeat_kv.expand_clone(a, 2), rank_bad=KV[0],
              huge_shape=(1, 2**10, 2**18, 8))
equal("repeat_kv.expand_clone-kv-bf16-negstride", lambda: repeat_kv.expand_clone(KV.astype(BF16)[..., ::-1], 3),
      lambda: repeat_kv.expand_clone(np.ascontiguousarray(KV.astype(BF16)[..., ::-1]), 3))
check("repeat_kv.expand_clone-nan-inf-copied", lambda: repeat_kv.expand_clone(_SPECIAL.reshape(1, 2, 3, 2), 2),
      lambda out: np.testing.assert_array_equal(out.view(np.uint32), np.repeat(_SPECIAL.reshape(1, 2, 3, 2), 2, 1).view(np.uint32)))
for _label, _n in (("zero", 0), ("negative", -1), ("float", 2.0), ("bool", True), ("none", None)):
    raises(f"repeat_kv.expand_clone-n_rep-{_label}", lambda n=_n: repeat_kv.expand_clone(KV, n), ConstraintError,
           r"n_rep must be a positive integer")
raises("repeat_kv.expand_clone-output-over-int32", lambda: repeat_kv.expand_clone(_normal((1, 2, 2**10, 128)), 2**13),
       ConstraintError, r"output .*2147483648 elements.*INT32_MAX", needs_cap=True)
raises("repeat_kv.expand_clone-plan-output-over-int32", lambda: repeat_kv.plan_expand_clone((1, 8, 2**20, 128), 4),
       ConstraintError, r"output .* elements.*INT32_MAX")
raises("repeat_kv.expand_clone-plan-shape", lambda: repeat_kv.plan_expand_clone((1, 8, 128), 2), ShapeError,
       r"kv must have 4 dims")
raises("repeat_kv.expand_clone-plan-dtype", lambda: repeat_kv.plan_expand_clone((1, 8, 4, 8), 2, "float64"), DTypeError,
       r"dtype 'float64'")
_profile_cases("repeat_kv.expand_clone", lambda **kw: repeat_kv.expand_clone(KV, 2, **kw))

# ---------------------------------------------------------------------------------------------
# moe

_GATE = {"sigmoid_gating": (moe.sigmoid_gating, reference.moe_sigmoid_gating),
         "softmax_gating": (moe.softmax_gating, reference.moe_softmax_gating)}
for _g, (_fn, _ref) in _GATE.items():
    _p = f"moe.{_g}"
    _tensor_cases(_p, "logits", LOG, lambda a, f=_fn: f(a, 4), rank_bad=LOG[0], huge_shape=(2**27, 16))
    equal(f"{_p}-logits-bf16-transposed", lambda f=_fn: f(np.ascontiguousarray(LOG.T).astype(BF16).T, 4),
          lambda f=_fn: f(LOG.astype(BF16), 4))
    for _label, _k in (("zero", 0), ("too-many", 17), ("negative", -1), ("float", 2.0), ("bool", True), ("none", None)):
        raises(f"{_p}-top_k-{_label}", lambda f=_fn, k=_k: f(LOG, k), ConstraintError, r"top_k")
    raises(f"{_p}-top_k-over-eligible", lambda f=_fn: f(LOG, 5, n_group=4, topk_group=1), ConstraintError,
           r"top_k=5 must be in \[1, 4\] \(the 1 best of 4 groups hold 4 eligible experts\)")
    raises(f"{_p}-n_group-divisor", lambda f=_fn: f(LOG, 2, n_group=3), ConstraintError, r"n_group=3 does not divide E=16")
    raises(f"{_p}-n_group-zero", lambda f=_fn: f(LOG, 2, n_group=0), ConstraintError, r"n_group=0 must be in \[1, 16\]")
    raises(f"{_p}-n_group-too-many", lambda f=_fn: f(LOG, 2, n_group=32), ConstraintError, r"n_group=32 must be in \[1, 16\]")
    raises(f"{_p}-n_group-float", lambda f=_fn: f(LOG, 2, n_group=2.0), ConstraintError, r"n_group must be an int")
    raises(f"{_p}-topk_group-zero", lambda f=_fn: f(LOG, 2, n_group=4, topk_group=0), ConstraintError, r"topk_group=0 must be in \[1, 4\]")
    raises(f"{_p}-topk_group-too-many", lambda f=_fn: f(LOG, 2, n_group=4, topk_group=5), ConstraintError, r"topk_group=5 must be in \[1, 4\]")
    raises(f"{_p}-group_score", lambda f=_fn: f(LOG, 2, n_group=4, topk_group=2, group_score="min"), ConstraintError,
           r"group_score must be one of")
    raises(f"{_p}-group_score-top2-singletons", lambda f=_fn: f(LOG, 2, n_group=16, topk_group=2, group_score="top2_sum"),
           ConstraintError, r"top2_sum' needs at least 2 experts per group")
    raises(f"{_p}-renormalize", lambda f=_fn: f(LOG, 2, renormalize="yes"), ConstraintError, r"renormalize must be True or False")
    for _label, _sf in (("nan", float("nan")), ("inf", float("inf")), ("str", "2.5")):
        raises(f"{_p}-routed_scaling_factor-{_label}", lambda f=_fn, sf=_sf: f(LOG, 2, routed_scaling_factor=sf), ConstraintError,
               r"routed_scaling_factor")
    _ln = LOG.copy()
    _ln[2, 5] = np.nan
    raises(f"{_p}-logits-nan", lambda f=_fn, l=_ln: f(l, 4), ConstraintError, r"logits row 2 \(of 1 such rows\) has NaN")
    _tile_cases(_p, "token_tile", lambda f=_fn, **kw: f(LOG, 4, **kw), too_big=10**6)
    raises(f"{_p}-E-over-merge-sort", lambda f=_fn: f(_normal((2, 6000)), 4), TileError, r"MERGE_SORT limit")
    _profile_cases(_p, lambda f=_fn, **kw: f(LOG, 4, **kw))

_li = LOG.copy()
_li[1, 3] = np.inf
_li[1, 7] = np.inf
_li[4, :] = -np.inf
_li[4, 9] = 0.0
check("moe.sigmoid_gating-logits-inf", lambda: moe.sigmoid_gating(_li, 4),
      lambda r: (np.testing.assert_array_equal(r[1], reference.moe_sigmoid_gating(_li, 4)[1]),
                 np.testing.assert_allclose(r[0], reference.moe_sigmoid_gating(_li, 4)[0], rtol=1e-5, atol=1e-6)))
raises("moe.softmax_gating-logits-inf", lambda: moe.softmax_gating(_li, 4), ConstraintError,
       r"logits row 1 \(of 1 such rows\) has NaN or infinite values")
_lm = LOG.copy()
_lm[3, :8] = -np.inf  # -inf logits are fine for softmax (p = 0) while the row has a finite max
check("moe.softmax_gating-logits-some-neginf", lambda: moe.softmax_gating(_lm, 4),
      lambda r: (np.testing.assert_array_equal(r[1], reference.moe_softmax_gating(_lm, 4)[1]),
                 np.testing.assert_allclose(r[0], reference.moe_softmax_gating(_lm, 4)[0], rtol=1e-5, atol=1e-7)))
_tensor_cases("moe.sigmoid_gating", "bias", BIAS, lambda a: moe.sigmoid_gating(LOG, 4, bias=a), rank_bad=BIAS[None],
              zero_shape=(0,))
raises("moe.sigmoid_gating-bias-shape", lambda: moe.sigmoid_gating(LOG, 4, bias=BIAS[:15]), ShapeError, r"bias must have shape \(16,\)")
raises("moe.sigmoid_gating-bias-nan", lambda: moe.sigmoid_gating(LOG, 4, bias=np.where(np.arange(16) == 3, np.nan, BIAS).astype(F32)),
       ConstraintError, r"bias has non-finite values")
for _label, _e in (("negative", -1.0), ("nan", float("nan")), ("str", "0")):
    raises(f"moe.sigmoid_gating-eps-{_label}", lambda e=_e: moe.sigmoid_gating(LOG, 4, eps=e), ConstraintError, r"eps")

_tensor_cases("moe.combine", "expert_out", EO, lambda a: moe.combine(a, EW), rank_bad=EO[0], huge_shape=(2**20, 2, 2**10))
_tensor_cases("moe.combine", "weights", EW, lambda a: moe.combine(EO, a), rank_bad=EW[0])
raises("moe.combine-weights-shape", lambda: moe.combine(EO, EW[:5]), ShapeError, r"weights must have shape \(6, 2\)")
equal("moe.combine-weights-bf16", lambda: moe.combine(EO, EW.astype(BF16)), lambda: moe.combine(EO, EW.astype(BF16).astype(F32)))
_ewn = EW.copy()
_ewn[3, 1] = np.nan
_eon = EO.copy()
_eon[1, 0, 4] = np.inf
close("moe.combine-nan-inf", lambda: moe.combine(_eon, _ewn), lambda: reference.moe_combine(_eon, _ewn), rtol=1e-5, atol=1e-5)
_tile_cases("moe.combine", "token_tile", lambda **kw: moe.combine(EO, EW, **kw), too_big=10**6)
_tile_cases("moe.combine", "h_tile", lambda **kw: moe.combine(EO, EW, **kw), unaligned=7, huge=False)
equal("moe.combine-h_tile-larger-than-H", lambda: moe.combine(EO, EW, h_tile=2**20), lambda: moe.combine(EO, EW))  # clamped to H
check("moe.combine-h_tile-clamped-in-plan", lambda: moe.plan_combine((6, 2, 20), h_tile=2**62).params["h_tile"],
      lambda t: expect(t == 24, t))  # H = 20 rounded up to 32 B
_profile_cases("moe.combine", lambda **kw: moe.combine(EO, EW, **kw))

# ---------------------------------------------------------------------------------------------
# linear

_LIN = {"matmul_add": linear.matmul_add, "fused_bias": linear.fused_bias}
_LXN = LX.copy()
_LXN[1, 3] = np.nan
_LXN[2, 0] = np.inf
for _s, _fn in _LIN.items():
    _p = f"linear.{_s}"
    _tensor_cases(_p, "x", LX, lambda a, f=_fn: f(a, LW, LB), rank_bad=np.float32(1.0), huge_shape=(2**27, 16, 1),
                  zero_shape=(0, 24))
    _tensor_cases(_p, "weight", LW, lambda a, f=_fn: f(LX, a, LB), rank_bad=LW[0], huge_shape=(2**27, 24))
    _tensor_cases(_p, "bias", LB, lambda a, f=_fn: f(LX, LW, a), rank_bad=LB[None], zero_shape=(0,))
    raises(f"{_p}-K-mismatch", lambda f=_fn: f(LX[:, :20], LW, LB), ShapeError, r"x has K = 20 .* weight \(12, 24\) has K = 24")
    raises(f"{_p}-bias-shape", lambda f=_fn: f(LX, LW, LB[:11]), ShapeError, r"bias has shape \(11,\) .* bias must be \[N\]")
    raises(f"{_p}-dtype-mix", lambda f=_fn: f(LX, LW.astype(BF16), LB), DTypeError, r"inputs must share one storage dtype")
    close(f"{_p}-x-1d", lambda f=_fn: f(LX[0], LW, LB), lambda: reference.linear(LX[0], LW, LB), rtol=1e-5, atol=1e-5)
    close(f"{_p}-x-nan-inf", lambda f=_fn: f(_LXN, LW, LB), lambda: reference.linear(_LXN, LW, LB), rtol=1e-5, atol=1e-5)
    equal(f"{_p}-weight-transposed-view", lambda f=_fn: f(LX, np.ascontiguousarray(LW.T).T, LB), lambda f=_fn: f(LX, LW, LB))
    for _label, _t in (("not-nested", (16, 16)), ("str", "abc"), ("zero", ((0, 16), (16, 16), (16, 16))),
                       ("negative", ((-16, 16), (16, 16), (16, 16)))):
        raises(f"{_p}-cube_tiles-{_label}", lambda f=_fn, t=_t: f(LX, LW, LB, cube_tiles=t), TileError, r"cube[_ ]tiles? ")
    raises(f"{_p}-cube_tiles-float", lambda f=_fn: f(LX, LW, LB, cube_tiles=((16.5, 32), (16, 32), (16, 32))), TileError,
           r"cube_tiles must be .* of integers")
    raises(f"{_p}-cube_tiles-bool", lambda f=_fn: f(LX, LW, LB, cube_tiles=((True, 32), (16, 32), (16, 32))), TileError,
           r"cube_tiles must be .* of integers")
    raises(f"{_p}-cube_tiles-unaligned", lambda f=_fn: f(LX, LW, LB, cube_tiles=((17, 34), (16, 32), (16, 32))), TileError,
           r"not a multiple of 16 elements")
    raises(f"{_p}-cube_tiles-L0-overflow", lambda f=_fn: f(LX, LW, LB, cube_tiles=((256, 256), (256, 256), (256, 256))),
           TileError, r"need L0[ABC] = ")
    raises(f"{_p}-cube_tiles-L1-not-multiple", lambda f=_fn: f(LX, LW, LB, cube_tiles=((32, 48), (16, 32), (16, 32))),
           TileError, r"mL1 % mL0 == 0")
    raises(f"{_p}-output-over-int32", lambda s=_s: getattr(linear, f"plan_{s}")((2**16, 16), (2**16, 16)), ConstraintError,
           r"INT32_MAX")
    _profile_cases(_p, lambda f=_fn, **kw: f(LX, LW, LB, **kw))

# linear.fused_bias(row_scale=): fp32 [M] or x's leading dims
_LS = np.ones(LX.shape[0], F32)
raises("linear.fused_bias-row_scale-shape", lambda: linear.fused_bias(LX, LW, LB, row_scale=_LS[:-1]), ShapeError,
       rf"row_scale must have shape \({LX.shape[0]},\)")
raises("linear.fused_bias-row_scale-shape-3d", lambda: linear.fused_bias(LX[None], LW, LB, row_scale=_LS[None, None]),
       ShapeError, rf"row_scale must have shape \({LX.shape[0]},\) or x's leading dims \(1, {LX.shape[0]}\)")
raises("linear.fused_bias-row_scale-dtype", lambda: linear.fused_bias(LX, LW, LB, row_scale=_LS.astype(BF16)), DTypeError,
       r"row_scale must be fp32")
raises("linear.fused_bias-row_scale-list", lambda: linear.fused_bias(LX, LW, LB, row_scale=[1.0]), DTypeError,
       r"row_scale must be a numpy array")
equal("linear.fused_bias-row_scale-ones", lambda: linear.fused_bias(LX, LW, LB, row_scale=_LS),
      lambda: linear.fused_bias(LX, LW, LB))
close("linear.fused_bias-row_scale-leading-dims", lambda: linear.fused_bias(LX[None], LW, LB, row_scale=_LS[None] * 2),
      lambda: reference.linear(LX, LW)[None] * 2 + LB.astype(np.float64), rtol=1e-5, atol=1e-5)

# ---------------------------------------------------------------------------------------------
# embedding

_EMB = {"gather": embedding.gather, "index_select": embedding.index_select}
for _s, _fn in _EMB.items():
    _p = f"embedding.{_s}"
    _tensor_cases(_p, "weight", EMB, lambda a, f=_fn: f(a, IDS), rank_bad=EMB[0], huge_shape=(2**28, 8))
    raises(f"{_p}-ids-out-of-range", lambda f=_fn: f(EMB, np.array([[1, 2], [10, 0]], np.int32)), IndexError,
           r"ids\[1, 0\] = 10 is out of range \[0, 10\)")
    raises(f"{_p}-ids-negative", lambda f=_fn: f(EMB, np.array([3, -1], np.int64)), IndexError, r"ids\[1\] = -1 is out of range")
    raises(f"{_p}-ids-float", lambda f=_fn: f(EMB, IDS.astype(np.float64)), DTypeError, r"ids have dtype float64; accepted: int32 or int64")
    raises(f"{_p}-ids-bool", lambda f=_fn: f(EMB, IDS > 0), DTypeError, r"ids have dtype bool")
    raises(f"{_p}-ids-uint32", lambda f=_fn: f(EMB, IDS.astype(np.uint32)), DTypeError, r"ids have dtype uint32")
    raises(f"{_p}-ids-object", lambda f=_fn: f(EMB, IDS.astype(object)), DTypeError, r"ids have dtype object")
    raises(f"{_p}-ids-list", lambda f=_fn: f(EMB, [1, 2]), DTypeError, r"ids must be a numpy array")
    raises(f"{_p}-ids-zero-size", lambda f=_fn: f(EMB, np.empty((0,), np.int32)), ShapeError, r"ids has shape \(0,\) with no elements")
    raises(f"{_p}-ids-over-int32", lambda f=_fn: f(EMB, _huge((2**31,), np.int32)), ConstraintError,
           r"ids has 2147483648 elements.*INT32_MAX", needs_cap=True)
    raises(f"{_p}-output-over-int32", lambda s=_s: getattr(embedding, f"plan_{s}")((10, 2**16), (2**16,)), ConstraintError,
           r"INT32_MAX")
    equal(f"{_p}-ids-negstride", lambda f=_fn: f(EMB, IDS[::-1, ::-1]), lambda f=_fn: f(EMB, np.ascontiguousarray(IDS[::-1, ::-1])))
    equal(f"{_p}-ids-int64", lambda f=_fn: f(EMB, IDS.astype(np.int64)), lambda f=_fn: f(EMB, IDS))
    check(f"{_p}-nan-inf-rows-copied", lambda f=_fn: f(_SPECIAL[:8].reshape(1, 8).repeat(3, 0), np.array([2, 0], np.int32)),
          lambda out: np.testing.assert_array_equal(out.view(np.uint32), _SPECIAL[:8].reshape(1, 8).repeat(2, 0).view(np.uint32)))
    raises(f"{_p}-out-shape", lambda f=_fn: f(EMB, IDS, out=np.empty((2, 2, 7), F32)), ShapeError, r"out must be")
    raises(f"{_p}-out-noncontig", lambda f=_fn: f(EMB, IDS, out=np.broadcast_to(np.zeros(8, F32), (2, 2, 8))), ShapeError,
           r"out must be a C-contiguous float32 array of shape \(2, 2, 8\)")
    raises(f"{_p}-out-readonly", lambda f=_fn: f(EMB, IDS, out=_readonly(np.zeros((2, 2, 8), F32))), (ShapeError, ConstraintError),
           r"out must be .*writeable")
    _tile_cases(_p, "row_tile", lambda f=_fn, **kw: f(EMB, IDS, **kw), too_big=10**6, unaligned=3)
    _tile_cases(_p, "h_tile", lambda f=_fn, **kw: f(EMB, IDS, **kw), too_big=10**6, unaligned=7)
    _profile_cases(_p, lambda f=_fn, **kw: f(EMB, IDS, **kw))
raises("embedding.index_select-ids-3d", lambda: embedding.index_select(EMB, IDS[None]), ShapeError, r"use embedding.gather")
equal("embedding.gather-ids-0d", lambda: embedding.gather(EMB, np.array(3, np.int64)), lambda: EMB[3])

# ---------------------------------------------------------------------------------------------
# plans (advise() uses them alone): the same size limits as the data path, without any data

_OVER = r"has \d+ elements, more than PyPTO's INT32_MAX"
raises("mean.plan_sum_div-over-int32", lambda: mean.plan_sum_div((2**16, 2**15 + 1)), ConstraintError, rf"x {_OVER}")
raises("moe.plan_sigmoid_gating-over-int32", lambda: moe.plan_sigmoid_gating((2**27, 16)), ConstraintError, rf"logits {_OVER}")
raises("moe.plan_softmax_gating-over-int32", lambda: moe.plan_softmax_gating((2**27, 16)), ConstraintError, rf"logits {_OVER}")
raises("moe.plan_combine-over-int32", lambda: moe.plan_combine((2**20, 2, 2**10)), ConstraintError, rf"expert_out {_OVER}")
for _k in ("standard", "interleaved", "fused_rmsnorm"):
    raises(f"rope.plan_{_k}-over-int32", lambda k=_k: getattr(rope, f"plan_{k}")((2**21, 2**10, 1, 2)), ConstraintError, rf"x {_OVER}")
raises("rope.plan_rmsnorm-over-int32", lambda: rope.plan_rmsnorm((2**21, 2**10, 1, 2)), ConstraintError, rf"x {_OVER}")
for _s in ("online", "flash"):
    _plan = getattr(attention, f"plan_{_s}")
    raises(f"attention.plan_{_s}-q-over-int32", lambda pl=_plan: pl((1, 2**10, 2**18, 8), (1, 2**10, 4, 8)), ConstraintError,
           rf"q {_OVER}")
    raises(f"attention.plan_{_s}-k-over-int32", lambda pl=_plan: pl((1, 8, 1, 8), (1, 8, 2**28, 8)), ConstraintError,
           rf"k {_OVER}")
    # Dv >> D: q, k and v fit, the output [B, Hq, Sq, Dv] does not (a 32 GiB allocation)
    raises(f"attention.plan_{_s}-output-over-int32", lambda pl=_plan: pl((1, 64, 2**17, 1), (1, 64, 1, 1), (1, 64, 1, 2**8)),
           ConstraintError, r"output.*INT32_MAX")

for _s in _ATT:
    raises(f"attention.{_s}-output-over-int32", lambda f=_ATT[_s]: f(_normal((1, 64, 2**17, 1)), _normal((1, 64, 1, 1)),
                                                                       _normal((1, 64, 1, 2**8))),
           ConstraintError, r"output.*INT32_MAX", needs_cap=True)
raises("attention.plan_standard-output-over-int32",
       lambda: attention.plan_standard((1, 64, 2**17, 1), (1, 64, 1, 1), (1, 64, 1, 2**8)),
       ConstraintError, r"output.*INT32_MAX")

# ---------------------------------------------------------------------------------------------
# profiles

raises("load_profile-unknown", lambda: pn.load_profile("nope"), ProfileError, r"unknown hardware profile 'nope'")
raises("load_profile-empty", lambda: pn.load_profile(""), ProfileError, r"unknown hardware profile ''")
raises("load_profile-path-traversal", lambda: pn.load_profile("../tiles/ascend910b"), ProfileError,
       r"unknown hardware profile '../tiles/ascend910b'")
raises("load_profile-type", lambda: pn.load_profile(["ascend910b"]), ProfileError, r"profile must be a name or a HardwareProfile, not list")
raises("load_profile-is-keyerror", lambda: pn.load_profile("nope"), KeyError, r"unknown hardware profile")
raises("load_profile-is-valueerror", lambda: pn.load_profile("nope"), ValueError, r"unknown hardware profile")
raises("use_profile-unknown", lambda: pn.use_profile("nope"), ProfileError, r"unknown hardware profile 'nope'")
raises("use_profile-type", lambda: pn.use_profile(910), ProfileError, r"profile must be a name")


def _use_profile_restores():
    before = pn.active_profile().name
    try:
        with pn.use_profile("nope"):
            pass
    except ProfileError:
        pass
    with pn.use_profile("ascend950"):
        inside = pn.active_profile().name
    return before, inside, pn.active_profile().name


check("use_profile-restores-after-error", _use_profile_restores,
      lambda r: expect(r == ("ascend910b", "ascend950", "ascend910b"), r))


def _env_profile(name):
    old = os.environ.get("PYPTO_NUMBA_PROFILE")
    os.environ["PYPTO_NUMBA_PROFILE"] = name
    try:
        return gelu.tanh(X)
    finally:
        if old is None:
            del os.environ["PYPTO_NUMBA_PROFILE"]
        else:
            os.environ["PYPTO_NUMBA_PROFILE"] = old


raises("PYPTO_NUMBA_PROFILE-unknown", lambda: _env_profile("nope"), ProfileError, r"unknown hardware profile 'nope'")

# ---------------------------------------------------------------------------------------------
# cast modes: a bad name is refused by every strategy that takes cast_mode=, naming the modes

from pypto_numba.machine.dtypes import CastModeError  # noqa: E402
from pypto_numba.machine.profile import use_cast_mode  # noqa: E402

_CM = r"unknown cast mode 'nearest'; modes: rint, round, floor, ceil, trunc, odd"
_xb = np.ones((4, 32), BF16)
_cs = rope.cos_sin(np.arange(4), 32, dtype=BF16)
_ci = rope.cos_sin(np.arange(4), 32, dtype=BF16, layout="interleaved")
_x4 = np.ones((4, 2, 32), BF16)
_xf = np.ones((4, 32), F32)
_csf = rope.cos_sin(np.arange(4), 32, dtype=F32)
for _cid, _call in (
    ("gelu.tanh", lambda: gelu.tanh(_xb, cast_mode="nearest")),
    ("gelu.erf", lambda: gelu.erf(_xb, cast_mode="nearest")),
    ("swiglu.fused", lambda: swiglu.fused(_xb, cast_mode="nearest")),
    ("swiglu.separate", lambda: swiglu.separate(_xb, cast_mode="nearest")),
    ("swiglu.epilogue", lambda: swiglu.epilogue(_xb, _xb, _xb, cast_mode="nearest")),
    ("softmax.whole_row", lambda: softmax.whole_row(_xb, cast_mode="nearest")),
    ("softmax.online", lambda: softmax.online(_xb, cast_mode="nearest")),
    ("mean.sum_div", lambda: mean.sum_div(_xb, cast_mode="nearest")),
    ("rmsnorm.plain", lambda: rmsnorm.plain(_xb, _xb[0], cast_mode="nearest")),
    ("rmsnorm.fused_add", lambda: rmsnorm.fused_add(_xb, _xb, _xb[0], cast_mode="nearest")),
    ("rmsnorm.deferred", lambda: rmsnorm.deferred(_xb, cast_mode="nearest")),
    ("rope.standard", lambda: rope.standard(_x4, *_cs, cast_mode="nearest")),
    ("rope.interleaved", lambda: rope.interleaved(_x4, *_ci, cast_mode="nearest")),
    ("rope.rmsnorm", lambda: rope.rmsnorm(_x4, _xb[0], cast_mode="nearest")),
    ("rope.fused_rmsnorm", lambda: rope.fused_rmsnorm(_x4, _xb[0], *_cs, cast_mode="nearest")),
    ("linear.matmul_add", lambda: linear.matmul_add(_xb, _xb, cast_mode="nearest")),
    ("linear.fused_bias", lambda: linear.fused_bias(_xb, _xb, cast_mode="nearest")),
    ("moe.combine", lambda: moe.combine(np.ones((4, 2, 32), BF16), np.ones((4, 2), F32), cast_mode="nearest")),
    ("moe.softmax_gating", lambda: moe.softmax_gating(np.ones((4, 8), F32), 2, cast_mode="nearest")),
    ("moe.sigmoid_gating", lambda: moe.sigmoid_gating(np.ones((4, 8), F32), 2, cast_mode="nearest")),
    ("embedding.gather", lambda: embedding.gather(_xb, np.array([1, 2]), cast_mode="nearest")),
    ("embedding.index_select", lambda: embedding.index_select(_xb, np.array([1, 2]), cast_mode="nearest")),
    ("repeat_kv.expand_clone", lambda: repeat_kv.expand_clone(np.ones((1, 2, 4, 32), BF16), 2, cast_mode="nearest")),
    ("attention.standard", lambda: attention.standard(_x4[None], _x4[None], _x4[None], cast_mode="nearest")),
    ("attention.online", lambda: attention.online(_x4[None], _x4[None], _x4[None], cast_mode="nearest")),
    ("attention.flash", lambda: attention.flash(_x4[None], _x4[None], _x4[None], cast_mode="nearest")),
    ("attention.flash-fp32", lambda: attention.flash(Q, K, V, cast_mode="nearest")),
    # fp32 calls never narrow, yet a bad mode name is still refused (not silently ignored)
    ("swiglu.fused-fp32", lambda: swiglu.fused(_xf, cast_mode="nearest")),
    ("softmax.online-fp32", lambda: softmax.online(_xf, cast_mode="nearest")),
    ("mean.sum_div-fp32", lambda: mean.sum_div(_xf, cast_mode="nearest")),
    ("rmsnorm.plain-fp32", lambda: rmsnorm.plain(_xf, _xf[0], cast_mode="nearest")),
    ("rope.standard-fp32", lambda: rope.standard(_x4.astype(F32), *_csf, cast_mode="nearest")),
    ("linear.matmul_add-fp32", lambda: linear.matmul_add(_xf, _xf, cast_mode="nearest")),
    ("moe.combine-fp32", lambda: moe.combine(np.ones((4, 2, 32), F32), np.ones((4, 2), F32), cast_mode="nearest")),
    ("attention.online-paged", lambda: attention.online(_PQ, _PKC, _PVC, block_table=_PT, kv_len=_PL, cast_mode="nearest")),
    ("attention.flash-paged", lambda: attention.flash(_PQ, _PKC, _PVC, block_table=_PT, kv_len=_PL, cast_mode="nearest")),
    ("attention.write_kv", lambda: attention.write_kv(*_WK, _WN, _WN, np.array([0, 1]), cast_mode="nearest")),
):
    raises(f"{_cid}-cast-mode-unknown", _call, CastModeError, _CM)
raises("use_cast_mode-unknown", lambda: use_cast_mode("RINT"), CastModeError, r"use_cast_mode: unknown cast mode 'RINT'")
raises("rope.cos_sin-scaling-unknown", lambda: rope.cos_sin(np.arange(4), 8, scaling={"rope_type": "su"}),
       ConstraintError, r"unknown rope_scaling type 'su'; supported: default, linear, dynamic, llama3, yarn")
raises("rope.cos_sin-scaling-missing", lambda: rope.cos_sin(np.arange(4), 8, scaling={"type": "linear"}),
       ConstraintError, r"rope_scaling of type 'linear' lacks factor")
raises("rope.cos_sin-layout-unknown", lambda: rope.cos_sin(np.arange(4), 8, layout="neox"), ConstraintError,
       r"layout must be 'half'")
raises("rope.interleaved-half-tables", lambda: rope.interleaved(_x4, *_cs), ConstraintError,
       r"split-half \(HF\) table.*layout='interleaved'")

# ---------------------------------------------------------------------------------------------
# compare / advise

raises("compare-op-unknown", lambda: pn.compare("conv2d"), PyptoNumbaError, r"compare: unknown op 'conv2d'")
raises("compare-strategy-unknown", lambda: pn.compare("gelu", X, strategies=["exact"]), PyptoNumbaError,
       r"gelu has no strategy \['exact'\]")
raises("compare-x-float64", lambda: pn.compare("gelu", X.astype(np.float64)), DTypeError, r"x has dtype float64")
raises("compare-inputs-list", lambda: pn.compare("gelu", X.tolist()), DTypeError, r"compare: .*numpy array")
raises("compare-policy-unknown", lambda: pn.compare("gelu", X, policy="strict"), PyptoNumbaError, r"unknown tolerance policy 'strict'")
raises("compare-repeats", lambda: pn.compare("gelu", X, repeats="5"), PyptoNumbaError, r"repeats must be")
raises("compare-mean-dim", lambda: pn.compare("mean", MX, dim=4), ShapeError, r"dim=4 is out of range")
check("compare-bad-tile-ruled-out", lambda: pn.compare("gelu", X, tile=33, repeats=1),
      lambda c: expect([r.verdict for r in c.rows] == ["RULED OUT", "RULED OUT"]
                       and "tile x_ub last dim 33" in c.rows[0].ruled_out, c.to_table()))
check("compare-nan-input", lambda: pn.compare("gelu", _SPECIAL, repeats=1),
      lambda c: expect([r.verdict for r in c.rows] == ["PASS", "PASS"], c.to_table()))
raises("compare-profile-unknown", lambda: pn.compare("gelu", X, profile="nope"), ProfileError, r"unknown hardware profile 'nope'")
raises("advise-op-unknown", lambda: pn.advise("conv2d"), PyptoNumbaError, r"advise: unknown op 'conv2d'")
raises("advise-keyword-unknown", lambda: pn.advise("gelu", size=3), PyptoNumbaError, r"scenario keywords are shape, dtype, exact")
raises("advise-gelu-dtype", lambda: pn.advise("gelu", dtype="float64"), DTypeError, r"dtype 'float64'")
raises("advise-gelu-zero", lambda: pn.advise("gelu", shape=(0, 8)), ShapeError, r"zero-size")
raises("advise-gelu-over-int32", lambda: pn.advise("gelu", shape=(2**16, 2**15 + 1)), ConstraintError, r"INT32_MAX")
raises("advise-mean-dim", lambda: pn.advise("mean", dim=2), ShapeError, r"dim=2 is out of range")
raises("advise-attention-zero-kv", lambda: pn.advise("attention", kv_len=0), ShapeError, r"positive dims")
raises("advise-attention-gqa", lambda: pn.advise("attention", q_heads=32, kv_heads=5), ShapeError, r"Hq=32 is not a multiple of Hkv=5")
raises("advise-moe-top_k", lambda: pn.advise("moe", top_k=0), ConstraintError, r"top_k=0 must be")
raises("advise-moe-experts", lambda: pn.advise("moe", experts=8000, n_group=8, topk_group=4), TileError, r"MERGE_SORT")
raises("advise-repeat_kv-strategy", lambda: pn.advise("repeat_kv", strategy="standard"), PyptoNumbaError, r"strategy must be one of")
raises("advise-profile-unknown", lambda: pn.advise("gelu", profile="nope"), ProfileError, r"unknown hardware profile 'nope'")
raises("advise-linear-zero", lambda: pn.advise("linear", tokens=0), ShapeError, r"zero-size|positive")
raises("advise-embedding-zero", lambda: pn.advise("embedding", ids_shape=(0,)), ShapeError, r"zero-size|no elements")
raises("advise-swiglu-limit", lambda: pn.advise("swiglu", limit=-1.0), ConstraintError, r"limit must be a finite number > 0")
raises("advise-swiglu-zero", lambda: pn.advise("swiglu", tokens=0), ShapeError, r"zero-size")


# ---------------------------------------------------------------------------------------------
# the worker (subprocess) and the pytest side


def _limit_address_space(extra_bytes=4 << 30) -> bool:
    """Cap the address space a few GiB above the current size: a runaway allocation -> MemoryError.
    Returns whether the cap is in force (Linux); without it the ``needs_cap`` cases are skipped."""
    try:
        import resource

        with open("/proc/self/statm") as fh:
            vm = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = vm + extra_bytes
        hard = resource.getrlimit(resource.RLIMIT_AS)[1]
        if hard != resource.RLIM_INFINITY and hard < limit:
            return False
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
        return True
    except (ImportError, OSError, ValueError):  # not Linux: no cap
        return False


CASE_SECONDS = 180  # a case that hangs (e.g. a Python loop over a huge count) fails after this


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout(f"the call did not return within {CASE_SECONDS} s")


def _evaluate(case: Case) -> dict:
    try:
        if hasattr(signal, "SIGALRM"):
            signal.alarm(CASE_SECONDS)
        try:
            got = case.call()
        finally:
            if hasattr(signal, "SIGALRM"):
                signal.alarm(0)
        error = None
    except Exception as exc:  # noqa: BLE001 - every failure is a result to report
        got, error = None, exc
    try:
        if case.kind == "raises":
            if error is None:
                return {"ok": False, "detail": f"no exception; returned {type(got).__name__}"}
            if not isinstance(error, case.exc):
                return {"ok": False, "detail": f"raised {type(error).__module__}.{type(error).__name__}: {error}"[:2000]}
            if not re.search(case.pattern, str(error)):
                return {"ok": False, "detail": f"message {str(error)!r} does not match {case.pattern!r}"[:2000]}
            return {"ok": True, "detail": f"{type(error).__name__}: {error}"[:500]}
        if error is not None:
            return {"ok": False, "detail": "".join(traceback.format_exception(type(error), error, error.__traceback__))[-2500:]}
        if case.kind == "check":
            result = case.ref(got)
            if result is False:
                return {"ok": False, "detail": "check returned False"}
            return {"ok": True, "detail": "check passed"}
        ref = case.ref()
        gots = got if isinstance(got, tuple) else (got,)
        refs = ref if isinstance(ref, tuple) else (ref,)
        assert len(gots) == len(refs), (len(gots), len(refs))
        for g, r in zip(gots, refs):
            g, r = np.asarray(g), np.asarray(r)
            assert g.shape == r.shape, f"shape {g.shape} != {r.shape}"
            if case.kind == "equal":
                assert g.dtype == r.dtype, f"dtype {g.dtype} != {r.dtype}"
                np.testing.assert_array_equal(g, r)
            else:
                np.testing.assert_allclose(g.astype(np.float64), r.astype(np.float64), rtol=case.rtol, atol=case.atol,
                                           equal_nan=True)
        return {"ok": True, "detail": "result as expected"}
    except Exception as exc:  # noqa: BLE001
        return {"ok": False, "detail": f"{type(exc).__name__}: {exc}"[:2500]}


def main(out_path: str):
    capped = _limit_address_space()
    if hasattr(signal, "SIGALRM"):
        signal.signal(signal.SIGALRM, _alarm)
    results = {}
    for case in CASES:
        print(case.id, file=sys.stderr, flush=True)  # the last line names the case of a crash
        if case.needs_cap and not capped:
            results[case.id] = {"ok": None, "detail": "skipped: no address-space cap on this platform"}
            continue
        results[case.id] = _evaluate(case)
    with open(out_path, "w") as fh:
        json.dump(results, fh)


def child_env() -> dict:
    """The environment of a worker subprocess: it imports the same pypto_numba as this process."""
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(pn.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env.setdefault("NUMBA_NUM_THREADS", "2")
    return env


@pytest.fixture(scope="module")
def results():
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "results.json")
        env = child_env()
        proc = subprocess.run([sys.executable, __file__, out], capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0 or not os.path.exists(out):
            last = proc.stderr.strip().splitlines()[-5:]
            pytest.fail(f"bad-input worker died (rc={proc.returncode}); last lines: {last}", pytrace=False)
        with open(out) as fh:
            return json.load(fh)


def _params():
    out = []
    for case in CASES:
        marks = [pytest.mark.xfail(strict=True, reason=case.xfail)] if case.xfail else []
        out.append(pytest.param(case.id, id=case.id, marks=marks))
    return out


@pytest.mark.parametrize("case_id", _params())
def test_bad_input(case_id, results):
    r = results[case_id]
    if r["ok"] is None:
        pytest.skip(r["detail"])
    assert r["ok"], r["detail"]


def test_matrix_size():
    """Every public function is in the matrix (and the matrix keeps its size)."""
    prefixes = {c.id.split("-")[0] for c in CASES}
    for op, entries in pn.strategies().items():
        for e in entries:
            assert f"{op}.{e.name}" in prefixes, f"{op}.{e.name} has no bad-input cases"
    for name in ("rope.cos_sin", "load_profile", "use_profile", "compare", "advise"):
        assert name in prefixes, name
    assert len(CASES) >= 600, len(CASES)


if __name__ == "__main__":
    main(sys.argv[1])
