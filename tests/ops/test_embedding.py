"""embedding.gather / embedding.index_select: exact rows, ids checks, counted Cost, tile rules."""

from __future__ import annotations

import numpy as np
import pytest

import pypto_numba as pn
from helpers import NP_DTYPE, assert_cost_matches_plan, make, run_traced
from pypto_numba import embedding, reference
from pypto_numba.errors import DTypeError, ShapeError, TileError
from pypto_numba.machine import tile


@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("ids_shape", [(7,), (3, 5), (2, 3, 4), ()])
def test_gather_exact(ids_shape, ids_dtype, dtype, rng):
    w = make((50, 37), dtype, rng)
    ids = rng.integers(0, 50, size=ids_shape).astype(ids_dtype)
    out, rec = run_traced(embedding.gather, w, ids, row_tile=8, h_tile=16)
    assert out.dtype == NP_DTYPE[dtype] and out.shape == ids_shape + (37,)
    assert np.array_equal(out.astype(np.float64), reference.embedding(w, ids))
    assert_cost_matches_plan(rec)


@pytest.mark.parametrize("ids_shape", [(7,), (3, 5)])
def test_index_select_exact(ids_shape, dtype, rng):
    w = make((50, 37), dtype, rng)
    ids = rng.integers(0, 50, size=ids_shape).astype(np.int64)
    out, rec = run_traced(embedding.index_select, w, ids)
    assert np.array_equal(out.astype(np.float64), reference.embedding(w, ids))
    assert_cost_matches_plan(rec)
    assert np.array_equal(out.view(np.uint8), embedding.gather(w, ids).view(np.uint8))


def test_index_select_rank3_points_to_gather(rng):
    w = make((10, 16), "fp32", rng)
    with pytest.raises(ShapeError, match=r"embedding.gather"):
        embedding.index_select(w, np.zeros((2, 2, 2), np.int32))
    with pytest.raises(ShapeError, match=r"embedding.gather"):
        embedding.plan_index_select((10, 16), (2, 2, 2))


def test_bit_exact_special_values():
    w = np.array([[np.nan, -0.0, np.inf, 1e-45], [1.0, 2.0, 3.0, 4.0]], np.float32)
    out = embedding.gather(w, np.array([[1, 0], [0, 0]], np.int32))
    assert np.array_equal(out.view(np.uint32)[0, 1], w.view(np.uint32)[0])


def test_cost_formula(rng):
    """Hand-computed: n=15 ids (int32), H=37 bf16, row_tile=8, h_tile=16 -> 2 x 3 tasks."""
    p = embedding.plan_gather((50, 37), (3, 5), "bf16", "int32", row_tile=8, h_tile=16)
    c = p.cost
    assert (c.kernels, c.tasks) == (1, 6)
    assert c.gm_read_bytes == 15 * 37 * 2 + 15 * 4 * 3
    assert c.gm_write_bytes == 15 * 37 * 2
    assert c.ub_peak_bytes == 8 * 4 + 8 * 16 * 2


def test_default_h_tile_fits_ub():
    p = embedding.plan_gather((151936, 2048), (8, 2048), "bf16")
    rows, cols = p.params["row_tile"], p.params["h_tile"]
    assert rows * cols * 2 <= p.profile.ub_bytes // 2 and (cols * 2) % 32 == 0
    small = embedding.plan_gather((10, 20), (4,), "fp32")
    assert small.params["h_tile"] == 24  # H rounded up to 32 B


@pytest.mark.parametrize("H, dtype, ids_dtype, rows, whole", [
    (2048, "bf16", "int32", 16, True), (2048, "fp32", "int32", 8, True), (4096, "bf16", "int32", 8, True),
    (4096, "fp32", "int64", 4, True), (4096, "fp32", "int32", 8, False), (8192, "fp32", "int64", 4, False)])
