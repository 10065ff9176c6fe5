"""The modelled schedule as trace-event JSON (machine/timeline.py, Plan.timeline, Trace.timeline).

The hand-computed case uses the published constants themselves (npu-facts 5.2, 8.6 as copied into
tiles/ascend910b.toml), not the model's helpers; validity is checked against the Chrome
trace-event format's rules, independently of how the timeline is built.
"""

import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pypto_numba as pn
from pypto_numba import gelu, linear
from pypto_numba.machine import pipes
from pypto_numba.machine.plan import Buffer, KernelPlan
from pypto_numba.machine.timeline import Timeline, kernels_timeline

from helpers import make

GIB = 1024 ** 3
CLOCK = 1.85e9
LAUNCH = (10000 + 100) / 2e9          # npu-facts 5.2: stitch + submit latency at 2 GHz
TASK = (240 + 200 + 390) / 2e9        # npu-facts 5.2: AICPU completion + scheduler + resolve
SWIMLANES = {"MTE2", "MTE1", "CUBE", "VECTOR", "FIXPIPE", "MTE3"}


def hill(peak_gibs, k, nbytes):
    return peak_gibs * GIB * nbytes / (k + nbytes)


def ns(us: float) -> int:
    return round(us * 1000)


def check_trace(data: dict) -> dict:
    """Assert the trace-event format's rules; returns (pid, tid) -> [(start ns, end ns, name)]."""
    assert set(data) >= {"traceEvents"}
    tracks, names = {}, {}
    for e in data["traceEvents"]:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int) and isinstance(e["name"], str)
        assert e["ph"] in ("X", "M"), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index", "thread_sort_index")
            if e["name"] == "thread_name":
                names[(e["pid"], e["tid"])] = e["args"]["name"]
            continue
        assert e["dur"] >= 0 and e["ts"] >= 0 and math.isfinite(e["ts"] + e["dur"]), e
        tracks.setdefault((e["pid"], e["tid"]), []).append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]))
    for key, slices in tracks.items():
        assert key in names, f"track {key} has no thread_name"
        starts = [a for a, _, _ in slices]
        assert starts == sorted(starts), f"timestamps of {names[key]} are not monotone"
        stack = []  # ends of the open enclosing slices
        for a, b, name in slices:
            while stack and stack[-1] <= a:
                stack.pop()
            assert not stack or b <= stack[-1], f"{names[key]}: {name} [{a}, {b}] overlaps without nesting"
            stack.append(b)
    return {names[k]: v for k, v in tracks.items()} | {"_by_key": tracks, "_names": names}


def makespan_us(tl: Timeline) -> float:
    return max(e["ts"] + e["dur"] for e in tl.events if e["ph"] == "X")


def processes(tl: Timeline) -> dict:
    return {e["pid"]: e["args"]["name"] for e in tl.events if e["ph"] == "M" and e["name"] == "process_name"}


def test_two_task_kernel_by_hand():
    n, tiles = 4096, 2
    nbytes = 4 * n
    k = KernelPlan("scale", "vector", 2, (Buffer("x_ub", "UB", (n,), "fp32"),),
                   gm_read_bytes=2 * tiles * nbytes, gm_write_bytes=2 * tiles * nbytes,
                   tiles_per_task=tiles, load_bytes=nbytes, store_bytes=nbytes,
                   vector_mix=(("TMUL", "fp32", 2 * tiles * n),), vector_tile_elems=n, vector_cols=n)
    tl = kernels_timeline([("scale", k.cost)], "ascend910b")
    m2 = nbytes / hill(247.16, 30643, nbytes)      # GM -> UB fit (npu-facts 8.6)
    v = (0.0312 * n + 43) / CLOCK                   # TMUL fp32, the widest listed cols
    m3 = nbytes / hill(28.19, 1755, nbytes)        # UB -> GM fit: the slowest pipe
    assert m3 > m2 + v
    # the flow shop of two tiles: tile 1's VECTOR waits for its MTE2, its MTE3 for tile 0's MTE3
    expected = {
        "MTE2": [(0, m2), (m2, 2 * m2)],
        "VECTOR": [(m2, m2 + v), (2 * m2, 2 * m2 + v)],
        "MTE3": [(m2 + v, m2 + v + m3), (m2 + v + m3, m2 + v + 2 * m3)],
    }
    task = m2 + v + 2 * m3
    data = json.loads(tl.to_json())
    tracks = check_trace(data)
    names = tracks["_names"]
    procs = processes(tl)
    assert sorted(procs.values()) == ["AIV 0", "AIV 1", "chip"]
    for (pid, tid), slices in tracks["_by_key"].items():
        thread = names[(pid, tid)]
        if procs[pid] == "chip":
            continue
        s0 = LAUNCH * 1e6  # both tasks start after the launch, one per vector core
        if thread == "tasks":
            assert [(a, b, nm) for a, b, nm in slices] == [
                (ns(s0), ns(s0 + task * 1e6), f"scale task {pid - 1000}"),
                (ns(s0 + task * 1e6), ns(s0 + (task + TASK) * 1e6), "AICPU")]
            continue
        assert thread in expected, thread  # a vector kernel has no MTE1 / CUBE / FIXPIPE slices
        for (a, b, name), (x, y) in zip(slices, expected[thread], strict=True):
            assert abs(a - ns(s0 + x * 1e6)) <= 1 and abs(b - ns(s0 + y * 1e6)) <= 1, (thread, name)
    end = LAUNCH + task + TASK  # the cores outlast the chip's GM time and the AICPUs' dispatch
    assert tl.seconds == pytest.approx(end) == k.cost.estimate("ascend910b").seconds
    assert makespan_us(tl) == pytest.approx(end * 1e6, abs=1e-3)
    kernels = tracks["kernels"]
    assert kernels[0][2] == "scale" and kernels[1] == (0, ns(LAUNCH * 1e6), "launch")


