"""CLI: compare layer (per-op table and totals from plans) and advise layer."""

from __future__ import annotations

from pypto_numba.cli import main


def test_compare_layer_prints_the_per_op_tables(capsys):
    assert main(["compare", "layer", "--model", "deepseek-v3", "--phase", "decode", "--batch", "4"]) == 0
    out = capsys.readouterr().out
    assert out.count("| **total** |") == 2 and "moe.sigmoid_gating" in out and "== advised" in out


def test_advise_layer_prints_the_choice(capsys):
    assert main(["advise", "layer", "--model", "qwen3-14b", "--phase", "decode", "--batch", "16",
                 "--context", "4096"]) == 0
    out = capsys.readouterr().out
    assert "chosen" in out and "attention:" in out and "swiglu:" in out


def test_advise_layer_refuses_unknown_keywords(capsys):
    assert main(["advise", "layer", "--modle", "qwen3-14b"]) == 2
    assert "modle" in capsys.readouterr().err
