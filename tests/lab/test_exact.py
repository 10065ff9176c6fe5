"""use_exact() / PYPTO_NUMBA_EXACT: every strategy in fp32 storage (pypto_numba/exact.py)."""

import os
import subprocess
import sys
import threading

import ml_dtypes
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import precision
from pypto_numba.compare import case, make_inputs
from pypto_numba.strategy import specs, trace

# small shapes in compare's --shape order, odd where the op allows it
SHAPES = {
    "gelu": (3, 77), "mean": (5, 130), "rope": (7, 4, 64), "attention": (1, 4, 2, 3, 70, 64),
    "repeat_kv": (1, 2, 9, 64, 2), "moe": (13, 64), "linear": (5, 64, 48), "embedding": (500, 64, 2, 5),
    "rmsnorm": (5, 192), "softmax": (5, 130), "swiglu": (5, 200),
}
NARROW = {"bf16": ml_dtypes.bfloat16, "fp16": np.float16}


def _widen(a):
    return a.astype(np.float32) if isinstance(a, np.ndarray) and a.dtype in map(np.dtype, NARROW.values()) else a


def _rows():
    for sp in specs():
        for v in sp.rows():
            if "+" not in v.label:  # a composition (numpy_add+plain) adds in storage outside any strategy
                yield sp.name, v


def test_every_op_has_a_small_shape():
    assert set(SHAPES) == {sp.name for sp in specs()}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("op,variant", list(_rows()), ids=lambda x: getattr(x, "label", x))
def test_exact_is_the_strategy_on_fp32_widened_inputs(op, variant, dtype):
    inputs = make_inputs(op, SHAPES[op], dtype, seed=1)
    with pn.use_exact():
        got = variant.call(*inputs)
    want = variant.call(*(_widen(a) for a in inputs))  # outside use_exact: the fp32 strategy
    normal = variant.call(*inputs)
    c = case(op)
    gots, wants = c.outputs(got), c.outputs(want)
    for g, w, n in zip(gots, wants, c.outputs(normal)):
        assert g.dtype == w.dtype and g.shape == w.shape
        if n.dtype.kind == "f":
            assert g.dtype == np.float32  # the documented exception (MoE weights are fp32 anyway)
            assert n.dtype in (np.dtype(NARROW[dtype]), np.dtype(np.float32))
            np.testing.assert_array_equal(g.view(np.uint32), w.view(np.uint32))  # bit for bit
        else:
            np.testing.assert_array_equal(g, w)
    # error against float64 within fp32 tolerance (the op's fp32 (rtol, atol) under its policy)
    ref = variant.reference(*inputs)
    refs = ref if isinstance(ref, tuple) else (ref,)
    rtol, atol = c.tolerance("fp32")
    for g, r in zip(gots, refs):
        res = precision.evaluate(g, r, "fp32", c.tolerance.policy, rtol, atol)
        assert res.passed, f"{op}.{variant.label} exact {dtype}: {res}"


def test_env_var_turns_it_on_and_use_exact_false_turns_it_off(monkeypatch):
    x = np.linspace(-2, 2, 64).astype(ml_dtypes.bfloat16).reshape(2, 32)
    monkeypatch.setenv("PYPTO_NUMBA_EXACT", "1")
    assert pn.exact_active() and pn.gelu.tanh(x).dtype == np.float32
    with pn.use_exact(False):
        assert not pn.exact_active() and pn.gelu.tanh(x).dtype == x.dtype
    for off in ("0", "", "no"):
        monkeypatch.setenv("PYPTO_NUMBA_EXACT", off)
        assert not pn.exact_active() and pn.gelu.tanh(x).dtype == x.dtype
    monkeypatch.setenv("PYPTO_NUMBA_EXACT", "true")
    assert pn.exact_active()


def test_env_var_in_a_fresh_process():
    code = ("import numpy as np, ml_dtypes, pypto_numba as pn; "
            "print(pn.gelu.tanh(np.ones((2, 32), ml_dtypes.bfloat16)).dtype)")
    env = dict(os.environ, PYPTO_NUMBA_EXACT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "float32"


def test_nesting_and_restore(monkeypatch):
    monkeypatch.delenv("PYPTO_NUMBA_EXACT", raising=False)
    assert not pn.exact_active()
    with pn.use_exact() as on:
        assert on and pn.exact_active()
        with pn.use_exact(False):
            assert not pn.exact_active()
            with pn.use_exact():
                assert pn.exact_active()
            assert not pn.exact_active()
        assert pn.exact_active()
    assert not pn.exact_active()
    switch = pn.use_exact()  # without `with`: until restore()
    assert pn.exact_active()
    switch.restore()
    switch.restore()  # idempotent
    assert not pn.exact_active()
    with pytest.raises(pn.PyptoNumbaError, match="on must be True or False"):
        pn.use_exact("yes")


def test_use_exact_is_per_thread(monkeypatch):
    monkeypatch.delenv("PYPTO_NUMBA_EXACT", raising=False)
    seen = {}

    def worker():
        seen["other"] = pn.exact_active()

    with pn.use_exact():
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert pn.exact_active()
    assert seen["other"] is False


def test_trace_and_compare_mark_exact_runs():
    x = make_inputs("gelu", (2, 64), "bf16")[0]
    with pn.use_exact(), trace() as t:
        pn.gelu.tanh(x)
    rec = t.records[-1]
    assert rec.exact and rec.dtype == "fp32"  # priced as the fp32 run it is
    with trace() as t:
        pn.gelu.tanh(x)
    assert not t.records[-1].exact and t.records[-1].dtype == "bf16"
    with pn.use_exact():
        cmp = pn.compare("gelu", x, repeats=1)
    assert cmp.exact and cmp.to_dict()["exact"] is True and "EXACT" in cmp.title()
    assert cmp.dtype == "bf16"  # the inputs' dtype; scored with fp32 tolerances
    assert all(p.rtol == precision.tolerances("allclose", "fp32")[0] for r in cmp.rows for p in r.precision)
    plain = pn.compare("gelu", x, repeats=1)
    assert not plain.exact and "EXACT" not in plain.title()


def test_cli_exact_flag(capsys):
    from pypto_numba.cli import main

    assert main(["compare", "gelu", "--shape", "2,64", "--exact", "--repeats", "1", "--format", "json"]) == 0
    assert '"exact": true' in capsys.readouterr().out
    assert not pn.exact_active()  # the flag holds for the command only


def test_out_and_torch_under_exact():
    x = make_inputs("gelu", (2, 64), "bf16")[0]
    with pn.use_exact():
        with pytest.raises(pn.DTypeError, match="under use_exact.*out= is bfloat16.*fp32 out="):
            pn.gelu.tanh(x, out=np.empty_like(x))
        out = np.empty(x.shape, np.float32)
        assert pn.gelu.tanh(x, out=out) is out
        np.testing.assert_array_equal(out, pn.gelu.tanh(x.astype(np.float32)))
    torch = pytest.importorskip("torch")
    t = torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)
    with pn.use_exact():
        r = pn.gelu.tanh(t)
    assert isinstance(r, torch.Tensor) and r.dtype == torch.float32
    np.testing.assert_array_equal(r.numpy(), pn.gelu.tanh(x.astype(np.float32)))
