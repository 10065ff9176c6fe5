"""machine.scratch: named regions carved out of one per-thread slab."""

from __future__ import annotations

import numpy as np
import pytest

from pypto_numba.machine.scratch import Regions


def test_carve_lays_regions_out_in_declared_order():
    regions = Regions("q", "scores", "res")
    assert regions.indices == (0, 1, 2)
    c = regions.carve(res=16, q=3 * 8, scores=3 * 5)  # keyword order does not matter
    assert c.bounds.dtype == np.int64 and list(c.bounds) == [0, 24, 39, 55]
    assert c.total == 55 and c.offset("scores") == 24 and c.offset("res") == 39


def test_carve_needs_every_region_named_once():
    regions = Regions("a", "b")
    with pytest.raises(ValueError, match="do not name the regions"):
        regions.carve(a=1)
    with pytest.raises(ValueError, match="do not name the regions"):
        regions.carve(a=1, b=2, c=3)
    with pytest.raises(ValueError, match="repeat"):
        Regions("a", "a")


def test_attention_layouts_are_the_former_hand_kept_offsets():
    """The offsets the attention kernels used to compute by hand (same numbers: same bits)."""
    import importlib

    online = importlib.import_module("pypto_numba.attention.online")
    flash = importlib.import_module("pypto_numba.attention.flash")
    for Rmax, D, Dv, kv, qg in [(8, 128, 128, 128, 1), (16, 32, 48, 64, 4), (3, 7, 5, 33, 2)]:
        oq = qg * Rmax * D
        o1, o2, o3 = oq + Rmax * kv, oq + 2 * Rmax * kv, oq + 3 * Rmax * kv
        o5, o6 = o3 + Rmax * Dv, o3 + 2 * Rmax * Dv
        o7 = o6 + Rmax
        assert list(online.scratch_layout(Rmax, D, Dv, kv, qg).bounds) == [
            0, oq, o1, o2, o3, o5, o6, o7, o7 + Rmax, o7 + Rmax + 16]
        o4 = o2 + Rmax * Dv
        o5 = o4 + Rmax
        assert list(flash.scratch_layout(Rmax, D, Dv, kv, qg).bounds) == [
            0, oq, o1, o2, o4, o5, o5 + Rmax, o5 + Rmax + 16]
        assert list(flash.state_layout(Rmax, Dv).bounds) == [0, Rmax, 2 * Rmax, Rmax * (Dv + 2)]
