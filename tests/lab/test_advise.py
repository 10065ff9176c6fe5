"""advise(): constraints first, then estimated cost, fusion on ties; reasons cite numbers."""

import json
import os
import subprocess
import sys

import pytest

import pypto_numba as pn
from pypto_numba.advise import advise


def test_long_decode_attention_rules_out_standard_by_ub():
    a = advise("attention", batch=1, q_heads=32, kv_heads=8, q_len=1, kv_len=32768, head_dim=128, dtype="bf16")
    assert a.chosen in ("online", "flash")
    assert "standard" in a.rejected
    # the rejection carries the UB numbers: 32768 fp32 scores are 131072 B, UB is 196608 B
    assert "Skv=32768" in a.rejected["standard"] and "196608 B" in a.rejected["standard"]
    assert "131072 B" in a.rejected["standard"]
    assert any("us (" in r and "GM" in r for r in a.reasons)


def test_short_decode_attention_lets_standard_compete():
    a = advise("attention", kv_len=256)
    assert "standard" not in a.rejected and len(a.ranking) == 3


def test_fused_bias_over_matmul_add():
    a = advise("linear", tokens=16, in_features=4096, out_features=4096, dtype="bf16")
    assert a.chosen == "fused_bias" and a.agrees_with_seed
    fused = dict((r[0], r) for r in a.ranking)
    assert fused["fused_bias"][3] == 1 and fused["matmul_add"][3] == 2  # kernels
    assert fused["fused_bias"][4] < fused["matmul_add"][4]  # GM bytes


def test_gather_for_2d_ids():
    a = advise("embedding", vocab=151936, hidden=2048, ids_shape=(8, 2048))
    assert a.chosen == "gather"


def test_fused_rmsnorm_rope_when_adjacent_and_standard_otherwise():
    a = advise("rope", tokens=128, heads=16, head_dim=128, dtype="bf16", adjacent_rmsnorm=True)
    assert a.chosen == "fused_rmsnorm" and a.agrees_with_seed
    ranking = dict((r[0], r) for r in a.ranking)
    assert ranking["rmsnorm+standard"][3] == 2 and ranking["fused_rmsnorm"][3] == 1
    assert advise("rope", adjacent_rmsnorm=False).chosen == "standard"


def test_gqa_decode_contradicts_the_seed_and_says_so():
    # the seed: expand_clone at decode because "S=1 makes the copy negligible"; but the copy is of
    # the whole KV cache (G-1 extra copies of kv_len rows), so the plans favour head_loop
    a = advise("repeat_kv", q_len=1, kv_len=4096, q_heads=32, kv_heads=8)
    assert a.chosen == "head_loop" and not a.agrees_with_seed
    assert any("the seed recommends expand_clone" in r for r in a.reasons)
    b = advise("repeat_kv", q_len=4096, kv_len=4096, q_heads=32, kv_heads=8)
    assert b.chosen == "head_loop" and b.agrees_with_seed


def test_gelu_tie_keeps_the_seed_and_exact_forces_erf():
    assert advise("gelu", shape=(8, 11008), dtype="bf16").chosen == "tanh"
    assert advise("gelu", exact=True).chosen == "erf"


def test_profile_reaches_the_plans():
    # kv_len=20000: 80000 B fp32 scores + 80000 B exp + 40000 B bf16 P = 200000 B > 196608 B (910B)
    b = advise("attention", kv_len=20000, profile="ascend910b")
    assert "standard" in b.rejected and "200000 B of UB" in b.rejected["standard"]
    # on the 950 (248 KiB UB) the row fits UB but the 80000 B reduction tile breaks the 64 KiB rule
    a = advise("attention", kv_len=20000, profile="ascend950")
    assert "reduction tile, above the 65536 B limit of ascend950" in a.rejected["standard"]
    assert "of the 253952 B Vec limit" in a.reasons[0]


def test_bad_scenarios():
    with pytest.raises(pn.PyptoNumbaError, match="scenario keywords are batch, q_heads"):
        advise("attention", kvlen=3)
    with pytest.raises(pn.PyptoNumbaError, match="unknown op 'conv2d'"):
        advise("conv2d")


def test_cli_advise_json():
    out = subprocess.run([sys.executable, "-m", "pypto_numba", "advise", "linear", "--tokens", "8",
                          "--format", "json"], capture_output=True, text=True, env=dict(os.environ), timeout=300)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["chosen"] == "fused_bias" and data["scenario"] == {"tokens": 8}


def test_best_tiles_by_default_and_the_defaults_on_request():
    # gelu at the Gemma-2 FFN (2048 x 9216 bf16): the default 4096-element tile is AICPU-dispatch
    # bound (4608 tasks); the search finds a larger tile, and advise says so in its notes
    best = advise("gelu", shape=(2048, 9216), dtype="bf16")
    default = advise("gelu", shape=(2048, 9216), dtype="bf16", tiles="default")
    assert default.tiles == {"tanh": {}, "erf": {}}
    assert best.tiles["tanh"] and best.tiles["tanh"]["tile"] != 4096
    assert any("tiles='best'" in r and "tanh" in r for r in best.reasons)
    assert any("tiles='default'" in r for r in default.reasons)
    b, d = dict((r[0], r[1]) for r in best.ranking), dict((r[0], r[1]) for r in default.ranking)
    for label in ("tanh", "erf"):
        assert b[label] <= d[label]
    # the best tile's price is its plan's own estimate (independent re-plan)
    plan = pn.gelu.plan_tanh((2048, 9216), "bf16", **best.tiles["tanh"])
    assert b["tanh"] == pytest.approx(plan.estimate().seconds)
    assert d["tanh"] == pytest.approx(pn.gelu.plan_tanh((2048, 9216), "bf16").estimate().seconds)


def test_a_strategy_refused_at_its_default_tiles_stays_refused_and_the_fitting_tiles_are_named():
    # softmax.whole_row of [32768, 2048] bf16 masked rows: 8 rows per task need 196608 B of UB
    # (> the 188416 B Vec limit); 4 rows need half of it. softmax.whole_row(x) with no row_tile
    # raises, so advise keeps it refused and names the tiles at which it fits
    shape = (32768, 2048)
    default = advise("softmax", shape=shape, masked=True, tiles="default")
    assert "whole_row" in default.rejected and "196608 B of UB" in default.rejected["whole_row"]
    best = advise("softmax", shape=shape, masked=True)
    assert "whole_row" in best.rejected and best.chosen == "online"
    note = next(r for r in best.reasons if "refused at its default tiles but fits at" in r)
    rows = int(note.split("whole_row is refused at its default tiles but fits at row_tile=")[1].split(":")[0])
    assert rows < 8 and pn.softmax.plan_whole_row(shape, "bf16", has_mask=True, row_tile=rows).cost.ub_peak_bytes <= 188416
