"""The registry, trace() recording, compare() and the command line."""

import json
import os
import subprocess
import sys
import threading

import pytest

import pypto_numba as pn
from pypto_numba.strategy import SEED

from helpers import make


def test_registry_lists_ops_with_seed_recommendation():
    reg = pn.strategies()
    assert [s.name for s in reg["gelu"]] == ["tanh", "erf"]
    tanh, erf = reg["gelu"]
    assert tanh.recommended and not erf.recommended
    assert tanh.fn is pn.gelu.tanh and tanh.plan is pn.gelu.plan_tanh
    assert tanh.qualname == "gelu.tanh" and pn.gelu.tanh.strategy is tanh
    assert SEED["attention"][0] == "online"
    with pytest.raises(pn.PyptoNumbaError, match="unknown op 'conv2d'; known ops: gelu"):
        pn.strategies("conv2d")


def test_trace_records_calls_costs_and_nests(rng):
    x = make((3, 40), "bf16", rng)
    with pn.trace() as outer:
        pn.gelu.tanh(x)
        with pn.trace() as inner:
            pn.gelu.erf(x, tile=64)
    assert [r.strategy for r in outer.records] == ["tanh", "erf"]
    assert [r.strategy for r in inner.records] == ["erf"]
    rec = inner.records[0]
    assert (rec.op, rec.shapes, rec.dtype, rec.profile) == ("gelu", ((3, 40),), "bf16", "ascend910b")
    assert rec.params["tile"] == 64 and rec.seconds > 0
    assert rec.cost.tasks == 2 and rec.cost.gm_read_bytes == 3 * 40 * 2
    assert outer.total.kernels == 2
    assert outer.total.gm_bytes == 2 * (3 * 40 * 2 * 2)
    # outside a trace nothing is recorded (and nothing fails)
    pn.gelu.tanh(x)
    assert len(outer.records) == 2


def test_trace_is_per_thread(rng):
    x = make((64,), "fp32", rng)
    other = []

    def worker():
        with pn.trace() as t:
            pn.gelu.erf(x)
        other.append(len(t.records))

    with pn.trace() as mine:
        th = threading.Thread(target=worker)
        th.start()
        th.join()
        pn.gelu.tanh(x)
    assert other == [1] and [r.strategy for r in mine.records] == ["tanh"]


def test_profile_argument_reaches_the_plan(rng):
    x = make((64,), "fp32", rng)
    with pn.trace() as t:
        pn.gelu.tanh(x, profile="ascend950")
        with pn.use_profile("ascend910c"):
            pn.gelu.tanh(x)
    assert [r.profile for r in t.records] == ["ascend950", "ascend910c"]


def test_compare_gelu_rows(rng):
    x = make((5, 300), "bf16", rng, scale=2.0)
    result = pn.compare("gelu", x, repeats=1)
    assert [r.strategy for r in result.rows] == ["tanh", "erf"]
    for row in result.rows:
        assert row.verdict == "PASS" and row.cost.kernels == 1 and row.seconds > 0
        assert row.estimate.seconds > 0
    md = result.to_markdown()
    assert md.count("\n| tanh *") == 1 and "| erf |" in md
    data = json.loads(result.to_json())
    assert data["rows"][0]["cost"]["gm_read_bytes"] == 5 * 300 * 2


def test_compare_keeps_ruled_out_strategies(rng):
    x = make((64,), "fp32", rng)
    result = pn.compare("gelu", x, tile=11776, repeats=1)
    verdicts = {r.strategy: r.verdict for r in result.rows}
    # tanh fp32: in + out + 2 temps = 4 x 46 KiB = 184 KiB, exactly the safe Vec limit, fits;
    # erf: 7 x 46 KiB does not
    assert verdicts == {"tanh": "PASS", "erf": "RULED OUT"}
    erf = result.rows[1]
    assert "needs 329728 B of UB" in erf.ruled_out and "use tile <=" in erf.ruled_out
    assert "RULED OUT" in result.to_table()


def _cli(*args):
    env = dict(os.environ)
    return subprocess.run([sys.executable, "-m", "pypto_numba", *args], capture_output=True, text=True, env=env, timeout=600)


def test_cli_profiles_and_compare_json():
    out = _cli("profiles")
    assert out.returncode == 0 and "ascend910b (active)" in out.stdout and "UB 248 KiB" in out.stdout
    out = _cli("compare", "gelu", "--shape", "4,33", "--dtype", "fp16", "--repeats", "1", "--format", "json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data[0]["op"] == "gelu" and data[0]["shapes"] == [[4, 33]]
    assert {r["strategy"] for r in data[0]["rows"]} == {"tanh", "erf"}


def test_cli_errors_are_clear():
    out = _cli("compare", "gelu", "--shape", "4,x")
    assert out.returncode == 2 and "--shape must be comma-separated integers" in out.stderr
    out = _cli("compare", "conv2d")
    assert out.returncode == 2 and "unknown op 'conv2d'" in out.stderr
    out = _cli("compare", "gelu", "--profile", "a9")
    assert out.returncode == 2 and "unknown hardware profile 'a9'" in out.stderr
