"""``OpSpec``: everything the lab (compare, advise, report, the CLI) needs to know about one op.

Each op module ends with ``OP = OpSpec(...)``. Creating the spec registers it (see
:func:`pypto_numba.strategy.register_op`), in the order the op modules are imported by
``pypto_numba/__init__.py``: that import line is the list of ops. The lab layer reads only specs;
it holds no per-op table or branch.

A spec declares:

- ``seed``: the seed document's recommendation (preferred, alternative, deciding criterion); the
  strategies themselves are the module's ``@register``-ed functions (``OpSpec.strategies``);
- ``reference``: the float64 oracle compare scores registry rows against, and ``oracles``, the
  public oracles that :mod:`pypto_numba.reference` re-exports by name;
- ``inputs``: how compare makes inputs from a shape; ``variants``: compare's rows when they are
  not simply the registered strategies; ``outputs``: which arrays of a result are scored;
- ``tolerance``: the precision policy and (rtol, atol) per dtype;
- ``advise``: the scenario rule, ``(profile, **keywords) -> (candidates, seed choice, notes)``;
  its keyword defaults are the scenario's defaults and the keywords scenarios.toml may use;
- ``tiles`` (optional): the tile search space of a scenario, ``(profile, **keywords) ->
  iterable of Candidate`` with ``Candidate.tiles`` set to the plan's tile keywords (one per
  strategy and legal-looking tile shape; the plans refuse the rest). It gets every advise
  keyword, defaults filled in. :func:`pypto_numba.tune.search` ranks them, advise takes the best;
- ``figures`` (optional): published device timings of the op (:class:`DeviceFigure`) that
  ``strategies/calibration.md`` sets the estimate against.

Sweeps are data, not code: a scenario's sweep axis, keys and values are its rows in
``strategies/scenarios.toml``, and any advise keyword can be swept.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable, NamedTuple

import numpy as np

from .. import precision
from ..errors import ShapeError
from ..machine import dtypes


class Seed(NamedTuple):
    """The seed document's recommendation for an op (../shared/seed, section 十)."""

    preferred: str
    alternative: str  # None when the seed names no alternative
    criterion: str


@dataclasses.dataclass(frozen=True)
class Inputs:
    """How compare builds deterministic inputs for an op from a shape."""

    make: Callable  # (shape tuple, dtype name, numpy Generator) -> tuple of inputs
    default_shape: tuple
    help: str  # the --shape order, e.g. "M,K,N, e.g. 16,2048,2048"


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """The precision policy compare applies and its (rtol, atol); ``None`` keeps the policy's default."""

    policy: str = precision.DEFAULT_POLICY
    fp32: tuple = (None, None)
    half: tuple = (None, None)  # bf16 and fp16 (and any other dtype name)

    def __call__(self, dtype: str) -> tuple:
        return self.fp32 if dtype == "fp32" else self.half


@dataclasses.dataclass(frozen=True)
class Variant:
    """One row of a comparison: how to call it and its float64 reference.

    ``reference(*inputs, mirror=True, **options)`` is the row's kernel-faithful golden (see
    :func:`mirrored`): a reference that does not declare ``mirror`` itself is wrapped here."""

    label: str
    call: Callable  # (*inputs, **options) -> result
    reference: Callable  # (*inputs, mirror=False, **options) -> float64 array, or a tuple matching ``outputs``
    recommended: bool = False

    def __post_init__(self):
        object.__setattr__(self, "reference", mirrored(self.reference))


# --- kernel-faithful goldens (``mirror=True``) -------------------------------------------------
# A mirror is the float64 reference rounded to the storage dtype at exactly the strategy's cast
# points. Most strategies narrow only at the final store, so the default mirror is the truth
# rounded once to the inputs' storage dtype; a reference with inner cast points declares
# ``mirror`` itself (``@mirrors``) and rounds with :func:`to_storage`.

def to_storage(x, dtype: str, mode=None) -> np.ndarray:
    """``x`` rounded to storage dtype ``dtype`` (via float32, then by cast mode ``mode``; None: the
    mode in force, ``use_cast_mode`` / ``$PYPTO_NUMBA_CAST_MODE`` / the default profile's, as a
    strategy's vector casts narrow; a FIXPIPE cast passes ``"rint"``), back in float64. The one
    rounding call of every mirror; compare runs a mirror under its strategy's resolved mode."""
    from ..machine.profile import resolve_cast_mode

    mode = resolve_cast_mode(None, None, "mirror") if mode is None else mode
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        return dtypes.to_float32(dtypes.from_float32(x.astype(np.float32), dtype, mode)).astype(np.float64)


def storage_of(*inputs) -> str:
    """The storage dtype name of the first floating-point array among ``inputs`` (fp32 if none)."""
    names = (dtypes.storage_name(a.dtype) for a in inputs if isinstance(a, np.ndarray))
    return next((n for n in names if n), "fp32")


def mirrors(fn):
    """Mark a reference that takes ``mirror=`` (and ``profile=``, or ``**options``) and rounds at its
    strategy's cast points itself."""
    fn.mirrors = True
    return fn


