"""The cube unit on its own: machine/cube/ against a float64 matmul of the widened operands.

Covers every storage dtype, odd M/N/K tails on every tile level, the BLAS and the hand-written
skinny (decode) paths and which one runs by default, the bias epilogue, exact counts of the walk, thread-count
independence, and each budget rule of npu-facts 4.3 (TileError naming buffer, bytes, budget).
"""

from __future__ import annotations

import numba
import numpy as np
import pytest

from helpers import DTYPES, NP_DTYPE, make, needs_avx512_bf16
from pypto_numba.errors import ConstraintError, TileError
from pypto_numba.machine import cube, dtypes
from pypto_numba.machine.cube import blas, ir_blocks
from pypto_numba.machine.cube import plan as cube_plan
from pypto_numba.machine.profile import load_profile

U_OUT = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}
# small tiles so that the test shapes have tails on every level (m, k and n; L0 and L1)
TILES = ((16, 32), (16, 64), (16, 48))


def _run(a, b, bias, tiles=TILES, skinny=None, out_dtype=None):
    dt = dtypes.storage_name(a.dtype)
    out_dt = out_dtype or dt
    m, k = a.shape
    n = b.shape[0]
    walk = cube.plan_walk(m, k, n, tiles, dt, out_dtype=out_dt,
                          bias_dtype=None if bias is None else dt)
    out, out_k = dtypes.empty((m, n), out_dt)
    counted = cube.run_walk(dtypes.kernel_view(a), dtypes.kernel_view(b),
                            None if bias is None else dtypes.kernel_view(bias), out_k, walk, skinny=skinny)
    return out, counted, walk


def _check_close(out, a, b, bias, out_dt):
    """|out - exact| <= u_out*|exact| + (K*2^-24 + u_out) * (|a| |b|^T + |bias|): fp32 accumulation
    error plus one rounding to the output dtype (a wrong tile offset gives O(1) errors)."""
    a64 = a.astype(np.float64)
    b64 = b.astype(np.float64)
    exact = a64 @ b64.T
    mag = np.abs(a64) @ np.abs(b64).T
    if bias is not None:
        exact = exact + bias.astype(np.float64)
        mag = mag + np.abs(bias.astype(np.float64))
    k = a.shape[1]
    bound = U_OUT[out_dt] * np.abs(exact) + (k * 2.0**-24 + U_OUT[out_dt]) * mag
    err = np.abs(out.astype(np.float64) - exact)
    assert np.all(err <= bound), f"max err {err.max()} vs bound {bound[np.argmax(err - bound)]}"


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("m,k,n", [(37, 150, 61), (3, 150, 61), (1, 17, 5), (16, 64, 48)])
def test_matches_float64_with_bias(dt, m, k, n, rng):
    a, b, bias = make((m, k), dt, rng), make((n, k), dt, rng), make((n,), dt, rng)
    out, counted, walk = _run(a, b, bias)
    _check_close(out, a, b, bias, dt)
    assert counted == (walk.tasks, walk.gm_read_bytes, walk.gm_write_bytes, 0, walk.cube_flops)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])  # bf16 -> fp32 out: one extra signature only
def test_no_bias_and_fp32_output(dt, rng):
    a, b = make((21, 70), dt, rng), make((19, 70), dt, rng)
    out, counted, walk = _run(a, b, None, out_dtype="fp32")
    assert out.dtype == np.float32
    _check_close(out, a, b, None, "fp32")
    assert counted[1] == 21 * 70 * a.itemsize * 1 + 19 * 70 * b.itemsize * 1  # one block each way
    assert counted[2] == 21 * 19 * 4


