"""tune.l0_tile: the device-fitted L0 tile model of npu-facts 8.2 (PyPTO's ChooseL0Tile)."""

import dataclasses
import itertools
import math
import shutil

import pytest

from pypto_numba import tune
from pypto_numba.errors import ConstraintError, DTypeError, ShapeError
from pypto_numba.machine import plan
from pypto_numba.machine.profile import ProfileError, load_profile

# npu-facts 8.2, pinned by pypto:tests/ut/ir/transforms/test_l0_tile_chooser.py
# (TestL0TilingRooflineMigration): (M, N, K, operand dtype) -> (m, n, k), output-stationary, dbC = 1
PINNED = [
    ((256, 256, 64, "bf16"), (128, 256, 64)),
    ((272, 272, 64, "bf16"), (144, 128, 64)),
    ((320, 320, 64, "bf16"), (160, 128, 64)),
    ((256, 256, 256, "fp32"), (128, 256, 32)),
]

SHAPES = [(256, 256, 64), (272, 272, 64), (320, 320, 64), (256, 256, 256), (100, 300, 17),
          (16, 16, 16), (1, 4096, 4096), (4096, 1, 128), (1000, 1000, 1000), (512, 384, 96),
          (6144, 6144, 6144)]


@pytest.mark.parametrize("args, tile", PINNED)
def test_pinned_tiles(args, tile):
    got = tune.l0_tile(*args)
    assert (got.m, got.n, got.k) == tile
    assert (got.stationarity, got.dbc) == ("output", 1)


def test_pinned_tiles_under_any_of_the_a2a3_profiles():
    for name in ("ascend910b", "ascend910c"):
        for args, tile in PINNED:
            assert tune.l0_tile(*args, profile=name).shape == tile


def test_hand_computed_cycles():
    # (256, 256, 64) bf16 -> (128, 256, 64): P = 2, Q = 1, T = 2 output tiles, kb = 1 (k == K)
    t = tune.l0_tile(256, 256, 64, "bf16")
    a_panel = 128 * 64 * 2 / 129.7   # 126.32 cycles per [m, K] A panel, L1 -> L0A
    b_panel = 64 * 256 * 2 / 85.4    # 383.70 cycles per [K, n] B panel, L1 -> L0B
    rows_outer = 2 * a_panel + 2 * b_panel  # A held: P A panels, T B panels = 1020.04
    cols_outer = 2 * a_panel + 1 * b_panel  # B held: T A panels, Q B panels = 636.34
    assert t.outer == "B" and t.load == pytest.approx(cols_outer) and cols_outer < rows_outer
    # kt = 32 / 2 = 16: 4 K-fractals per tile, each 21 + 1 pass * (128/16) * (256/16) = 149
    assert t.mad == 2 * 1 * 4 * (21 + 8 * 16) == 1192
    # N0 = 8, ceil(256/8) = 32 fractals, odd(32) = 1 (no penalty); per row max(4.45, 4*256/118)
    row = 4 * 256 / 118              # 8.678 cycles per M-row
    assert t.drain == pytest.approx(2 * (164 + 128 * row))  # 2549.56
    assert t.wall == pytest.approx(1192 + 2 * (164 + 128 * row))  # 3741.56, max(load, mad) + drain
    assert t.bound == "drain" and t.grid == (2, 1) and t.k_blocks == 1
    assert t.wall_s == pytest.approx(t.wall / 1.85e9)
    # PTO-ISA (npu-facts 8.6): 2 TMATMULs of 6 + ceil(128/16)*ceil(64/16)*ceil(256/16) = 518
    assert t.isa_mad == 2 * (6 + 8 * 4 * 16) == 1036
    assert tune.isa_mad_cycles(128, 64, 256, "bf16") == 518
    assert (t.l0a_bytes, t.l0b_bytes, t.l0c_bytes) == (128 * 64 * 2 * 2, 64 * 256 * 2 * 2, 128 * 256 * 4)


def test_hand_computed_double_buffered_c():
    # dbC = 2 on (256, 256, 64) bf16: wall = max(load, mad, drain) + min(compute, drain) / T
    t = tune.l0_tile(256, 256, 64, "bf16", dbc=2)
    assert (t.m, t.n, t.k, t.dbc) == (128, 128, 64, 2)  # 2 x 2 grid, L0C 2 x 64 KiB
    a_panel, b_panel = 128 * 64 * 2 / 129.7, 64 * 128 * 2 / 85.4
    load = min(2 * a_panel + 4 * b_panel, 4 * a_panel + 2 * b_panel)
    mad = 4 * 4 * (21 + 8 * 8)                       # 1360
    drain = 4 * (164 + 128 * 4.45)                   # 4 * max(4.45, 4*128/118 = 4.34) per row
    assert (t.load, t.mad, t.drain) == (pytest.approx(load), mad, pytest.approx(drain))
    assert t.wall == pytest.approx(max(load, mad, drain) + min(max(load, mad), drain) / 4)


