"""strategies/layers.md: its plan sections regenerate as committed, and `report --check` compares them
(its numerical sections are measured blocks, kept as on disk)."""

from __future__ import annotations

import io
import pathlib

from pypto_numba import report
from pypto_numba.layers.page import build
from pypto_numba.report.check import old_measured

STRATEGIES = pathlib.Path(__file__).resolve().parents[2] / "strategies"


def test_committed_page_plan_sections_are_up_to_date():
    path = STRATEGIES / "layers.md"
    text = path.read_text(encoding="utf-8")
    assert "<!-- measured:begin layers-drift -->" in text and "<!-- measured:end layers-attribution -->" in text
    assert build(numerics=False, measured=old_measured(path)) == text
    assert "host.transpose" not in text and "| kv_write | attention.write_kv | 1 | 1 |" in text


def test_report_check_covers_the_layers_page(tmp_path):
    blocks = (STRATEGIES / "scenarios.toml").read_text(encoding="utf-8").split("\n[[scenario]]\n")
    keep = [b for b in blocks[1:] if 'name = "mean-qwen3-hidden"' in b]
    (tmp_path / "scenarios.toml").write_text("\n[[scenario]]\n".join([blocks[0]] + keep), encoding="utf-8")
    assert report.generate(str(tmp_path), measure_runs=False, stream=io.StringIO(), charts=False) == 0
    assert not (tmp_path / "layers.md").exists()  # a folder without the page is not given one
    page = (STRATEGIES / "layers.md").read_text(encoding="utf-8")
    start = page.index("<!-- measured:begin layers-drift -->\n") + len("<!-- measured:begin layers-drift -->\n")
    (tmp_path / "layers.md").write_text(page[:start] + "other host's numbers\n" + page[start:], encoding="utf-8")
    err = io.StringIO()
    assert report.generate(str(tmp_path), check=True, stream=err, charts=False) == 0, err.getvalue()
    (tmp_path / "layers.md").write_text(page.replace("| kv_write |", "| kv write |", 1), encoding="utf-8")
    err = io.StringIO()
    assert report.generate(str(tmp_path), check=True, stream=err, charts=False) == 1
    assert "--- layers.md differs" in err.getvalue()