def test_walk_counts_formula():
    """Hand-computed counts: M=37, K=150, N=61 with mL1=32, nL1=48 -> 2 x 2 blocks."""
    walk = cube.plan_walk(37, 150, 61, TILES, "bf16", bias_dtype="bf16")
    assert walk.tasks == 4
    assert walk.gm_read_bytes == 37 * 150 * 2 * 2 + 61 * 150 * 2 * 2 + 61 * 2 * 2
    assert walk.gm_write_bytes == 37 * 61 * 2
    assert walk.cube_flops == 2 * 37 * 61 * 150
    names = {buf.name: (buf.level, buf.nbytes) for buf in walk.buffers}
    assert names["a_l0"] == ("L0A", 16 * 16 * 2)
    assert names["c_l0"] == ("L0C", 16 * 16 * 4)
    assert names["bias_bt"] == ("BT", 16 * 4)
    assert names["a_l1"] == ("L1", 32 * 64 * 2)


@pytest.mark.parametrize("dt", DTYPES)
def test_skinny_and_blas_paths_agree(dt, rng):
    # 13 rows: three 4-row register blocks and a single row; 43 weight rows: one 48-wide block
    # of 10 groups of 4 weight rows, a pair and a single row (gemv_rows' every branch), K = 300:
    # kL1 tail and a < 16-element rest
    a, b, bias = make((13, 300), dt, rng), make((43, 300), dt, rng), make((43,), dt, rng)
    fast, cf, walk = _run(a, b, bias, skinny=False)
    loops, cl, _ = _run(a, b, bias, skinny=True)
    _check_close(loops, a, b, bias, dt)
    _check_close(fast, a, b, bias, dt)
    assert not np.array_equal(fast, np.zeros_like(fast))
    assert cf == cl == (walk.tasks, walk.gm_read_bytes, walk.gm_write_bytes, 0, walk.cube_flops)


@pytest.mark.parametrize("dt, loops, blas", [("fp32", 95, 96), ("fp16", 127, 128), ("bf16", 200, None)])
def test_default_path_by_rows_and_dtype(dt, loops, blas, rng):
    """The walk runs the decode loops below a per-dtype row count (cube.use_loops: where they were
    measured faster), BLAS / the widening walk from it; bf16 always the loops. Same counts."""
    b, bias = make((40, 70), dt, rng), make((40,), dt, rng)
    for m, skinny in ((16, True), (loops, True)) + (((blas, False),) if blas else ()):
        a = make((m, 70), dt, rng)
        assert cube.use_loops(m, dtypes.kernel_view(a).dtype) is skinny
        default, cd, walk = _run(a, b, bias)
        forced, cf, _ = _run(a, b, bias, skinny=skinny)
        assert np.array_equal(dtypes.kernel_view(default), dtypes.kernel_view(forced)), (dt, m)
        assert cd == cf == (walk.tasks, walk.gm_read_bytes, walk.gm_write_bytes, 0, walk.cube_flops)
        _check_close(default, a, b, bias, dt)


@pytest.mark.parametrize("edge", [32, 96, 10**6])
def test_grouped_blas_calls_count_per_block(edge, rng, monkeypatch):
    """fp32 prefill: groups of walk blocks run as one BLAS call (tails in both axes); the counts
    are the walk's, per block, and the values those of the ungrouped walk."""
    monkeypatch.setattr(cube_plan, "GROUP_EDGE", edge)
    a, b, bias = make((100, 70), "fp32", rng), make((200, 70), "fp32", rng), make((200,), "fp32", rng)
    walk = cube.plan_walk(100, 70, 200, TILES, "fp32", bias_dtype="fp32")
    gm, gn = cube_plan._groups(100, 200, 32, 48, numba.config.NUMBA_NUM_THREADS)
    assert (gm * gn > 1) == (edge > 48)
    outs = []
    for group in (True, False):
        out, out_k = dtypes.empty((100, 200), "fp32")
        counted = cube.run_walk(a, b, bias, out_k, walk, group=group)
        assert counted == (walk.tasks, walk.gm_read_bytes, walk.gm_write_bytes, 0, walk.cube_flops)
        _check_close(out, a, b, bias, "fp32")
        outs.append(out)
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_bit_identical_for_one_and_two_threads(rng):
    a, b, bias = make((40, 130), "bf16", rng), make((50, 130), "bf16", rng), make((50,), "bf16", rng)
    two, _, _ = _run(a, b, bias)
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        one, _, _ = _run(a, b, bias)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(one.view(np.uint16), two.view(np.uint16))


