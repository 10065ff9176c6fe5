"""Layer weights under Hugging Face parameter names: generated from a seed, from a dict, or from a
safetensors file (read here: no ``safetensors`` package is needed).

Names are relative to the layer (``self_attn.q_proj.weight``); full names carry the prefix
``model.layers.{i}.``. Projections are ``[out, in]`` in the storage dtype; norm weights and the
router's correction bias are fp32 (production keeps both in fp32, npu-facts 8.4).

Generated weights are fan-in scaled normals (``N(0, 1/in)``, so a projection keeps the scale of its
input), norm weights ``1 + N(0, 0.1)``; each parameter has its own seed (from ``seed``, the layer
index and its name), so a DeepSeek-V3 expert is generated only when it is read.

A dict's values are NumPy arrays or CPU torch tensors (``model.state_dict()``): a tensor of a
layer parameter becomes a NumPy view of its memory (:func:`pypto_numba.interop.to_numpy`, which
refuses one that requires grad or is not on the CPU) and is judged as that array.

safetensors format: 8-byte little-endian header length ``n``, ``n`` bytes of JSON header
(``{name: {"dtype", "shape", "data_offsets": [begin, end]}}``, optional ``__metadata__``), then the
raw little-endian data; offsets are relative to the end of the header. Dtypes F32, F16, BF16.
"""

from __future__ import annotations

import difflib
import json
import math
import struct
import zlib

import numpy as np

from .. import interop
from ..errors import ConfigError, DTypeError, ShapeError
from ..machine import dtypes

_ST_DTYPES = {"F32": "fp32", "F16": "fp16", "BF16": "bf16"}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
FP32_PARAMS = ("layernorm.weight", "q_norm.weight", "k_norm.weight", "e_score_correction_bias")
# given in the storage dtype or in fp32 (production keeps the MoE router in fp32); generated in the former
FP32_ALLOWED = ("mlp.gate.weight",)
_TORCH_NAMES = {"fp32": "torch.float32", "bf16": "torch.bfloat16", "fp16": "torch.float16"}


def prefix(layer: int) -> str:
    return f"model.layers.{int(layer)}."


def _mlp(prefix_, inter, H):
    return {f"{prefix_}gate_proj.weight": (inter, H), f"{prefix_}up_proj.weight": (inter, H),
            f"{prefix_}down_proj.weight": (H, inter)}


def attention_shapes(cfg) -> dict:
    H, D, Hq, Hkv = cfg.hidden_size, cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
    return {
        "input_layernorm.weight": (H,),
        "self_attn.q_proj.weight": (Hq * D, H),
        "self_attn.k_proj.weight": (Hkv * D, H),
        "self_attn.v_proj.weight": (Hkv * D, H),
        "self_attn.o_proj.weight": (H, Hq * D),
        "self_attn.q_norm.weight": (D,),
        "self_attn.k_norm.weight": (D,),
        "post_attention_layernorm.weight": (H,),
    }


def mlp_shapes(cfg) -> dict:
    return _mlp("mlp.", cfg.intermediate_size, cfg.hidden_size)


def moe_shapes(cfg) -> dict:
    """The MoE block's parameters (DeepSeek-V3 names)."""
    H, E, inter = cfg.hidden_size, cfg.n_routed_experts, cfg.moe_intermediate_size
    out = {"mlp.gate.weight": (E, H), "mlp.gate.e_score_correction_bias": (E,)}
    for e in range(E):
        out.update(_mlp(f"mlp.experts.{e}.", inter, H))
    if cfg.n_shared_experts:
        out.update(_mlp("mlp.shared_experts.", inter * cfg.n_shared_experts, H))
    return out


def param_dtype(name: str, dtype: str) -> str:
    return "fp32" if name.endswith(FP32_PARAMS) else dtype


def _generate(name, shape, dtype, seed, layer):
    rng = np.random.default_rng([int(seed), int(layer), zlib.crc32(name.encode())])
    if name.endswith(("layernorm.weight", "q_norm.weight", "k_norm.weight")):
        values = 1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)
    elif name.endswith("e_score_correction_bias"):
        values = 0.01 * rng.standard_normal(shape, dtype=np.float32)
    else:
        values = rng.standard_normal(shape, dtype=np.float32) * np.float32(shape[-1] ** -0.5)
    return dtypes.from_float32(values, param_dtype(name, dtype))


