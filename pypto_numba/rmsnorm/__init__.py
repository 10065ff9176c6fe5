"""RMSNorm over the last dim: plain, fused with the residual add that precedes it, and deferred
into the next Linear.

Math (``x[..., D]`` read as rows ``[N, D]``; ``weight[D]`` fp32 or x's dtype; all math fp32)::

    plain      y = x * inv(mean(x**2) + eps) * (weight + offset)
    fused_add  h = round_r(residual + x);  y = h * inv(mean(h**2) + eps) * (weight + offset)
               -> (y in x's dtype, h in the residual's dtype)
    deferred   r = inv(mean(x**2) + eps)  -> fp32 [N] (x's leading dims); the next Linear applies
               it: linear.fused_bias(x, fold(weight, W, offset), row_scale=r)

``offset`` (fp32; 1.0 is Gemma's ``(1 + w)``) is added to the widened weight once per task.
``inv`` is the normaliser: ``"rsqrt"`` (one vector rsqrt) or ``"recip_sqrt"`` (sqrt, then a
reciprocal). On the CPU both evaluate the same fp32 expression, so they give the same IEEE bits;
only their counted vector instructions differ (3 or 4 per row). On the device they are different
instructions with different rounding: switching a kernel from ``recip(sqrt(x))`` to ``rsqrt``
changed a mismatch rate from 0.0031 % to 20.7 % (npu-facts 8.3, pypto-lib PR #361), and the
device rsqrt has a ``high_precision=`` variant. The option lets a plan count what a device
kernel would run; it does not emulate the device's rounding of either.

``fused_add`` normalises the *rounded* new residual (what a separate add kernel would write and
the norm read back), so its results are exactly ``new = (residual + x)`` rounded to the residual's
dtype and ``normed = plain(new, weight).astype(x.dtype)`` (one rounding from fp32 either way).

Strategies (N rows, bx, br, bw = itemsizes of x, residual, weight, T = rows per task,
tasks = ceil(N/T))::

    plain      1 vector kernel, GM read N*D*bx + tasks*D*bw, write N*D*bx
    fused_add  1 vector kernel, GM read N*D*(bx + br) + tasks*D*bw, write N*D*(bx + br)
    deferred   1 vector kernel, GM read N*D*bx, write N*4

``deferred`` is the "deferred 1/rms denominator" of production Qwen3-14B decode
(``inv_rms_states``, npu-facts 8.4): ``(x * r_i * g) @ W^T = r_i * (x @ (W * g)^T)``, so the gamma
``g = weight + offset`` is folded into the next Linear's weight once, offline (:func:`fold`, NumPy),
and the Linear multiplies its fp32 accumulator by ``r_i`` in the epilogue. Against ``plain`` +
Linear it saves the ``N*D*bx`` write of the normed rows and their read back (the Linear reads x
instead), and the weight row of every task; it rounds ``W * g`` once to the weight's dtype instead
of the normed activations to x's. ``r`` comes from plain's kernel, its row loop and its
``1/sqrt(ss/D + eps)`` (:func:`~.kernels.row_rstd`), and plain stores ``(x * r) * g`` from that
same fp32 ``r`` (``tile.store_scale_mul``), so ``plain(x, w)`` is exactly
``((x * deferred(x)[:, None]) * w)`` rounded once to x's dtype. ``r`` is IEEE ``1/sqrt`` (not the
estimate-and-refine form the kernel's fast-math flags would allow): a row holding ``inf`` has
``r = 0`` (its finite elements normalise to 0, the ``inf`` to NaN, as the math), and an all-zero
row with ``eps=0`` has ``r = inf`` (plain gives ``0 * inf = NaN``).

An add kernel then ``plain`` reads the new residual back: ``fused_add`` saves one kernel and
N*D*br bytes of GM reads (plus, with an fp32 residual and bf16 x, the cast kernel of the normed
rows: N*D*(br + bx) more). Qwen3, Llama and DeepSeek run it before every attention and MLP block.

Vector ops: 4 per element (square, sum, *inv, *w; deferred 2) + 3 per row (/D, +eps, rsqrt;
recip_sqrt 4) + 2 per element for a 16-bit x (widen, narrow; deferred 1, widen only); weight: D
per task to widen a 16-bit one, D per task for a nonzero offset (not deferred); fused_add: 1 per
element (the add) + 2 per element for a 16-bit residual.

Tiling: one task = T rows of D, T from the profile's ``rmsnorm_row_tile`` lowered until the
``[T, D]`` fp32 square tile fits the 64 KiB reduction limit and the tiles fit UB. The row loop is
written as ``rope.rmsnorm``'s, but LLVM vectorises each kernel's fp32 sum of squares on its own
(``reassoc``, machine/jit.py): the two agree within one storage ulp, not bit for bit, so
``rope.rmsnorm`` keeps its own kernel (and bits) for now.

The package: ``kernels.py`` (the one kernel of the three), ``plans.py`` (tiles, plans, option
checks), ``calls.py`` (the public strategies and :func:`fold`), ``spec.py`` (the lab spec).
"""

from __future__ import annotations

# the internals as importable as when rmsnorm was one module
from .calls import _CALLS, _Call, deferred, fold, fused_add, plain  # noqa: F401
from .kernels import (  # noqa: F401
    ADD_OPS,
    CAST_OPS,
    INVS,
    NORM_OPS,
    ROW_OPS,
    SUMSQ_OPS,
    WIDEN_OPS,
    _rmsnorm_kernel,
    _widen_weight,
    row_rstd,
)
from .plans import _plan, plan_deferred, plan_fused_add, plan_plain  # noqa: F401
from .spec import OP, reference

__all__ = ["OP", "deferred", "fold", "fused_add", "plain", "plan_deferred", "plan_fused_add", "plan_plain",
           "reference"]
