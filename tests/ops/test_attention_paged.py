"""Paged KV cache (attention.paged): a paged online/flash call gives the bits of the dense call on
the gathered cache (same kv_tile, same num_splits); write_kv against NumPy assignment."""

from __future__ import annotations

import numpy as np
import pytest

from pypto_numba.attention import flash, online, plan_paged, plan_write_kv, standard, write_kv
from pypto_numba.attention.paged_decode import head_groups, rows_per_page
from pypto_numba.errors import ConstraintError, DTypeError, ShapeError

from helpers import DTYPES, NP_DTYPE, assert_cost_matches_plan, make, run_traced

STRATEGIES = {"flash": flash, "online": online}


def paged_case(rng, dtype, B, Hq, Hkv, Sq, D, kv_len, bs, max_blocks, spare=3):
    """q, the paged caches (shuffled, non-monotone block table; NaN in every unused page and slot),
    the table and the dense caches gathered from it [B, Hkv, max_blocks*bs, D]."""
    nb = B * max_blocks + spare
    q = make((B, Hq, Sq, D), dtype, rng)
    kc = np.full((nb, bs, Hkv, D), np.nan, np.float32).astype(NP_DTYPE[dtype])
    vc = np.full((nb, bs, Hkv, D), np.nan, np.float32).astype(NP_DTYPE[dtype])
    perm = rng.permutation(nb)
    table = np.full((B, max_blocks), -1, np.int32)  # -1: padding past the used pages
    used = 0
    for b in range(B):
        need = -(-int(kv_len[b]) // bs)
        table[b, :need] = perm[used:used + need]
        used += need
        for j in range(int(kv_len[b])):
            page, off = table[b, j // bs], j % bs
            kc[page, off] = make((Hkv, D), dtype, rng)
            vc[page, off] = make((Hkv, D), dtype, rng)
    Skv = max_blocks * bs
    kd = np.zeros((B, Hkv, Skv, D), NP_DTYPE[dtype])
    vd = np.zeros((B, Hkv, Skv, D), NP_DTYPE[dtype])
    for b in range(B):
        for j in range(int(kv_len[b])):
            kd[b, :, j] = kc[table[b, j // bs], j % bs]
            vd[b, :, j] = vc[table[b, j // bs], j % bs]
    return q, kc, vc, table, kd, vd


def same_bits(x, y):
    x, y = np.asarray(x), np.asarray(y)
    assert x.shape == y.shape and x.dtype == y.dtype
    assert np.array_equal(x.view(np.uint8), y.view(np.uint8)), f"max diff {np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)))}"
    assert np.isfinite(x.astype(np.float32)).all()  # the NaN in unused pages never reaches the output


@pytest.mark.parametrize("name", ["flash", "online"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [16, 64, 128])
def test_decode_same_bits_as_dense(name, dtype, bs, rng):
    """GQA decode with per-batch odd kv_len; kv_tile below, equal to and above block_size."""
    B, Hq, Hkv, D = 3, 8, 2, 32
    kv_len = np.array([1, 2 * bs + 5, 3 * bs - 1])
    q, kc, vc, table, kd, vd = paged_case(rng, dtype, B, Hq, Hkv, 1, D, kv_len, bs, 3)
    fn = STRATEGIES[name]
    for kvt in (48, bs, 2 * bs + 16):
        extra = {"num_splits": 2} if name == "flash" else {}
        out, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, kv_tile=kvt, **extra)
        assert_cost_matches_plan(rec)
        same_bits(out, fn(q, kd, vd, kv_len=kv_len, kv_tile=kvt, **extra))


@pytest.mark.parametrize("name", ["flash", "online"])
def test_decode_head_groups_same_bits_as_dense(name, rng):
    """Batch 1: the page-major decode kernel splits the KV heads into groups (halves, single heads,
    thirds); kv_tile 50 (not a multiple of 4) takes the gathering kernel instead."""
    fn = STRATEGIES[name]
    extra = {"num_splits": 1} if name == "flash" else {}
    for Hkv, kvt in ((4, 64), (3, 64), (6, 32), (4, 50)):
        kv_len = np.array([301])
        q, kc, vc, table, kd, vd = paged_case(rng, "bf16", 1, 2 * Hkv, Hkv, 1, 32, kv_len, 64, 6)
        out, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, kv_tile=kvt, **extra)
        assert_cost_matches_plan(rec)
        same_bits(out, fn(q, kd, vd, kv_len=kv_len, kv_tile=kvt, **extra))


@pytest.mark.parametrize("name", ["flash", "online"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_decode_key_groups_same_bits_as_dense(name, dtype, rng):
    """Key rows of 4, 2 and 1 per 4 KiB CPU page: the page-major kernel takes Q K^T in groups of
    every 4th / 2nd key (or plain blocks of 4). kv_tile 20 starts groups off the page grid, where
    the kernel falls back to blocks of 4; kv_len cuts a group."""
    fn = STRATEGIES[name]
    extra = {"num_splits": 2} if name == "flash" else {}
    item = np.dtype(NP_DTYPE[dtype]).itemsize
    seen = set()
    for Hkv in (2, 4, 8):  # rows of 1, 2 and 4 KiB
        D = 512 // item
        seen.add(rows_per_page(Hkv * D * item))
        kv_len = np.array([150, 77])
        q, kc, vc, table, kd, vd = paged_case(rng, dtype, 2, 2 * Hkv, Hkv, 1, D, kv_len, 16, 10)
        for kvt in (20, 64):
            out, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, kv_tile=kvt, **extra)
            assert_cost_matches_plan(rec)
            same_bits(out, fn(q, kd, vd, kv_len=kv_len, kv_tile=kvt, **extra))
    assert seen == {4, 2, 1}


def test_head_groups_keep_both_threads_busy():
    assert head_groups(4, 8, 2) == 1  # 4 tasks for 2 threads
    assert head_groups(3, 8, 2) == 1
    assert head_groups(1, 8, 2) == 2
    assert head_groups(1, 8, 4) == 4
    assert head_groups(1, 3, 2) == 3  # no divisor of 3 between: one head per task
    assert head_groups(1, 1, 2) == 1


@pytest.mark.parametrize("name", ["flash", "online"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [16, 64, 128])
def test_causal_prefill_same_bits_as_dense(name, dtype, bs, rng):
    """MHA and GQA causal prefill (prefill blocks use the GEMM path), per-batch kv_len, tails."""
    for Hq, Hkv in ((2, 2), (4, 2)):
        B, Sq, D = 2, 37, 16
        kv_len = np.array([Sq + bs + 3, Sq])
        q, kc, vc, table, kd, vd = paged_case(rng, dtype, B, Hq, Hkv, Sq, D, kv_len, bs, -(-(Sq + bs + 3) // bs) + 1)
        fn = STRATEGIES[name]
        out, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, causal=True, kv_tile=32)
        assert_cost_matches_plan(rec)
        same_bits(out, fn(q, kd, vd, kv_len=kv_len, causal=True, kv_tile=32))


@pytest.mark.parametrize("name", ["flash", "online"])
def test_window_softcap_sinks_same_bits_as_dense(name, rng):
    B, Hq, Hkv, Sq, D, bs = 2, 4, 2, 3, 16, 16
    kv_len = np.array([150, 61])
    q, kc, vc, table, kd, vd = paged_case(rng, "bf16", B, Hq, Hkv, Sq, D, kv_len, bs, 10)
    fn = STRATEGIES[name]
    sinks = rng.standard_normal(Hq).astype(np.float32)
    for opts in ({"window": 40}, {"window": (20, 2)}, {"softcap": 5.0, "sinks": sinks, "window": 33}):
        out, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, kv_tile=32, **opts)
        assert_cost_matches_plan(rec)
        same_bits(out, fn(q, kd, vd, kv_len=kv_len, kv_tile=32, **opts))


def test_mask_and_pv_modes_same_bits_as_dense(rng):
    """An additive mask over the logical cache [B, Hq, Sq, max_blocks*bs]; online's pv modes."""
    B, Hq, Hkv, Sq, D, bs = 2, 4, 2, 2, 16, 16
    kv_len = np.array([45, 30])
    q, kc, vc, table, kd, vd = paged_case(rng, "bf16", B, Hq, Hkv, Sq, D, kv_len, bs, 4)
    mask = rng.standard_normal((1, Hq, 1, 4 * bs)).astype(np.float32)
    mask[..., 3] = -np.inf
    for fn, opts in ((flash, {}), (online, {}), (online, {"pv": "compensated"}), (online, {"pv": "fp32"})):
        out, rec = run_traced(fn, q, kc, vc, block_table=table, kv_len=kv_len, mask=mask, kv_tile=32, **opts)
        assert_cost_matches_plan(rec)
        same_bits(out, fn(q, kd, vd, kv_len=kv_len, mask=mask, kv_tile=32, **opts))


def test_flash_lse_and_default_splits(rng):
    B, Hq, Hkv, D, bs = 1, 4, 1, 64, 64
    kv_len = np.array([1000])
    q, kc, vc, table, kd, vd = paged_case(rng, "fp32", B, Hq, Hkv, 1, D, kv_len, bs, 16)
    (out, lse), rec = run_traced(flash, q, kc, vc, block_table=table, kv_len=kv_len, return_lse=True)
    assert_cost_matches_plan(rec)
    ref, ref_lse = flash(q, kd, vd, kv_len=kv_len, return_lse=True)
    same_bits(out, ref)
    same_bits(lse, ref_lse)


def test_int64_table_is_accepted(rng):
    kv_len = np.array([40, 17])
    q, kc, vc, table, kd, vd = paged_case(rng, "fp32", 2, 2, 2, 1, 16, kv_len, 16, 3)
    same_bits(online(q, kc, vc, block_table=table.astype(np.int64), kv_len=kv_len),
              online(q, kc, vc, block_table=table, kv_len=kv_len))


def test_plan_counts_table_reads_and_no_keys_past_kv_len():
    """Decode, 1 task per KV head (G = 2 rows): K/V of kv_len keys only, 4 B per page touched."""
    p = plan_paged("flash", (1, 4, 1, 64), (20, 16, 2, 64), (1, 10), None, "fp32", kv_len=[50], kv_tile=64,
                   num_splits=1)
    dense = p.kernels[0]
    # per KV head: Q 2*64*4, K/V 50 keys * 128 * 4 (not the table's 160), 4 pages * 4 B; out 2*64*4
    assert dense.gm_read_bytes == 2 * (2 * 64 * 4 + 50 * 128 * 4 + 4 * 4)
    assert dense.gm_write_bytes == 2 * 2 * 64 * 4
    assert p.params["block_size"] == 16


def test_write_kv_matches_numpy_assignment(rng):
    for dtype in DTYPES:
        nb, bs, Hkv, D = 5, 16, 2, 8
        kc = make((nb, bs, Hkv, D), dtype, rng)
        vc = make((nb, bs, Hkv, D), dtype, rng)
        T = 7
        kn, vn = make((T, Hkv, D), dtype, rng), make((T, Hkv, D), dtype, rng)
        slots = np.array([3, -1, 79, 16, -1, 40, 0], np.int64)
        for sm in (slots, slots.astype(np.int32)):
            ek, ev = kc.copy(), vc.copy()
            for t, s in enumerate(slots):
                if s >= 0:
                    ek[s // bs, s % bs] = kn[t]
                    ev[s // bs, s % bs] = vn[t]
            k2, v2 = kc.copy(), vc.copy()
            assert write_kv(k2, v2, kn, vn, sm) is None
            assert np.array_equal(k2.view(np.uint8), ek.view(np.uint8))
            assert np.array_equal(v2.view(np.uint8), ev.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_counted_cost_equals_plan(dtype, rng):
    """One copy kernel: GM read = written = live tokens x Hkv x (D + Dv) x b, plus 8 B per slot
    read (v with another Dv); a strided k_new (copied first, counted as workspace) gives NumPy's bits."""
    nb, bs, Hkv, D, Dv, T = 3, 16, 2, 24, 8, 5
    kc, vc = make((nb, bs, Hkv, D), dtype, rng), make((nb, bs, Hkv, Dv), dtype, rng)
    kn, vn = make((T, Hkv, D), dtype, rng), make((T, Hkv, Dv), dtype, rng)
    slots = np.array([47, -1, 0, 17, -1], np.int32)
    ek, ev = kc.copy(), vc.copy()
    for t, s in enumerate(slots):
        if s >= 0:
            ek[s // bs, s % bs], ev[s // bs, s % bs] = kn[t], vn[t]
    _, rec = run_traced(write_kv, kc, vc, kn, vn, slots)
    assert_cost_matches_plan(rec)
    assert (rec.op, rec.strategy) == ("attention", "write_kv")
    b = np.dtype(NP_DTYPE[dtype]).itemsize
    assert rec.cost.kernels == 1 and rec.cost.tasks == 1  # 5 tokens' rows fit one 32 KiB tile
    assert rec.cost.gm_write_bytes == 3 * Hkv * (D + Dv) * b
    assert rec.cost.gm_read_bytes == 3 * Hkv * (D + Dv) * b + 8 * T
    assert np.array_equal(kc.view(np.uint8), ek.view(np.uint8))
    assert np.array_equal(vc.view(np.uint8), ev.view(np.uint8))
    strided = np.ascontiguousarray(kn[::-1].transpose(1, 0, 2)).transpose(1, 0, 2)  # not C-contiguous
    _, rec = run_traced(write_kv, kc, vc, strided, vn, slots)
    assert rec.cost.workspace_bytes == kn.nbytes  # its contiguous copy
    for t, s in enumerate(slots):
        if s >= 0:
            assert np.array_equal(kc[s // bs, s % bs].view(np.uint8), kn[::-1][t].view(np.uint8))
    p = plan_write_kv((T, Hkv, D), (nb, bs, Hkv, D), dtype, v_dim=Dv)  # all T tokens live
    assert p.cost.gm_write_bytes == T * Hkv * (D + Dv) * b
    many = plan_write_kv((2048, 8, 128), (16, 128, 8, 128), dtype)  # a prefill: 32 KiB of rows per task
    assert many.cost.tasks == 2048 // (32768 // (8 * 128 * b))
    with pytest.raises(ShapeError, match="must share Hkv and D"):
        plan_write_kv((T, Hkv, D), (nb, bs, Hkv + 1, D), dtype)
    with pytest.raises(ConstraintError, match="tokens=6"):
        plan_write_kv((T, Hkv, D), (nb, bs, Hkv, D), dtype, tokens=6)


def test_write_kv_then_decode(rng):
    """A decode layer: write the step's token through slot_mapping, then attend the paged cache."""
    bs, Hkv, D, Hq = 16, 2, 16, 4
    kc = np.zeros((4, bs, Hkv, D), np.float32)
    vc = np.zeros((4, bs, Hkv, D), np.float32)
    table = np.array([[2, 0]], np.int32)
    ks, vs = make((20, Hkv, D), "fp32", rng), make((20, Hkv, D), "fp32", rng)
    slots = np.array([table[0, j // bs] * bs + j % bs for j in range(20)])
    write_kv(kc, vc, ks, vs, slots)
    q = make((1, Hq, 1, D), "fp32", rng)
    out = flash(q, kc, vc, block_table=table, kv_len=np.array([20]))
    kd = np.zeros((1, Hkv, 2 * bs, D), np.float32)
    vd = np.zeros((1, Hkv, 2 * bs, D), np.float32)
    kd[0, :, :20] = ks.transpose(1, 0, 2)
    vd[0, :, :20] = vs.transpose(1, 0, 2)
    same_bits(out, flash(q, kd, vd, kv_len=np.array([20])))


def _good(rng):
    kv_len = np.array([40, 17])
    q, kc, vc, table, _, _ = paged_case(rng, "fp32", 2, 4, 2, 1, 16, kv_len, 16, 3)
    return q, kc, vc, table, kv_len


@pytest.mark.parametrize("name", ["flash", "online"])
def test_bad_paged_inputs(name, rng):
    q, kc, vc, table, kv_len = _good(rng)
    fn = STRATEGIES[name]
    bad = table.copy()
    bad[0, 1] = kc.shape[0]
    with pytest.raises(ConstraintError, match=r"block_table\[0, 1\] = 9 is outside \[0, num_blocks=9\)"):
        fn(q, kc, vc, block_table=bad, kv_len=kv_len)
    bad[0, 1] = -1
    with pytest.raises(ConstraintError, match="outside"):
        fn(q, kc, vc, block_table=bad, kv_len=kv_len)
    with pytest.raises(ConstraintError, match="beyond the sequence's blocks.*at least 4 entries"):
        fn(q, kc, vc, block_table=table, kv_len=np.array([49, 3]))
    with pytest.raises(ConstraintError, match="needs kv_len"):
        fn(q, kc, vc, block_table=table)
    with pytest.raises(ConstraintError, match="multiple of 16"):
        fn(q, kc[:, :8], vc[:, :8], block_table=table, kv_len=np.array([8, 3]))
    with pytest.raises(ShapeError, match="head dim of k_cache"):
        fn(q, kc[..., :8], vc[..., :8], block_table=table, kv_len=kv_len)
    with pytest.raises(ShapeError, match="not a multiple of the cache's Hkv=3"):
        fn(q, np.zeros((9, 16, 3, 16), np.float32), np.zeros((9, 16, 3, 16), np.float32), block_table=table,
           kv_len=kv_len)
    with pytest.raises(ShapeError, match="must share"):
        fn(q, kc, vc[:, :, :1], block_table=table, kv_len=kv_len)
    with pytest.raises(DTypeError, match="block_table must be int32"):
        fn(q, kc, vc, block_table=table.astype(np.float32), kv_len=kv_len)
    with pytest.raises(ShapeError, match=r"block_table must have shape \[B, max_blocks_per_seq\]"):
        fn(q, kc, vc, block_table=table[:1], kv_len=kv_len)
    with pytest.raises(ConstraintError, match="gqa='head_loop' only"):
        fn(q, kc, vc, block_table=table, kv_len=kv_len, gqa="expand_clone")


def test_standard_refuses_block_table(rng):
    q, kc, vc, table, kv_len = _good(rng)
    with pytest.raises(ConstraintError, match="use attention.flash or attention.online"):
        standard(q, kc, vc, block_table=table, kv_len=kv_len)


def test_bad_write_kv(rng):
    kc = np.zeros((2, 16, 2, 8), np.float32)
    vc = np.zeros((2, 16, 2, 8), np.float32)
    kn = np.ones((3, 2, 8), np.float32)
    with pytest.raises(ConstraintError, match=r"slot_mapping\[1\] = 32 is outside \[0, num_blocks \* block_size = 32\)"):
        write_kv(kc, vc, kn, kn, np.array([0, 32, -1]))
    with pytest.raises(ConstraintError, match="outside"):
        write_kv(kc, vc, kn, kn, np.array([0, -2, 1]))
    with pytest.raises(ConstraintError, match=r"slot 5 appears more than once.*tokens \[0, 2\]"):
        write_kv(kc, vc, kn, kn, np.array([5, -1, 5]))
    with pytest.raises(DTypeError, match="int32 or int64"):
        write_kv(kc, vc, kn, kn, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ShapeError, match=r"slot_mapping must have shape \[T\] = \(3,\)"):
        write_kv(kc, vc, kn, kn, np.array([0, 1]))
    with pytest.raises(ShapeError, match=r"must be \[T, Hkv, D\]"):
        write_kv(kc, vc, kn[:, :1], kn[:, :1], np.array([0, 1, 2]))
    with pytest.raises(DTypeError, match="share one storage dtype"):
        write_kv(kc, vc, kn.astype(np.float16), kn.astype(np.float16), np.array([0, 1, 2]))
    with pytest.raises(ConstraintError, match="writeable C-contiguous"):
        write_kv(kc[:, ::2], vc[:, ::2], kn, kn, np.array([0, 1, 2]))
    assert not kc.any()  # nothing written by a refused call
