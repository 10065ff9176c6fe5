"""GM <-> UB tile movers: streaming copy-out with unaligned heads and tails, scratch layout."""

import numba
import numpy as np
import pytest

from pypto_numba.machine import dtypes, tile
from pypto_numba.machine.ir.lines import first_line
from pypto_numba.machine.jit import kernel


@kernel
def _copy_rows(src, dst, n, stream):
    """Rows ``src[r, :n] -> dst[r, :n]``: with ``stream`` the head up to dst's first line
    boundary and the tail with plain copies, the whole lines between with stream_lines (how
    rope and embedding copy a staged row out)."""
    size = np.uint64(dst.itemsize)
    L = np.uint64(tile.LINE) // size
    un = np.uint64(n)
    for r in numba.prange(src.shape[0]):
        s, d = src[r], dst[r]
        a = np.uint64(0)
        b = np.uint64(0)
        if stream:
            a = first_line(d, np.uint64(0), un)
            b = a + (un - a) // L * L
        tile.copy(s, np.uint64(0), d, np.uint64(0), a)
        if b > a:
            tile.stream_lines(d, a, s, a, (b - a) * size)
        tile.copy(s, b, d, b, un - b)
        if stream:
            tile.store_fence()
    return 0


@pytest.mark.parametrize("dtype", [np.float32, np.uint16, np.int16])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("offset", [0, 1, 3, 15])
def test_streamed_row_copy_matches_plain_copy(dtype, stream, offset):
    rng = np.random.default_rng(offset)
    rows, n = 5, 203  # not a multiple of the line
    src = rng.integers(0, 2**15, size=(rows, n)).astype(dtype)
    buf = np.zeros(rows * (n + 40) + 64, dtype)
    dst = buf[offset: offset + rows * (n + 40)].reshape(rows, n + 40)  # misaligned rows
    _copy_rows(src, dst, n, stream)
    np.testing.assert_array_equal(dst[:, :n], src)
    assert not dst[:, n:].any()  # nothing written past the tile's valid shape


def test_scratch_slabs_are_cache_line_aligned_and_padded():
    s = tile.scratch(100, np.float32, 3)
    assert s.shape[0] == numba.get_num_threads() and s.shape[1] == 3
    assert s.ctypes.data % tile.ALIGN == 0
    assert (s.shape[2] * 4) % tile.ALIGN == 0 and s.shape[2] >= 100 + tile.ALIGN // 4


