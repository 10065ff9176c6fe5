"""compare() shows the three NPU estimators side by side and flags where they disagree; --timeline."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

import pypto_numba as pn
from pypto_numba import cli
from pypto_numba.compare import model_check
from pypto_numba.machine.cost import Estimate

from helpers import make


def est(us, bound="memory"):
    return Estimate(seconds=us * 1e-6, bound=bound)


def rows(**by):
    """strategy=(pipes us, roofline us, sim us)."""
    return [(name, {"pipes": est(p), "roofline": est(r, "vector"), "sim": est(s)}) for name, (p, r, s) in by.items()]


def test_model_check_winners_and_ratios():
    check = model_check(rows(a=(100, 30, 110), b=(200, 20, 150)))
    assert check["winners"] == {"pipes": "a", "roofline": "b", "sim": "a"}
    assert check["winner_differs"] == ["roofline"]
    # a: roofline 0.3x (flagged), sim 1.1x (not); b: roofline 0.1x; sim 0.75x
    assert check["over_2x"] == {"a": {"roofline": pytest.approx(0.3)}, "b": {"roofline": pytest.approx(0.1)}}
    notes = check["notes"]
    assert notes[0] == ("# roofline picks b (20.0 us, vector-bound) where the pipes model picks a "
                        "(100.0 us, memory-bound)")
    assert notes[1] == "! a: roofline 0.3x (vector-bound) of the pipes estimate, 100.0 us (memory-bound)"
    assert len(notes) == 3


def test_model_check_edges():
    # exactly 2x is not flagged, just over is; a tie in the pipes model agrees with either pick
    check = model_check(rows(a=(100, 200, 100), b=(100, 80, 201)))
    assert check["winner_differs"] == [] and check["over_2x"] == {"b": {"sim": pytest.approx(2.01)}}
    # one strategy: nothing to disagree on but the ratio
    check = model_check(rows(a=(10, 10, 50)))
    assert check["winner_differs"] == [] and list(check["over_2x"]) == ["a"]
    assert model_check([]) == {"winners": {}, "winner_differs": [], "over_2x": {}, "notes": []}


@pytest.fixture(scope="module")
def gelu_cmp():
    import numpy as np

    x = make((64, 9216), "bf16", np.random.default_rng(3), scale=2.0)
    return pn.compare("gelu", x, repeats=1)


def test_compare_rows_carry_every_model(gelu_cmp):
    for row in gelu_cmp.rows:
        assert set(row.estimates) == {"pipes", "roofline", "sim"}
        for m, e in row.estimates.items():
            assert e.model == m and e.seconds == row.cost.estimate(gelu_cmp.profile, "bf16", model=m).seconds
        assert row.estimate is row.estimates["pipes"]
    data = gelu_cmp.to_dict()
    r0 = data["rows"][0]
    assert r0["npu_estimate_seconds"] == r0["npu_estimates"]["pipes"]["seconds"]
    assert set(r0["npu_estimates"]) == {"pipes", "roofline", "sim"}
    assert data["model_check"] == gelu_cmp.model_check()
    json.loads(gelu_cmp.to_json())


def test_table_and_markdown_columns_and_marks(gelu_cmp):
    table = gelu_cmp.to_table()
    head = table.splitlines()[1]
    assert head.index("NPU us (bound)") < head.index("roofline us") < head.index("sim us")
    md = gelu_cmp.to_markdown()
    assert "| NPU us (bound) | roofline us | sim us |" in md
    check = gelu_cmp.model_check()
    for row in gelu_cmp.rows:
        line = next(l for l in md.splitlines() if l.startswith(f"| {row.strategy}"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        for m, cell in zip(("roofline", "sim"), cells[-2:]):
            assert cell.split()[0] == f"{row.estimates[m].seconds * 1e6:.1f}"
            assert ("!" in cell) == (m in check["over_2x"].get(row.strategy, {}))
    for note in check["notes"]:
        assert f"- {note}" in md and f"models: {note}" in table


def test_winner_mark_in_the_table():
    c = pn.compare("gelu", make((4, 128), "bf16", __import__("numpy").random.default_rng(0)), repeats=1)
    # force a disagreement on the rows' estimates: the roofline picks erf where pipes picks tanh
    tanh, erf = c.rows
    tanh.estimates = {"pipes": est(10), "roofline": est(15), "sim": est(10)}
    erf.estimates = {"pipes": est(12), "roofline": est(14, "vector"), "sim": est(12)}
    tanh.estimate, erf.estimate = tanh.estimates["pipes"], erf.estimates["pipes"]
    md = c.to_markdown()
    assert "| 14.0 # | 12.0 |" in md and "| 15.0 | 10.0 |" in md and "!" not in md
    assert md.endswith("\n\n- # roofline picks erf (14.0 us, vector-bound) where the pipes model picks tanh "
                       "(10.0 us, memory-bound)")
    assert "models: # roofline picks erf" in c.to_table()


def test_comparison_timeline_and_cli_flag(gelu_cmp, tmp_path):
    tl = gelu_cmp.timeline()
    names = {e["args"]["name"] for e in tl.events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"gelu.tanh: chip", "gelu.erf: chip", "gelu.tanh: AIV 0", "gelu.erf: AIV 0"} <= names
    assert tl.seconds == max(r.estimate.seconds for r in gelu_cmp.rows)
    for label, one in gelu_cmp.timelines():
        row = next(r for r in gelu_cmp.rows if f"gelu.{r.strategy}" == label)
        assert one.seconds == pytest.approx(row.estimate.seconds, rel=1e-12)
    path = tmp_path / "out.json"
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = cli.main(["compare", "gelu", "--shape", "4,33", "--repeats", "1", "--format", "json",
                         "--timeline", str(path)])
    assert code == 0, err.getvalue()
    json.loads(out.getvalue())  # stdout stays pure JSON; the note goes to stderr
    assert "wrote the modelled timeline of 2 strategies" in err.getvalue()
    data = json.loads(path.read_text(encoding="utf-8"))
    procs = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"gelu.tanh: chip", "gelu.erf: chip"} <= procs
    assert all(e["dur"] >= 0 for e in data["traceEvents"] if e["ph"] == "X")


def test_timeline_when_everything_is_ruled_out(tmp_path):
    import numpy as np

    # erf needs 7 live 46 KiB fp32 buffers at tile 11776: its plan is refused
    c = pn.compare("gelu", make((64,), "fp32", np.random.default_rng(0)), strategies="erf", tile=11776, repeats=1)
    assert c.rows[0].ruled_out and c.timelines() == []
    with pytest.raises(pn.PyptoNumbaError, match="every strategy was ruled out"):
        cli._save_timeline([c], tmp_path / "x.json")
    assert not (tmp_path / "x.json").exists()


def test_op_pages_show_the_models_and_the_timeline_chart():
    from pathlib import Path

    from pypto_numba import report
    from pypto_numba.report import charts, markdown

    strategies = Path(__file__).resolve().parents[2] / "strategies"
    if not (strategies / "scenarios.toml").exists():
        pytest.skip("strategies/ is not part of this source tree")
    sc = next(s for s in report.load_scenarios(strategies / "scenarios.toml") if s.name == "gelu-gemma2-ffn")
    res = report.plan_scenario(sc, "ascend910b")
    rows = {r[0]: r for r in report.plan_rows(res)}
    head = report.PLAN_HEAD
    for label, p in res.priced.items():
        row = rows[f"`{label}`"]
        for m in ("roofline", "sim"):
            value = p.cost.estimate("ascend910b", "bf16", model=m).seconds
            assert row[head.index(m)].split(" ")[:2] == report.fmt_us(value).split(" ")
    # GELU at the Gemma-2 FFN: dispatch-bound in the pipes model, the roofline 5-7x below it
    estimates, check = markdown.model_check_of(res)
    assert set(check["over_2x"]) == {"tanh", "erf"} and "! tanh: roofline" in "\n".join(check["notes"])
    page = report.op_page("gelu", [res], {})
    assert page.count("charts/gelu-timeline.svg") == 1 and "- ! tanh: roofline" in page
    pytest.importorskip("matplotlib")
    svg = charts.timeline_svg("gelu", res)
    assert svg == charts.timeline_svg("gelu", res)  # byte-deterministic, as --check needs
    tl = charts.scenario_timeline(res)
    assert tl.seconds == pytest.approx(res.priced[res.advice.chosen].seconds, rel=1e-12)
    for lane in (b"chip kernels", b"chip AICPU", b"AIV 0 tasks", b"AIV 0 VECTOR", b"AIV 0 MTE3"):
        assert lane in svg