def test_blas_thread_count_restored():
    assert cube.blas_available() == (blas._scipy_openblas() is not None)
    if not cube.blas_available():
        pytest.skip("SciPy's OpenBLAS not found on this platform")
    get, _ = blas._scipy_openblas()
    before = get()
    with cube.single_thread_blas():
        assert get() == 1
    assert get() == before


@pytest.mark.parametrize(
    "tiles,dt,level,used,cap",
    [
        (((256, 256), (128, 128), (16, 16)), "fp32", "L0A", 256 * 128 * 4, 65536),
        (((16, 16), (128, 128), (256, 256)), "fp32", "L0B", 256 * 128 * 4, 65536),
        (((256, 256), (16, 16), (256, 256)), "bf16", "L0C", 256 * 256 * 4, 131072),
        (((128, 256), (128, 512), (128, 256)), "fp32", "L1", (256 * 512 + 256 * 512) * 4, 524288),
        (((16, 16), (16, 16), (512, 512)), "bf16", "BT", 512 * 4, 1024),
    ],
)
def test_budget_rules_raise_tile_error(tiles, dt, level, used, cap):
    with pytest.raises(TileError, match=rf"{level} = .* = {used} B but ascend910b has {cap} B"):
        cube.plan_walk(64, 64, 64, tiles, dt, bias_dtype=dt, where="cube.test")


@pytest.mark.parametrize(
    "tiles,match",
    [
        (((16, 24), (16, 16), (16, 16)), r"mL1 % mL0 == 0"),
        (((32, 16), (16, 16), (16, 16)), r"mL0 <= mL1"),
        (((16, 16), (8, 8), (16, 16)), r"not a multiple of 16 elements"),
        (((16, 16), (16, 16)), r"cube_tiles must be"),
        (((0, 16), (16, 16), (16, 16)), r"must be > 0"),
    ],
)
def test_alignment_and_shape_rules(tiles, match):
    with pytest.raises(TileError, match=match):
        cube.plan_walk(64, 64, 64, tiles, "fp32", where="cube.test")


def test_inner_axis_limit():
    with pytest.raises(ConstraintError, match="65535"):
        cube.plan_walk(4, 70000, 4, TILES, "bf16")


def test_default_linear_tiles_fit_every_dtype():
    prof = load_profile("ascend910b")
    for key in ("linear_cube_tiles", "linear_decode_cube_tiles"):
        for dt in DTYPES:
            cube.plan_walk(64, 64, 64, prof.tile(key), dt, bias_dtype=dt, profile=prof)


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_blas_call_per_l0_step(dt, rng):
    """merge_k=False (one BLAS call per kL0 step) gives the same counts and a correct result."""
    a, b, bias = make((37, 150), dt, rng), make((61, 150), dt, rng), make((61,), dt, rng)
    walk = cube.plan_walk(37, 150, 61, TILES, dt, bias_dtype=dt)
    out, out_k = dtypes.empty((37, 61), dt)
    counted = cube.run_walk(dtypes.kernel_view(a), dtypes.kernel_view(b), dtypes.kernel_view(bias),
                            out_k, walk, merge_k=False)
    _check_close(out, a, b, bias, dt)
    assert counted == (walk.tasks, walk.gm_read_bytes, walk.gm_write_bytes, 0, walk.cube_flops)


