"""RoPE (split-half and GPT-J interleaved), per-head RMSNorm, and the fused Qwen3 RMSNorm+RoPE.

Math (``x[..., S, H, D]``; ``cos``, ``sin``: ``[S, R]`` or ``[..., S, R]`` broadcast over the
leading dims of x and over the H heads; ``R <= D`` even; dims ``R..D`` pass through unchanged)::

    standard     h = R/2:  out[i]   = x[i]*cos[i]     - x[h+i]*sin[i]        (i < h)
                           out[h+i] = x[h+i]*cos[h+i] + x[i]*sin[h+i]        (rotate_half, NeoX/HF)
    interleaved  out[2k]   = x[2k]*cos[2k]     - x[2k+1]*sin[2k]             (k < R/2, GPT-J)
                 out[2k+1] = x[2k+1]*cos[2k+1] + x[2k]*sin[2k+1]
    rmsnorm      y = x * rsqrt(mean(x**2, over D) + eps) * weight            (weight[D])
    fused        standard(rmsnorm(x, weight, eps), cos, sin), fp32 between the two
    cos_sin      f[p, i] = positions[p] * theta**(-2i/R); cos = cos(cat(f, f)), sin = sin(cat(f, f))
                 (layout="interleaved": cos[2i] = cos[2i+1] = cos(f[i]), the tables interleaved needs;
                 scaling=: HF rope_scaling linear / dynamic / llama3 / yarn, rope/scaling.py)

All math is fp32 with one cast to the storage dtype at the end (cos/sin and weight share x's
storage dtype). ``rmsnorm`` also accepts ``x[S, D]`` (read as H=1) and ``x[D]``.

Strategies (T = token tile, N = tokens = prod(x.shape[:-2]), n_lead = prod(x.shape[:-3]),
tasks = n_lead*ceil(S/T), b = itemsize, X = N*H*D*b = the bytes of x)::

    standard      1 vector kernel, GM read X + 2*N*R*b, write X
    interleaved   1 vector kernel, GM read X + 2*N*R*b, write X   (+ gathermask split / assemble ops)
    rmsnorm       1 vector kernel, GM read X + tasks*D*b, write X
    fused_rmsnorm 1 vector kernel, GM read X + tasks*D*b + 2*N*R*b, write X
    cos_sin       1 vector kernel, GM read 8*P + tasks*4*R (positions, inverse frequencies in
                  float64), write 2*P*R*b

``rmsnorm`` then ``standard`` costs 2 kernels and X read + X written more than ``fused_rmsnorm``
(the normed tensor makes a GM round trip): 4X of x traffic instead of 2X, so on a memory-bound
machine the fused kernel is up to 2x faster.

Tiling (npu-facts 3, the Qwen3 q/k RMSNorm+RoPE kernel): one task = T tokens x all H heads x D
(a contiguous ``T*H*D`` block of x), T from the profile's ``rope_token_tile`` (8); the last tile
of each leading index is a valid-shape tail. UB per task (last dims padded to 32 B):

- ``x_ub[T, H, D]`` storage (for 16-bit dtypes it takes the cast result back out: x is dead by then);
- 16-bit: ``xf_ub[T, H, D]`` fp32 (the widened tile, rotated in place);
- norm: ``sq_ub[T, H, D]`` fp32 (x*x, reduced over D -- a reduction tile, <= 64 KiB -- then reused
  for the normed result), ``rstd_ub[T, H, 8]`` fp32, ``w_ub[D]`` (+ ``wf_ub[D]`` fp32 for 16-bit);
- rope: ``cos_ub``, ``sin_ub[T, R]`` (+ fp32 copies for 16-bit);
- interleaved: the gathermask even/odd halves ``x_even``, ``x_odd[T, H, R/2]`` and
  ``cos_even``, ``cos_odd``, ``sin_even``, ``sin_odd[T, R/2]``, fp32.

Qwen3 q (bf16, H=16, D=128, T=8): 32 + 64 + 64 + 4 + 0.75 + 12 KiB = 176.75 KiB <= 192 KiB, and
sq_ub = 8*16*128*4 = 64 KiB: exactly the reduction limit, so T=8 is the largest token tile that
kernel could use. With the default ``token_tile`` the plan lowers T until the tiles fit (recorded
in ``plan.params["token_tile"]``); an explicit ``token_tile`` that does not fit is a TileError.

On the CPU each head row's D results are computed into a small per-thread staging row (the out
tile in UB) by one LLVM IR loop for every dtype (``rotate_ir._rotate``: 16-lane steps, exact
widening on load, one rounding on store; ``rotate_plain`` is its readable form), and written
out at once. fp32 rope alone on line-aligned head rows skips the staging: each row goes from
registers to GM, and a task walks its T tokens head row by head row across the tokens, keeping
T line streams in flight (``kernels._rotate_tokens``). A task's output (T tokens x H x D) is
one contiguous run of out; for outputs of >= ``STREAM_MIN_BYTES`` (4 MiB) every whole 64-byte
line of that run is written with a streaming (non-temporal) store (``lines``), which skips the
read-for-ownership of the destination lines that otherwise costs a third of the DRAM traffic of
this memory-bound op. Every strategy takes ``out=`` (x's shape and dtype; ``out=x`` works in
place: a head row is read before it is written). A fresh output costs its page faults on top
(the kernel zeroes each new page before the first write): pass ``out=`` to reuse one.

Vector ops per element (cast = 1 for bf16/fp16, else 0; rows = N*H): rope 3 per rotated element
(2 mul + 1 add) + cast*(2 per rotated element + 2R per token for cos/sin); interleaved adds 2 per
rotated element (gathermask split + assemble back) and 2R per token (gathermask of cos/sin);
rmsnorm 4 per element (square, add, *rstd, *w) + 3 per row (/D, +eps, rsqrt) + cast*(2 per
element + D per task for the weight); fused = rmsnorm + rope with the casts of the norm only.

The package: ``rotate_ir`` (the rotation of one head row in LLVM IR), ``rotate_plain`` (its
readable form in plain numba loops, same bits), ``lines`` (how a task writes its rows: whole
lines, streaming stores), ``kernels`` (the numba kernels), ``plans`` (shapes, tiles and counted
cost), ``public`` (the strategies, their call memo, and cos_sin), ``scaling`` (HF rope_scaling).
"""

from .plans import plan_cos_sin, plan_fused_rmsnorm, plan_interleaved, plan_rmsnorm, plan_standard
from .public import _CALLS, cos_sin, fused_rmsnorm, interleaved, rmsnorm, standard

__all__ = ["standard", "interleaved", "rmsnorm", "fused_rmsnorm", "cos_sin", "plan_standard",
           "plan_interleaved", "plan_rmsnorm", "plan_fused_rmsnorm", "plan_cos_sin"]

from .spec import OP  # noqa: E402  (the lab's view of the op; after the strategies it names)
