"""The cube walk's AMX blocks (machine/cube/amx.py): the VNNI packing against its formula, and
bf16 walks on AMX against the float64 product and the decode loops, with tails on every axis.

Only where the host runs AMX (``amx.enabled()``); elsewhere the walk never takes that path.
"""

import ml_dtypes
import numpy as np
import pytest

from pypto_numba.machine import cube, dtypes
from pypto_numba.machine.cube import amx

pytestmark = pytest.mark.skipif(not amx.enabled(), reason="the host has no AMX-BF16 (or the OS refused its tiles)")


def test_pack_pairs_is_the_vnni_layout():
    """Tile t, step s, pair row r, row i of a: (a[16t + i, 32s + 2r], a[16t + i, 32s + 2r + 1]);
    rows past M are zeros, and the K % 32 rest is not packed."""
    M, K = 21, 70
    a = (np.arange(M * K, dtype=np.uint32) % 65521 + 1).astype(np.uint16).reshape(M, K)
    xv = amx.pack_pairs(a)
    ks = K // 32
    got = xv.reshape(2, ks, 16, 16, 2)  # [tile, step, pair row, row of a, element]
    padded = np.zeros((32, ks * 32), np.uint16)
    padded[:M] = a[:, : ks * 32]
    want = padded.reshape(2, 16, ks, 16, 2).transpose(0, 2, 3, 1, 4)
    np.testing.assert_array_equal(got, want)


def _walk(a, b, tiles, out_dtype="fp32"):
    m, k = a.shape
    walk = cube.plan_walk(m, k, b.shape[0], tiles, "bf16", out_dtype=out_dtype)
    out, out_k = dtypes.empty((m, b.shape[0]), out_dtype)
    counted = cube.run_walk(dtypes.kernel_view(a), dtypes.kernel_view(b), None, out_k, walk, skinny=True)
    return out, counted


@pytest.mark.parametrize("M, N, K, tiles", [
    (2, 16, 32, ((16, 16), (16, 32), (16, 16))),      # one tile of each, the fewest rows AMX takes
    (5, 80, 100, ((16, 16), (16, 64), (16, 48))),     # K % 32 rest, weight rows past the last 16
    (17, 100, 96, ((16, 32), (16, 64), (16, 64))),    # a second 16-row tile of a with one row
    (40, 200, 1000, ((16, 32), (32, 256), (16, 128))),  # several blocks, groups of 4 weight tiles
    (16, 37, 31, ((16, 16), (16, 32), (16, 16))),     # K below one step: the loops only
])
def test_amx_walk_matches_float64_and_the_loops(M, N, K, tiles, monkeypatch):
    """fp32 out (no output rounding): within the fp32 accumulation bound ``K * 2^-24 * |a| |b|^T`` of
    the float64 product, and as close to the decode loops (AMX off); the counts are the walk's."""
    rng = np.random.default_rng(M * 1000 + N)
    a = rng.standard_normal((M, K)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((N, K)).astype(ml_dtypes.bfloat16)
    a[0, : min(K, 3)] = 0.0  # exact zeros and a wide range of magnitudes
    b[-1] *= 1e3
    got, counted = _walk(a, b, tiles)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64.T
    bound = K * 2.0**-24 * (np.abs(a64) @ np.abs(b64).T)
    assert np.all(np.abs(got - exact) <= bound)
    monkeypatch.setattr(amx, "enabled", lambda: False)
    loops, counted_loops = _walk(a, b, tiles)
    assert np.all(np.abs(loops - exact) <= bound)
    assert counted == counted_loops
    if K >= 96:  # the tiles ran: their order of additions is not the loops'
        assert not np.array_equal(got, loops)


def test_amx_bf16_output_is_one_rounding_of_the_fp32_sums(monkeypatch):
    """bf16 out: the fp32 accumulation rounded once (the epilogue is the same for every path), so
    AMX and the loops differ by at most one bf16 step where their fp32 sums straddle a rounding."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((16, 4096)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 4096)).astype(ml_dtypes.bfloat16)
    tiles = ((16, 16), (64, 512), (16, 64))
    got, _ = _walk(a, b, tiles, "bf16")
    monkeypatch.setattr(amx, "enabled", lambda: False)
    loops, _ = _walk(a, b, tiles, "bf16")
    steps = np.abs(got.view(np.int16).astype(np.int32) - loops.view(np.int16).astype(np.int32))
    assert steps.max() <= 1


def test_gate_up_swiglu_on_amx_matches_blas(monkeypatch):
    """linear.gate_up_swiglu's bf16 products on AMX (tails: a second 16-row tile of x with one row,
    weight rows past the last 16, the K % 32 rest) give BLAS's result within one bf16 step (both
    round the same epilogue of fp32 sums; the tile unit and this BLAS both add the exact products
    in ascending k, so here they agree bit for bit)."""
    from pypto_numba import linear

    rng = np.random.default_rng(5)
    x = rng.standard_normal((17, 100)).astype(ml_dtypes.bfloat16)
    wg, wu = ((rng.standard_normal((100, 100)) / 10).astype(ml_dtypes.bfloat16) for _ in range(2))
    packed = []
    pack = amx.pack_pairs
    monkeypatch.setattr(amx, "pack_pairs", lambda a: (packed.append(a.shape), pack(a))[1])
    got = linear.gate_up_swiglu(x, wg, wu)
    assert packed == [(17, 100)]  # the AMX path ran
    monkeypatch.setattr(amx, "enabled", lambda: False)
    blas = linear.gate_up_swiglu(x, wg, wu)
    assert len(packed) == 1
    steps = np.abs(got.view(np.int16).astype(np.int32) - blas.view(np.int16).astype(np.int32))
    assert steps.max() <= 1