@numba.njit(cache=True)
def _dot4x4_all(a, w, nvec, res, out):
    """out[i, j] = dot4x4 of rows (r0 = i0*lda) of a and (w0 = j0*ldw) of w, every 4x4 block."""
    lda = np.uint64(a.shape[1])
    ldw = np.uint64(w.shape[1])
    af = a.reshape(-1)
    for i0 in range(0, a.shape[0], 4):
        for j0 in range(0, w.shape[0], 4):
            cube.dot4x4(af, np.uint64(i0) * lda, lda, w, np.uint64(j0) * ldw, ldw, np.uint64(nvec), res)
            for e in range(16):
                out[i0 + e // 4, j0 + e % 4] = res[e]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("k, nvec", [(128, 8), (80, 5), (83, 5), (16, 1), (16, 0)])
def test_dot4x4_register_block(dt, k, nvec, rng):
    """cube.dot4x4 (the attention QK^T block): 16 dot products over the first L*nvec elements
    (L = 16), widened exactly from every storage dtype, results in row-major order; the
    rest of the row is not read."""
    a = rng.standard_normal((8, k)).astype(np.float32)
    w = make((12, k), dt, rng)
    res = np.full(16, np.nan, np.float32)
    out = np.full((8, 12), np.nan, np.float32)
    _dot4x4_all(a, dtypes.kernel_view(w), nvec, res, out)
    used = cube.V16 * nvec
    assert used <= k
    ref = a[:, :used].astype(np.float64) @ dtypes.to_float32(w)[:, :used].astype(np.float64).T
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(1, used) ** 0.5)
    if nvec:
        assert np.abs(out).max() > 0.1


@numba.njit(cache=True)
def _dot1x4_all(a, w, nvec, res, out):
    """out[i, j] = dot1x4 of row i of a against weight rows j .. j+3, every 4 weight rows."""
    lda = np.uint64(a.shape[1])
    ldw = np.uint64(w.shape[1])
    af = a.reshape(-1)
    wf = w.reshape(-1)
    for i in range(a.shape[0]):
        for j0 in range(0, w.shape[0], 4):
            cube.dot1x4(af, np.uint64(i) * lda, lda, wf, np.uint64(j0) * ldw, ldw, np.uint64(nvec), res)
            for e in range(4):
                out[i, j0 + e] = res[e]


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("k, nvec", [(128, 8), (83, 5), (16, 1), (16, 0)])
def test_dot1x4_register_block(dt, k, nvec, rng):
    """cube.dot1x4 (decode rows of x left after the 4-row blocks): 4 dot products over the first
    16*nvec elements, widened exactly from every storage dtype, in weight-row order; the rest of
    the row is not read (NaN there would poison the sums)."""
    a = rng.standard_normal((3, k)).astype(np.float32)
    w = make((8, k), dt, rng)
    used = 16 * nvec
    a[:, used:] = np.nan
    res = np.full(4, np.nan, np.float32)
    out = np.full((3, 8), np.nan, np.float32)
    _dot1x4_all(a, dtypes.kernel_view(w), nvec, res, out)
    ref = a[:, :used].astype(np.float64) @ dtypes.to_float32(w)[:, :used].astype(np.float64).T
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5 * max(1, used) ** 0.5)
    if nvec:
        assert np.abs(out).max() > 0.1


