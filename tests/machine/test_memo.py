"""machine/memo.py: plans are memoised by arguments and the profile they resolve to."""

from __future__ import annotations

import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import attention, gelu
from pypto_numba.errors import TileError
from pypto_numba.machine.memo import memo_plan


def test_same_arguments_same_plan_other_arguments_other_plan():
    a = gelu.plan_tanh((8, 4096), "bf16")
    assert gelu.plan_tanh((8, 4096), "bf16") is a
    assert gelu.plan_tanh((8, 4097), "bf16") is not a
    assert gelu.plan_tanh((8, 4096), "fp16") is not a
    assert gelu.plan_tanh((8, 4096), "bf16", tile=1024).params["tile"] == 1024


def test_the_active_profile_is_part_of_the_key():
    base = attention.plan_flash((1, 32, 1, 128), (1, 8, 4096, 128), None, "bf16")
    with pn.use_profile("ascend950"):
        other = attention.plan_flash((1, 32, 1, 128), (1, 8, 4096, 128), None, "bf16")
    assert other.profile.name == "ascend950" and base.profile.name == "ascend910b"
    assert attention.plan_flash((1, 32, 1, 128), (1, 8, 4096, 128), None, "bf16") is base


def test_positional_profile_and_unhashable_arguments():
    calls = []

    @memo_plan
    def plan(shape, profile=None, extra=None):
        calls.append(shape)
        return object()

    p = plan((2, 3), "ascend910b")
    assert plan((2, 3), "ascend910b") is p and len(calls) == 1
    assert plan((2, 3), "ascend950") is not p and len(calls) == 2
    plan((2, 3), extra={"unhashable": 1})  # computed every time, never cached
    plan((2, 3), extra={"unhashable": 1})
    assert len(calls) == 4
    plan((2, 3), extra=np.arange(3))  # small arrays are keyed by content
    plan((2, 3), extra=np.arange(3))
    assert len(calls) == 5


def test_errors_are_raised_every_time_and_params_are_read_only():
    for _ in range(2):
        with pytest.raises(TileError, match="kv_tile"):
            attention.plan_online((1, 4, 1, 128), (1, 1, 100, 128), None, "fp32", kv_tile=10**6)
    p = attention.plan_online((1, 4, 1, 128), (1, 1, 100, 128), None, "fp32")
    with pytest.raises(TypeError):
        p.params["kv_tile"] = 1


def test_equal_values_of_other_types_do_not_share_a_plan():
    # True == 1 and 16.0 == 16 hash alike, but a plan refuses a bool or a fractional tile size:
    # a plan built for the int must not be handed out for them
    assert gelu.plan_tanh((8, 4096), "fp32", tile=1024) is gelu.plan_tanh((8, 4096), "fp32", tile=1024)
    for equal in (1024.0, np.float64(1024), True):
        with pytest.raises(TileError):
            gelu.plan_tanh((8, 4096), "fp32", tile=equal)
    assert attention.plan_online((1, 4, 1, 128), (1, 1, 100, 128), None, "fp32", kv_tile=1).params["kv_tile"] == 1
    with pytest.raises(TileError):
        attention.plan_online((1, 4, 1, 128), (1, 1, 100, 128), None, "fp32", kv_tile=True)
    calls = []

    @memo_plan
    def plan(shape, flag=None, profile=None):
        calls.append((shape, flag))
        return (shape, flag)

    assert plan((2, 3), flag=1) == ((2, 3), 1)
    assert plan((2, 3), flag=True)[1] is True
    assert plan((2, 3), flag=1.0)[1] == 1.0 and type(plan((2, 3), flag=1.0)[1]) is float
    assert plan((np.int64(2), 3), flag=1)[0][0].__class__ is np.int64  # not the cached int shape
    assert plan([2, 3], flag=1)[0] == [2, 3]
    assert len(calls) == 5


def test_call_memo_through_keeps_only_calls_that_copied_nothing():
    from pypto_numba.machine.memo import CallMemo

    memo = CallMemo(maxsize=2)
    a = np.zeros((3, 4), np.float32)
    calls = []

    def prepare(copied):
        def run():
            calls.append(copied)
            return ("entry", copied), ("arrays",), copied
        return run

    key = memo.key(None, (a,), ("opt",))
    assert memo.through(key, prepare(8)) == (("entry", 8), ("arrays",), 8)  # copied: not kept
    assert memo.through(key, prepare(0)) == (("entry", 0), ("arrays",), 0)  # kept now
    assert memo.through(key, prepare(0)) == (("entry", 0), None, 0)         # from the memo
    assert calls == [8, 0]
    assert memo.through(None, prepare(0)) == (("entry", 0), ("arrays",), 0)  # no signature
    assert len(memo) == 1
    other = memo.key(None, (a.T,), ("opt",))  # other strides: another signature
    assert other != key and memo.through(other, prepare(0))[1] == ("arrays",)
