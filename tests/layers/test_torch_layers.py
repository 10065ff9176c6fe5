"""The layers with torch tensors (pypto_numba/interop.py's rules): torch hidden/positions/x in,
tensors out bit-equal to the NumPy run and sharing our outputs' memory; a torch state dict as the
weights; an fp32 MoE router (production's) in a bf16 block against the float64 block."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import bits_of as bits, torch_copy as tt

torch = pytest.importorskip("torch", reason="torch is optional; the torch layer tests need it")

import pypto_numba as pn
from pypto_numba import interop, layers, precision
from pypto_numba.errors import DTypeError, ShapeError
from pypto_numba.layers import weights as lw
from pypto_numba.layers.torch_peer import TorchMoe
from pypto_numba.machine import dtypes

CFG = layers.config("qwen3-1.7b", hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                    intermediate_size=96)
MOE = layers.config("deepseek-v3", hidden_size=128, n_routed_experts=8, n_group=4, topk_group=2,
                    num_experts_per_tok=3, moe_intermediate_size=64)
TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16}


@pytest.fixture
def made(monkeypatch):
    """The arrays interop turned into result tensors (a result must share one's memory)."""
    arrays = []
    real = interop.to_torch
    monkeypatch.setattr(interop, "to_torch", lambda a, torch_: arrays.append(a) or real(a, torch_))
    return arrays


def _state_dict(layer_or_block, index=0):
    """A torch state dict (full HF names) of a layer's weights, plus entries of other modules."""
    sd = {lw.prefix(index) + n: tt(layer_or_block.weights[n]) for n in layer_or_block.weights.shapes}
    sd["model.embed_tokens.weight"] = torch.zeros(10, layer_or_block.config.hidden_size, dtype=torch.bfloat16)
    sd[lw.prefix(index + 1) + "mlp.down_proj.weight"] = torch.zeros(3, device="meta")  # another layer's: unread
    return sd


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
@pytest.mark.parametrize("phase", ["prefill", "decode"])
def test_qwen3_torch_in_torch_out(dt, phase, rng, made):
    layer = layers.Qwen3Layer(CFG, dtype=TORCH_DTYPE[dt], seed=3)  # a torch.dtype works as dtype
    assert layer.dtype == dt
    B, C = 2, 7
    S = C if phase == "prefill" else 1
    h = dtypes.from_float32(rng.standard_normal((B, S, 64)), dt)
    caches = [layer.new_cache(B, C, TORCH_DTYPE[dt]) for _ in range(2)]
    if phase == "decode":
        past = [dtypes.from_float32(rng.standard_normal((B, 2, C - 1, 16)), dt) for _ in range(2)]
        caches[0].fill(*past)
        caches[1].fill(*map(tt, past))  # torch k, v fill the same cache
    positions = caches[0].lens[:, None] + np.arange(S)[None, :]
    want = layer(h, cache=caches[0], positions=positions)
    made.clear()
    got = layer(tt(h), cache=caches[1], positions=torch.from_numpy(positions))
    assert type(want) is np.ndarray and isinstance(got, torch.Tensor)
    assert got.dtype == torch.float32 and want.dtype == np.float32  # the fp32 residual stream, both ways
    assert bits(got) == bits(want)
    assert len(made) == 1 and got.data_ptr() == made[0].ctypes.data  # our output, not a copy
    for a, b in ((caches[0].k, caches[1].k), (caches[0].v, caches[1].v), (caches[0].lens, caches[1].lens)):
        assert np.array_equal(a.view(np.uint8), b.view(np.uint8))
    # forward (the stacked form) and the float64 reference take tensors too
    r, d = layer.forward(tt(h), cache=layer.new_cache(B, C), positions=torch.from_numpy(positions))
    assert isinstance(r, torch.Tensor) and isinstance(d, torch.Tensor) and d.dtype == TORCH_DTYPE[dt]
    if phase == "prefill":
        assert bits(r + d.float()) == bits(want)
        ref = layer.reference(tt(h))
        assert ref.dtype == torch.float64 and bits(ref) == bits(layer.reference(h))
        stack = [layer, layers.Qwen3Layer(CFG, dtype=dt, seed=4, layer=1)]  # the second's norm fused with the add
        got = layers.run_stack(stack, tt(h))
        assert isinstance(got, torch.Tensor) and bits(got) == bits(layers.run_stack(stack, h))


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_moe_block_torch_in_torch_out(dt, rng, made):
    block = layers.MoeBlock(MOE, dtype=dt, seed=5)
    x = dtypes.from_float32(rng.standard_normal((2, 5, 128)), dt)
    want = block(x)
    made.clear()
    got = block(tt(x))
    assert isinstance(got, torch.Tensor) and got.dtype == TORCH_DTYPE[dt] and bits(got) == bits(want)
    assert len(made) == 1 and got.data_ptr() == made[0].ctypes.data


def test_strided_and_refused_hidden(rng):
    layer = layers.Qwen3Layer(CFG, dtype="bf16", seed=3)
    h = dtypes.from_float32(rng.standard_normal((1, 3, 128)), "bf16")
    got = layer(tt(h)[..., ::2])  # non-contiguous: judged (and copied) as the strided NumPy view
    assert bits(got) == bits(layer(h[..., ::2]))
    with pytest.raises(DTypeError, match=r"^Qwen3Layer: hidden is a torch tensor with requires_grad=True.*"
                                         r"pass hidden\.detach\(\)"):
        layer(torch.zeros(1, 3, 64, requires_grad=True))
    with pytest.raises(DTypeError, match=r"^Qwen3Layer: hidden is a torch tensor on device meta.*hidden\.cpu\(\)"):
        layer(torch.zeros(1, 3, 64, device="meta"))
    block = layers.MoeBlock(MOE, dtype="bf16")
    with pytest.raises(DTypeError, match=r"^MoeBlock: x is a torch tensor with requires_grad=True"):
        block(torch.zeros(2, 128, requires_grad=True))
    with pytest.raises(ShapeError, match="hidden_size=64"):  # the NumPy path's checks and messages
        layer(torch.zeros(1, 3, 63))


@pytest.mark.parametrize("dt", ["fp32", "bf16"])
def test_state_dict_weights_equal_numpy_dict_weights(dt, rng):
    gen = layers.Qwen3Layer(CFG, dtype=dt, seed=4, layer=1)
    sd = _state_dict(gen, 1)
    from_torch = layers.Qwen3Layer(CFG, weights=sd, dtype=dt, layer=1)
    from_numpy = layers.Qwen3Layer(CFG, weights={lw.prefix(1) + n: gen[n] for n in gen.weights.shapes}, dtype=dt,
                                   layer=1)
    q = from_torch["self_attn.q_proj.weight"]  # a view of the tensor's memory (zero-copy)
    assert q.ctypes.data == sd["model.layers.1.self_attn.q_proj.weight"].data_ptr()
    assert dtypes.storage_name(q.dtype) == dt and from_torch["input_layernorm.weight"].dtype == np.float32
    h = dtypes.from_float32(rng.standard_normal((1, 4, 64)), dt)
    assert bits(from_torch(h)) == bits(from_numpy(h))
    block = layers.MoeBlock(MOE, dtype=dt, seed=6)
    x = dtypes.from_float32(rng.standard_normal((3, 128)), dt)
    assert bits(layers.MoeBlock(MOE, weights=_state_dict(block), dtype=dt)(x)) == bits(block(x))


def test_bad_state_dict_entries_name_the_parameter():
    sd = _state_dict(layers.Qwen3Layer(CFG, dtype="bf16"))
    name = "model.layers.0.mlp.up_proj.weight"
    cases = [
        (torch.zeros(95, 64, dtype=torch.bfloat16), ShapeError, r"mlp\.up_proj\.weight has shape \(95, 64\).*\(96, 64\)"),
        (torch.zeros(96, 64, dtype=torch.float16), DTypeError,
         r"mlp\.up_proj\.weight has dtype torch\.float16, the layer needs bf16 \(cast it with \.to\(torch\.bfloat16\)\)"),
        (torch.zeros(96, 64, dtype=torch.bfloat16, requires_grad=True), DTypeError,
         r"weights: model\.layers\.0\.mlp\.up_proj\.weight is a torch tensor with requires_grad=True"),
        (torch.zeros(96, 64, dtype=torch.bfloat16, device="meta"), DTypeError, r"up_proj\.weight is a torch tensor on device"),
    ]
    for value, error, message in cases:
        with pytest.raises(error, match=message):
            layers.Qwen3Layer(CFG, weights=dict(sd, **{name: value}), dtype="bf16")
    norm = "model.layers.0.input_layernorm.weight"  # norm weights stay fp32, as with NumPy arrays
    with pytest.raises(DTypeError, match=r"input_layernorm\.weight has dtype torch\.bfloat16.*fp32.*torch\.float32"):
        layers.Qwen3Layer(CFG, weights=dict(sd, **{norm: sd[norm].to(torch.bfloat16)}), dtype="bf16")
    gone = {k: v for k, v in sd.items() if k != name}
    with pytest.raises(KeyError, match=r"missing parameter 'model\.layers\.0\.mlp\.up_proj\.weight'"):
        layers.Qwen3Layer(CFG, weights=gone, dtype="bf16")


def test_fp32_router_in_a_bf16_block_meets_the_layer_policy(rng):
    """Production keeps the router in fp32: x widened, the router linear and the gating in fp32.
    Policy (test_layer_policy.py): rel-L2 against float64 at most 1.5x the torch peer's."""
    base = layers.MoeBlock(MOE, dtype="bf16", seed=7)
    w = {n: base.weights[n] for n in base.weights.shapes}
    w["mlp.gate.weight"] = (rng.standard_normal((8, 128)) / np.sqrt(128)).astype(np.float32)  # not bf16 values
    block = layers.MoeBlock(MOE, weights=w, dtype="bf16")
    assert block.router_dtype == "fp32"
    x = dtypes.from_float32(rng.standard_normal((2, 9, 128)), "bf16")
    with pn.trace() as t:
        ours = block(x)
    assert dtypes.storage_name(ours.dtype) == "bf16"
    plan = block.plan("prefill", batch=2, context=9, dtype="bf16", expert_tokens=block.last_tokens)
    assert [s.plan.dtype for s in plan.steps[:2]] == ["fp32", "fp32"]  # router + gating planned in fp32
    assert t.total == plan.cost, t.total.differences(plan.cost)
    expected = block.reference(x)
    peer = TorchMoe(block)
    theirs = peer(x).float().numpy()
    assert np.array_equal(block.last_tokens, peer.last_tokens)  # every token routed as torch's fp32 router does
    e_ours, e_peer = precision.rel_l2(ours, expected), precision.rel_l2(theirs, expected)
    assert e_ours <= 1.5 * e_peer, (e_ours, e_peer)
    # the same block from a torch state dict (the router an fp32 tensor) gives the same bits
    sd = {lw.prefix(0) + n: tt(a) for n, a in w.items()}
    assert sd["model.layers.0.mlp.gate.weight"].dtype == torch.float32
    assert bits(layers.MoeBlock(MOE, weights=sd, dtype="bf16")(tt(x))) == bits(ours)
    # the router weight takes the storage dtype or fp32, nothing else
    with pytest.raises(DTypeError, match=r"mlp\.gate\.weight has dtype float16, the layer needs bf16 \(or fp32\)"):
        layers.MoeBlock(MOE, weights=dict(w, **{"mlp.gate.weight": w["mlp.gate.weight"].astype(np.float16)}),
                        dtype="bf16")
