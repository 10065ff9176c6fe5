"""The ops' OP specs drive compare, advise, report and the CLI: one place per op, no per-op code in the lab."""

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import reference, strategy
from pypto_numba.lab import Candidate, Inputs, OpSpec, Seed, Tolerance, normal

ROOT = Path(__file__).resolve().parents[2]
LAB_FILES = ["compare.py", "advise.py", "strategy.py", "cli.py"]


def test_every_op_has_its_spec_in_its_module():
    # the op list is pypto_numba/__init__.py's import line of the op modules, in its order
    line = next(l for l in (ROOT / "pypto_numba" / "__init__.py").read_text(encoding="utf-8").splitlines()
                if l.startswith("from . import ") and "noqa" in l)
    imported = [n.strip() for n in line[len("from . import "):].split("#")[0].split(",")]
    assert strategy.OPS == tuple(n for n in imported if hasattr(getattr(pn, n), "OP"))
    assert strategy.OPS[:3] == ("gelu", "mean", "rope")
    for op in strategy.OPS:
        spec = strategy.spec(op)
        assert getattr(pn, op).OP is spec and spec.name == op
        assert pn.SEED[op] == tuple(spec.seed)
        assert spec.strategies == pn.strategies(op)
        labels = {v.label for v in spec.rows()}
        assert spec.seed.preferred in labels, op
        assert spec.scenario_keywords, op


def test_reference_reexports_every_oracle():
    for spec in strategy.specs():
        for name, fn in spec.oracles.items():
            assert getattr(reference, name) is fn
            assert name in dir(reference)
    assert reference.f64(np.float32(1.5)).dtype == np.float64
    with pytest.raises(AttributeError):
        reference.no_such_oracle  # noqa: B018


def test_unknown_op_messages_list_the_specs():
    with pytest.raises(pn.PyptoNumbaError, match="compare: unknown op 'x'; known: gelu, mean, rope"):
        pn.compare("x")
    with pytest.raises(pn.PyptoNumbaError, match="advise: unknown op 'x'; known: gelu, mean, rope"):
        pn.advise("x")


def test_lab_layer_names_no_op():
    """compare, advise, the registry, the CLI and the report hold no per-op table or branch."""
    files = [ROOT / "pypto_numba" / f for f in LAB_FILES] + sorted((ROOT / "pypto_numba" / "report").glob("*.py"))
    ops = "|".join(strategy.OPS)
    for path in files:
        hits = [line for line in path.read_text(encoding="utf-8").splitlines() if re.search(rf'"({ops})"', line)]
        assert not hits, (path.name, hits)


def test_git_grep_finds_no_op_name_in_the_lab():
    try:
        run = subprocess.run(["git", "grep", "-nE", '"(gelu|mean|rope|attention|repeat_kv|moe|linear|embedding)"',
                              "--", *(f"pypto_numba/{f}" for f in LAB_FILES), "pypto_numba/report*"],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("git is not available")
    if run.returncode not in (0, 1):
        pytest.skip(f"not a git checkout: {run.stderr.strip()}")
    assert run.stdout == ""


@pytest.fixture
def toy_op():
    """A new op declared by its spec alone: one strategy (gelu's tanh under another op name)."""

    def tanh(x, *, profile=None):
        return pn.gelu.tanh(x, profile=profile)

    strategy.register("toy", "tanh", plan=pn.gelu.plan_tanh, summary="gelu's tanh, as a toy op")(tanh)

    def _toy(profile, shape=(4, 96), dtype="fp32"):
        return [Candidate("tanh", lambda: (pn.gelu.plan_tanh(shape, dtype, profile=profile),))], None, ()

    spec = OpSpec(
        name="toy",
        seed=Seed("tanh", None, "the only one"),
        inputs=Inputs(make=lambda shape, dtype, rng: (normal(shape, dtype, rng),), default_shape=(4, 96), help="x"),
        reference=lambda x, strategy, **o: reference.gelu_tanh(x),
        tolerance=Tolerance(half=(1e-2, 1e-2)),
        advise=_toy,
        oracles={"toy_tanh": reference.gelu_tanh},
    )
    try:
        yield spec
    finally:
        strategy._SPECS.pop("toy", None)
        strategy.SEED.pop("toy", None)
        strategy._REGISTRY.pop("toy", None)


def test_a_new_op_needs_no_change_in_the_lab(toy_op):
    assert strategy.OPS[-1] == "toy" and pn.SEED["toy"] == ("tanh", None, "the only one")
    assert [s.name for s in pn.strategies("toy")] == ["tanh"] and pn.strategies("toy")[0].recommended
    result = pn.compare("toy", repeats=1)
    assert [(r.strategy, r.verdict, r.recommended) for r in result.rows] == [("tanh", "PASS", True)]
    a = pn.advise("toy", shape=(8, 128))
    assert a.chosen == "tanh" and a.agrees_with_seed
    with pytest.raises(pn.PyptoNumbaError, match="scenario keywords are shape, dtype"):
        pn.advise("toy", size=3)
    assert reference.toy_tanh is reference.gelu_tanh
    assert Tolerance(half=(1e-2, 1e-2))("bf16") == (1e-2, 1e-2) and toy_op.tolerance("fp32") == (None, None)