def _pairs_sums(a, w, steps, odd_first=True):
    """NumPy float32 model of the bf16 pairs blocks (ir_blocks._pairs_step): lane l of an accumulator
    adds a[2l+1]*w[2l+1], then a[2l]*w[2l], for each 32-element step (products exact in fp32, each
    sum rounded to nearest even), then the 16 lanes are summed by halves (16 -> 8 -> 4 -> 2 -> 1).
    ``odd_first=False``: the even element first (the wrong order, to show the test can tell)."""
    out = np.empty((a.shape[0], w.shape[0]), np.float32)
    first, second = (slice(1, None, 2), slice(0, None, 2))[:: 1 if odd_first else -1]
    for i in range(a.shape[0]):
        for j in range(w.shape[0]):
            acc = np.zeros(16, np.float32)
            for s in range(steps):
                x = a[i, 32 * s: 32 * s + 32].astype(np.float32)
                y = w[j, 32 * s: 32 * s + 32].astype(np.float32)
                acc = acc + x[first] * y[first]
                acc = acc + x[second] * y[second]
            while acc.size > 1:
                acc = acc[: acc.size // 2] + acc[acc.size // 2:]
            out[i, j] = acc[0]
    return out


def _pairs_kernels(hw):
    """njit drivers of the 4x4 and 1x4 pairs blocks; hw: VDPBF16PS (DPBF16), the FMA form
    (PAIRS_FMA) or whatever numba's target has (PAIRS_AUTO: the blocks the decode loops use)."""
    if hw == ir_blocks.PAIRS_AUTO:
        b44, b14 = cube.dot4x4_pairs_stream, cube.dot1x4_pairs_stream
    else:
        b44 = ir_blocks._dot4x4(cube.V16, cube.SKINNY_AHEAD, stream=True, pairs=hw)
        b14 = ir_blocks._dot_intrinsic(f"dot1x4_pairs_test_{hw}", ir_blocks._tree_sums_codegen(4, rows=1, pairs=hw),
                                  stream=True, pairs=True)

    @numba.njit
    def run(a, w, nvec, res, out4, out1):
        lda = np.uint64(a.shape[1])
        ldw = np.uint64(w.shape[1])
        af = a.reshape(-1)
        wf = w.reshape(-1)
        far = np.uint64(4) * ldw  # prefetch hints for the next four weight rows (they exist)
        b44(af, np.uint64(0), lda, wf, np.uint64(0), ldw, np.uint64(nvec), res, far)
        for e in range(16):
            out4[e // 4, e % 4] = res[e]
        for i in range(4):
            b14(af, np.uint64(i) * lda, lda, wf, np.uint64(0), ldw, np.uint64(nvec), res, np.uint64(0))
            for e in range(4):
                out1[i, e] = res[e]

    return run




@pytest.mark.parametrize("hw", [ir_blocks.PAIRS_FMA, pytest.param(ir_blocks.DPBF16, marks=needs_avx512_bf16),
                                ir_blocks.PAIRS_AUTO])
@pytest.mark.parametrize("k, nvec", [(96, 3), (70, 2), (32, 1), (40, 0)])
def test_bf16_pairs_blocks_sum_in_pairs(hw, k, nvec, rng):
    """The bf16 decode blocks (cube.dot4x4_pairs / dot1x4_pairs and their VDPBF16PS and FMA forms)
    give exactly the bits of the pairs order, modelled in NumPy float32, over the first 32*nvec
    elements (NaN past them would poison the sums); the 4x4 and 1x4 blocks agree. The inputs
    have no subnormals, which VDPBF16PS would flush to zero."""

    def spread(shape):  # magnitudes 2^-6 .. 2^6: most additions round
        return (rng.standard_normal(shape) * 2.0 ** rng.integers(-6, 7, size=shape)).astype(NP_DTYPE["bf16"])

    a, w = spread((4, k)), spread((8, k))
    used = 32 * nvec
    a[:, used:] = np.nan
    res = np.full(16, np.nan, np.float32)
    out4 = np.full((4, 4), np.nan, np.float32)
    out1 = np.full((4, 4), np.nan, np.float32)
    _pairs_kernels(hw)(dtypes.kernel_view(a), dtypes.kernel_view(w), nvec, res, out4, out1)
    want = _pairs_sums(a, w[:4], nvec)
    assert np.array_equal(out4.view(np.uint32), want.view(np.uint32))
    assert np.array_equal(out1.view(np.uint32), want.view(np.uint32))
    if nvec:
        assert np.abs(want).max() > 0.1
        exact = a[:, :used].astype(np.float64) @ w[:4, :used].astype(np.float64).T
        np.testing.assert_allclose(out4, exact, rtol=1e-5, atol=1e-3 * used ** 0.5)
    if nvec >= 3:  # the comparison is sharp: the other order of a pair gives other bits
        assert not np.array_equal(out4, _pairs_sums(a, w[:4], nvec, odd_first=False))


@numba.njit(cache=True)
def _outer_rows(c, c0, ldc, a, a0, lda, w, w0, ldw, m, ncols, k):
    cube.outer_rows(c, c0, ldc, a, a0, lda, w, w0, ldw, m, ncols, k)


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("m, ncols, k", [(11, 130, 150), (4, 64, 128), (5, 17, 1), (1, 67, 20), (3, 5, 9),
                                         (6, 80, 0), (2, 0, 7)])
def test_outer_rows_block(dt, m, ncols, k, rng):
    """cube.outer_rows (the prefill attention GEMM blocks): C[m, ncols] = A[m, k] @ B[k, ncols] on
    flat views with row strides and offsets, B widened exactly from every storage dtype; the
    register blocks (4 x 64, 4 x 16, 1 x 64, 1 x 16) and the plain last columns all agree with
    float64; nothing outside A[:, :k], B[:k, :ncols] is read (NaN there) and nothing outside
    C[:, :ncols] is written."""
    lda, ldw, ldc = k + 3, ncols + 5, ncols + 2
    a0, w0, c0 = 7, 11, 4
    a = np.full(a0 + m * lda + 3, np.nan, np.float32)
    w = np.full(w0 + k * ldw + 5, np.nan, np.float32).astype(NP_DTYPE[dt])
    c = np.full(c0 + m * ldc + 2, np.nan, np.float32)
    A = rng.standard_normal((m, k)).astype(np.float32)
    B = make((k, ncols), dt, rng)
    for i in range(m):
        a[a0 + i * lda:a0 + i * lda + k] = A[i]
    for p in range(k):
        w[w0 + p * ldw:w0 + p * ldw + ncols] = B[p]
    _outer_rows(c, np.uint64(c0), np.uint64(ldc), a, np.uint64(a0), np.uint64(lda), dtypes.kernel_view(w),
                np.uint64(w0), np.uint64(ldw), m, ncols, k)
    got = np.stack([c[c0 + i * ldc:c0 + i * ldc + ncols] for i in range(m)]) if m else np.zeros((0, ncols))
    ref = A.astype(np.float64) @ dtypes.to_float32(B).astype(np.float64)
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * max(1, k) ** 0.5)
    written = np.zeros(c.size, bool)
    for i in range(m):
        written[c0 + i * ldc:c0 + i * ldc + ncols] = True
    assert np.isnan(c[~written]).all()
    if k and ncols:
        assert np.abs(got).max() > 0.1


def test_outer_rows_exact_on_integers(rng):
    """Integer-valued operands small enough that every partial sum is exact in fp32: the blocks
    must give the exact product, bit for bit (a dropped or repeated term cannot hide)."""
    m, k, n = 7, 133, 83  # k: three passes of OUTER_K, the last one partial
    A = rng.integers(-8, 9, (m, k)).astype(np.float32)
    B = rng.integers(-8, 9, (k, n)).astype(np.float32)
    c = np.zeros(m * n, np.float32)
    _outer_rows(c, np.uint64(0), np.uint64(n), A.reshape(-1), np.uint64(0), np.uint64(k), B.reshape(-1),
                np.uint64(0), np.uint64(n), m, n, k)
    np.testing.assert_array_equal(c.reshape(m, n), (A.astype(np.int64) @ B.astype(np.int64)).astype(np.float32))


@pytest.mark.parametrize("value", ["yes", "2", "off", "true"])
def test_amx_setting_takes_only_0_or_1(value, monkeypatch):
    """PYPTO_NUMBA_AMX: a value other than 0 or 1 is a ConfigError naming the variable and the
    value (not silently AMX on); 0 turns AMX off on every host; unset, empty or 1 is the default."""
    from pypto_numba.errors import ConfigError
    from pypto_numba.machine.cube import amx

    try:
        monkeypatch.setenv(amx.ENV, value)
        amx.enabled.cache_clear()
        with pytest.raises(ConfigError, match=f"PYPTO_NUMBA_AMX={value!r}: expected 0"):
            amx.enabled()
        monkeypatch.setenv(amx.ENV, " 0 ")
        amx.enabled.cache_clear()
        assert amx.enabled() is False
        monkeypatch.setenv(amx.ENV, "")
        amx.enabled.cache_clear()
        default = amx.enabled()
        monkeypatch.setenv(amx.ENV, "1")
        amx.enabled.cache_clear()
        assert amx.enabled() is default
    finally:
        monkeypatch.undo()
        amx.enabled.cache_clear()