def test_isa_mad_cycles_fp32_uses_two_passes_and_eight_wide_k():
    assert tune.isa_mad_cycles(16, 8, 16, "fp32") == 6 + 2 * 1 * 1 * 1
    assert tune.isa_mad_cycles(16, 16, 16, "fp16") == 6 + 1
    assert tune.isa_mad_cycles(17, 16, 16, "bf16") == 6 + 2  # partial fractals round up


def _check_legal(t, profile):
    """The capacity rules of npu-facts 8.2, written out independently of tune."""
    p = load_profile(profile)
    nbytes = 4 if t.dtype == "fp32" else 2
    db_a, db_b = {"output": (2, 2), "A": (1, 2), "B": (2, 1)}[t.stationarity]
    assert t.m % 16 == 0 and t.n % 16 == 0 and t.k % 16 == 0 and min(t.m, t.n, t.k) >= 16
    assert t.m <= -(-t.M // 16) * 16 and t.n <= -(-t.N // 16) * 16 and t.k <= -(-t.K // 16) * 16
    assert -(-t.m // 16) * 16 * t.n * 4 * t.dbc <= p.l0c_bytes
    assert t.m * t.k * nbytes * db_a <= p.l0a_bytes
    assert t.k * t.n * nbytes * db_b <= p.l0b_bytes
    if t.stationarity != "output" or t.dbc == 2:
        assert t.k == -(-t.K // 16) * 16  # these hold the whole K
    if t.dbc == 2:
        assert min(t.grid) >= 2
    # and the cube plan of the lab accepts one buffer of each
    plan.cube_tiles(((t.m, t.m), (t.k, t.k), (t.n, t.n)), t.dtype, t.dtype, p, "test_tune")
    assert t.wall > 0 and math.isfinite(t.wall)


@pytest.mark.parametrize("profile", ["ascend910b", "ascend950"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_every_tile_is_legal_and_any_is_never_worse(profile, dtype):
    for M, N, K in SHAPES:
        default = tune.l0_tile(M, N, K, dtype, profile=profile)
        _check_legal(default, profile)
        best = tune.l0_tile(M, N, K, dtype, profile=profile, stationarity="any", dbc="any")
        _check_legal(best, profile)
        assert best.wall <= default.wall
        for stationarity, dbc in itertools.product(("output", "A", "B", "any"), (1, 2, "any")):
            try:
                t = tune.l0_tile(M, N, K, dtype, profile=profile, stationarity=stationarity, dbc=dbc)
            except ConstraintError:
                assert (stationarity, dbc) != ("output", 1)
                continue
            _check_legal(t, profile)
            assert best.wall <= t.wall
            if stationarity != "any":
                assert t.stationarity == stationarity
            if dbc != "any":
                assert t.dbc == dbc


def test_950_uses_its_own_constants():
    a2, a5 = load_profile("ascend910b").cube_model, load_profile("ascend950").cube_model
    assert (a2.bw_a, a2.bw_b, a2.mad_head, a2.mad_fp32_passes, a2.drain_fixed, a2.drain_row,
            a2.bw_drain, a2.drain_penalty, a2.l0c_align_m) == (129.7, 85.4, 21, 2, 164, 4.45, 118, 2.6, 16)
    assert (a5.bw_a, a5.bw_b, a5.mad_head, a5.mad_fp32_passes, a5.drain_fixed, a5.drain_row,
            a5.bw_drain) == (206.3, 223.8, 25, 8, 343.4, 4.59, 30)
    t = tune.l0_tile(256, 256, 256, "fp32", profile="ascend950")
    assert t.profile == "ascend950" and t.l0c_bytes <= 262144
    assert t.mad > tune.l0_tile(256, 256, 256, "fp32").mad  # 8 fp32 passes against 2


def test_padding_to_the_fractal():
    # K = 17 pads to 32: two bf16 K-fractals, the tile keeps the padded K
    t = tune.l0_tile(100, 300, 17, "bf16")
    assert t.k == 32 and t.m <= 112 and t.n <= 304


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(M=0), ShapeError, r"tune.l0_tile: M must be a positive integer, got 0"),
    (dict(N=-16), ShapeError, r"N must be a positive integer, got -16"),
    (dict(K=16.0), ShapeError, r"K must be a positive integer, got 16.0"),
    (dict(M=True), ShapeError, r"M must be a positive integer"),
    (dict(dtype="int8"), DTypeError, r"tune.l0_tile: dtype 'int8' is not a storage dtype"),
    (dict(stationarity="C"), ConstraintError, r"stationarity must be one of 'output', 'A', 'B', 'any', got 'C'"),
    (dict(stationarity=None), ConstraintError, r"stationarity must be one of"),
    (dict(dbc=3), ConstraintError, r"dbc must be one of 1, 2, 'any', got 3"),
    (dict(dbc=True), ConstraintError, r"dbc must be one of"),
    (dict(dbc="2"), ConstraintError, r"dbc must be one of"),
    (dict(profile="a9"), ProfileError, r"unknown hardware profile 'a9'"),
])
def test_bad_inputs(kwargs, error, match):
    args = dict(M=256, N=256, K=64) | kwargs
    with pytest.raises(error, match=match):
        tune.l0_tile(**args)


def test_no_legal_tile_names_the_rule_and_the_way_out():
    # A-stationary holds all of K = 8192 bf16 in L0A: 16 x 8192 x 2 = 256 KiB > 64 KiB
    rule = r"no legal L0 tile.*A/B-stationary holds the whole K.*stationarity='output'"
    with pytest.raises(ConstraintError, match=rule):
        tune.l0_tile(256, 256, 8192, stationarity="A")
    # dbc=2 needs a 2 x 2 grid; a 16 x 16 output has one tile
    with pytest.raises(ConstraintError, match=r"dbc=2 needs the whole K and a grid of at least 2 x 2"):
        tune.l0_tile(16, 16, 16, dbc=2)
    with pytest.raises(ShapeError, match=r"tune.isa_mad_cycles: k must be a positive integer"):
        tune.isa_mad_cycles(16, 0, 16)


def test_malformed_cube_model_section(tmp_path, monkeypatch):
    from pypto_numba.machine import profile as P

    shutil.copy(P._tiles_dir() / "ascend910b.toml", tmp_path / "ascend910b.toml")
    (tmp_path / "nobw.toml").write_text(
        (tmp_path / "ascend910b.toml").read_text().replace("bw_a = 129.7", "# no bw_a")
    )
    (tmp_path / "zero.toml").write_text("base = 'ascend910b'\n[cube_model]\nmad_head = 0\n")
    (tmp_path / "text.toml").write_text("base = 'ascend910b'\n[cube_model]\nl0c_align_m = 'x'\n")
    monkeypatch.setattr(P, "_tiles_dir", lambda: tmp_path)
    P._load.cache_clear()
    try:
        with pytest.raises(ProfileError, match=r"lacks \[cube_model\] bw_a"):
            load_profile("nobw")
        with pytest.raises(ProfileError, match=r"\[cube_model\] mad_head = 0 must be > 0"):
            load_profile("zero")
        with pytest.raises(ProfileError, match=r"\[cube_model\] l0c_align_m = 'x' is not a int"):
            load_profile("text")
    finally:
        P._load.cache_clear()


# --- tune.search: the tile search (issue 19 item 5) ----------------------------------------------

import json as _json
import os as _os
import subprocess as _subprocess
import sys as _sys

from hypothesis import given, settings
from hypothesis import strategies as st

import pypto_numba as pn
from pypto_numba import gelu, linear, strategy
from pypto_numba.errors import PyptoNumbaError, TileError
from pypto_numba.machine.plan import LEVELS
from pypto_numba.report.scenarios import load_scenarios

SCENARIOS = load_scenarios(_os.path.join(_os.path.dirname(__file__), "..", "..", "strategies", "scenarios.toml"))


def _fits(plan):
    """Every kernel's buffers within the profile's limit, level by level (checked here, not by Plan)."""
    return all(k.level_bytes(level) <= plan.profile.limit(level) for k in plan.kernels for level in LEVELS)


def test_search_never_returns_a_tile_the_plan_refuses():
    # gelu erf at 32768 elements: 2*2 + 5*4 = 24 B per element = 786432 B of UB > 188416 B
    s = tune.search("gelu", top=1000, shape=(64, 9216), dtype="bf16")
    assert s.refused["erf"] > 0 and s.refused["tanh"] > 0
    with pytest.raises(TileError, match="188416"):
        gelu.plan_erf((64, 9216), "bf16", tile=32768)
    for t in s:
        assert t.tiles.get("tile") != 32768 or t.strategy == "tanh"
        plan = (gelu.plan_tanh if t.strategy == "tanh" else gelu.plan_erf)((64, 9216), "bf16", **t.tiles)
        assert _fits(plan) and plan.estimate().seconds == pytest.approx(t.seconds)
    # linear: re-plan every returned cube tile through the public plan function
    s = tune.search("linear", top=1000, tokens=256, in_features=1024, out_features=2048)
    assert sum(s.refused.values()) > 0
    for t in s:
        fn = linear.plan_fused_bias if t.strategy == "fused_bias" else linear.plan_matmul_add
        plan = fn((256, 1024), (2048, 1024), "bf16", **t.tiles)
        assert _fits(plan)
        (m0, m1), (k0, k1), (n0, n1) = t.tiles.get("cube_tiles", plan.params and
                                                   ((plan.params["m0"], plan.params["m1"]),
                                                    (plan.params["k0"], plan.params["k1"]),
                                                    (plan.params["n0"], plan.params["n1"])))
        assert (m1 + n1) * k1 * 2 <= 524288 and m0 * n0 * 4 <= 131072  # L1 and L0C by hand


@pytest.mark.parametrize("sc", SCENARIOS, ids=[sc.name for sc in SCENARIOS])
def test_best_is_no_worse_than_the_default_tiles_and_ranking_is_monotone(sc):
    s = tune.search(sc.op, top=50, **sc.advise)
    secs = [t.seconds for t in s]
    assert secs == sorted(secs) and all(math.isfinite(x) and x > 0 for x in secs)
    assert s[0].seconds == min(b.seconds for b in s.best.values())
    for label, d in s.defaults.items():
        assert s.best[label].seconds <= d.seconds
        assert d.default
    # the defaults are the advise rule's own plans (tiles='default' prices exactly those)
    a = pn.advise(sc.op, tiles="default", **sc.advise)
    for label, seconds, *_ in a.ranking:
        assert s.defaults[label].seconds == pytest.approx(seconds)
    b = pn.advise(sc.op, **sc.advise)
    assert min(r[1] for r in b.ranking) <= min(r[1] for r in a.ranking) * (1 + 1e-12)
    assert any("tiles='best'" in r for r in b.reasons)


def test_matmul_6144_default_and_best():
    # npu-facts 8.5: 6144^3 fp16, ~2.1 ms at 128-256 tiles, ~1.6 ms tuned; the model: cube-bound
    s = tune.search("linear", top=3, tokens=6144, in_features=6144, out_features=6144, dtype="fp16", bias=False)
    d = s.defaults["fused_bias"]
    assert d.bound == "cube" and 2.1e-3 / 1.3 <= d.seconds <= 2.1e-3 * 1.3
    assert s[0].seconds < d.seconds and s[0].bound == "cube"
    assert s[0].tiles["cube_tiles"] != ((128, 256), (64, 256), (128, 256))


def test_search_reports_pipes_memory_and_hints():
    s = tune.search("attention", top=2, q_len=1, kv_len=4096)
    t = s[0]
    assert set(t.pipes) == {"MTE2", "MTE1", "CUBE", "VECTOR", "FIXPIPE", "MTE3"}
    assert "usage" in t.memory_report() and "UB" in t.memory_report()
    text = str(s)
    assert "tile shapes planned" in text and t.label in text and "default tiles" in text
    d = s.to_dict()
    assert d["results"][0]["strategy"] == t.strategy and d["results"][0]["memory"]
    assert "hints:" in s.details(1)


def test_search_errors():
    with pytest.raises(PyptoNumbaError, match="unknown op 'conv2d'"):
        tune.search("conv2d")
    with pytest.raises(PyptoNumbaError, match="scenario keywords are shape, dtype, exact"):
        tune.search("gelu", shap=(8, 8))
    with pytest.raises(PyptoNumbaError, match="top must be a positive int"):
        tune.search("gelu", top=0)
    with pytest.raises(PyptoNumbaError, match="tiles must be one of"):
        pn.advise("gelu", tiles="fastest")


def test_every_op_declares_a_search_space():
    for spec in strategy.specs():
        assert spec.tiles is not None, spec.name


def test_progress_bar_draws_on_a_given_stream():
    import io

    out = io.StringIO()
    tune.search("gelu", progress=out)
    lines = out.getvalue().splitlines()
    assert lines and lines[-1].startswith("tune [####") and "/" in lines[-1]
    quiet = io.StringIO()
    tune.search("gelu", progress=False)
    assert quiet.getvalue() == ""


def test_measure_runs_the_top_on_the_cpu():
    s = tune.search("gelu", top=2, measure=True, shape=(4, 1000), dtype="fp32")
    for t in s:
        assert t.measured["verdict"] == "PASS" and t.measured["cpu_seconds"] > 0
        assert t.measured["shape"] == (4, 1000)


def test_cli_tune_json():
    out = _subprocess.run([_sys.executable, "-m", "pypto_numba", "tune", "rmsnorm", "--shape", "64,2048", "--top", "2",
                           "--format", "json"], capture_output=True, text=True, env=dict(_os.environ), timeout=300)
    assert out.returncode == 0, out.stderr
    data = _json.loads(out.stdout)
    assert len(data["results"]) == 2 and data["scenario"]["shape"] == [64, 2048]
    bad = _subprocess.run([_sys.executable, "-m", "pypto_numba", "tune", "rmsnorm", "--shap", "1"],
                          capture_output=True, text=True, env=dict(_os.environ), timeout=300)
    assert bad.returncode == 2 and "scenario keywords are shape" in bad.stderr


FIT_SLACK = 0.02
"""PTO-ISA's fitted vector rows are per column count (npu-facts 8.6: TMUL fp32 has bias 26 at 64
cols, ~43 at others), so a wider row can cost a few cycles less: a drop under 2 % is the fit's."""


def _search_or_none(op, **scenario):
    try:
        return tune.search(op, top=1, **scenario)
    except TileError:  # no tile of any strategy fits: not a legal shape
        return None


def _grows(small, big):
    """big's best estimate >= small's when tune keeps its choice (strategy and tiles). The pipe
    model charges every task the kernel's average bytes (machine/pipes.py), so one more, partly
    filled task lowers the average: a drop down to small * tasks_small / tasks_big is that
    averaging, not a new choice; below that, FIT_SLACK."""
    if small is None or big is None:
        return
    a, b = small[0], big[0]
    assert math.isfinite(a.seconds) and a.seconds > 0 and math.isfinite(b.seconds) and b.seconds > 0
    if (a.strategy, a.tiles) != (b.strategy, b.tiles):
        return
    ta, tb = a.cost.tasks, b.cost.tasks
    floor = a.seconds * min(1.0, ta / tb) if tb > ta else a.seconds
    assert b.seconds >= floor * (1 - FIT_SLACK), (a.label, a.seconds, b.seconds, ta, tb)


@settings(max_examples=12, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 400).map(lambda c: 16 * c), grow=st.integers(1, 4),
       axis=st.integers(0, 1), op=st.sampled_from(["gelu", "rmsnorm", "softmax"]),
       dtype=st.sampled_from(["fp32", "bf16", "fp16"]))
def test_hypothesis_vector_estimates_positive_and_growing(rows, cols, grow, axis, op, dtype):
    shape = [rows, cols]
    big = list(shape)
    big[axis] *= 1 + grow
    _grows(_search_or_none(op, shape=tuple(shape), dtype=dtype), _search_or_none(op, shape=tuple(big), dtype=dtype))


@settings(max_examples=8, deadline=None)
@given(m=st.integers(1, 600), k=st.integers(1, 160).map(lambda c: 16 * c), n=st.integers(1, 160).map(lambda c: 16 * c),
       axis=st.sampled_from(["tokens", "in_features", "out_features"]), dtype=st.sampled_from(["fp32", "bf16", "fp16"]))
def test_hypothesis_linear_estimates_positive_and_growing(m, k, n, axis, dtype):
    sc = dict(tokens=m, in_features=k, out_features=n, dtype=dtype)
    big = dict(sc, **{axis: sc[axis] * 2})
    _grows(_search_or_none("linear", **sc), _search_or_none("linear", **big))


# --- strategies/calibration.md (issue 19 item 8) ------------------------------------------------

def _results(names):
    from pypto_numba.report.pricing import PlanResult, advise_or_none

    scs = [sc for sc in SCENARIOS if sc.name in names]
    return [PlanResult(sc, advise_or_none(sc.op, sc.advise, "ascend910b"), {}, []) for sc in scs]


def test_calibration_page_figures_checks_and_contradictions():
    from pypto_numba.report import calibration

    text = calibration._page(_results({"repeat_kv-qwen3-decode-4k", "linear-4096-decode"}), "ascend910b")
    plan = linear.plan_fused_bias((6144, 6144), (6144, 6144), "fp16", bias=False)
    est = plan.estimate()
    assert est.bound == "cube" and 2.1e-3 / 1.3 <= est.seconds <= 2.1e-3 * 1.3
    row = next(line for line in text.splitlines() if line.startswith("| 6144^3 fp16 matmul, 128-256 tiles"))
    assert f"{est.seconds * 1e6:,.1f} us" in row and f"{est.seconds / 2.1e-3:.2f}" in row and row.endswith("| cube |")
    assert "within 1.3x of 2.1 ms: PASS; cube-bound as the source says: PASS" in text
    best = tune.search("linear", top=1, tokens=6144, in_features=6144, out_features=6144, dtype="fp16", bias=False)[0]
    tuned = next(line for line in text.splitlines() if line.startswith("| 6144^3 fp16 matmul, tuned"))
    assert f"{best.seconds * 1e6:,.1f} us" in tuned and f"{best.seconds / 1.6e-3:.2f}" in tuned
    assert "| 6144^3 fp16 matmul, tuned (L2 hit rate) |" in text  # the figures come from linear's OP.figures
    for a in calibration.ASSUMPTIONS:
        assert f"| {a.name} |" in text and f"`{a.name}`" in text
    # repeat_kv decode contradicts the seed (expand_clone); linear decode agrees and is not listed
    assert "| repeat_kv-qwen3-decode-4k | `head_loop`" in text and "| linear-4096-decode |" not in text
    assert "- **repeat_kv-qwen3-decode-4k**" in text and "Decided by the chip's shared GM" in text
    assert "QuantIndexerProlog" in text and "no such op in the lab" in text


def test_calibration_assumption_variants_change_one_field():
    from pypto_numba.machine.profile import load_profile
    from pypto_numba.report import calibration

    base = load_profile("ascend910b")
    by = {a.name: a for a in calibration.ASSUMPTIONS}
    v = calibration.variant(base, by["hbm_bytes_per_s"], 1.2e12)
    assert v.pipes.hbm_bytes_per_s == 1.2e12 and v.pipes.l2_bytes_per_s == base.pipes.l2_bytes_per_s
    off = calibration.variant(base, by["contention cap"], "off")
    assert math.isinf(off.pipes.hbm_bytes_per_s) and math.isinf(off.pipes.l2_bytes_per_s)
    slow = calibration.variant(base, by["clock_hz"], 1.8e9)
    assert slow.clock_hz == 1.8e9 and slow.pipes == base.pipes
    # a memory-bound kernel moves with the HBM rate, never below the faster HBM's time
    p = linear.plan_fused_bias((16, 4096), (4096, 4096), "bf16")
    assert p.estimate(v).seconds >= p.estimate(base).seconds >= p.estimate(
        calibration.variant(base, by["hbm_bytes_per_s"], 1.6e12)).seconds
    # the fitted GM->L1 peak (28.61 GiB/s) makes the 6144^3 matmul memory-bound, as docs/model.md says
    mm = linear.plan_fused_bias((6144, 6144), (6144, 6144), "fp16", bias=False)
    assert mm.estimate(calibration.variant(base, by["gm_to_l1_peak_gibs"], 28.61)).bound == "memory"


def test_calibration_flags_a_kernel_whose_modelled_cube_work_is_short():
    from pypto_numba.report import calibration

    s = tune.search("swiglu", top=1, tokens=2048, intermediate=6144, hidden=2048)
    epi = s.best["epilogue"]
    k = epi.plans[0].kernels[0]
    assert k.cube_flops == 2 * 2 * 2048 * 6144 * 2048  # gate and up: two [2048, 2048] @ [2048, 6144]
    assert calibration._cube_caveats("swiglu", (epi,)) == []  # its plan names the task's two products
    # without cube_task the pipe model infers one product per task from the L1 buffers: half the work
    inferred = dataclasses.replace(epi.plans[0], kernels=(dataclasses.replace(k, cube_task=None),))
    got = calibration._cube_caveats("swiglu", (dataclasses.replace(epi, plans=(inferred,)),))
    assert len(got) == 1 and "swiglu.epilogue" in got[0] and "0.50x" in got[0]
    # a plain linear kernel's modelled task is its planned work: no caveat
    lin = tune.search("linear", top=1, tokens=2048, in_features=2048, out_features=6144)
    assert calibration._cube_caveats("linear", (lin[0],)) == []
