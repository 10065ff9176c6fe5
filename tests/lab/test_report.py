"""report: scenarios parse and match advise(); --check passes on the committed pages and catches edits.

Plan-only paths throughout (--check, no compare runs): plans are cached per process, so the
in-process checks after the first one cost little.
"""

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import pypto_numba as pn
from pypto_numba import report
from pypto_numba.advise import advise
from pypto_numba.errors import PyptoNumbaError

STRATEGIES = Path(__file__).resolve().parents[2] / "strategies"
pytestmark = pytest.mark.skipif(not (STRATEGIES / "scenarios.toml").exists(),
                                reason="strategies/ is not part of this source tree")

try:
    import matplotlib

    HAVE_MPL = True
    # committed charts are compared byte for byte only with the matplotlib version that drew them
    _svg = next(iter(sorted((STRATEGIES / "charts").glob("*-sweep.svg"))), None)
    SAME_MPL = _svg is not None and report.svg_matplotlib_version(_svg.read_bytes()) == matplotlib.__version__
except ImportError:
    HAVE_MPL = SAME_MPL = False


def _copy(tmp_path) -> Path:
    dst = tmp_path / "strategies"
    shutil.copytree(STRATEGIES, dst)
    return dst


def _check(out, **kw):
    stream = io.StringIO()
    code = report.generate(str(out), check=True, stream=stream, **kw)
    return code, stream.getvalue()


def test_scenarios_parse_and_advise_accepts_every_key():
    scenarios = report.load_scenarios(STRATEGIES / "scenarios.toml")
    assert {sc.op for sc in scenarios} == set(pn.SEED), "every op of the seed has a scenario"
    for sc in scenarios:
        a = advise(sc.op, **sc.advise)  # a wrong key would raise PyptoNumbaError naming the keywords
        assert a.chosen in report.price_all(sc.op, sc.advise, sc.also)
        for override in sc.also:
            advise(sc.op, **{**sc.advise, **override})
        if sc.sweep:
            for v in sc.sweep.values:
                s = report.at(sc.advise, sc.sweep.keys, v)
                assert set(s) == set(sc.advise)
        if sc.compare:
            assert all(d > 0 for d in sc.compare["shape"])


def test_sweep_keys_set_tuple_elements():
    s = report.at({"shape": (8, 2048), "dim": -1}, ["shape.1"], 4096)
    assert s == {"shape": (8, 4096), "dim": -1}
    assert report.at({"q_len": 1, "kv_len": 2}, ["q_len", "kv_len"], 64) == {"q_len": 64, "kv_len": 64}


def test_bad_scenario_keyword_is_named(tmp_path):
    path = tmp_path / "scenarios.toml"
    path.write_text('[[scenario]]\nname = "x"\nop = "linear"\n[scenario.advise]\ntokenz = 16\n')
    with pytest.raises(PyptoNumbaError, match=r"advise linear takes no \['tokenz'\].*in_features"):
        report.load_scenarios(path)
    params = pn.strategy.spec("linear").scenario_keywords
    assert "tokens" in params


def test_check_passes_on_committed_pages_with_progress():
    code, err = _check(STRATEGIES)
    assert code == 0, err
    assert "up to date" in err
    # progress: one line per step when the stream is not a terminal
    assert "report [" in err and "plans: attention-qwen3-decode-4k" in err and "pages" in err
    assert err.count("\n") >= len(report.load_scenarios(STRATEGIES / "scenarios.toml"))


def test_progress_redraws_in_place_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    s = Tty()
    p = report.Progress(2, s)
    p.step("one")
    p.step("two")
    out = s.getvalue()
    assert out.startswith("\rreport [") and "2/2" in out and out.endswith("\n")


def test_seed_table_rows_and_plan_numbers_appear():
    text = (STRATEGIES / report.PAGE).read_text(encoding="utf-8")
    for op, (pref, alt, crit) in pn.SEED.items():
        row = next(line for line in text.splitlines() if line.startswith(f"| [{op}]({op}.md) |"))
        assert f"`{pref}`" in row and crit in row
        assert (f"`{alt}`" if alt else "--") in row
    # the per-scenario plan numbers are advise()'s own: the linear decode scenario's fused_bias time
    a = advise("linear", tokens=16, in_features=4096, out_features=4096, dtype="bf16", bias=True)
    t = dict((r[0], r[1]) for r in a.ranking)["fused_bias"]
    assert f"| `fused_bias` | {report.fmt_us(t)} |" in text
    assert "<!-- measured:begin summary -->" in text and "<!-- measured:end summary -->" in text


