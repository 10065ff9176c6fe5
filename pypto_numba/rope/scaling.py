"""RoPE frequency scaling as Hugging Face configs hold it (``rope_scaling``), for ``rope.cos_sin``.

``rope_scaling`` names its type under ``rope_type`` (or the older key ``type``). Each type gives
the inverse frequencies ``inv[i]`` (i < R/2, from ``base = theta``) and an attention factor that
multiplies cos and sin; all in float64. The formulas are those of Hugging Face transformers'
``modeling_rope_utils.py`` (``_compute_*_parameters``, huggingface/transformers main), restated:

=========  ====================================================================================
default    ``inv[i] = theta**(-2i/R)``, factor 1
linear     ``inv / factor``
dynamic    NTK-aware: ``L = max(seq_len, L0)``, ``theta' = theta * (factor*L/L0 - (factor-1))**(R/(R-2))``,
           ``inv = theta'**(-2i/R)`` (``seq_len``: ``max_position``, default ``positions.max()+1``;
           ``L0``: ``original_max_position_embeddings`` or ``max_position_embeddings=``)
llama3     wavelength ``w = 2*pi/inv``; ``w > L0/low_freq_factor``: ``inv/factor``; ``w <
           L0/high_freq_factor``: ``inv``; between: ``(1-s)*inv/factor + s*inv`` with ``s =
           (L0/w - low_freq_factor)/(high_freq_factor - low_freq_factor)``
yarn       ``inv = inv_interp*(1-e) + inv_extrap*e``, ``inv_extrap = theta**(-2i/R)``,
           ``inv_interp = inv_extrap/factor``, ``e = 1 - clip((i - low)/(high - low), 0, 1)`` with
           ``low/high = floor/ceil(R*ln(L0/(beta*2*pi))/(2*ln(theta)))`` for ``beta_fast`` (32) and
           ``beta_slow`` (1), clamped to ``[0, R-1]`` (``truncate=False``: no floor/ceil);
           attention factor ``attention_factor``, else ``mscale(factor, mscale)/mscale(factor,
           mscale_all_dim)`` when both are set, else ``mscale(factor) = 0.1*ln(factor) + 1`` (1 if
           factor <= 1). ``factor`` missing: ``max_position_embeddings / L0``.
=========  ====================================================================================
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ..errors import ConstraintError

TYPES = ("default", "linear", "dynamic", "llama3", "yarn")
_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": (),  # factor, or max_position_embeddings / original_max_position_embeddings
}


def _number(value, name, where, *, positive=True):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) \
            or (positive and float(value) <= 0.0):
        raise ConstraintError(f"{where}: rope_scaling[{name!r}] must be a finite number{' > 0' if positive else ''}, "
                              f"got {value!r}")
    return float(value)


def rope_type(scaling, where):
    """The type named by a ``rope_scaling`` dict (``rope_type``, else ``type``; None -> default)."""
    if scaling is None:
        return "default"
    if not isinstance(scaling, dict):
        raise ConstraintError(f"{where}: scaling must be a Hugging Face rope_scaling dict (e.g. "
                              f"{{'rope_type': 'linear', 'factor': 2.0}}) or None, got {type(scaling).__name__}")
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind is None:
        raise ConstraintError(f"{where}: rope_scaling names no type: give 'rope_type' (or the older 'type'), "
                              f"one of {', '.join(TYPES)}; got keys {sorted(scaling)}")
    if kind not in TYPES:
        raise ConstraintError(f"{where}: unknown rope_scaling type {kind!r}; supported: {', '.join(TYPES)}")
    missing = [k for k in _REQUIRED[kind] if scaling.get(k) is None]
    if missing:
        raise ConstraintError(f"{where}: rope_scaling of type {kind!r} lacks {', '.join(missing)} "
                              f"(required: {', '.join(_REQUIRED[kind])})")
    return kind


def _original_len(scaling, max_position_embeddings, kind, where):
    L0 = scaling.get("original_max_position_embeddings", max_position_embeddings)
    if L0 is None:
        raise ConstraintError(f"{where}: rope_scaling of type {kind!r} needs the original context length: "
                              f"'original_max_position_embeddings' in the dict, or max_position_embeddings= "
                              f"(the config's)")
    return _number(L0, "original_max_position_embeddings", where)


def _default(R, theta):
    return theta ** (-np.arange(0, R, 2, dtype=np.float64) / R)


def frequencies(R, theta, scaling=None, *, max_position=None, max_position_embeddings=None, where="rope.cos_sin"):
    """``(inv_freq[R/2] float64, attention_factor)`` of a ``rope_scaling`` dict (None: plain RoPE).

    ``max_position``: the sequence length ``dynamic`` scales for; ``max_position_embeddings``:
    the config's context length (``dynamic``/``yarn`` without ``original_max_position_embeddings``
    in the dict use it as the original one; ``yarn`` without ``factor`` divides by it)."""
    kind = rope_type(scaling, where)
    inv = _default(R, theta)
    if kind == "default":
        return inv, 1.0
    if kind == "linear":
        return inv / _number(scaling["factor"], "factor", where), 1.0
    if kind == "dynamic":
        factor = _number(scaling["factor"], "factor", where)
        L0 = _original_len(scaling, max_position_embeddings, kind, where)
        if max_position is None:
            raise ConstraintError(f"{where}: rope_scaling 'dynamic' needs the sequence length: max_position=")
        if R <= 2:
            raise ConstraintError(f"{where}: rope_scaling 'dynamic' needs rot_dim > 2 (its exponent is R/(R-2)), got {R}")
        L = max(_number(max_position, "max_position", where), L0)
        base = theta * ((factor * L / L0) - (factor - 1.0)) ** (R / (R - 2))
        return _default(R, base), 1.0
    if kind == "llama3":
        factor = _number(scaling["factor"], "factor", where)
        low = _number(scaling["low_freq_factor"], "low_freq_factor", where)
        high = _number(scaling["high_freq_factor"], "high_freq_factor", where)
        if high <= low:
            raise ConstraintError(f"{where}: rope_scaling 'llama3' needs high_freq_factor > low_freq_factor, "
                                  f"got {high} and {low}")
        L0 = _number(scaling["original_max_position_embeddings"], "original_max_position_embeddings", where)
        wavelen = 2.0 * math.pi / inv
        s = (L0 / wavelen - low) / (high - low)
        out = np.where(wavelen > L0 / low, inv / factor, inv)
        medium = (wavelen >= L0 / high) & (wavelen <= L0 / low)
        return np.where(medium, (1.0 - s) * inv / factor + s * inv, out), 1.0
    # yarn
    L0 = _original_len(scaling, max_position_embeddings, kind, where)
    factor = scaling.get("factor")
    if factor is None:
        if max_position_embeddings is None:
            raise ConstraintError(f"{where}: rope_scaling 'yarn' lacks factor: give it, or max_position_embeddings= "
                                  f"(factor = max_position_embeddings / original_max_position_embeddings)")
        factor = _number(max_position_embeddings, "max_position_embeddings", where) / L0
    factor = _number(factor, "factor", where)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0

    att = scaling.get("attention_factor")
    ms, ms_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
    if att is None:
        att = mscale(factor, float(ms)) / mscale(factor, float(ms_all)) if ms and ms_all else mscale(factor)
    att = _number(att, "attention_factor", where)
    beta_fast = _number(scaling.get("beta_fast") or 32, "beta_fast", where)
    beta_slow = _number(scaling.get("beta_slow") or 1, "beta_slow", where)

    def dim_of(rotations):  # the dimension whose wavelength makes `rotations` turns over L0
        return R * math.log(L0 / (rotations * 2.0 * math.pi)) / (2.0 * math.log(theta))

    lo, hi = dim_of(beta_fast), dim_of(beta_slow)
    if scaling.get("truncate", True):
        lo, hi = math.floor(lo), math.ceil(hi)
    lo, hi = max(lo, 0), min(hi, R - 1)
    if lo == hi:
        hi += 0.001  # as HF: no zero-width ramp
    ramp = np.clip((np.arange(R // 2, dtype=np.float64) - lo) / (hi - lo), 0.0, 1.0)
    extrap = 1.0 - ramp
    return (inv / factor) * (1.0 - extrap) + inv * extrap, att
