"""Argument checks of the attention strategies (Python, before any kernel), and the call memo."""

from __future__ import annotations

import math
import numbers

import numpy as np

from .. import inputs
from ..errors import ConstraintError, DTypeError, ShapeError
from ..machine import dtypes
from ..machine.memo import CallMemo
from .tiles import PV_COMPENSATED, PV_FP32, PV_STORAGE

GQA_MODES = ("head_loop", "expand_clone")
PV_MODES = ("storage", "compensated", "fp32")
PV_CODE = {"storage": PV_STORAGE, "compensated": PV_COMPENSATED, "fp32": PV_FP32}


class Args:
    """Validated attention inputs and options."""

    __slots__ = ("q", "k", "v", "dtype", "B", "Hq", "Hkv", "Sq", "Skv", "D", "Dv", "G", "scale",
                 "causal", "kv_len", "kv_len_given", "has_mask", "mask_flat", "mask_strides", "mask_dtype", "gqa",
                 "window", "left", "right", "softcap", "has_sinks", "sinks", "copied_bytes", "layout")

    @property
    def shapes(self):
        return (self.q.shape, self.k.shape, self.v.shape)

    def plan_options(self) -> dict:
        """The window, soft-cap, sink and mask-dtype options as the plans take them."""
        return {"window": self.window, "softcap": float(self.softcap) if self.softcap > 0 else None,
                "has_sinks": self.has_sinks, "mask_dtype": self.mask_dtype}

    def with_arrays(self, q, k, v) -> "Args":
        """These arguments for other q, k, v of the same shapes, strides and dtypes (contiguous)."""
        a = Args()
        for name in Args.__slots__:
            setattr(a, name, getattr(self, name))
        a.q, a.k, a.v = (in_layout(inputs.Tensor(x, self.dtype, dtypes.kernel_view(x), 0), self.layout)
                         for x in (q, k, v))
        return a

    def empty_out(self, Dv=None):
        """-> (the result array in the call's layout, its kernel view as [B, Hq, Sq, Dv])."""
        Dv = self.Dv if Dv is None else Dv
        if self.layout == "bshd":
            out, out_k = dtypes.empty((self.B, self.Sq, self.Hq, Dv), self.dtype)
            return out, out_k.transpose(0, 2, 1, 3)
        return dtypes.empty((self.B, self.Hq, self.Sq, Dv), self.dtype)


LAYOUTS = ("bhsd", "bshd")


def check_layout(layout, where):
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise ConstraintError(f"{where}: layout must be 'bhsd' (q [B, Hq, Sq, D], the default, torch SDPA's) or "
                              f"'bshd' (q [B, Sq, Hq, D], Hugging Face's and flash-attn's), got {layout!r}; "
                              f"k, v and the result use the same layout")
    return layout


def in_layout(t, layout):
    """A validated [B, S, H, D] tensor (layout "bshd") as its [B, H, S, D] view, no copy: the
    kernels index the transposed view (strided.py); "bhsd" tensors as they are."""
    if layout != "bshd":
        return t
    return inputs.Tensor(t.array.transpose(0, 2, 1, 3), t.dtype, t.kview.transpose(0, 2, 1, 3), t.copied_bytes)


# Validated arguments and plan of each call signature (see CallMemo): validation and the plan's key
# are a good part of a decode-sized call (docs/performance-attention.md).
_CALLS = CallMemo()


def _full(where, q, k, v, plan, scale, causal, kv_len, mask, gqa, window, softcap, sinks, layout):
    a = validate(q, k, v, where, scale=scale, causal=causal, kv_len=kv_len, mask=mask, gqa=gqa,
                 window=window, softcap=softcap, sinks=sinks, layout=layout)
    return (a, plan(a)), a, a.copied_bytes


def prepare(where, q, k, v, profile, plan, *, scale, causal, kv_len, mask, gqa, window=None, softcap=None,
            sinks=None, options=(), layout="bhsd"):
    """-> (:class:`Args`, plan) of a call: validated in full (``plan(args)`` builds the plan), or,
    for a call with the signature of an earlier one, that call's with this call's arrays.

    The signature: q, k, v by shape, strides and dtype, the options, ``kv_len`` and ``sinks`` by
    value, the profile. A call with a ``mask`` (data) or a non-contiguous input (copied) keeps nothing."""
    key = None if mask is not None else _CALLS.key(
        profile, (q, k, v), (where, scale, causal, kv_len, gqa, window, softcap, sinks, options, layout))

    (a, p), fresh, _ = _CALLS.through(key, _full, where, q, k, v, plan, scale, causal, kv_len, mask, gqa,
                                      window, softcap, sinks, layout)
    return (a if fresh is not None else a.with_arrays(q, k, v)), p


def validate(q, k, v, where, *, scale=None, causal=False, kv_len=None, mask=None, gqa="head_loop",
             window=None, softcap=None, sinks=None, layout="bhsd") -> Args:
    """The checked arguments of an attention call.

    Options beyond the shared ones (API.md):

    - ``window``: ``(left, right)`` ints >= 0 allow key j of query i iff ``-right <= i' - j <= left``,
      ``i' = i + kv_len - Sq`` (bottom-right aligned, like ``causal``; flash-attn's
      ``window_size``); an int ``W >= 1`` means ``(W - 1, 0)`` and implies ``causal``;
    - ``softcap``: a finite ``c > 0``: scores become ``c * tanh(s / c)`` after the scale, before
      the masks (Gemma 2);
    - ``sinks``: float32 ``[Hq]``, one logit per query head joining every row's softmax as a
      column with no value (not scaled, not capped; in the row max and the lse; gpt-oss);
    - ``mask``: see :func:`check_mask` (additive fp32/bf16/fp16 or bool, True = keep);
    - ``layout``: "bhsd" (``[B, H, S, D]``) or "bshd" (``[B, S, H, D]``, Hugging Face's) for q,
      k, v and the result; a "bshd" array is read in place through its transposed view (shape
      errors show that view, and say so).
    """
    a = Args()
    a.layout = check_layout(layout, where)
    qt = in_layout(inputs.tensor(q, "q", where, min_rank=4, max_rank=4), a.layout)
    kt = in_layout(inputs.tensor(k, "k", where, min_rank=4, max_rank=4), a.layout)
    vt = in_layout(inputs.tensor(v, "v", where, min_rank=4, max_rank=4), a.layout)
    a.dtype = inputs.same_dtype(where, q=qt, k=kt, v=vt)
    B, Hq, Sq, D = qt.shape
    Bk, Hkv, Skv, Dk = kt.shape
    Bv, Hv, Sv, Dv = vt.shape
    note = ("" if a.layout == "bhsd"
            else " (layout='bshd': shapes shown as the [B, H, S, D] views of the [B, S, H, D] inputs)")
    if Bk != B or Bv != B:
        raise ShapeError(f"{where}: batch sizes differ: q {qt.shape}, k {kt.shape}, v {vt.shape}{note}")
    if Dk != D:
        raise ShapeError(f"{where}: head dim of k ({Dk}) differs from q ({D}); q {qt.shape}, k {kt.shape}{note}")
    if Hv != Hkv or Sv != Skv:
        raise ShapeError(f"{where}: k {kt.shape} and v {vt.shape} must share [B, Hkv, Skv]{note}")
    if Hq % Hkv:
        raise ShapeError(
            f"{where}: Hq={Hq} is not a multiple of Hkv={Hkv} (GQA needs Hq % Hkv == 0){note}"
        )
    a.q, a.k, a.v = qt, kt, vt
    a.B, a.Hq, a.Hkv, a.Sq, a.Skv, a.D, a.Dv, a.G = B, Hq, Hkv, Sq, Skv, D, Dv, Hq // Hkv
    a.copied_bytes = qt.copied_bytes + kt.copied_bytes + vt.copied_bytes
    a.scale = check_scale(scale, D, where)
    if not isinstance(causal, (bool, np.bool_)):
        raise ConstraintError(f"{where}: causal must be True or False, got {causal!r}")
    a.causal, a.window, a.left, a.right = check_window(window, bool(causal), Sq, Skv, where)
    a.kv_len, a.kv_len_given = check_kv_len(kv_len, B, Skv, where)
    a.has_mask, a.mask_flat, a.mask_strides, a.mask_dtype = check_mask(mask, (B, Hq, Sq, Skv), where)
    a.gqa = check_gqa(gqa, where)
    a.softcap = check_softcap(softcap, where)
    a.has_sinks, a.sinks = check_sinks(sinks, Hq, where)
    return a


def _is_int(x):
    return isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_))