def test_op_pages_state_where_a_strategy_stops_fitting():
    text = (STRATEGIES / "attention.md").read_text(encoding="utf-8")
    # whole-row scores stop fitting UB at a 32K KV cache: the page says so with the plan's message
    assert "`standard` fits up to kv_len = 16384; from kv_len = 32768 its plan raises: TileError:" in text
    assert "charts/attention-qwen3-decode-4k-sweep.svg" in text


def test_check_fails_after_a_plan_derived_edit_and_ignores_measured_sections(tmp_path):
    out = _copy(tmp_path)
    page = out / "gelu.md"
    text = page.read_text(encoding="utf-8")
    # measured sections are free to change
    start = text.index("<!-- measured:begin")
    start = text.index("\n", start) + 1
    page.write_text(text[:start] + "timing changed\n" + text[start:], encoding="utf-8")
    code, err = _check(out, charts=False)
    assert code == 0, err
    # a plan-derived number is not
    edited = text.replace("| `tanh` |", "| `tanh` | 1 us |", 1)
    assert edited != text
    page.write_text(edited, encoding="utf-8")
    code, err = _check(out, charts=False)
    assert code == 1
    assert "gelu.md" in err and "+++ regenerated/gelu.md" in err
    assert "run `pypto-numba report` to update" in err


@pytest.mark.skipif(not SAME_MPL, reason="needs the matplotlib version that drew the committed charts")
def test_check_compares_sweep_charts_bytes(tmp_path):
    out = _copy(tmp_path)
    svg = out / "charts" / "linear-4096-decode-sweep.svg"
    data = svg.read_bytes()
    res = report.plan_scenario(next(s for s in report.load_scenarios(out / "scenarios.toml")
                                    if s.name == "linear-4096-decode"), "ascend910b")
    assert report._sweep_svg(res) == report.sweep_svg(res) == data  # byte-deterministic, and as committed
    svg.write_bytes(data.replace(b"fused_bias", b"fused_bias ", 1))
    code, err = _check(out)
    assert code == 1 and "linear-4096-decode-sweep.svg" in err


@pytest.mark.skipif(not SAME_MPL, reason="needs the matplotlib version that drew the committed charts")
def test_no_measure_rewrites_the_same_pages_and_keeps_measured_sections(tmp_path):
    out = _copy(tmp_path)
    code = report.generate(str(out), measure_runs=False, stream=io.StringIO())
    assert code == 0
    for path in sorted(STRATEGIES.rglob("*")):
        if path.is_file():
            assert (out / path.relative_to(STRATEGIES)).read_bytes() == path.read_bytes(), path.name


def test_check_works_without_matplotlib_and_report_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now fails
    code, err = _check(STRATEGIES)
    assert code == 0 and "matplotlib is not installed" in err
    with pytest.raises(PyptoNumbaError, match=r"pip install \.\[plot\]"):
        report.generate(str(_copy(tmp_path)), stream=io.StringIO())


def test_cli_check_in_a_subprocess(tmp_path):
    # a two-scenario folder keeps the two subprocess runs short; the committed pages' own check is
    # test_check_passes_on_committed_pages_with_progress (same code, in-process)
    text = (STRATEGIES / "scenarios.toml").read_text(encoding="utf-8")
    blocks = text.split("\n[[scenario]]\n")
    keep = [b for b in blocks[1:] if 'name = "mean-qwen3-hidden"' in b or 'name = "linear-4096-decode"' in b]
    assert len(keep) == 2
    out = tmp_path / "small"
    out.mkdir()
    (out / "scenarios.toml").write_text("\n[[scenario]]\n".join([blocks[0]] + keep), encoding="utf-8")
    assert report.generate(str(out), measure_runs=False, stream=io.StringIO(), charts=None if HAVE_MPL else False) == 0
    assert sorted(p.name for p in out.glob("*.md")) == ["calibration.md", "linear.md", "mean.md", "strategy-comparison.md"]
    cmd = [sys.executable, "-m", "pypto_numba", "report", "--check", "--out", str(out)]
    env = dict(os.environ, NUMBA_NUM_THREADS="2")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "up to date" in run.stderr
    assert "report [" in run.stderr and "plans: mean-qwen3-hidden" in run.stderr  # progress lines
    (out / "mean.md").write_text("stale\n", encoding="utf-8")
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "--- mean.md differs" in run.stderr and "run `pypto-numba report` to update" in run.stderr
    assert "linear.md" not in run.stderr.split("out of date")[-1]  # only the edited page is reported
