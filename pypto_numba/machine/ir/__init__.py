"""LLVM IR building blocks for the hand-written kernels, each defined once.

==============  ==================================================================================
``vector``      constants and run-time splats, lane folds, ``fma``/``mul_add``, ``scalef``, :class:`FOps`
                (float32 formulas on a scalar or a vector) and :class:`IOps` (32-bit bit tricks)
``convert``     float32 <-> bf16 / fp16 bits (``widen_ir``, ``narrow_ir``), ``round_ir``
``memory``      loads/stores at element offsets, ``load_widen``, ``store_narrow``,
                ``stream_store``, ``masked_load``, ``prefetch``, ``fence``
``kinds``       the numba type checks of kernel-view arrays (``storage_array``, ``f32_array``,
                ``bf16_array``), the ``bfloat`` type :class:`BFloat`, ``target_has``, ``target_has_bf16_dot``
``lines``       the loop template: a span as head, whole 64-byte lines, tail (``line_span``,
                ``copy_lines``; ``first_line``, ``line_head`` for numba loops)
==============  ==================================================================================

The numba rules these kernels follow (uint64 offsets, fast-math flags, vector width) are stated
in ``machine/jit.py``. Numba-callable intrinsics built from these live with their users
(``machine/tile.py``, ``machine/vmath.py``, ``machine/dtypes.py``, the op modules).
"""

from .convert import (  # noqa: F401
    bf16_bits_ir,
    bf16_value_ir,
    fp16_bits_ir,
    fp16_value_hw,
    fp16_value_ir,
    narrow_ir,
    round_ir,
    widen_ir,
)
from .kinds import STORAGE_KINDS, BFloat, bf16_array, f32_array, storage_array, target_has, target_has_bf16_dot  # noqa: F401
from .lines import LINE, copy_lines, first_line, line_head, line_span, steps  # noqa: F401
from .memory import (  # noqa: F401
    PREFETCH_L1,
    PREFETCH_L2,
    fence,
    load,
    load_widen,
    masked_load,
    prefetch,
    ptr,
    raw_type,
    store_narrow,
    stream_store,
)
from .vector import CONTRACT, F32, I32, I64, FOps, IOps, const, fma, fold_halves, mul_add, scalef, splat  # noqa: F401
