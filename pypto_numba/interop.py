"""PyTorch interop: CPU torch tensors in, torch tensors out, for every public strategy.

:func:`torch_aware` wraps a public function (``strategy.register`` applies it to every strategy).
torch stays optional: this module never imports it. A call looks for torch in ``sys.modules`` and,
only when torch is loaded, checks the call's arguments for tensors; a NumPy call passes straight
through. A tensor argument becomes a NumPy view of its memory (zero-copy; bf16 through an int16
view, as NumPy has no bfloat16 of its own), so validation, its messages and the contiguous copy of
a strided input (counted as workspace) are the NumPy path's. ``torch.dtype`` arguments (e.g.
``rope.cos_sin``'s ``dtype``) become their NumPy dtypes. A tensor is judged exactly as its NumPy
view would be (a bool ``mask`` is refused like a NumPy bool mask, until both accept it).

When the main argument (the first, or the one named by ``main=``) is a tensor, every array in the
result becomes a tensor sharing its memory (the result of an ``out=`` tensor is that tensor
itself). Dtypes are kept: MoE ids stay int32 (``torch.int32``), while ``torch.topk`` returns int64
indices.

Refused with :class:`~pypto_numba.errors.DTypeError` (the error for an argument of the wrong kind):
a tensor that requires grad (there is no autograd: pass ``t.detach()``) and a tensor that is not on
the CPU (CUDA, NPU, meta: pass ``t.cpu()``).
"""

from __future__ import annotations

import functools
import sys

import numpy as np

from .errors import DTypeError


# Argument types that are never a tensor nor a torch dtype: a call made only of these is a NumPy
# call and passes straight through (one set lookup per argument).
_PLAIN = frozenset({np.ndarray, int, float, str, bool, tuple, type(None)})


def _torch_types(torch):
    """(torch.Tensor, torch.dtype) of a loaded torch, or None while torch is half imported."""
    tensor, dtype = getattr(torch, "Tensor", None), getattr(torch, "dtype", None)
    if tensor is None or dtype is None:
        return None
    return tensor, dtype


def is_tensor(a) -> bool:
    """Whether ``a`` is a torch tensor (False while torch is not loaded; never imports it)."""
    torch = sys.modules.get("torch")
    types = None if torch is None else _torch_types(torch)
    return types is not None and isinstance(a, types[0])


def to_numpy(t, name: str, where: str) -> np.ndarray:
    """A NumPy view of CPU tensor ``t``'s memory (same shape and strides); refusals name ``name``."""
    import torch

    if t.requires_grad:
        raise DTypeError(
            f"{where}: {name} is a torch tensor with requires_grad=True; pypto_numba has no "
            f"autograd: pass {name}.detach()"
        )
    if t.device.type != "cpu":
        raise DTypeError(
            f"{where}: {name} is a torch tensor on device {t.device}; pypto_numba runs on the CPU: "
            f"pass {name}.cpu()"
        )
    t = t.resolve_conj().resolve_neg()  # no-ops unless a lazy conj/neg bit is set
    if t.dtype == torch.bfloat16:
        import ml_dtypes

        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    try:
        return t.numpy()
    except TypeError:  # a torch dtype NumPy has no counterpart for (e.g. float8, complex32)
        raise DTypeError(
            f"{where}: {name} has torch dtype {t.dtype}, which has no NumPy counterpart; accepted: "
            f"torch.float32, torch.float16 or torch.bfloat16; convert with {name}.float()"
        ) from None


def to_torch(a, torch):
    """A torch tensor sharing ``a``'s memory (bf16 through an int16 view)."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _numpy_dtype(d, torch):
    if d == torch.bfloat16:
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return torch.empty((), dtype=d).numpy().dtype  # raises TypeError for a dtype NumPy lacks


def torch_aware(fn, where: str, main: str | None = None):
    """Wrap ``fn`` (keeping its name, docstring and signature) to take and give torch tensors.

    ``main``: the name of the main argument, whose being a tensor makes the results tensors (by
    default the first parameter; a method names its input, e.g. ``main="hidden"``)."""
    import inspect

    names = list(inspect.signature(fn).parameters)
    first = main or (names[0] if names else None)

    @functools.wraps(fn)
    def call(*args, **kwargs):
        for a in args:  # the NumPy call: every argument of a type that cannot be a tensor
            if type(a) not in _PLAIN:
                break
        else:
            for a in kwargs.values():
                if type(a) not in _PLAIN:
                    break
            else:
                return fn(*args, **kwargs)
        torch = sys.modules.get("torch")
        if torch is None:  # no torch loaded, so no tensor can be in the call
            return fn(*args, **kwargs)
        types = _torch_types(torch)
        if types is None:
            return fn(*args, **kwargs)
        for a in args:
            if isinstance(a, types):
                break
        else:
            for a in kwargs.values():
                if isinstance(a, types):
                    break
            else:
                return fn(*args, **kwargs)
        return _torch_call(fn, where, names, first, torch, types[0], args, kwargs)

    return call


def _torch_call(fn, where, names, first, torch, Tensor, args, kwargs):
    """The call with tensors: convert in, run, convert the result back when the main input was one."""
    originals = {}  # id of a NumPy view -> the tensor it views (kept alive by `views`)
    views = []

    def convert(a, name):
        if isinstance(a, Tensor):
            v = to_numpy(a, name, where)
            originals[id(v)] = a
            views.append(v)
            return v
        if isinstance(a, torch.dtype):
            try:
                return _numpy_dtype(a, torch)
            except TypeError:
                raise DTypeError(
                    f"{where}: {name}={a} has no NumPy counterpart; use torch.float32, "
                    f"torch.float16 or torch.bfloat16"
                ) from None
        return a

    at = names.index(first) if first in names else 0
    main = args[at] if len(args) > at else kwargs.get(first)
    new_args = tuple(convert(a, names[i] if i < len(names) else f"argument {i}") for i, a in enumerate(args))
    new_kwargs = {k: convert(v, k) for k, v in kwargs.items()}
    result = fn(*new_args, **new_kwargs)
    if not isinstance(main, Tensor):
        return result

    def back(r):
        if isinstance(r, np.ndarray):
            original = originals.get(id(r))
            if original is not None:  # e.g. the out= tensor: give back the tensor itself
                return original
            return to_torch(r, torch)
        return r

    if isinstance(result, tuple):
        return tuple(back(r) for r in result)
    return back(result)