def test_default_tiles_keep_rows_whole(H, dtype, ids_dtype, rows, whole):
    """The profile's row tile (16) is halved until a tile of whole rows fits half of UB (96 KiB),
    down to one 32-byte block of ids (8 int32, 4 int64); below that H is split. A given row_tile
    keeps its value and splits H."""
    p = embedding.plan_gather((100, H), (8, 2048), dtype, ids_dtype)
    b = 4 if dtype == "fp32" else 2
    assert p.params["row_tile"] == rows and (p.params["h_tile"] >= H) == whole
    assert rows * p.params["h_tile"] * b <= p.profile.ub_bytes // 2 and p.params["h_tile"] * b % 32 == 0
    given = embedding.plan_gather((100, 2048), (8, 2048), "fp32", row_tile=16)
    assert given.params["row_tile"] == 16 and given.params["h_tile"] == 1536


@pytest.mark.parametrize("bad,pos", [(-1, [1, 2]), (50, [1, 2]), (10**6, [1, 2])])
def test_out_of_range_ids(bad, pos, rng):
    w = make((50, 8), "fp32", rng)
    ids = np.zeros((3, 4), np.int64)
    ids[1, 2] = bad
    ids[2, 3] = -5  # a later bad id is not the one reported
    with pn.trace() as t, pytest.raises(IndexError, match=rf"ids\[{pos[0]}, {pos[1]}\] = {bad} .*\[0, 50\)"):
        embedding.gather(w, ids)
    assert len(t.records) == 0  # no kernel ran


@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("bad", [-1, 50, "min"])
def test_out_of_range_id_found_in_a_long_index(bad, ids_dtype, rng):
    """The first bad id of a long index (the check runs in blocks of 1024): in a later block,
    with another bad id after it in the same block and one in the next block; the most
    negative id of the dtype is out of range too."""
    w = make((50, 8), "fp32", rng)
    value = int(np.iinfo(ids_dtype).min) if bad == "min" else bad
    ids = rng.integers(0, 50, size=(3, 1000)).astype(ids_dtype)
    ids[2, 100] = value  # flat 2100: the third block
    ids[2, 500] = 50
    ids[2, 999] = -3
    with pytest.raises(IndexError, match=rf"ids\[2, 100\] = {value} is out of range \[0, 50\)"):
        embedding.gather(w, ids)
    ids[2, 100] = 49  # the last valid row
    ids[2, 500] = ids[2, 999] = 0
    assert np.array_equal(embedding.gather(w, ids), w[ids])


def test_bad_inputs(rng):
    w = make((10, 16), "fp32", rng)
    with pytest.raises(DTypeError, match=r"int32 or int64"):
        embedding.gather(w, np.zeros(3, np.float32))
    with pytest.raises(DTypeError, match=r"int32 or int64"):
        embedding.gather(w, np.zeros(3, np.int16))
    with pytest.raises(DTypeError, match=r"int32 or int64"):
        embedding.gather(w, np.zeros(3, bool))
    with pytest.raises(DTypeError, match=r"numpy array"):
        embedding.gather(w, [1, 2])
    with pytest.raises(DTypeError, match=r"float64"):
        embedding.gather(w.astype(np.float64), np.zeros(3, np.int32))
    with pytest.raises(DTypeError, match=r"int64"):
        embedding.gather(w.astype(np.int64), np.zeros(3, np.int32))
    with pytest.raises(ShapeError, match=r"no elements"):
        embedding.gather(w, np.zeros((0, 3), np.int32))
    with pytest.raises(ShapeError, match=r"weight must have 2 dims"):
        embedding.gather(w[0], np.zeros(3, np.int32))
    with pytest.raises(ShapeError, match=r"zero-size"):
        embedding.gather(w[:, :0], np.zeros(3, np.int32))


def test_tile_errors(rng):
    with pytest.raises(TileError, match=r"UB"):
        embedding.plan_gather((10, 4096), (64,), "fp32", row_tile=64, h_tile=4096)
    with pytest.raises(TileError, match=r"32 B"):
        embedding.plan_gather((10, 40), (4,), "fp32", h_tile=10)
    with pytest.raises(TileError, match=r"row_tile must be a positive integer"):
        embedding.plan_gather((10, 40), (4,), "fp32", row_tile=0)


def test_non_contiguous_ids_counted(rng):
    w = make((30, 16), "bf16", rng)
    ids = rng.integers(0, 30, size=(4, 10)).astype(np.int32)[:, ::2]
    out, rec = run_traced(embedding.gather, w, ids)
    assert np.array_equal(out.astype(np.float64), reference.embedding(w, ids))
    assert rec.cost.workspace_bytes == ids.size * 4


def test_out_argument(rng):
    w = make((30, 16), "fp16", rng)
    ids = rng.integers(0, 30, size=(2, 5)).astype(np.int32)
    out = np.empty((2, 5, 16), np.float16)
    got = embedding.gather(w, ids, out=out)
    assert got is out and np.array_equal(out.astype(np.float64), reference.embedding(w, ids))
    with pytest.raises(ShapeError, match=r"out must be"):
        embedding.gather(w, ids, out=np.empty((2, 5, 16), np.float32))


@pytest.mark.parametrize("h_tile", [None, 16, 48])
@pytest.mark.parametrize("ids_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("row_tile", [8, 24])
@pytest.mark.parametrize("H", [3, 37, 64, 100, 160])
def test_streaming_rows_any_alignment(H, row_tile, ids_dtype, h_tile, dtype, rng, monkeypatch):
    """Whole-line streaming stores (forced by lowering the size threshold): rows shorter and
    longer than a cache line, rows of whole lines (64, 160: GATHER_ROWS rows at a time and the
    last rows of a task one by one, the line between two rows assembled when out is not on a
    line), outputs starting at every 2-byte offset of a line, tasks of one and of several row
    groups, a row_tile tail, int32 and int64 ids (the last row of the weight among them), tasks
    of whole rows and of column tiles (h_tile 16 or 48: runs shorter and longer than a line, ending
    anywhere in one); exact rows, nothing written outside out, counted Cost == planned."""
    monkeypatch.setattr(embedding, "STREAM_MIN_BYTES", 0)
    w = make((50, H), dtype, rng)
    ids = rng.integers(0, 50, size=(3, 13)).astype(ids_dtype)  # 39 ids: either row_tile leaves a tail
    ids[0, :2] = 49
    expected = reference.embedding(w, ids)
    n = ids.size * H
    size = w.itemsize
    for off_bytes in range(0, 64, 2 * size if dtype == "fp32" else 14):
        buf = np.zeros(n + 128 // size, w.dtype)
        start = (-buf.ctypes.data % 64 + off_bytes) // size
        out = buf[start : start + n].reshape(ids.shape + (H,))
        got, rec = run_traced(embedding.gather, w, ids, row_tile=row_tile, h_tile=h_tile, out=out)
        assert got is out
        assert np.array_equal(out.astype(np.float64), expected)
        assert not buf[:start].view(np.uint8).any() and not buf[start + n :].view(np.uint8).any()
        assert_cost_matches_plan(rec)


def test_fresh_result_shares_the_weights_page_offset(rng, monkeypatch):
    """A new result starts at the weight's offset within a page (so the streamed rows' loads and
    stores line up and never alias, machine.tile.stream_gather_rows), for weights at several
    offsets; the rows are exact."""
    monkeypatch.setattr(embedding, "STREAM_MIN_BYTES", 0)
    base = make((40 + 64, 64), "bf16", rng)  # rows of 128 bytes: whole lines
    ids = rng.integers(0, 40, size=(21,)).astype(np.int64)
    for skip in (0, 1, 7, 32):  # 16-bit elements: offsets 0, 2, 14, 64 bytes into a line/page
        w = base.reshape(-1)[skip : skip + 40 * 64].reshape(40, 64)
        got = embedding.gather(w, ids)
        assert (got.ctypes.data - w.ctypes.data) % tile.PAGE == 0
        assert np.array_equal(got.astype(np.float64), reference.embedding(w, ids))