class Weights:
    """One layer's parameters by layer-relative HF name; generated lazily when ``arrays`` lacks one.

    ``shapes``: name -> shape expected; ``dtype``: storage dtype of the projections."""

    def __init__(self, shapes: dict, dtype: str, *, arrays=None, seed=0, layer=0, generate=True, source=""):
        self.shapes, self.dtype, self.seed, self.layer = dict(shapes), dtype, seed, layer
        self.generate, self.source = generate, source
        self._arrays, self._torch = {}, {}  # _torch: name -> the torch dtype of a tensor given for it
        for name, value in (arrays or {}).items():
            key = self._key(name)
            if key in self.shapes and interop.is_tensor(value):
                self._torch[key] = str(value.dtype)
                value = interop.to_numpy(value, prefix(self.layer) + key, "weights")
            self._arrays[key] = value
        for name in list(self._arrays):
            self._check(name, self._arrays[name])
        self._given = set(self._arrays)

    def _key(self, name):
        p = prefix(self.layer)
        return name[len(p):] if name.startswith(p) else name

    def _check(self, name, a):
        full = prefix(self.layer) + name
        if name not in self.shapes:
            return
        if not isinstance(a, np.ndarray):
            raise DTypeError(f"weights: {full} must be a numpy array or a CPU torch tensor, got {type(a).__name__}")
        want = tuple(self.shapes[name])
        if tuple(a.shape) != want:
            raise ShapeError(f"weights: {full} has shape {tuple(a.shape)}, the config needs {want}")
        want_dt = param_dtype(name, self.dtype)
        have_dt = dtypes.storage_name(a.dtype)
        if have_dt != want_dt and not (have_dt == "fp32" and name.endswith(FP32_ALLOWED)):
            also = " (or fp32)" if name.endswith(FP32_ALLOWED) else ""
            if name in self._torch:
                raise DTypeError(f"weights: {full} has dtype {self._torch[name]}, the layer needs {want_dt}{also} "
                                 f"(cast it with .to({_TORCH_NAMES[want_dt]}))")
            raise DTypeError(f"weights: {full} has dtype {a.dtype}, the layer needs {want_dt}{also} "
                             f"(cast it with .astype(...))")

    def __getitem__(self, name):
        if name not in self._arrays:
            if name not in self.shapes:
                raise KeyError(_missing(prefix(self.layer) + name, [prefix(self.layer) + n for n in self.shapes],
                                        self.source))
            if not self.generate:
                raise KeyError(_missing(prefix(self.layer) + name, [prefix(self.layer) + n for n in self._arrays],
                                        self.source))
            self._arrays[name] = _generate(name, self.shapes[name], self.dtype, self.seed, self.layer)
        return self._arrays[name]

    def forget(self, prefix_: str):
        """Drop the generated parameters under ``prefix_`` (they are generated again when read):
        a DeepSeek-V3 block at full width then holds one expert at a time. Given arrays stay."""
        if self.generate:
            for name in [n for n in self._arrays if n.startswith(prefix_) and n not in self._given]:
                del self._arrays[name]

    def missing(self):
        """Names of the expected parameters not given (they would be generated or refused)."""
        return [n for n in self.shapes if n not in self._arrays]

    def require_all(self):
        gone = self.missing()
        if gone:
            raise KeyError(_missing(prefix(self.layer) + gone[0], [prefix(self.layer) + n for n in self._arrays],
                                    self.source))


def _missing(key, known, source):
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.6)
    where = f" in {source}" if source else ""
    return (f"weights: missing parameter {key!r}{where}"
            + (f"; close matches: {', '.join(close)}" if close else f"; {len(known)} parameters present"))


# ---------------------------------------------------------------------------------------------
# safetensors