def test_aligned_empty_and_streamable():
    a, k = tile.aligned_empty((3, 5), "bf16")
    assert a.shape == (3, 5) and a.ctypes.data % tile.ALIGN == 0 and k.dtype == np.uint16
    assert tile.streamable(np.empty(tile.STREAM_MIN_BYTES // 4, np.float32))
    assert not tile.streamable(np.empty(16, np.float32))
    assert tile.streamable(np.empty(16, np.float32), min_bytes=0)


def test_address_is_the_data_pointer():
    """tile.address agrees with NumPy's ctypes.data for every storage and index dtype, for views
    that start inside an array and for non-contiguous views."""
    import ml_dtypes

    for dt in (np.float32, np.float16, ml_dtypes.bfloat16, np.uint16, np.int32, np.int64):
        a = np.zeros((6, 10), dt)
        for view in (a, a[1:, 3:], a[:, ::2], a.T, a[2]):
            assert tile.address(view) == view.ctypes.data


@pytest.mark.parametrize("dtype", [np.float32, np.uint16])
def test_empty_in_phase(dtype):
    """The new array starts at the same byte offset within a line as the model array, for every
    offset the dtype allows, and has the asked shape and dtype."""
    item = np.dtype(dtype).itemsize
    buf = np.empty(64, dtype)
    for off in range(0, tile.ALIGN, item):
        start = ((off - buf.ctypes.data) % tile.ALIGN) // item
        like = buf[start : start + 8]
        assert like.ctypes.data % tile.ALIGN == off
        a = tile.empty_in_phase((4, 7), dtype, like)
        assert a.shape == (4, 7) and a.dtype == dtype and a.flags.c_contiguous
        assert a.ctypes.data % tile.ALIGN == off
        b = tile.empty_in_phase((4, 7), dtype, like, tile.PAGE)
        assert b.shape == (4, 7) and b.dtype == dtype and b.flags.c_contiguous
        assert (b.ctypes.data - like.ctypes.data) % tile.PAGE == 0


def test_streams_apart_is_false_just_past_the_source_within_a_page():
    base = np.empty(3 * tile.PAGE, np.uint8)
    src = base[100:200]
    for d in (0, 1, 16, 64, tile.ALIAS_WINDOW - 1, tile.ALIAS_WINDOW, 2048, tile.PAGE - 1, tile.PAGE,
              tile.PAGE + 48, tile.PAGE + tile.ALIAS_WINDOW):
        dst = base[100 + d : 200 + d]
        assert tile.streams_apart(dst, src) == (not 0 < d % tile.PAGE < tile.ALIAS_WINDOW), d
        assert tile.streams_apart(src, dst) == (not 0 < -d % tile.PAGE < tile.ALIAS_WINDOW), d


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_empty_apart(name):
    size = 4 if name == "fp32" else 2
    base = np.empty(3 * tile.PAGE, np.uint8)
    for off in (0, 2, 16, 64, 100, 4000):
        like = base[off : off + 64 * size]
        a, k = tile.empty_apart((8, 8), name, like)
        assert a.shape == (8, 8) and a.flags.c_contiguous and a.dtype == tile.dtypes.STORAGE[name]
        assert k.dtype == tile.dtypes.KERNEL[name] and tile.address(k) == tile.address(a)
        assert tile.address(a) % tile.LINE == 0
        assert 0 <= (tile.address(like) - tile.address(a)) % tile.PAGE < tile.LINE  # less than a line before
        assert tile.streams_apart(a, like)
        a[...] = 1  # the whole array is inside its buffer


@numba.njit(cache=True)
def _gather_rows(dst, src, ids, r0, row, off, nbytes, joins):
    tile.stream_gather_rows(dst, src, ids, np.uint64(r0), np.uint64(row), np.uint64(off), np.uint64(nbytes),
                            np.uint64(joins))
    tile.store_fence()


def _expected_gather(dst, src, ids, r0, row, off, n, joins):
    """What stream_gather_rows writes, from its definition: rows, then join lines."""
    out = dst.copy()
    L = tile.LINE // dst.itemsize
    for k in range(tile.GATHER_ROWS):
        r = r0 + k
        out[r * row + off : r * row + off + n] = src[int(ids[r]) * row + off :][:n]
    for k in range(joins):
        r = r0 + k
        tail = L - off
        at = (r + 1) * row + off - L
        out[at : at + tail] = src[int(ids[r]) * row + row - tail : int(ids[r]) * row + row]
        out[at + tail : at + L] = src[int(ids[r + 1]) * row : int(ids[r + 1]) * row + off]
    return out


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16])
@pytest.mark.parametrize("ids_dtype", [np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("row_lines, off_lines, lines", [(1, 0, 1), (3, 1, 2), (64, 0, 64), (5, 1, 3)])
def test_stream_gather_rows(row_lines, off_lines, lines, ids_dtype, dtype):
    """GATHER_ROWS rows from r0 on, no joins: dst[(r0+k)*row + off:][:lines] == src[ids[r0+k]*row +
    off:][:lines] bit for bit, every other element of dst (and around it) unchanged."""
    rng = np.random.default_rng(row_lines + off_lines)
    L = tile.LINE // np.dtype(dtype).itemsize
    row, off = row_lines * L, off_lines * L
    nsrc, r0 = 37, 3
    src = rng.integers(0, np.iinfo(dtype).max, size=nsrc * row, dtype=dtype)
    ids = rng.integers(0, nsrc, size=r0 + tile.GATHER_ROWS + 2).astype(ids_dtype)
    ids[r0] = nsrc - 1
    buf = rng.integers(0, np.iinfo(dtype).max, size=ids.size * row + 2 * L, dtype=dtype)
    first = (-buf.ctypes.data % tile.LINE) // buf.itemsize
    dst = buf[first : first + ids.size * row]
    expected = _expected_gather(dst, src, ids, r0, row, off, lines * L, 0)
    before = buf.copy()
    _gather_rows(dst, src, ids, r0, row, off, lines * tile.LINE, 0)
    assert np.array_equal(dst, expected)
    assert np.array_equal(buf[:first], before[:first]) and np.array_equal(buf[first + dst.size :], before[first + dst.size :])


@pytest.mark.parametrize("dtype", [np.uint32, np.uint16])
@pytest.mark.parametrize("joins", [1, 5, tile.GATHER_ROWS])
@pytest.mark.parametrize("off", [1, 3, 8])
def test_stream_gather_rows_joins(off, joins, dtype):
    """Rows not on lines (dst ``off`` elements before a line, ``0 < off < L``): the join line
    before each of the next ``joins`` rows is the end of one gathered row and the start of the
    next, including the row after the group (ids[r0 + GATHER_ROWS], the last id here), and
    nothing else is written; the first row of src among the ids (its start is read masked)."""
    rng = np.random.default_rng(off * 10 + joins)
    item = np.dtype(dtype).itemsize
    L = tile.LINE // item
    row = 3 * L
    nsrc, r0 = 29, 2
    src = rng.integers(0, np.iinfo(dtype).max, size=nsrc * row, dtype=dtype)
    ids = rng.integers(0, nsrc, size=r0 + tile.GATHER_ROWS + 1).astype(np.int32)
    ids[r0 + 1] = 0
    ids[r0] = nsrc - 1
    buf = rng.integers(0, np.iinfo(dtype).max, size=ids.size * row + 3 * L, dtype=dtype)
    first = (-buf.ctypes.data % tile.LINE) // item + (L - off)  # dst[off] on a line
    dst = buf[first : first + ids.size * row]
    n = row - L  # the whole lines of a row
    expected = _expected_gather(dst, src, ids, r0, row, off, n, joins)
    before = buf.copy()
    _gather_rows(dst, src, ids, r0, row, off, n * item, joins)
    assert np.array_equal(dst, expected)
    assert np.array_equal(buf[:first], before[:first]) and np.array_equal(buf[first + dst.size :], before[first + dst.size :])


@kernel
def _store_rows(op, w, g, dst, starts, n, d, stream, mode):
    """Row r of ``w`` into flat ``dst`` from element ``starts[r]``: divided by ``d[r]`` (op 0), cast
    (op 1), or times ``d[r]`` times ``g`` (op 2)."""
    un = np.uint64(n)
    for r in numba.prange(starts.size):
        at, w0 = np.uint64(starts[r]), np.uint64(r) * un
        if op == 0:
            tile.store_div(w, w0, dst, at, un, d[r], stream, mode)
        elif op == 1:
            tile.store_cast(w, w0, dst, at, un, stream, mode)
        else:
            tile.store_scale_mul(w, w0, d[r], g, dst, at, un, stream, mode)
        if stream:
            tile.store_fence()
    return 0


@kernel(fastmath=False)
def _store_rows_scalar(op, w, g, dst, starts, n, d, mode):
    for r in numba.prange(starts.size):
        rcp = np.float32(1.0) / d[r]
        for j in range(n):
            v = w[r * n + j]
            y = v * rcp if op == 0 else (v if op == 1 else v * d[r] * g[j])
            dst[starts[r] + j] = dtypes.narrow(dst, y, mode)
    return 0


@pytest.mark.parametrize("op", ["div", "cast", "scale_mul"])
@pytest.mark.parametrize("fmt", ["fp32", "bf16", "fp16"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("mode", ["rint", "floor", "odd"])
def test_stores_are_the_scalar_loops(op, fmt, stream, mode):
    """store_div writes exactly ``narrow(w * fp32(1/d))`` (what ``arcp`` made of softmax's division
    loop, whose bits it keeps), store_cast ``narrow(w)``, store_scale_mul ``narrow((w * d) * g)``,
    each rounding by the mode, on rows that start on and off a line, with heads, whole lines and
    tails (n = 1, 15, 100, 131), and leave every element outside the rows untouched; subnormal,
    Inf and NaN results included."""
    rng = np.random.default_rng(3)
    kind = dtypes.KERNEL[fmt]
    cm = dtypes.cast_mode(mode)
    code = ("div", "cast", "scale_mul").index(op)
    for n in (1, 15, 100, 131):
        rows = 5
        w = (rng.standard_normal(rows * n) * 50).astype(np.float32)
        w[::7] = np.float32(1e-38)
        w[3::11] = np.inf
        w[5::13] = np.nan
        g = (rng.standard_normal(n) * 2).astype(np.float32)
        d = np.array([3.0, 0.7, 1e3, 7.0, 1.0], np.float32)
        starts = np.array([0, n + 1, 2 * n + 17, 3 * n + 40, 4 * n + 64], np.int64)
        size = 4 * n + 64 + n + 16
        got = tile.aligned_empty((size,), fmt)[1]
        got[:] = 0x1234 if kind != np.float32 else 5.0  # sentinels outside the rows
        want = got.copy()
        _store_rows(code, w, g, got, starts, n, d, stream, cm)
        _store_rows_scalar(code, w, g, want, starts, n, d, cm)
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
