"""What an intrinsic's typing and code generator ask about their operands and target: the numba
type checks of kernel-view arrays (float32 = fp32, uint16 = bf16 bits, int16 = fp16 bits;
``machine/dtypes.py``), LLVM's ``bfloat`` type, and whether the target CPU has VDPBF16PS."""

from __future__ import annotations

from llvmlite import ir
from numba import types

STORAGE_KINDS = (types.float32, types.uint16, types.int16)


def storage_array(a) -> bool:
    """``a`` is a numba array of a storage kernel-view dtype (fp32, bf16 or fp16 bits)."""
    return isinstance(a, types.Array) and a.dtype in STORAGE_KINDS


def f32_array(a) -> bool:
    """``a`` is a numba float32 array."""
    return isinstance(a, types.Array) and a.dtype == types.float32


def bf16_array(a) -> bool:
    """``a`` is a numba array of bf16 bits (uint16)."""
    return isinstance(a, types.Array) and a.dtype == types.uint16


try:
    class BFloat(ir.types._BaseFloatType):
        """LLVM's ``bfloat`` (llvmlite.ir has none): only to type VDPBF16PS's operands."""

        null = "0.0"
        intrinsic_name = "bf16"

        def __str__(self):
            return "bfloat"

    BFloat._create_instance()
except Exception:  # an llvmlite without this (private) base class: callers use an FMA form
    BFloat = None


def target_has(context, feature: str) -> bool:
    """Whether the CPU numba compiles for has ``feature`` (an LLVM name: ``"avx512f"``): the
    feature string numba's codegen uses (``NUMBA_CPU_FEATURES``, else the host's), so a cached
    kernel matches it."""
    try:
        features = context.codegen()._get_host_cpu_features()
    except Exception:  # a numba without this hook: the portable form is right everywhere
        return False
    return f"+{feature}" in str(features).split(",")


def target_has_bf16_dot(context) -> bool:
    """Whether the target has AVX512_BF16 (VDPBF16PS) and llvmlite has the ``bfloat`` type."""
    return BFloat is not None and target_has(context, "avx512bf16")
