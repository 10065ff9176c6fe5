"""Helpers shared by the tests (``from helpers import make, ...``; pyproject puts tests/ on the path):
storage dtypes, random inputs, the plan == counted check, and marks for CPU-dependent paths."""

from __future__ import annotations

import ml_dtypes
import numba
import numpy as np
import pytest

import pypto_numba as pn

DTYPES = ("fp32", "bf16", "fp16")
NP_DTYPE = {"fp32": np.float32, "bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def make(shape, dtype: str, rng: np.random.Generator, scale: float = 1.0, loc: float = 0.0) -> np.ndarray:
    """A random normal array of ``shape`` in storage ``dtype``."""
    return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(NP_DTYPE[dtype])


def pair_tables(cos, sin):
    """Split-half (HF) rope tables -> the GPT-J pair tables rope.interleaved expects (it refuses
    split-half ones it can tell apart): column 2k and 2k+1 both hold frequency k."""
    half = cos.shape[-1] // 2
    return tuple(np.repeat(t[..., :half], 2, axis=-1) for t in (cos, sin))


def run_traced(fn, *args, **kwargs):
    """Call a strategy under trace(); return (result, record)."""
    with pn.trace() as t:
        out = fn(*args, **kwargs)
    assert len(t.records) == 1, [r.strategy for r in t.records]
    return out, t.records[0]


def assert_cost_matches_plan(record):
    """The Cost the kernels counted equals the Cost the plan predicted, field by field."""
    diff = record.cost.differences(record.planned)
    assert not diff, f"{record.op}.{record.strategy}: counted != planned: {diff}"


def _host_has_bf16_dot() -> bool:
    """Whether the CPU numba compiles for (NUMBA_CPU_FEATURES, else the host's) has AVX512_BF16."""
    import llvmlite.binding as llvm

    from pypto_numba.machine.ir import BFloat

    features = numba.config.CPU_FEATURES or llvm.get_host_cpu_features().flatten()
    return BFloat is not None and "+avx512bf16" in features.split(",")


# The VDPBF16PS form of the bf16 pairs blocks runs only where the CPU has AVX512_BF16.
needs_avx512_bf16 = pytest.mark.skipif(not _host_has_bf16_dot(),
                                       reason="needs AVX512_BF16 (VDPBF16PS), which this CPU lacks")


def torch_copy(a):
    """A torch tensor holding a copy of NumPy array ``a``'s bits (bf16 through int16; torch is
    imported only here, by the torch tests)."""
    import torch

    a = np.ascontiguousarray(a)
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def bits_of(x):
    """(bytes, shape) of a NumPy array or a torch tensor, for bit-for-bit comparisons of either."""
    if type(x).__module__.startswith("torch"):
        import torch

        x = x.contiguous()
        x = x.view(torch.int16) if x.dtype == torch.bfloat16 else x
        return x.numpy().tobytes(), tuple(x.shape)
    return np.ascontiguousarray(x).tobytes(), tuple(np.shape(x))