def mirrored(reference):
    """``reference`` with the keywords ``mirror`` and ``profile`` (for a mirror that plans its tiles):
    unchanged if it declares them (``@mirrors``), else ``mirror=True`` rounds each floating-point
    output once to the inputs' storage dtype (a strategy whose only narrowing is its final store);
    integer outputs (ids) are returned as they are."""
    if getattr(getattr(reference, "func", reference), "mirrors", False):
        return reference

    def reference_with_mirror(*inputs, mirror=False, profile=None, **options):
        ref = reference(*inputs, **options)
        if not mirror:
            return ref
        dtype = storage_of(*inputs)
        one = lambda r: to_storage(r, dtype) if np.asarray(r).dtype.kind == "f" else r  # noqa: E731
        return tuple(one(r) for r in ref) if isinstance(ref, tuple) else one(ref)

    reference_with_mirror.mirrors = True
    return reference_with_mirror


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One strategy (or composition) that advise prices from its plans."""

    label: str
    plans: Callable  # () -> tuple of Plans (several for a composition)
    fused: bool = True
    tiles: dict = None  # the tile keywords its plans were given (None: the profile's defaults)
    shape: tuple = None  # compare's --shape for the scenario (tune.search(measure=True) runs it)


@dataclasses.dataclass(frozen=True)
class DeviceFigure:
    """A published device timing of one scenario, for the calibration page (npu-facts 8.5, 7)."""

    label: str
    scenario: dict      # the op's advise keywords
    strategy: str       # the strategy whose plans run it
    seconds: float      # the published time
    source: str         # e.g. "npu-facts 8.5, 7"
    tiles: str = "default"  # "default": the profile's default tiles; "best": tune.search's best
    flops: int = 0      # the work, for a throughput row (0: none)
    throughput: str = ""  # the published throughput, e.g. "220 TFLOPS"
    bound: str = ""     # the bound its source states ("" : none stated); the page checks it
    within: float = 0.0  # the estimate must be within this factor of ``seconds`` (0: no check)
    note: str = ""      # what the device run did that the model does or does not express


def _single(result) -> tuple:
    return (result,)


@dataclasses.dataclass(frozen=True)
class OpSpec:
    """One op as the lab sees it; see the module docstring for what each field means."""

    name: str
    seed: Seed
    inputs: Inputs
    advise: Callable  # (profile, **scenario) -> ([Candidate], seed choice or None, notes)
    reference: Callable = None  # (*inputs, strategy=name, **options) -> reference, for registry rows
    variants: Callable = None  # () -> [Variant]; None: one row per registered strategy
    outputs: Callable = _single  # result -> tuple of arrays to score
    tolerance: Tolerance = Tolerance()
    oracles: dict = dataclasses.field(default_factory=dict)  # public name -> float64 oracle
    tiles: Callable = None  # (profile, **scenario) -> iterable of Candidate with .tiles; None: no search
    figures: tuple = ()  # DeviceFigure records (published device timings)

    def __post_init__(self):
        from ..strategy import register_op

        register_op(self)

    @property
    def strategies(self) -> list:
        """The op's registered strategies (each public function's ``@register`` in the op's module)."""
        from ..strategy import strategies

        return strategies(self.name)

    @property
    def scenario_keywords(self) -> list:
        """The keywords ``advise(op, ...)`` takes, in order."""
        return [p for p in inspect.signature(self.advise).parameters if p != "profile"]

    def rows(self) -> list:
        """compare's rows: the declared variants, else one per registered strategy."""
        if self.variants is not None:
            return self.variants()
        return [Variant(e.name, e.fn, functools.partial(self.reference, strategy=e.name), e.recommended)
                for e in self.strategies]


# --- input helpers shared by the ops' ``Inputs.make`` ------------------------------------------

def normal(shape, dtype, rng, scale=1.0, loc=0.0) -> np.ndarray:
    """Gaussian values rounded to float32, then to the storage dtype."""
    return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(dtypes.STORAGE[dtype])


def grid(**axes):
    """Every combination of the axes' values as keyword dicts, e.g. ``grid(tile=(1024, 2048))``;
    None values are left out of the dicts (the plan's default)."""
    import itertools

    names = list(axes)
    for values in itertools.product(*(axes[n] for n in names)):
        yield {n: v for n, v in zip(names, values) if v is not None}


def pow2(lo: int, hi: int) -> tuple:
    """Powers of two from ``lo`` to ``hi`` inclusive."""
    out, v = [], 1
    while v <= hi:
        if v >= lo:
            out.append(v)
        v *= 2
    return tuple(out)


MAX_TILE_PAIRS = 2 ** 17
"""Attention search spaces leave out (query tile, KV tile) grids of more than this many pairs per
head: planning walks every pair in Python (the default 64 x 128 flash tiles of a 32K prefill are
exactly this many)."""


def attention_grid(q_len: int, kv_len: int):
    """kv_tile x q_tile dicts for an attention search: KV tiles of 32 to 512 (x query tiles of 16
    to 256 at prefill), within MAX_TILE_PAIRS."""
    if q_len == 1:
        return [{"kv_tile": kv} for kv in pow2(32, 512)]
    return [{"kv_tile": kv, "q_tile": q} for kv in pow2(32, 512) for q in pow2(16, 256)
            if -(-q_len // q) * -(-kv_len // kv) <= MAX_TILE_PAIRS]


def elems(lo: int, hi: int) -> tuple:
    """Element tile sizes from ``lo`` to ``hi``: powers of two and 1.5x powers of two."""
    return tuple(sorted(set(v for p in pow2(lo, hi) for v in (p, p * 3 // 2) if lo <= v <= hi)))


def need(shape, n, help_text) -> tuple:
    """``shape`` when it has ``n`` numbers, else compare's ShapeError naming the order."""
    if len(shape) != n:
        raise ShapeError(f"compare: --shape must have {n} numbers ({help_text}), got {shape}")
    return shape