@pytest.mark.parametrize("plan", [
    lambda: gelu.plan_tanh((64, 11008), "bf16"),
    lambda: gelu.plan_erf((4096, 9216), "bf16"),
    lambda: linear.plan_fused_bias((6144, 6144), (6144, 6144), "fp16"),
    lambda: linear.plan_matmul_add((16, 4096), (4096, 4096), "bf16"),
], ids=["gelu-tanh", "gelu-erf-dispatch-bound", "matmul-6144", "linear-decode"])
def test_plan_timeline_is_valid_and_its_makespan_is_the_estimate(plan):
    p = plan()
    tl = p.timeline()
    est = p.estimate()
    assert est.model == "pipes" and tl.seconds == est.seconds  # one source of truth: the same float
    assert makespan_us(tl) == pytest.approx(est.seconds * 1e6, abs=2e-3)
    tracks = check_trace(json.loads(tl.to_json()))
    threads = set(tracks["_names"].values())
    assert threads - {"tasks", "kernels", "GM", "AICPU"} <= SWIMLANES
    # every kernel is a slice on the chip's kernels track, one after the other
    kernels = [s for s in tracks["kernels"] if s[2] != "launch"]
    assert [s[2] for s in kernels] == [f"{p.where}: {k.name}" for k in p.kernels]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(kernels))


def test_cube_kernel_has_the_cube_pipes_and_the_drain():
    p = linear.plan_fused_bias((6144, 6144), (6144, 6144), "fp16")
    tl = p.timeline()
    row = p.estimate().kernels[0]
    tracks = check_trace(json.loads(tl.to_json()))
    by = {}
    for (pid, tid), slices in tracks["_by_key"].items():
        by.setdefault(tracks["_names"][(pid, tid)], []).extend(slices)
    assert {"MTE2", "MTE1", "CUBE", "FIXPIPE"} <= set(by) and "VECTOR" not in by
    assert sorted(set(processes(tl).values()) - {"chip"}) == sorted(f"AIC {i}" for i in range(24))
    # the CUBE slices of a core add up to the pipe's busy time per task, for each of its waves
    cube = sum(b - a for a, b, _ in tracks["_by_key"][(100, 3)]) / 1e9
    assert cube == pytest.approx(row["pipes"]["CUBE"] * row["waves"], rel=1e-3)
    assert any(name == "L0C drain" for _, _, name in by["FIXPIPE"])


def test_memory_bound_kernel_ends_with_its_gm_slice():
    # every byte of a 48-task stream from HBM: the chip's GM time outlasts the cores
    n, tiles = 1 << 14, 64
    k = KernelPlan("stream", "vector", 48, (Buffer("x_ub", "UB", (n,), "fp32"),),
                   gm_read_bytes=48 * tiles * 4 * n, gm_write_bytes=48 * tiles * 4 * n, tiles_per_task=tiles,
                   load_bytes=4 * n, store_bytes=4 * n)
    est = k.cost.estimate("ascend910b")
    tl = kernels_timeline([("stream", k.cost)], "ascend910b")
    tracks = check_trace(tl.to_dict())
    row = est.kernels[0]
    assert row["gm_chip"] > row["waves"] * (row["task_seconds"] + TASK) and est.bound == "memory"
    (gm,) = tracks["GM"]
    assert gm == (ns(LAUNCH * 1e6), ns(makespan_us(tl)), "stream: GM (HBM + L2)")
    last_task = max(b for (pid, tid), sl in tracks["_by_key"].items() if pid >= 1000 for _, b, _ in sl)
    assert last_task < gm[1]
    assert tl.seconds == est.seconds


