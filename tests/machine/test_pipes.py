"""The per-pipe time model (machine/pipes.py) and the vector ISA costs (machine/isa.py).

Hand-computed cases use the published constants themselves (npu-facts 5.2, 8.6 and 4.1 as
copied into tiles/ascend910b.toml), not the model's helpers.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pypto_numba as pn
from pypto_numba import gelu, linear
from pypto_numba.machine import isa, pipes
from pypto_numba.machine.cost import Cost
from pypto_numba.machine.plan import Buffer, KernelPlan

A2 = pn.load_profile("ascend910b")
GIB = 1024 ** 3
CLOCK = 1.85e9
LAUNCH = (10000 + 100) / 2e9          # npu-facts 5.2: stitch + submit latency at 2 GHz
TASK = (240 + 200 + 390) / 2e9        # npu-facts 5.2: AICPU completion + scheduler + resolve
HBM, L2 = 1.42e12, 4.88e12            # tiles/ascend910b.toml [pipes] (named assumptions)


def hill(peak_gibs, k, nbytes):
    return peak_gibs * GIB * nbytes / (k + nbytes)


def vector_plan(tasks, n_elems, tiles=1, mix=(("TMUL", "fp32"),), unique=None, reads=None):
    """The planned Cost of a vector kernel whose tasks read and write ``tiles`` fp32 tiles of
    ``n_elems`` (a KernelPlan alone: tiles larger than UB are fine as model inputs)."""
    nbytes = 4 * n_elems
    reads = tasks * tiles * nbytes if reads is None else reads
    k = KernelPlan("k", "vector", tasks, (Buffer("x_ub", "UB", (n_elems,), "fp32"),),
                   gm_read_bytes=reads, gm_write_bytes=tasks * tiles * nbytes,
                   gm_unique_bytes=unique, tiles_per_task=tiles, load_bytes=nbytes, store_bytes=nbytes,
                   vector_mix=tuple((op, dt, tasks * tiles * n_elems) for op, dt in mix),
                   vector_tile_elems=n_elems, vector_cols=n_elems)
    return k.cost


def test_one_vector_task_by_hand():
    n = 4096
    e = vector_plan(1, n).estimate()
    nbytes = 4 * n
    mte2 = nbytes / hill(247.16, 30643, nbytes)          # GM -> UB fit (npu-facts 8.6)
    vector = (0.0312 * n + 43) / CLOCK                    # TMUL fp32 at the widest row, cols 336
    mte3 = nbytes / hill(28.19, 1755, nbytes)             # UB -> GM fit
    (row,) = e.kernels
    assert row["pipes"]["MTE2"] == pytest.approx(mte2)
    assert row["pipes"]["VECTOR"] == pytest.approx(vector)
    assert row["pipes"]["MTE3"] == pytest.approx(mte3)
    # one tile: nothing overlaps
    assert e.seconds == pytest.approx(LAUNCH + mte2 + vector + mte3 + TASK)
    assert e.model == "pipes" and e.bound == "launch"  # ~1 us of work under a 5 us launch


def test_double_buffered_tiles_overlap():
    n, tiles = 4096, 8
    one = vector_plan(1, n).estimate().kernels[0]["pipes"]
    e = vector_plan(1, n, tiles=tiles).estimate()
    slowest = max(one.values())
    assert e.kernels[0]["pipe"] == "MTE3"  # the UB -> GM fit is the slowest pipe at 16 KiB
    assert e.seconds == pytest.approx(LAUNCH + sum(one.values()) + (tiles - 1) * slowest + TASK)


@pytest.mark.parametrize("delta, waves", [(-1, 1), (0, 1), (1, 2)])
def test_waves_at_cores_plus_minus_one(delta, waves):
    cores = A2.vector_cores
    # 1 KiB transfers: the per-core fits (~8.6 / 11 GB/s) stay under a 48th of the HBM (29.6 GB/s)
    # 64 tiles per task: the cores' time exceeds the AICPUs' dispatch of 49 tasks (49 x 0.415 us / 5)
    base = vector_plan(1, 256, tiles=64).estimate().kernels[0]
    e = vector_plan(cores + delta, 256, tiles=64).estimate()
    row = e.kernels[0]
    assert row["waves"] == waves
    # small tiles: the chip's HBM share is not binding, so every wave costs one task time
    assert row["task_seconds"] == pytest.approx(base["task_seconds"])
    assert e.seconds == pytest.approx(LAUNCH + waves * (base["task_seconds"] + TASK))


@pytest.mark.parametrize("side", [-1, +1])
def test_l2_just_under_and_over_its_size(side):
    unique = A2.pipes.l2_bytes + side * 4096
    n = 1 << 20  # 4 MiB fp32 tiles
    tiles = -(-2 * unique // (A2.vector_cores * 4 * n))
    reads = 2 * unique  # every byte read twice
    e = vector_plan(A2.vector_cores, n, tiles=tiles, unique=unique, reads=reads).estimate()
    row = e.kernels[0]
    writes = A2.vector_cores * tiles * 4 * n
    if side < 0:  # the second read of each byte hits the L2
        assert row["l2_fits"] and row["l2_read_bytes"] == unique
        t_read = unique / HBM + unique / L2
    else:  # thrashes: every read from HBM
        assert not row["l2_fits"] and row["l2_read_bytes"] == 0
        t_read = reads / HBM
    assert row["gm_chip"] == pytest.approx(t_read + writes / HBM)
    assert e.bound == "memory"


def test_l2_step_is_the_hbm_l2_difference():
    unique = A2.pipes.l2_bytes
    costs = []
    for u in (unique, unique + 1):
        costs.append(vector_plan(48, 1 << 20, tiles=8, unique=u, reads=2 * unique).estimate().kernels[0]["gm_chip"])
    assert costs[1] - costs[0] == pytest.approx(unique / HBM - unique / L2, rel=1e-6)


def test_matmul_6144_is_cube_bound_near_the_device_figure():
    # npu-facts 8.5: ~2.1 ms with 128-256 tiles on A2/A3, cube-bound as A and B fit the 192 MB L2
    plan = linear.plan_fused_bias((6144, 6144), (6144, 6144), "fp16")
    e = plan.cost.estimate("ascend910b")
    assert e.bound == "cube"
    assert 2.1e-3 / 1.3 <= e.seconds <= 2.1e-3 * 1.3, e
    row = e.kernels[0]
    n = 6144
    # the distinct bytes: A and B (the walk's grid is taken square: 24 x 24 tasks)
    assert row["gm_unique_bytes"] == pytest.approx(2 * n * n * 2, rel=1e-3)
    assert row["l2_fits"] and row["waves"] == 24 and row["tiles"] == 24
    # the cube pipe is l0_tile's MAD cycles over the 24 waves
    t = pn.tune.l0_tile(256, 256, n, "fp16")
    assert row["pipes"]["CUBE"] == pytest.approx(t.mad / CLOCK)
    assert e.seconds > 24 * t.wall / CLOCK
    # the roofline is kept, named
    assert plan.cost.estimate("ascend910b", model="roofline").model == "roofline"


def test_unknown_model_and_variant():
    c = Cost(kernels=1, tasks=1, gm_read_bytes=64)
    with pytest.raises(ValueError, match=r"unknown estimate model 'sim2'; known: pipes, roofline, sim"):
        c.estimate(A2, model="sim2")
    with pytest.raises(pn.ConstraintError, match=r"unknown vector ISA variant 'hw'; known: pto-isa, seed"):
        c.estimate(A2, variant="hw")


def test_bare_cost_gets_generic_work():
    c = Cost(kernels=1, tasks=100, gm_read_bytes=10**8, gm_write_bytes=10**8, vector_ops=10**7)
    e = c.estimate(A2)
    assert e.seconds > 0 and e.kernels[0]["tiles"] == -(-10**6 // pipes.DEFAULT_TILE_BYTES)
    mm = Cost(kernels=1, tasks=24, gm_read_bytes=10**7, cube_flops=2 * 24 * 128 * 128 * 1024)
    assert mm.estimate(A2).kernels[0]["l0_tile"] is not None


def test_isa_rows_and_fallbacks():
    # PTO-ISA rows (npu-facts 8.6)
    assert isa.instruction_seconds("TEXP", "fp32", 1000, 1, 64, CLOCK) == pytest.approx((0.0314 * 1000 + 30.1) / CLOCK)
    assert isa.instruction_seconds("TMUL", "fp32", 640, 10, 64, CLOCK) == pytest.approx((0.0313 * 640 + 26 * 10) / CLOCK)
    assert isa.instruction_seconds("TDIVS", "fp32", 128, 1, 128, CLOCK) == pytest.approx((0.0794 * 128 + 36.5) / CLOCK)
    # nearest cols: 100 -> 96
    assert isa.instruction_seconds("TADDS", "fp16", 96, 1, 100, CLOCK) == pytest.approx((0.0078 * 96 + 25) / CLOCK)
    # bf16 math runs in fp32 rows
    assert isa.instruction_seconds("TMUL", "bf16", 64, 1, 64, CLOCK) == isa.instruction_seconds("TMUL", "fp32", 64, 1, 64, CLOCK)
    # no PTO-ISA row: hicann (a, b) at 2 GHz, TADD fp32 of 1024 elements (4096 B, pr = 2)
    expect = (math.floor((2.40457 * 4096 * 2 * 1e-6 + 0.0188) * 2000) + 1) / 2e9
    assert isa.instruction_seconds("TADD", "fp32", 1024, 1, 1024, CLOCK) == pytest.approx(expect)
    # fp32 DIV has pr = 1
    expect = (math.floor((3.82854 * 4096 * 1 * 1e-6 + 0.02462) * 2000) + 1) / 2e9
    assert isa.instruction_seconds("TDIV", "fp32", 1024, 1, 1024, CLOCK) == pytest.approx(expect)
    # neither: the latency fallback, 5 + 2 * repeats - 1 with 256-B repeats
    assert isa.instruction_seconds("TRSQRT", "fp32", 1024, 1, 1024, CLOCK) == pytest.approx((5 + 2 * 16 - 1) / 2e9)
    with pytest.raises(pn.ConstraintError, match="unknown vector op kind 'cosh'"):
        isa.expand("cosh")


def test_sequences_and_variants():
    assert isa.expand("tanh", "seed") == (("TTANH", 1),)
    tanh = dict(isa.expand("tanh", "pto-isa"))
    assert tanh["TEXP"] == 1 and tanh["TDIV"] == 1 and "TTANH" not in tanh
    erf = isa.expand("erf", "pto-isa")
    assert sum(c for _, c in erf) == 25 and isa.expand("erf", "seed") == erf
    assert [i for i, _ in isa.expand("sigmoid")] == ["TMULS", "TEXP", "TADDS", "TDIV"]
    assert isa.expand("rsqrt") == (("TRSQRT", 1),) and isa.expand("recip_sqrt") == (("TSQRT", 1), ("TDIV", 1))


def test_gelu_tanh_vector_time_under_each_variant():
    plan_t, plan_e = gelu.plan_tanh((1 << 20,), "bf16"), gelu.plan_erf((1 << 20,), "bf16")
    vec = {}
    for variant in isa.VARIANTS:
        vec[variant] = [p.estimate(variant=variant).kernels[0]["pipes"]["VECTOR"] for p in (plan_t, plan_e)]
    # erf's 25-instruction rational costs more than either reading of tanh
    assert vec["seed"][0] < vec["pto-isa"][0] < vec["pto-isa"][1] == vec["seed"][1]


def test_counted_equals_planned_keeps_the_plan_only_fields():
    import numpy as np

    x = np.linspace(-4, 4, 5000, dtype=np.float32)
    with pn.trace() as t:
        gelu.tanh(x)
    rec = t.records[-1]
    assert not rec.cost.differences(rec.planned)
    assert rec.cost.gm_unique_bytes == rec.planned.gm_unique_bytes == x.nbytes
    assert rec.cost.estimate(A2).seconds == rec.planned.estimate(A2).seconds


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 1 << 22), dtype=st.sampled_from(["fp32", "bf16", "fp16"]),
       m=st.integers(1, 2048), k=st.integers(16, 4096), nn=st.integers(16, 4096))
def test_estimates_positive_and_finite(n, dtype, m, k, nn):
    plans = [gelu.plan_tanh((n,), dtype), gelu.plan_erf((n,), dtype),
             linear.plan_fused_bias((m, k), (nn, k), dtype), linear.plan_matmul_add((m, k), (nn, k), dtype)]
    for p in plans:
        for model in ("pipes", "roofline", "sim"):
            s = p.estimate(model=model).seconds
            assert s > 0 and math.isfinite(s)


def test_pipes_section_of_the_profiles(tmp_path, monkeypatch):
    from pypto_numba.machine import profile as P

    a2, a950 = A2.pipes, pn.load_profile("ascend950").pipes
    assert a2.l2_bytes == 192 * 2**20 and a950.l2_bytes == 128 * 2**20  # npu-facts 4.1
    assert a2.gm_to_ub_peak_gibs == 247.16 and a2.gm_to_ub_k_bytes == 30643  # npu-facts 8.6
    assert a950.gm_to_ub_k_bytes == a2.gm_to_ub_k_bytes and a950.aicpu_threads == 7
    assert pn.load_profile("ascend910c").pipes == a2
    assert a2.launch_s == pytest.approx(LAUNCH) and a2.task_s == pytest.approx(TASK)
    shutil = __import__("shutil")
    shutil.copy(P._tiles_dir() / "ascend910b.toml", tmp_path / "ascend910b.toml")
    (tmp_path / "flat.toml").write_text("base = 'ascend910b'\n[pipes]\ngm_to_ub_k_bytes = 0\n")
    (tmp_path / "neg.toml").write_text("base = 'ascend910b'\n[pipes]\nl2_bytes = -1\n")
    (tmp_path / "zero.toml").write_text("base = 'ascend910b'\n[pipes]\nhbm_bytes_per_s = 0\n")
    monkeypatch.setattr(P, "_tiles_dir", lambda: tmp_path)
    P._load.cache_clear()
    try:
        assert P.load_profile("flat").pipes.gm_to_ub_k_bytes == 0  # a flat rate
        with pytest.raises(pn.PyptoNumbaError, match=r"\[pipes\] l2_bytes = -1 must be > 0"):
            P.load_profile("neg")
        with pytest.raises(pn.PyptoNumbaError, match=r"\[pipes\] hbm_bytes_per_s = 0 must be > 0"):
            P.load_profile("zero")
    finally:
        P._load.cache_clear()


def test_sim_model_by_hand():
    # npu-facts 5.2: cycles = floor((a * bytes * pr * 1e-6 + b) * 2000) + 1 at 2 GHz, +1400 per COPY_IN, +300 per COPY_OUT
    n = 4096
    nbytes = 4 * n
    copy_in = math.floor((2.613 * nbytes * 2 * 1e-6 + 0.00241) * 2000) + 1 + 1400
    mul = math.floor((1.63706 * nbytes * 2 * 1e-6 + 0.01419) * 2000) + 1  # fp32 MUL: pr = 2
    copy_out = math.floor((3.2883 * nbytes * 2 * 1e-6 + 0.00195) * 2000) + 1 + 300
    e = vector_plan(1, n).estimate(model="sim")
    assert e.model == "sim"
    assert e.seconds == pytest.approx(LAUNCH + (copy_in + mul + copy_out) / 2e9 + TASK)
    # the simulator's formula knows no shared HBM: a streaming kernel on all cores is faster than the pipes model says
    big = vector_plan(A2.vector_cores, 1 << 16, tiles=64)
    assert big.estimate(model="sim").seconds < big.estimate().seconds


def test_plans_state_their_distinct_bytes():
    from pypto_numba import rmsnorm, softmax

    on = softmax.plan_online((64, 32768), "bf16").cost
    assert 2 * on.gm_unique_bytes == on.gm_read_bytes  # the second pass re-reads every row
    rn = rmsnorm.plan_plain((4096, 2048), "bf16").cost
    assert rn.gm_unique_bytes == 4096 * 2048 * 2 + 2048 * 2  # x once, the weight row once
    # a decode linear (one row of 32 tasks) reads every weight once and x once per task: the
    # derived walk's distinct bytes are x and the weight, exactly
    dec = linear.plan_fused_bias((1, 4096), (4096, 4096), "bf16", bias=False).cost
    assert dec.gm_read_bytes == 32 * 4096 * 2 + 4096 * 4096 * 2
    assert dec.gm_unique_bytes == 4096 * 2 + 4096 * 4096 * 2


def test_rsqrt_is_cheaper_than_recip_sqrt():
    from pypto_numba import rmsnorm

    vec = [rmsnorm.plan_plain((4096, 128), "bf16", inv=inv).estimate().kernels[0]["vector_instructions"]
           for inv in ("rsqrt", "recip_sqrt")]
    assert "TRSQRT" in vec[0] and "TRSQRT" not in vec[1]
    assert sum(vec[0].values()) < sum(vec[1].values())