def check_window(window, causal, Sq, Skv, where):
    """-> (causal, (left, right) or None, left, right): the window as the kernels take it.

    ``window=W`` is ``(W - 1, 0)`` and sets causal. Bounds are clamped to ``Skv + Sq``, beyond
    which they bound nothing; no window is ``left = right = Skv + Sq`` (tiles.key_range)."""
    big = Skv + Sq
    if window is None:
        return causal, None, big, big
    how = ("window=W (an int >= 1: the W most recent keys, the query's own position included) or "
           "window=(left, right) (ints >= 0: keys before and after the diagonal)")
    if _is_int(window):
        if window < 1:
            raise ConstraintError(f"{where}: window={int(window)} must be >= 1; use {how}, or window=None for none")
        left, right, causal = int(window) - 1, 0, True
    elif isinstance(window, (tuple, list)) and len(window) == 2:
        for side, x in zip(("left", "right"), window):
            if not _is_int(x):
                raise ConstraintError(f"{where}: window {side} must be an int >= 0, got {x!r} "
                                      f"({type(x).__name__}); use {how}")
            if x < 0:
                raise ConstraintError(f"{where}: window {side} = {int(x)} is negative; bounds must be >= 0 "
                                      f"(for no bound on one side pass a bound >= Skv, e.g. {big}); use {how}")
        left, right = int(window[0]), int(window[1])
    else:
        raise ConstraintError(f"{where}: window must be an int W >= 1 or a (left, right) pair of ints >= 0, "
                              f"got {window!r}; use {how}")
    left, right = min(left, big), min(right, big)
    return bool(causal), (left, right), left, right


def check_softcap(softcap, where):
    """-> float32 c (0: no soft-capping)."""
    if softcap is None:
        return np.float32(0.0)
    ok = (not isinstance(softcap, (bool, np.bool_)) and isinstance(softcap, numbers.Real)
          and math.isfinite(softcap) and 0 < softcap <= float(np.finfo(np.float32).max))
    if not ok or not np.float32(softcap) > 0:  # a positive value below float32's range is 0 there
        raise ConstraintError(f"{where}: softcap must be a finite number > 0 within float32 "
                              f"(Gemma 2 uses 50.0), got {softcap!r}; pass softcap=None for no capping")
    return np.float32(softcap)


def check_sinks(sinks, Hq, where):
    """-> (has_sinks, float32 array [Hq] (a copy; one zero when absent))."""
    if sinks is None:
        return False, np.zeros(1, np.float32)
    if not isinstance(sinks, np.ndarray):
        raise DTypeError(f"{where}: sinks must be a numpy float32 array [Hq], got "
                         f"{type(sinks).__name__}; convert with numpy.asarray(sinks, numpy.float32)")
    if sinks.dtype != np.float32:
        raise DTypeError(f"{where}: sinks must be float32 [Hq] (one logit per query head), got dtype "
                         f"{sinks.dtype}; convert with sinks.astype(numpy.float32)")
    if sinks.shape != (Hq,):
        raise ShapeError(f"{where}: sinks must have shape [Hq] = ({Hq},), one logit per query head, "
                         f"got {sinks.shape}")
    bad = np.flatnonzero(~np.isfinite(sinks))
    if bad.size:
        raise ConstraintError(f"{where}: sinks[{int(bad[0])}] = {sinks[bad[0]]} is not finite; a sink is a "
                              f"finite logit (a very negative one, e.g. -1e30, mutes it; or pass sinks=None)")
    return True, np.array(sinks, dtype=np.float32)  # a copy: a kept call must not see later writes


def check_scale(scale, D, where):
    if scale is None:
        return np.float32(1.0 / math.sqrt(D))
    if isinstance(scale, (bool, np.bool_)) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ConstraintError(f"{where}: scale must be a finite real number, got {scale!r}")
    return np.float32(scale)


def check_gqa(gqa, where):
    if gqa not in GQA_MODES:
        raise ConstraintError(f"{where}: gqa must be one of {GQA_MODES}, got {gqa!r}")
    return gqa


def check_pv(pv, where):
    if pv not in PV_MODES:
        raise ConstraintError(f"{where}: pv must be one of {PV_MODES}, got {pv!r}")
    return pv


def check_kv_len(kv_len, B, Skv, where):
    """-> (int64 array [B], given?). Values must lie in [0, Skv]."""
    if kv_len is None:
        return np.full(B, Skv, dtype=np.int64), False
    arr = np.asarray(kv_len)
    if arr.dtype.kind not in "iu":
        raise DTypeError(f"{where}: kv_len must be an integer array [B], got dtype {arr.dtype}")
    if arr.shape != (B,):
        raise ShapeError(f"{where}: kv_len must have shape [B] = ({B},), got {arr.shape}")
    if arr.size and (arr.min() < 0 or arr.max() > Skv):
        bad = int(np.flatnonzero((arr < 0) | (arr > Skv))[0])
        raise ConstraintError(
            f"{where}: kv_len[{bad}] = {int(arr[bad])} is outside [0, Skv={Skv}]"
        )
    return np.array(arr, dtype=np.int64), True  # a copy: a kept call must not see later writes