def test_decode_attention_trace_timeline_is_valid(rng, tmp_path):
    q = make((1, 8, 1, 64), "bf16", rng)
    k = make((1, 2, 256, 64), "bf16", rng)
    v = make((1, 2, 256, 64), "bf16", rng)
    with pn.trace() as t:
        pn.attention.online(q, k, v)
        pn.gelu.tanh(make((4, 128), "bf16", rng))
    tl = t.timeline()
    est = t.total.estimate()
    assert tl.seconds == pytest.approx(est.seconds, rel=1e-12)
    path = tl.save(tmp_path / "decode.json")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    tracks = check_trace(data)
    kernels = [s[2] for s in tracks["kernels"] if s[2] != "launch"]
    assert kernels == [f"attention.online: {kp.name}" for kp in t.records[0].plan.kernels] + \
        [f"gelu.tanh: {kp.name}" for kp in t.records[1].plan.kernels]
    assert data["otherData"]["makespan_us"] == pytest.approx(est.seconds * 1e6)
    assert set(tracks["_names"].values()) - {"tasks", "kernels", "GM", "AICPU"} <= SWIMLANES
    # a mixed kernel (QK and PV on the cube, the softmax on the vector cores): its 2 tasks run on
    # AIC 0 / AIC 1, the vector half on their AIVs
    assert [kp.unit for kp in t.records[0].plan.kernels] == ["mixed"]
    assert {"AIC 0", "AIC 1", "AIV 0", "AIV 1", "AIV 2", "AIV 3"} <= set(processes(tl).values())
    by_pid = {processes(tl)[pid]: {tracks["_names"][(pid, tid)] for (p2, tid) in tracks["_by_key"] if p2 == pid}
              for pid in processes(tl)}
    assert {"MTE2", "CUBE"} <= by_pid["AIC 0"] and "VECTOR" not in by_pid["AIC 0"] and "VECTOR" in by_pid["AIV 1"]


def test_empty_trace_and_combine(rng):
    with pn.trace() as t:
        pass
    with pytest.raises(pn.PyptoNumbaError, match="recorded no call"):
        t.timeline()
    a = gelu.plan_tanh((8, 4096), "bf16").timeline()
    b = gelu.plan_erf((8, 4096), "bf16").timeline()
    both = Timeline.combine([("tanh", a), ("erf", b)])
    tracks = check_trace(both.to_dict())
    names = set(processes(both).values())
    assert {"tanh: chip", "erf: chip", "tanh: AIV 0", "erf: AIV 0"} <= names
    assert both.seconds == max(a.seconds, b.seconds)
    assert len(tracks["_by_key"]) == len(check_trace(a.to_dict())["_by_key"]) + len(check_trace(b.to_dict())["_by_key"])


def test_slice_budget_keeps_the_makespan():
    p = gelu.plan_erf((4096, 9216), "bf16")
    (k,) = p.kernels
    full = kernels_timeline([("k", k.cost)], p.profile)
    small = kernels_timeline([("k", k.cost)], p.profile, max_slices=500)
    assert small.seconds == full.seconds and small.notes and not full.notes
    assert len(small.events) < len(full.events)
    check_trace(small.to_dict())
    assert makespan_us(small) == pytest.approx(makespan_us(full), abs=1e-3)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0, 1e-5), min_size=6, max_size=6), st.integers(1, 12))
def test_task_slices_makespan_is_the_closed_form(times, tiles):
    step = dict(zip(pipes.PIPES, times))
    if max(times) == 0:
        return
    slices = list(pipes.task_slices(step, tiles))
    assert max(z for *_, z in slices) == pytest.approx(pipes.task_seconds(step, tiles), rel=1e-12)
    # one slice per tile and busy pipe; a pipe's tiles in order, never overlapping
    for pipe in pipes.PIPES:
        mine = [(a, z) for p, _, a, z in slices if p == pipe]
        assert len(mine) == (tiles if step[pipe] > 0 else 0)
        assert all(z0 <= a1 for (_, z0), (a1, _) in itertools.pairwise(mine))