def safetensors_names(path) -> list:
    """The tensor names of a safetensors file (its header only)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return [k for k in json.loads(f.read(n).decode("utf-8")) if k != "__metadata__"]


def read_safetensors(path, names=None) -> dict:
    """The tensors of a safetensors file -> {name: numpy array} (F32, F16, BF16); ``names``: only
    these (the file is mapped, so only their bytes are read)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ShapeError(f"safetensors {path}: {len(head)} bytes, shorter than the 8-byte header length")
        (n,) = struct.unpack("<Q", head)
        header_bytes = f.read(n)
    if len(header_bytes) != n:
        raise ShapeError(f"safetensors {path}: header length {n} runs past the file")
    header = json.loads(header_bytes.decode("utf-8"))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if any(
        k != "__metadata__" for k in header) else np.zeros(0, np.uint8)
    out = {}
    for name, info in header.items():
        if name == "__metadata__" or (names is not None and name not in names):
            continue
        kind = _ST_DTYPES.get(info.get("dtype"))
        if kind is None:
            raise DTypeError(f"safetensors {path}: {name} has dtype {info.get('dtype')!r}; readable: "
                             f"{', '.join(_ST_DTYPES)}")
        shape = tuple(int(d) for d in info["shape"])
        begin, end = (int(x) for x in info["data_offsets"])
        item = dtypes.itemsize(kind)
        if end - begin != math.prod(shape) * item or end > data.size:
            raise ShapeError(f"safetensors {path}: {name} data_offsets {begin}..{end} do not hold "
                             f"{shape} x {item} B")
        le = data[begin:end].view("<u2" if item == 2 else "<f4")
        arr = le.astype(le.dtype.newbyteorder("="))  # a copy in native order
        out[name] = arr.view(dtypes.STORAGE[kind]).reshape(shape)
    return out


def write_safetensors(path, tensors: dict, metadata=None):
    """Write {name: fp32/fp16/bf16 array} as a safetensors file (for tests and small exports)."""
    header, chunks, offset = {}, [], 0
    for name, a in tensors.items():
        a = np.ascontiguousarray(a)
        kind = dtypes.storage_name(a.dtype)
        if kind is None:
            raise DTypeError(f"write_safetensors: {name} has dtype {a.dtype}; writable: float32, float16, bfloat16")
        raw = a.view("<u2" if a.itemsize == 2 else "<f4").astype("<u2" if a.itemsize == 2 else "<f4").tobytes()
        header[name] = {"dtype": _ST_NAMES[kind], "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the format pads the header to 8 bytes with spaces
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for c in chunks:
            f.write(c)


def layer_weights(cfg, shapes, dtype, weights, seed, layer):
    """A :class:`Weights` from None (generated), a dict of arrays or torch tensors (a state dict), a
    safetensors path or a Weights."""
    if isinstance(weights, Weights):
        return weights
    if weights is None:
        return Weights(shapes, dtype, seed=seed, layer=layer, source="generated")
    if isinstance(weights, dict):
        w = Weights(shapes, dtype, arrays=_this_layer(weights, layer), layer=layer, generate=False,
                    source="the weights dict")
        w.require_all()
        return w
    if isinstance(weights, (str, bytes)) or hasattr(weights, "__fspath__"):
        wanted = set(shapes) | {prefix(layer) + n for n in shapes}
        tensors = read_safetensors(weights, names=wanted)  # only this layer's bytes are read
        w = Weights(shapes, dtype, arrays=_this_layer(tensors, layer), layer=layer, generate=False,
                    source=str(weights))
        gone = w.missing()
        if gone:  # close matches among every name in the file
            raise KeyError(_missing(prefix(layer) + gone[0], safetensors_names(weights), str(weights)))
        return w
    raise ConfigError(f"weights must be None, a dict of arrays or torch tensors, a safetensors path or a Weights, got "
                      f"{type(weights).__name__}")


def _this_layer(tensors, layer):
    """The entries of layer ``layer``: full HF names with its prefix, or layer-relative names."""
    p = prefix(layer)
    return {k[len(p):] if k.startswith(p) else k: v for k, v in tensors.items()
            if k.startswith(p) or not k.startswith("model.")}
