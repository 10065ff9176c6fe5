"""Hardware profiles: the TOML files, inheritance, selection, and errors."""

import os
import shutil
import subprocess
import sys
import threading

import pytest

import pypto_numba as pn
from pypto_numba.machine import profile as P


def test_shipped_profiles():
    assert pn.profiles() == ["ascend910b", "ascend910c", "ascend950"]


def test_910b_numbers_match_npu_facts():
    p = pn.load_profile("ascend910b")
    # npu-facts 4.1 (A2A3.ini)
    assert (p.ub_bytes, p.l1_bytes, p.l0a_bytes, p.l0b_bytes, p.l0c_bytes, p.bt_bytes) == (
        196608, 524288, 65536, 65536, 131072, 1024)
    assert (p.cube_cores, p.vector_cores, p.clock_hz) == (24, 48, 1.85e9)
    assert p.align_bytes == 32 and p.max_tile_rank == 4 and p.cube_fractal == (16, 16, 16)
    assert p.reduce_tile_max_bytes == 64 * 1024 and p.matmul_inner_max == 65535


def test_950_overrides_and_inherits():
    p, base = pn.load_profile("ascend950"), pn.load_profile("ascend910b")
    assert p.ub_bytes == 253952 and p.l0c_bytes == 262144 and p.bt_bytes == 4096
    assert (p.cube_cores, p.vector_cores, p.clock_hz) == (32, 64, 1.65e9)
    assert p.l1_bytes == base.l1_bytes and p.align_bytes == base.align_bytes  # inherited
    assert p.tiles == base.tiles


def test_910c_equals_910b_but_name():
    c, b = pn.load_profile("ascend910c"), pn.load_profile("ascend910b")
    assert c.name == "ascend910c"
    assert (c.ub_bytes, c.cube_cores, c.gm_bytes_per_s) == (b.ub_bytes, b.cube_cores, b.gm_bytes_per_s)


def test_default_and_use_profile_nesting():
    assert pn.active_profile().name == "ascend910b"
    with pn.use_profile("ascend950") as p:
        assert p.name == "ascend950" and pn.active_profile().name == "ascend950"
        with pn.use_profile("ascend910c"):
            assert pn.active_profile().name == "ascend910c"
        assert pn.active_profile().name == "ascend950"
    assert pn.active_profile().name == "ascend910b"


def test_use_profile_is_per_thread():
    seen = {}

    def worker():
        seen["other"] = pn.active_profile().name

    with pn.use_profile("ascend950"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
    assert seen["other"] == "ascend910b"


def test_environment_variable_selects_profile():
    code = "import pypto_numba as pn; print(pn.active_profile().name)"
    env = dict(os.environ, PYPTO_NUMBA_PROFILE="ascend950")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "ascend950"


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(pn.PyptoNumbaError, match=r"unknown hardware profile 'a3'.*ascend910b, ascend910c, ascend950"):
        pn.load_profile("a3")
    with pytest.raises(KeyError):  # also a KeyError
        pn.load_profile("a3")
    with pytest.raises(pn.PyptoNumbaError, match="name or a HardwareProfile"):
        pn.load_profile(3)


def test_profile_passes_through_and_tile_lookup():
    p = pn.load_profile("ascend910b")
    assert pn.load_profile(p) is p
    assert p.tile("gelu_tile") > 0
    with pytest.raises(KeyError, match="no default tile 'nope'"):
        p.tile("nope")


def test_malformed_profile_files(tmp_path, monkeypatch):
    (tmp_path / "bad.toml").write_text("name = 'bad'\n[memory]\nub_bytes = 'lots'\n")
    (tmp_path / "partial.toml").write_text("name = 'partial'\n[memory]\nub_bytes = 1024\n")
    (tmp_path / "broken.toml").write_text("name = [\n")
    (tmp_path / "loop.toml").write_text("base = 'loop'\n")
    (tmp_path / "neg.toml").write_text("base = 'ascend910b'\n[memory]\nub_bytes = -5\n")
    shutil.copy(P._tiles_dir() / "ascend910b.toml", tmp_path / "ascend910b.toml")
    monkeypatch.setattr(P, "_tiles_dir", lambda: tmp_path)
    P._load.cache_clear()
    try:
        with pytest.raises(pn.PyptoNumbaError, match=r"lacks \[memory\] l1_bytes"):
            P.load_profile("partial")
        with pytest.raises(pn.PyptoNumbaError, match="not valid TOML"):
            P.load_profile("broken")
        with pytest.raises(pn.PyptoNumbaError, match="loops"):
            P.load_profile("loop")
        with pytest.raises(pn.PyptoNumbaError, match="must be > 0"):
            P.load_profile("neg")
        with pytest.raises(pn.PyptoNumbaError, match="is not a int"):
            P.load_profile("bad")
    finally:
        P._load.cache_clear()
