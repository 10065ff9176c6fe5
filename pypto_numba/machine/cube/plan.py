"""Plan and run the cube walk: :func:`plan_walk` (tiles checked, exact counts) and
:func:`run_walk` (per-thread scratch, BLAS on one thread, the kernel)."""

from __future__ import annotations

import dataclasses

import numba
import numpy as np

from ...errors import ConstraintError
from .. import tile
from ..plan import ITEMSIZE, KernelPlan, cube_tiles
from ..profile import HardwareProfile, load_profile
from . import amx
from .blas import _ONE_F32_BITS, ARG_SLOTS, dynamic_tasks, single_thread_blas
from .decode import use_loops
from .walk import matmul_nt_kernel

GROUP_EDGE = 1024
"""fp32 prefill on the CPU: walk blocks are grouped into BLAS calls of about GROUP_EDGE x
GROUP_EDGE outputs (see :func:`run_walk`)."""


def _groups(m: int, n: int, m1: int, n1: int, threads: int):
    """(gm, gn): blocks per BLAS call for the fp32 merged-K path, keeping >= 4 calls per thread.

    ``threads`` is the process's thread pool size (``NUMBA_NUM_THREADS``), not the current
    ``numba.get_num_threads()``: the grouping (and so BLAS's order of the fp32 additions) must
    not change with ``set_num_threads``, so results stay bit-identical for any thread count."""
    tm, tn = -(-m // m1), -(-n // n1)
    gm = max(1, min(tm, GROUP_EDGE // m1))
    gn = max(1, min(tn, GROUP_EDGE // n1))
    while (gm > 1 or gn > 1) and -(-tm // gm) * -(-tn // gn) < 4 * threads:
        if gm >= gn:
            gm = max(1, gm // 2)
        else:
            gn = max(1, gn // 2)
    return gm, gn


def scratch(
    m1: int,
    k1: int,
    n1: int,
    k0: int,
    a_is_f32: bool,
    skinny: bool,
    threads: int = None,
    k: int = 0,
):
    """Per-thread scratch of one :func:`matmul_nt_kernel` call (allocated once per call):
    ``(acc, a_l1, b_l1, w_l0, slots)``.

    Parameters
    ----------
    m1, k1, n1, k0 : the tiles
    a_is_f32 : fp32 operands are read in place (no L1 copies)
    skinny : the decode loops (no L1 copy of b; a copy of a over the whole of K)
    threads : threads to allocate for (default: ``numba.get_num_threads()``)
    k : the full K, which sizes the decode path's widened copy of a: [mL1, K]
    """
    nth = numba.get_num_threads() if threads is None else threads
    la = 1 if a_is_f32 else m1
    lb = 1 if (a_is_f32 or skinny) else n1
    slots = np.zeros((nth, ARG_SLOTS), np.int32)
    slots[:, 6:8] = _ONE_F32_BITS  # alpha = beta = 1.0f
    slots[:, 8] = ord("T")  # little-endian: the first byte of the slot is the character
    slots[:, 9] = ord("N")
    return (
        np.empty((nth, m1, n1), np.float32),  # L0C tiles of one block
        np.empty((nth, la, max(k, k1) if skinny else k1), np.float32),  # fp32 copy of a (16-bit only)
        np.empty((nth, lb, k1), np.float32),  # fp32 L1 copy of b (16-bit, not skinny)
        np.empty((nth, 1, max(k0, amx.GROUP * amx.TILE**2 if skinny else 16)), np.float32),  # skinny: result slots
        slots,  # BLAS argument slots
    )


@dataclasses.dataclass(frozen=True)
class CubeWalk:
    """The cube walk for one matmul: resolved tiles, cube buffers and the exact counts."""

    m: int
    k: int
    n: int
    tiles: tuple  # ((mL0, mL1), (kL0, kL1), (nL0, nL1))
    a_dtype: str
    b_dtype: str
    out_dtype: str
    bias_dtype: str | None
    buffers: tuple
    tasks: int
    gm_read_bytes: int
    gm_write_bytes: int
    cube_flops: int
    row_scale: bool = False  # an fp32 scale per output row, applied in the epilogue

    @property
    def params(self) -> dict:
        (m0, m1), (k0, k1), (n0, n1) = self.tiles
        return {"m1": m1, "k1": k1, "n1": n1, "m0": m0, "k0": k0, "n0": n0}

    def kernel_plan(self, name: str, extra_buffers=()) -> KernelPlan:
        """A KernelPlan for a kernel that is exactly this walk (plus any extra buffers)."""
        scaled = self.m * self.n if self.row_scale else 0  # one fp32 multiply per output
        return KernelPlan(
            name=name,
            unit="cube",
            tasks=self.tasks,
            buffers=tuple(self.buffers) + tuple(extra_buffers),
            gm_read_bytes=self.gm_read_bytes,
            gm_write_bytes=self.gm_write_bytes,
            cube_flops=self.cube_flops,
            vector_ops=scaled,
            vector_mix=(("TMUL", "fp32", scaled),) if scaled else (),
        )


def _cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def plan_walk(
    m: int,
    k: int,
    n: int,
    tiles,
    a_dtype: str,
    b_dtype: str = None,
    out_dtype: str = None,
    *,
    bias_dtype: str = None,
    row_scale: bool = False,
    profile=None,
    where: str = "cube",
) -> CubeWalk:
    """Validate ``tiles`` for ``a[m, k] @ b[n, k]^T`` and return the walk's buffers and counts.

    ``tiles = ((mL0, mL1), (kL0, kL1), (nL0, nL1))``; ``b_dtype`` and ``out_dtype`` default to
    ``a_dtype``; ``bias_dtype`` None: no bias; ``row_scale``: an fp32 ``[m]`` scale per output
    row multiplies the accumulator in the epilogue (each block reads its rows' scales: ``m*4``
    bytes per column of blocks, and one vector op per output); ``where`` names the caller in error
    messages.

    Raises TileError (via :func:`~pypto_numba.machine.plan.cube_tiles`: the buffer, its bytes
    and its budget) and ConstraintError when ``k`` exceeds the matmul inner-axis limit.
    """
    prof = profile if isinstance(profile, HardwareProfile) else load_profile(profile)
    b_dtype = b_dtype or a_dtype
    out_dtype = out_dtype or a_dtype
    m, k, n = int(m), int(k), int(n)
    if k > prof.matmul_inner_max:
        raise ConstraintError(
            f"{where}: K = {k} exceeds the matmul inner (last) axis limit {prof.matmul_inner_max} "
            f"of {prof.name} (npu-facts 4.4); split K into chunks and add the partial products"
        )
    buffers = cube_tiles(tiles, a_dtype, b_dtype, prof, where, bias=bias_dtype is not None)
    (m0, m1), (k0, k1), (n0, n1) = ((int(x), int(y)) for x, y in tiles)
    tm, tn = _cdiv(m, m1), _cdiv(n, n1)
    reads = m * k * ITEMSIZE[a_dtype] * tn + n * k * ITEMSIZE[b_dtype] * tm
    if bias_dtype is not None:
        reads += n * ITEMSIZE[bias_dtype] * tm
    if row_scale:
        reads += m * ITEMSIZE["fp32"] * tn
    return CubeWalk(
        m=m, k=k, n=n, tiles=((m0, m1), (k0, k1), (n0, n1)),
        a_dtype=a_dtype, b_dtype=b_dtype, out_dtype=out_dtype, bias_dtype=bias_dtype,
        buffers=tuple(buffers), tasks=tm * tn,
        gm_read_bytes=reads, gm_write_bytes=m * n * ITEMSIZE[out_dtype],
        cube_flops=2 * m * n * k, row_scale=bool(row_scale),
    )


def run_walk(
    a_k: np.ndarray,
    b_k: np.ndarray,
    bias_k,
    out_k: np.ndarray,
    walk_or_params,
    *,
    skinny=None,
    merge_k=True,
    group=True,
    scale_k=None,
):
    """Run :func:`matmul_nt_kernel` on 2-D kernel views with a walk's tiles; returns its counters.

    ``bias_k`` is a 1-D kernel view or None; ``skinny`` forces (True) or forbids (False) the
    hand-written decode loops (default: :func:`.decode.use_loops`); ``merge_k`` issues the kL0 steps of
    one kL1 chunk as one BLAS call (default) instead of one call per kL0 step (same counts, same
    fp32 accumulation; only the order of the fp32 additions inside the chunk differs); ``group``
    (fp32 with ``merge_k``, not with the decode loops) runs groups of walk blocks as one BLAS call of about
    ``GROUP_EDGE`` x ``GROUP_EDGE`` outputs (same counts, per block); ``scale_k``: None, or a
    contiguous float32 ``[M]`` scale per output row, applied to the fp32 accumulator before the
    bias (``out = round(scale[:, None] * acc + bias)``).
    """
    p = walk_or_params.params if isinstance(walk_or_params, CubeWalk) else walk_or_params
    if a_k.dtype != b_k.dtype or (bias_k is not None and bias_k.dtype != a_k.dtype):
        # the kernel picks "fp32 in place" vs "widen into L1" from a's dtype alone
        raise TypeError(f"run_walk: a, b and bias must share one kernel dtype, got {a_k.dtype}, "
                        f"{b_k.dtype}, {None if bias_k is None else bias_k.dtype}")
    if a_k.ndim != 2 or b_k.ndim != 2 or a_k.shape[1] != b_k.shape[1] or out_k.shape != (a_k.shape[0], b_k.shape[0]):
        raise ValueError(f"run_walk: need a[M, K], b[N, K], out[M, N]; got {a_k.shape}, {b_k.shape}, {out_k.shape}")
    has_bias = bias_k is not None
    if not has_bias:
        bias_k = np.zeros(1, a_k.dtype)
    has_scale = scale_k is not None
    if has_scale:
        if scale_k.dtype != np.float32 or scale_k.shape != (a_k.shape[0],):
            raise ValueError(f"run_walk: scale_k must be float32 [{a_k.shape[0]}], got {scale_k.dtype} "
                             f"{scale_k.shape}")
    else:
        scale_k = np.zeros(1, np.float32)
    if skinny is None:
        skinny = use_loops(a_k.shape[0], a_k.dtype)
    skinny = bool(skinny)
    if skinny and a_k.dtype == np.float32 and tile.address(a_k) % tile.ALIGN:
        # decode reads fp32 rows of a in place, with every 64-byte vector load of them split
        # across two lines when a is off a line (NumPy's large arrays start 16 bytes past one):
        # a line-aligned copy is cheaper than the split loads
        aligned, _ = tile.aligned_empty(a_k.shape, "fp32")
        aligned[...] = a_k
        a_k = aligned
    gm = gn = 1
    # prefill only: a decode-shaped gemm (a few rows) is forwarded to gemv by OpenBLAS, and
    # wider calls made it slower
    if a_k.dtype == np.float32 and merge_k and not skinny and group:
        gm, gn = _groups(a_k.shape[0], b_k.shape[0], p["m1"], p["n1"], numba.config.NUMBA_NUM_THREADS)
    work = scratch(p["m1"] * gm, p["k1"], p["n1"] * gn, p["k0"], a_k.dtype == np.float32, skinny, k=a_k.shape[1])
    # bf16 decode loops: whole 16-row groups of weight rows on AMX tiles where the host has them
    use_amx = skinny and amx.applies(a_k.shape[0], a_k.shape[1], p["m1"], a_k.dtype)
    xv = amx.pack_pairs(a_k) if use_amx else amx.NO_PACK
    with single_thread_blas(), dynamic_tasks():
        return matmul_nt_kernel(a_k, b_k, bias_k, out_k, has_bias, scale_k, has_scale, p["m1"], p["k1"], p["n1"],
                                p["m0"], p["k0"], p["n0"], skinny, bool(merge_k), use_amx, xv, gm, gn, *work)
