"""torch tensors in, torch tensors out (pypto_numba/interop.py), for every public strategy.

Each case runs once on NumPy arrays and once on CPU torch tensors holding the same bits: the torch
call gives tensors of the same dtypes, bit-equal to the NumPy results, sharing memory with the
arrays the strategy made, with the same counted workspace (no copy for contiguous tensors).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is optional; the torch interop tests need it")

from helpers import NP_DTYPE, make
from helpers import bits_of as bits, torch_copy as tt

import pypto_numba as pn
from pypto_numba import interop
from pypto_numba.errors import DTypeError

TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def np_to_torch_dtype(d):
    if d.name == "bfloat16":
        return torch.bfloat16
    return torch.from_numpy(np.zeros(1, d)).dtype


def _rope_tables(S, R, dt, layout="half"):
    return pn.rope.cos_sin(np.arange(S) + 2, R, dtype=NP_DTYPE[dt], layout=layout)


# name -> (strategy, builder(rng, dt) -> (args, kwargs)); the first argument is the main input
def _cases():
    def attn(qs, ks, **opt):
        return lambda rng, dt: ((make(qs, dt, rng), make(ks, dt, rng), make(ks, dt, rng)), opt)

    def mask(rng, dt):
        m = np.where(rng.random((2, 1, 9, 33)) < 0.3, -np.inf, rng.standard_normal((2, 1, 9, 33)))
        return ((make((2, 4, 9, 64), dt, rng), make((2, 2, 33, 64), dt, rng), make((2, 2, 33, 64), dt, rng)),
                dict(mask=m.astype(np.float32), scale=0.2))

    cases = {
        "gelu.tanh": (pn.gelu.tanh, lambda rng, dt: ((make((3, 1001), dt, rng, 3.0),), {})),
        "gelu.erf": (pn.gelu.erf, lambda rng, dt: ((make((7, 77), dt, rng, 3.0),), {})),
        "mean.sum_div": (pn.mean.sum_div, lambda rng, dt: ((make((5, 37, 129), dt, rng),), dict(dim=1))),
        "rope.standard": (pn.rope.standard, lambda rng, dt: ((make((2, 13, 3, 64), dt, rng),) + _rope_tables(13, 32, dt), {})),
        "rope.interleaved": (pn.rope.interleaved, lambda rng, dt: ((make((2, 13, 3, 64), dt, rng),) + _rope_tables(13, 64, dt, "interleaved"), {})),
        "rope.rmsnorm": (pn.rope.rmsnorm, lambda rng, dt: ((make((2, 5, 2, 96), dt, rng, 2.0), make((96,), dt, rng)), {})),
        "rope.fused_rmsnorm": (pn.rope.fused_rmsnorm, lambda rng, dt: (
            (make((2, 5, 2, 96), dt, rng, 2.0), make((96,), dt, rng)) + _rope_tables(5, 64, dt), {})),
        "repeat_kv.expand_clone": (pn.repeat_kv.expand_clone, lambda rng, dt: ((make((2, 3, 17, 72), dt, rng), 3), {})),
        "moe.sigmoid_gating": (pn.moe.sigmoid_gating, lambda rng, dt: (
            (make((37, 64), dt, rng, 2.0), 6), dict(bias=(rng.standard_normal(64) * 0.1).astype(np.float32)))),
        "moe.softmax_gating": (pn.moe.softmax_gating, lambda rng, dt: ((make((5, 7), dt, rng, 2.0), 2), dict(renormalize=True))),
        "moe.combine": (pn.moe.combine, lambda rng, dt: (
            (make((19, 2, 1001), dt, rng), rng.random((19, 2)).astype(np.float32)), {})),
        "linear.fused_bias": (pn.linear.fused_bias, lambda rng, dt: (
            (make((37, 131), dt, rng), make((67, 131), dt, rng, 0.1), make((67,), dt, rng)), {})),
        "linear.fused_bias/row_scale": (pn.linear.fused_bias, lambda rng, dt: (
            (make((3, 131), dt, rng), make((67, 131), dt, rng, 0.1)), dict(row_scale=make((3,), "fp32", rng, 0.1, 1.0)))),
        "linear.matmul_add": (pn.linear.matmul_add, lambda rng, dt: (
            (make((3, 131), dt, rng), make((67, 131), dt, rng, 0.1), make((67,), dt, rng)), {})),
        "embedding.gather/int32": (pn.embedding.gather, lambda rng, dt: (
            (make((1000, 77), dt, rng), rng.integers(0, 1000, (3, 17)).astype(np.int32)), {})),
        "embedding.index_select/int64": (pn.embedding.index_select, lambda rng, dt: (
            (make((300, 129), dt, rng), rng.integers(0, 300, (41,)).astype(np.int64)), {})),
        "rmsnorm.plain": (pn.rmsnorm.plain, lambda rng, dt: ((make((5, 96), dt, rng, 2.0), make((96,), "fp32", rng)),
                                                             dict(offset=1.0))),
        "rmsnorm.fused_add": (pn.rmsnorm.fused_add, lambda rng, dt: (
            (make((5, 96), dt, rng), make((5, 96), "fp32", rng, 3.0), make((96,), dt, rng)), {})),
        "rmsnorm.deferred": (pn.rmsnorm.deferred, lambda rng, dt: ((make((5, 3, 96), dt, rng, 2.0),), {})),
        "softmax.whole_row": (pn.softmax.whole_row, lambda rng, dt: ((make((7, 1000), dt, rng, 4.0),), dict(scale=0.7))),
        "softmax.online": (pn.softmax.online, lambda rng, dt: ((make((3, 3001), dt, rng, 4.0),), dict(col_tile=512))),
        "swiglu.separate": (pn.swiglu.separate, lambda rng, dt: ((make((5, 3, 130), dt, rng, 3.0), make((5, 3, 130), dt, rng)),
                                                                 dict(limit=4.0))),
        "swiglu.fused": (pn.swiglu.fused, lambda rng, dt: ((make((37, 2 * 515), dt, rng, 3.0),), {})),
        "swiglu.epilogue": (pn.swiglu.epilogue, lambda rng, dt: (
            (make((5, 2, 64), dt, rng), make((40, 64), dt, rng, 0.2), make((40, 64), dt, rng, 0.2)), dict(limit=3.0))),
    }
    for fn in ("standard", "online", "flash"):
        f = getattr(pn.attention, fn)
        cases[f"attention.{fn}/causal"] = (f, attn((2, 4, 37, 64), (2, 2, 53, 64), causal=True))
        cases[f"attention.{fn}/kv_len"] = (f, attn((3, 8, 1, 128), (3, 2, 300, 128), kv_len=np.array([300, 1, 177])))
        cases[f"attention.{fn}/mask"] = (f, mask)
    return cases


CASES = _cases()


def test_every_strategy_has_a_case():
    """A new strategy needs a torch case here."""
    covered = {name.split("/")[0] for name in CASES}
    registered = {e.qualname for entries in pn.strategy.strategies().values() for e in entries}
    assert registered <= covered, registered - covered


def _torch_args(args, kwargs):
    return (tuple(tt(a) if isinstance(a, np.ndarray) else a for a in args),
            {k: tt(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()})


def _traced(fn, args, kwargs):
    with pn.trace() as t:
        result = fn(*args, **kwargs)
    return result, t.records[-1]


@pytest.mark.parametrize("name", list(CASES))
def test_torch_in_torch_out(name, dtype, rng, monkeypatch):
    fn, build = CASES[name]
    args, kwargs = build(rng, dtype)
    want, want_rec = _traced(fn, args, kwargs)
    made = []  # the arrays interop turned into tensors: the results must share their memory
    real = interop.to_torch
    monkeypatch.setattr(interop, "to_torch", lambda a, torch_: made.append(a) or real(a, torch_))
    targs, tkwargs = _torch_args(args, kwargs)
    for _ in range(2):  # the second call takes the call memo's path where the strategy keeps one
        made.clear()
        got, got_rec = _traced(fn, targs, tkwargs)
        wants = want if isinstance(want, tuple) else (want,)
        gots = got if isinstance(got, tuple) else (got,)
        assert type(got) is type(want) or isinstance(got, torch.Tensor)
        assert len(gots) == len(wants)
        for w, g, a in zip(wants, gots, made):
            assert isinstance(g, torch.Tensor), type(g)
            assert g.dtype == np_to_torch_dtype(w.dtype)
            assert bits(g) == bits(w)
            assert g.data_ptr() == a.ctypes.data  # the tensor is our output, not a copy
        assert len(made) == len(wants)
        assert got_rec.cost.workspace_bytes == want_rec.cost.workspace_bytes  # contiguous: no copy
        assert got_rec.cost == want_rec.cost
    fp32_out = name.startswith("moe.") and "gating" in name or name == "rmsnorm.deferred"  # fp32 by definition
    assert gots[0].dtype == TORCH_DTYPE[dtype] or fp32_out


def test_moe_ids_stay_int32(rng):
    """torch.topk returns int64 indices; the gatings keep their int32 ids (torch.int32)."""
    w, ids = pn.moe.softmax_gating(tt(make((4, 16), "bf16", rng)), 3)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.topk(torch.randn(4, 16), 3).indices.dtype == torch.int64


def test_cos_sin_takes_torch_positions_and_dtype(dtype):
    want = pn.rope.cos_sin(np.arange(37) * 3, 64, theta=1e5, dtype=NP_DTYPE[dtype])
    got = pn.rope.cos_sin(torch.arange(37) * 3, 64, theta=1e5, dtype=TORCH_DTYPE[dtype])
    for w, g in zip(want, got):
        assert isinstance(g, torch.Tensor) and g.dtype == TORCH_DTYPE[dtype]
        assert bits(g) == bits(w)
    # NumPy positions give NumPy tables, whatever the dtype is spelled as
    c, _ = pn.rope.cos_sin(np.arange(5), 32, dtype=TORCH_DTYPE[dtype])
    assert isinstance(c, np.ndarray) and c.dtype == NP_DTYPE[dtype]


@pytest.mark.parametrize("name", ["gelu.tanh", "gelu.erf", "rope.standard", "rope.interleaved", "rope.rmsnorm",
                                  "rope.fused_rmsnorm", "embedding.gather/int32", "embedding.index_select/int64"])
def test_out_torch(name, dtype, rng):
    """``out=`` a tensor: the strategy writes into its memory and returns that very tensor."""
    fn, build = CASES[name]
    args, kwargs = build(rng, dtype)
    want = fn(*args, **kwargs)
    targs, tkwargs = _torch_args(args, kwargs)
    out = torch.full(tuple(want.shape), 7.0, dtype=TORCH_DTYPE[dtype])
    got = fn(*targs, **tkwargs, out=out)
    assert got is out
    assert bits(out) == bits(want)
    # a NumPy main input with a tensor out=: written too, the result is the NumPy view
    out2 = torch.zeros_like(out)
    fn(*args, **kwargs, out=out2)
    assert bits(out2) == bits(want)


@pytest.mark.parametrize("name", list(CASES))
def test_strided_tensor_is_copied_and_counted(name, rng):
    """A non-contiguous main tensor takes the NumPy path of a non-contiguous array: the same
    result and the same counted workspace, one copy more than a contiguous input."""
    fn, build = CASES[name]
    args, kwargs = build(rng, "bf16")
    x = args[0]
    wide = np.repeat(x, 2, axis=-1)
    strided = wide[..., ::2]
    assert not strided.flags.c_contiguous and np.array_equal(strided.view(np.int16), x.view(np.int16))
    twide = tt(wide)
    tstrided = twide[..., ::2]
    assert not tstrided.is_contiguous()
    rest_t, kw_t = _torch_args(args[1:], kwargs)
    want, want_rec = _traced(fn, (strided,) + args[1:], kwargs)
    _, contiguous_rec = _traced(fn, args, kwargs)
    got, got_rec = _traced(fn, (tstrided,) + rest_t, kw_t)
    wants = want if isinstance(want, tuple) else (want,)
    gots = got if isinstance(got, tuple) else (got,)
    for w, g in zip(wants, gots):
        assert bits(g) == bits(w)
    assert got_rec.cost.workspace_bytes == want_rec.cost.workspace_bytes
    assert got_rec.cost.workspace_bytes == contiguous_rec.cost.workspace_bytes + x.nbytes


@pytest.mark.parametrize("name", list(CASES))
def test_refused_tensors(name, rng):
    fn, build = CASES[name]
    args, kwargs = build(rng, "fp32")
    targs, tkwargs = _torch_args(args, kwargs)
    grad = targs[0].clone().requires_grad_(True)
    with pytest.raises(DTypeError, match=r"requires_grad=True.*\.detach\(\)"):
        fn(grad, *targs[1:], **tkwargs)
    with pytest.raises(DTypeError, match=r"on device meta.*\.cpu\(\)"):
        fn(torch.empty(3, device="meta"), *targs[1:], **tkwargs)
    # the same validation and message as NumPy: a float64 tensor
    x64 = args[0].astype(np.float64)
    with pytest.raises(Exception) as np_info:
        fn(x64, *args[1:], **kwargs)
    with pytest.raises(type(np_info.value)) as t_info:
        fn(torch.from_numpy(x64), *targs[1:], **tkwargs)
    assert str(t_info.value) == str(np_info.value)


def test_refused_option_tensor(rng):
    """An option tensor (here kv_len) is refused by the same rules, naming the argument."""
    q, k, v = (tt(make(s, "fp32", rng)) for s in ((1, 2, 1, 64), (1, 2, 9, 64), (1, 2, 9, 64)))
    with pytest.raises(DTypeError, match=r"kv_len is a torch tensor on device meta"):
        pn.attention.flash(q, k, v, kv_len=torch.empty(1, dtype=torch.int64, device="meta"))
    with pytest.raises(DTypeError, match=r"^gelu.tanh: x has torch dtype torch.float8_e4m3fn"):
        pn.gelu.tanh(torch.zeros(4, dtype=torch.float8_e4m3fn))


def test_bool_mask_is_judged_as_its_numpy_view(dtype, rng):
    """A bool mask tensor (True = keep) gives the bits a NumPy bool mask gives: one rule for both paths."""
    q, k, v = make((2, 4, 9, 64), dtype, rng), make((2, 2, 33, 64), dtype, rng), make((2, 2, 33, 64), dtype, rng)
    keep = rng.random((2, 1, 9, 33)) < 0.7
    for fn in (pn.attention.standard, pn.attention.online, pn.attention.flash):
        want = fn(q, k, v, mask=keep)
        got = fn(tt(q), tt(k), tt(v), mask=torch.from_numpy(keep))
        assert bits(got) == bits(want)


def test_kv_len_int32_and_int64(rng):
    q, k, v = make((3, 8, 1, 128), "fp16", rng), make((3, 2, 300, 128), "fp16", rng), make((3, 2, 300, 128), "fp16", rng)
    want = pn.attention.flash(q, k, v, kv_len=np.array([300, 1, 177]))
    for idt in (torch.int32, torch.int64):
        got = pn.attention.flash(tt(q), tt(k), tt(v), kv_len=torch.tensor([300, 1, 177], dtype=idt))
        assert bits(got) == bits(want)


def test_numpy_main_input_gives_numpy(rng):
    x, w, b = make((3, 64), "bf16", rng), make((5, 64), "bf16", rng), make((5,), "bf16", rng)
    got = pn.linear.fused_bias(x, tt(w), tt(b))
    assert type(got) is np.ndarray and bits(got) == bits(pn.linear.fused_bias(x, w, b))


def test_wrapper_keeps_name_docstring_signature():
    import inspect

    for entries in pn.strategy.strategies().values():
        for e in entries:
            assert e.fn.__wrapped__.__doc__ == e.fn.__doc__ and e.fn.__doc__
            assert e.fn.plan is e.plan and e.fn.strategy is e
            assert inspect.signature(e.fn) == inspect.signature(e.fn.__wrapped__)
    assert pn.rope.cos_sin.__name__ == "cos_sin"


def test_import_does_not_import_torch():
    """Neither the package nor the layers import torch, nor does building a layer and its weights."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    code = ("import sys, pypto_numba, pypto_numba.layers as L; "
            "L.Qwen3Layer(L.config('qwen3-1.7b', hidden_size=64, num_attention_heads=4, num_key_value_heads=2, "
            "head_dim=16, intermediate_size=96)).new_cache(1, 4); "
            "L.MoeBlock(L.config('deepseek-v3', hidden_size=64, n_routed_experts=8, n_group=4, topk_group=2, "
            "num_experts_per_tok=3, moe_intermediate_size=32)); "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr
