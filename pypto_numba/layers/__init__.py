"""Model layers composed of the lab's op calls (nothing here is a kernel).

- :func:`config` / :func:`config_from_hf`: ``"qwen3-1.7b"``, ``"qwen3-14b"``, ``"deepseek-v3"`` or a
  Hugging Face config dict -> :class:`LayerConfig` (:class:`ConfigError` on an inconsistent field).
- :class:`Qwen3Layer`: ``layer(hidden[B, S, H], cache=, positions=, strategies=)``,
  ``layer.new_cache(batch, context, dtype)``, ``layer.plan(phase=, batch=, context=, dtype=,
  strategies=, profile=)`` -> :class:`LayerPlan` (``.cost``, ``.estimate()``, ``.breakdown()``).
- :class:`MoeBlock`: DeepSeek-V3's routed + shared experts.
- :func:`run_stack`, and the layer-level precision studies in :mod:`.study`.
- weights: generated from a seed, a dict (of NumPy arrays or torch tensors: a ``state_dict()``),
  or a safetensors file (:func:`read_safetensors`, :func:`write_safetensors`).
- torch: the layers take CPU torch tensors (``hidden``, ``positions``, ``x``) and then return
  tensors sharing our outputs' memory (:mod:`pypto_numba.interop`); torch is never imported here.
"""

from ..errors import ConfigError
from . import reference
from .config import NAMES, LayerConfig, config, config_from_hf
from .moe_block import MoeBlock, plan_moe
from .plan import LayerPlan, Step
from .qwen3 import KVCache, Qwen3Layer, plan_qwen3
from .advise import advice_text, advise_layer
from .study import attribution, drift, layer_precision, run_stack
from .weights import Weights, read_safetensors, safetensors_names, write_safetensors

__all__ = ["NAMES", "ConfigError", "KVCache", "LayerConfig", "LayerPlan", "MoeBlock", "Qwen3Layer", "Step", "Weights",
           "advice_text", "advise_layer", "attribution", "config", "config_from_hf", "drift", "layer_precision",
           "plan_moe", "plan_qwen3", "read_safetensors", "reference", "run_stack", "safetensors_names",
           "write_safetensors"]
