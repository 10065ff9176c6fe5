"""Capacity as the compiler enforces it (issue 19 item 4): the safe Vec limit, hints, memory report."""

import re

import pytest

import pypto_numba as pn
from pypto_numba import cli
from pypto_numba.machine.limits import Hint, MemoryReport
from pypto_numba.machine.plan import Buffer, KernelPlan, Plan
from pypto_numba.machine.profile import load_profile

A2 = load_profile("ascend910b")
A3 = load_profile("ascend910c")
A950 = load_profile("ascend950")
SAFE = 188416  # npu-facts 8.1: 184 KB
PHYSICAL = 196608  # npu-facts 4.1: 192 KB


def plan(*buffers, profile=A2, **params):
    return Plan("op", "s", "bf16", profile, [KernelPlan("k", "vector", 1, tuple(buffers))], params=params)


def test_profiles_carry_the_safe_limit():
    assert (A2.ub_bytes, A2.vec_safe_bytes, A2.limit("UB")) == (PHYSICAL, SAFE, SAFE)
    assert (A3.ub_bytes, A3.vec_safe_bytes) == (PHYSICAL, SAFE)  # inherited from ascend910b
    assert A2.limit("L1") == A2.l1_bytes and A2.limit("L0C") == A2.l0c_bytes
    # no public safe limit for 950: its physical UB is the limit
    assert A950.vec_safe_bytes == A950.ub_bytes == A950.limit("UB") == 253952


def test_exactly_the_safe_limit_passes_one_byte_more_is_refused():
    assert plan(Buffer("x_ub", "UB", (SAFE,), "uint8")).cost.ub_peak_bytes == SAFE
    # split over two buffers, the total counts
    assert plan(Buffer("a_ub", "UB", (SAFE - 32,), "uint8"), Buffer("b_ub", "UB", (32,), "uint8")).cost.ub_peak_bytes == SAFE
    with pytest.raises(pn.TileError) as err:
        plan(Buffer("small_ub", "UB", (1,), "uint8"), Buffer("big_ub", "UB", (SAFE,), "uint8"), token_tile=8)
    msg = str(err.value)
    assert "188417 B" in msg and str(SAFE) in msg and str(PHYSICAL) in msg
    assert "'big_ub'" in msg  # the largest buffer, the one to shrink
    assert "token_tile" in msg and "use smaller tiles" in msg


def test_950_keeps_its_physical_limit():
    assert plan(Buffer("x_ub", "UB", (253952,), "uint8"), profile=A950).cost.ub_peak_bytes == 253952
    with pytest.raises(pn.TileError, match="253953 B of UB .* allows 253952 B"):
        plan(Buffer("x_ub", "UB", (253953,), "uint8"), profile=A950)


def codes(p):
    return [h.code for h in p.hints]


def test_ph001_below_512_bytes_once_per_plan():
    narrow = plan(Buffer("q_ub", "UB", (64, 128), "bf16"), Buffer("k_ub", "UB", (64, 128), "bf16"))  # 256 B rows
    ph = [h for h in narrow.hints if h.code == "PH001"]
    assert len(ph) == 1 and isinstance(ph[0], Hint)
    assert ph[0].kernel == "k" and ph[0].buffer == "k.q_ub,k.k_ub" and "256 B" in ph[0].message
    assert codes(plan(Buffer("q_ub", "UB", (64, 256), "bf16"))) == []  # 512 B: no hint
    assert codes(plan(Buffer("q_ub", "UB", (32, 128), "fp32"))) == []  # 512 B in fp32 too
    # several kernels: still one PH001, naming both
    two = Plan("op", "s", "bf16", A2, [KernelPlan("a", "vector", 1, (Buffer("x", "UB", (8, 16), "bf16"),)),
                                       KernelPlan("b", "vector", 1, (Buffer("y", "L1", (8, 16), "bf16"),))])
    assert codes(two) == ["PH001"] and two.hints[0].kernel == "a,b"


@pytest.mark.parametrize("level, limit", [("UB", SAFE), ("L1", 524288), ("L0A", 65536), ("L0B", 65536),
                                          ("L0C", 131072)])
def test_marginal_within_15_percent_of_the_limit(level, limit):
    def at(frac):
        n = int(limit * frac) // 512 * 512  # rows of 512 B: no PH001
        return plan(Buffer("t", level, (n // 512, 512), "uint8"))

    hot = at(0.86)
    assert codes(hot) == ["MARGINAL"] and hot.hints[0].buffer == level and str(limit) in hot.hints[0].message
    assert codes(at(0.84)) == []


def test_memory_report_rows_match_the_buffers():
    from pypto_numba.attention import plan_online

    p = plan_online((1, 16, 2048, 128), (1, 8, 2048, 128), dtype="bf16")
    rep = p.memory_report()
    assert isinstance(rep, MemoryReport)
    want = {(k.name, b.level) for k in p.kernels for b in k.buffers}
    assert {(r.kernel, r.space) for r in rep.rows} == want
    for r in rep.rows:
        kernel = next(k for k in p.kernels if k.name == r.kernel)
        assert r.used == sum(b.nbytes for b in kernel.buffers if b.level == r.space)
        assert r.limit == A2.limit(r.space)
        assert r.usage == pytest.approx(100.0 * r.used / r.limit)
    text = str(rep)
    lines = text.splitlines()
    assert re.match(r"kernel\s+space\s+used\s+limit\s+usage", lines[1])
    assert len(lines) == 3 + len(rep.rows) and len({len(line) for line in lines[1:]}) == 1  # aligned
    assert any(r.space == "UB" and r.used == SAFE for r in rep.rows)  # issue 19: exactly the safe limit
    assert "100.0%" in text
    assert rep.to_dicts()[0]["usage"] == round(rep.rows[0].usage, 1)


def test_cli_plan_prints_report_and_hints(capsys):
    assert cli.main(["plan", "attention", "--batch", "1", "--q-len", "2048", "--kv-len", "2048",
                     "--q-heads", "16", "--kv-heads", "8", "--head-dim", "128"]) == 0
    out = capsys.readouterr().out
    assert "== attention online" in out and "online_softmax  UB" in out and "188416 B  188416 B  100.0%" in out
    assert "[MARGINAL]" in out and "[PH001]" in out
    assert cli.main(["plan", "gelu", "--shape", "8,11008", "--dtype", "bf16", "--format", "json"]) == 0
    assert '"space": "UB"' in capsys.readouterr().out
    assert cli.main(["plan", "gelu", "--nope", "1"]) == 2
    assert "scenario keywords" in capsys.readouterr().err


def test_cli_compare_prints_hints(capsys):
    assert cli.main(["compare", "attention", "--shape", "1,16,8,1,256,128", "--dtype", "bf16",
                     "--repeats", "1", "--strategy", "online"]) == 0
    out = capsys.readouterr().out
    assert "hints:" in out and "attention.online: [PH001]" in out


def test_auto_fitted_tiles_respect_the_safe_limit():
    # these picked tiles against the physical 192 KB and were then refused by the 184 KB limit
    from pypto_numba import linear
    from pypto_numba.rope import plan_standard

    p = plan_standard((4, 128, 45, 128), (128, 128), "fp32")  # default token_tile 8 does not fit: shrunk
    assert p.cost.ub_peak_bytes <= SAFE < p.cost.ub_peak_bytes * (p.params["token_tile"] + 1) / p.params["token_tile"]
    q = linear.plan_matmul_add((256, 1024), (128, 1024), "bf16", cube_tiles=((128, 256), (64, 256), (128, 128)))
    assert q.cost.ub_peak_bytes <= SAFE and q.params["bias_rows"] == 176
