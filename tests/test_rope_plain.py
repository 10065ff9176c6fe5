"""rope's readable rotation rows (rope/rotate_plain.py) give the kernels' bits.

The plain numba loops are the reference of the IR rotation (standard) and of the gathermask
kernel (interleaved): same bits on odd shapes (vector steps and scalar tails, partial rotary,
leading dims), every storage dtype, with the staged and the streaming store paths (streaming
stores, and fp32's direct registers-to-GM path, change no bits).
"""

from __future__ import annotations

import numpy as np
import pytest

from pypto_numba import rope
from pypto_numba.machine import dtypes
from pypto_numba.rope.rotate_plain import rope_rows

from conftest import make

# (lead, S, H, D, R): half = R/2 below, at and above one 16-lane step, with and without a tail,
# pass-through dims; D=64, R=32 in fp32 takes the direct streaming path when streaming
SHAPES = [(2, 7, 3, 24, 24), (1, 5, 2, 96, 64), (2, 9, 3, 70, 38), (1, 3, 1, 128, 128), (3, 4, 2, 64, 32)]


def plain(x, cos, sin, interleaved):
    """The plain loops on the kernel views of x[lead, S, H, D] and the tables [S, R]."""
    *lead, S, H, D = x.shape
    xk = x.view(dtypes.KERNEL[dtypes.storage_name(x.dtype)]).reshape(-1, H * D)
    out = np.empty_like(xk)
    crow = np.tile(np.arange(S, dtype=np.int64), int(np.prod(lead)))
    kv = dtypes.KERNEL[dtypes.storage_name(cos.dtype)]
    rope_rows(xk, cos.view(kv), sin.view(kv), crow, out, H, interleaved)
    return out.view(x.dtype).reshape(x.shape)


@pytest.mark.parametrize("stream", [False, True], ids=["plain-stores", "streaming"])
@pytest.mark.parametrize("fn", ["standard", "interleaved"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_plain_rows_give_the_kernels_bits(shape, fn, stream, dtype, rng, monkeypatch):
    lead, S, H, D, R = shape
    monkeypatch.setattr(rope.public, "STREAM_MIN_BYTES", 0 if stream else 1 << 62)
    x = make((lead, S, H, D), dtype, rng, scale=3.0)
    cos, sin = make((S, R), dtype, rng), make((S, R), dtype, rng)  # not the cat(f, f) layout
    got = getattr(rope, fn)(x, cos, sin)
    want = plain(x, cos, sin, fn == "interleaved")
    assert np.array_equal(got.view(np.uint8), want.view(np.uint8))