MASK_DTYPES = ("fp32", "bf16", "fp16", "bool")  # how a mask may be stored (plans: ``mask_dtype``)


def mask_itemsize(mask_dtype, where):
    """Bytes per mask element the kernels read (the mask as stored: nothing is widened in GM)."""
    if mask_dtype not in MASK_DTYPES:
        raise ConstraintError(f"{where}: mask_dtype must be one of {MASK_DTYPES}, got {mask_dtype!r}")
    return 1 if mask_dtype == "bool" else dtypes.itemsize(mask_dtype)


def check_mask(mask, full, where):
    """-> (has_mask, flat mask as the kernels read it, element strides (b, h, i, j) with 0 on
    broadcast dims, mask dtype name).

    A mask broadcasts to ``[B, Hq, Sq, Skv]`` and is either additive (float32, bfloat16 or
    float16: added to the scaled, capped scores) or boolean (True = keep the key, False = drop it:
    torch SDPA's convention, the same as an additive 0 / -inf). It is read as stored: a bool mask
    costs 1 B per element read, a 16-bit one 2 B."""
    if mask is None:
        return False, np.zeros(1, np.float32), (0, 0, 0, 0), "fp32"
    how = (f"float32, bfloat16 or float16 additive or bool (True = keep) numpy array broadcastable to "
           f"[B, Hq, Sq, Skv] = {full}")
    if not isinstance(mask, np.ndarray) or isinstance(mask, np.ma.MaskedArray):
        raise DTypeError(f"{where}: mask must be a {how}, got {type(mask).__name__}; "
                         f"use numpy.asarray(mask, numpy.float32) or a bool array")
    kind = "bool" if mask.dtype == np.bool_ else dtypes.storage_name(mask.dtype)
    if kind is None:
        raise DTypeError(
            f"{where}: mask has dtype {mask.dtype}; it must be a {how}; convert with "
            f"mask.astype(numpy.float32) (additive) or mask.astype(bool) (True = keep)"
        )
    if mask.ndim > 4:
        raise ShapeError(f"{where}: mask has {mask.ndim} dims; it must broadcast to [B, Hq, Sq, Skv] = {full}")
    shape4 = (1,) * (4 - mask.ndim) + mask.shape
    if any(m not in (1, f) for m, f in zip(shape4, full)) or mask.size == 0:
        raise ShapeError(f"{where}: mask of shape {mask.shape} does not broadcast to [B, Hq, Sq, Skv] = {full}; "
                         f"each dim must be 1 or the full size (e.g. [B, 1, Sq, Skv] for a padding mask)")
    # dims a broadcast view repeats (stride 0, e.g. np.broadcast_to) are kept as one slice:
    # the kernels read them with stride 0 instead of from a copy materialised at full size
    mask = mask[tuple(slice(0, 1) if st == 0 else slice(None) for st in mask.strides)]
    shape4 = (1,) * (4 - mask.ndim) + mask.shape
    flat = np.ascontiguousarray(mask).reshape(shape4)
    if kind != "bool":
        flat = dtypes.kernel_view(flat)  # 16-bit masks as their bits (dtypes.widen reads them)
    strides = []
    acc = 1
    for dim in reversed(shape4):
        strides.append(acc if dim > 1 else 0)
        acc *= dim
    strides = tuple(reversed(strides))
    return True, flat.reshape(-1), strides, kind


def shapes_of(q_shape, k_shape, v_shape, where):
    q_shape, k_shape = tuple(int(x) for x in q_shape), tuple(int(x) for x in k_shape)
    v_shape = k_shape if v_shape is None else tuple(int(x) for x in v_shape)
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(s) != 4 or any(d <= 0 for d in s):
            raise ShapeError(f"{where}: {name} shape must be [B, H, S, D] with positive dims, got {s}")
    B, Hq, Sq, D = q_shape
    _, Hkv, Skv, _ = k_shape
    if Hq % Hkv:
        raise ShapeError(f"{where}: Hq={Hq} is not a multiple of Hkv={Hkv} (GQA needs Hq % Hkv == 0)")
    for name, s in (("q", q_shape), ("k", k_shape), ("v", v_shape), ("the output [B, Hq, Sq, Dv]", (B, Hq, Sq, v_shape[3]))):
        inputs.check_size(s, name, where)
    return B, Hq, Sq, D, Hkv, Skv, v_shape[3]

