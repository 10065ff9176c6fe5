"""Shared helpers for the asv benchmarks: bandwidth peers, side-by-side ratios, compile timing.

Import them as ``from ._common import copy_seconds, median_ratio, ...`` (asv imports the suite as
a package). Nothing here depends on pypto_numba, so every engineer's benchmark can use it.

Peers (numba, same threads as the code under test; asv.conf.json pins ``NUMBA_NUM_THREADS=2``):

- ``copy_kernel(src, dst)``: plain ``for i in prange(n): dst[i] = src[i]`` on float32 arrays
  (LLVM turns it into a memcpy per thread chunk; measured ~1.6x faster than a chunked element
  loop on this machine, so it is the strongest simple peer).
  ``copy_seconds(nbytes)`` times a copy of an ``nbytes`` buffer (GM traffic: ``nbytes`` read +
  ``nbytes`` written); ``copy_gbps(nbytes)`` = ``2*nbytes / seconds / 1e9`` (read + write).
  Peer for element-wise ops: an op that reads and writes ``nbytes`` each at copy speed has
  ``median_ratio(op, copy) == 1.0``.
- ``sum_peer(nbytes)``: the read peer, a zero-argument callable that reads ``nbytes`` of float32
  once: ``torch.sum`` (vectorised; 48-51 GB/s on the 2-core Zen 5 for arrays beyond L3) when torch
  is installed, else the plain prange ``sum_kernel`` (which reads well below that: a prange
  reduction does not keep enough loads in flight). ``sum_seconds`` / ``sum_gbps`` time it
  (``nbytes / seconds / 1e9``, read bandwidth). Peer for reductions and decode reads.

Ratios: ``median_ratio(fn_a, fn_b, repeats=7)`` alternates a, b, a, b, ... (or blocks of runs,
``block=``) and returns
``median(time_b) / median(time_a)``. **> 1 means fn_a is faster.** So
``median_ratio(my_op, copy)`` is "fraction of copy speed" (1.0 = as fast as the copy), and
``median_ratio(my_op, torch_op)`` is "speed-up over torch".

``to_torch(torch, a)``: zero-copy torch tensor of a float32/float16/bfloat16 array (same dtype).

Imports run no kernel: asv.conf.json's ``launch_method = forkserver`` forks every benchmark from
one process that imported the suite, which is safe only while no OpenMP thread pool exists there.
Start kernels in ``setup``, never at module level.

torch is imported when this module is (if installed), before any numba kernel runs. An earlier
host ran torch 2.5-10x slower when it was imported after numba's first parallel launch (two
OpenMP runtimes); ``tools/import_order.py`` finds no such effect on this one (README), but the
peers keep the safe order.

Heavy set: ``@heavy`` marks a benchmark class (named ``Heavy...``) that the default suite does not
contain (asv does not discover it) unless ``PYPTO_NUMBA_BENCH_HEAVY=1``:
large sweeps and compile times. Run them with
``PYPTO_NUMBA_BENCH_HEAVY=1 asv run --bench Heavy``.

Unpinned BLAS: the machine pins ``OPENBLAS_CORETYPE`` (and may pin ``OPENBLAS_L2_SIZE``), which
halves NumPy's sgemm; tests and CI keep the pins. ``unpinned(module, function, *args)`` runs
``function(*args)`` of a benchmark module in a child process whose environment drops both, and
returns its float result: a GEMM ratio against NumPy is then measured inside that child, both
sides alternating in one process.

Compile time: ``compile_seconds(snippet)`` writes module source to a temporary .py file and runs
it twice in fresh processes sharing a brand-new ``NUMBA_CACHE_DIR``: the first run compiles, the
second loads from the cache. The snippet does its imports at top level (untimed) and defines
``setup()`` (data, untimed) and ``first_call()`` (timed once). Returns (first, cached) seconds.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

try:  # before numba's first parallel launch: see the module docstring
    import torch as _torch
except Exception:  # ImportError, or a broken install: the peer is simply absent
    _torch = None

import numba
import numpy as np
from numba import prange

__all__ = [
    "copy_kernel",
    "copy_seconds",
    "copy_gbps",
    "copy_peer",
    "sum_kernel",
    "sum_seconds",
    "sum_gbps",
    "sum_peer",
    "median_seconds",
    "median_ratio",
    "torch_or_none",
    "to_torch",
    "compile_seconds",
    "heavy",
    "unpinned",
    "M64",
    "M16",
]

HEAVY_ENV = "PYPTO_NUMBA_BENCH_HEAVY"
BLAS_PINS = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")

rounds = 1
"""asv's rounds for every benchmark (each bench_ module imports this name: asv reads benchmark
attributes from the module too). One process per benchmark instead of asv's default two keeps the
default suite inside its time budget (README); each process still repeats its timing."""

M64 = 64 * 1024 * 1024  # 64M elements: the benchmark size
M16 = 16 * 1024 * 1024

_FASTMATH = {"contract", "reassoc", "nsz", "arcp", "afn"}  # same subset as pypto_numba kernels


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=_FASTMATH, nogil=True)
def copy_kernel(src, dst):
    """dst[:] = src[:] (1-D float32), a plain prange loop."""
    for i in prange(src.size):
        dst[i] = src[i]


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=_FASTMATH, nogil=True)
def sum_kernel(x):
    """Plain prange sum of a 1-D float32 array (float32 accumulators, vectorised)."""
    s = np.float32(0.0)
    for i in prange(x.size):
        s += x[i]
    return s


def _f32_elems(nbytes: int) -> int:
    return max(1, int(nbytes) // 4)


SMOKE_ENV = "PYPTO_NUMBA_BENCH_SMOKE"
"""``PYPTO_NUMBA_BENCH_SMOKE=1`` (CI's ``asv run --quick``): the peers and ratios time one run per
side instead of ``repeats``, so every benchmark runs its code once; the figures are then noise."""


def _repeats(repeats: int) -> int:
    return 1 if os.environ.get(SMOKE_ENV) == "1" else repeats


def median_seconds(fn, repeats: int = 7) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls (call it once before to warm up)."""
    repeats = _repeats(repeats)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def median_ratio(fn_a, fn_b, repeats: int = 7, block: int = 1) -> float:
    """``median(time_b) / median(time_a)``, runs alternating a, b, a, b ... (each warmed up once).

    > 1: fn_a is faster than fn_b. ``median_ratio(op, copy)`` = op speed as a fraction of copy
    speed; ``median_ratio(op, torch_op)`` = speed-up of op over torch.

    ``block`` > 1 runs each side ``block`` times in a row (a, a, a, b, b, b, ...), every run timed:
    for a peer whose thread pool keeps spinning after a call (NumPy's OpenBLAS), the first run of
    a block shares the cores with those spinners and the median is that of the others. Measured
    (fused_bias, M = 2048, K = N = 4096, 2 cores): 384 ms right after NumPy's call, 342-351 ms
    after a 0.3 s pause; NumPy's time did not change. (A pause is no cure for short calls: a
    decode-sized call after 0.1 s idle took 4x as long.)
    """
    fn_a()
    fn_b()
    ta, tb = [], []
    for _ in range(_repeats(repeats)):
        for fn, times in ((fn_a, ta), (fn_b, tb)):
            for _ in range(block):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
    return statistics.median(tb) / statistics.median(ta)


def copy_peer(nbytes: int):
    """A zero-argument callable that copies an ``nbytes`` float32 buffer (warmed up)."""
    n = _f32_elems(nbytes)
    src = np.ones(n, dtype=np.float32)
    dst = np.empty_like(src)
    copy_kernel(src, dst)  # compile / load + first touch of dst
    return lambda: copy_kernel(src, dst)


def sum_peer(nbytes: int):
    """The read peer: a zero-argument callable that reads an ``nbytes`` float32 buffer once
    (``torch.sum`` when torch is installed, else ``sum_kernel``; warmed up)."""
    n = _f32_elems(nbytes)
    x = np.ones(n, dtype=np.float32)
    torch = torch_or_none()
    if torch is not None:
        t = torch.from_numpy(x)
        torch.sum(t)
        return lambda: torch.sum(t)
    sum_kernel(x)
    return lambda: sum_kernel(x)


def copy_seconds(nbytes: int, repeats: int = 7) -> float:
    """Median seconds of a numba prange copy of ``nbytes`` (``nbytes`` read + ``nbytes`` written)."""
    return median_seconds(copy_peer(nbytes), repeats)


def copy_gbps(nbytes: int, repeats: int = 7) -> float:
    """Copy bandwidth in GB/s counting read + write: ``2*nbytes / copy_seconds(nbytes) / 1e9``."""
    return 2 * _f32_elems(nbytes) * 4 / copy_seconds(nbytes, repeats) / 1e9


def sum_seconds(nbytes: int, repeats: int = 7) -> float:
    """Median seconds of a plain numba prange sum over ``nbytes`` of float32 (read only)."""
    return median_seconds(sum_peer(nbytes), repeats)


def sum_gbps(nbytes: int, repeats: int = 7) -> float:
    """Read bandwidth of the plain prange sum in GB/s: ``nbytes / sum_seconds(nbytes) / 1e9``."""
    return _f32_elems(nbytes) * 4 / sum_seconds(nbytes, repeats) / 1e9


def heavy(cls):
    """Class decorator: ``cls`` belongs to the heavy set (see the module docstring). Unless the set
    is asked for, the module holds ``None`` in its place, so asv does not discover it at all (a
    skipping setup would still cost one process per parameter point)."""
    return cls if os.environ.get(HEAVY_ENV) == "1" else None


def unpinned(module: str, function: str, *args, timeout: float = 1800.0) -> float:
    """``module.function(*args)`` (a float) computed in a child process without the machine's
    ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` pins (see the module docstring)."""
    env = {k: v for k, v in os.environ.items() if k not in BLAS_PINS}
    # asv strips PYTHONPATH and imports the suite through a meta-path hook, not sys.path: give the
    # child both the parent's sys.path and the directory that holds this package
    suite_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = os.pathsep.join([suite_parent, *(p for p in sys.path if p)])
    code = (f"import importlib, sys; m = importlib.import_module({module!r}); "
            f"print(repr(float(getattr(m, {function!r})(*{args!r}))))")
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=timeout, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"unpinned {module}.{function}{args!r} failed:\n{res.stderr[-2000:]}")
    return float(res.stdout.strip().splitlines()[-1])


def torch_or_none():
    """``torch`` if it is installed (benchmark peer only), else ``None``.

    Sets torch's intra-op threads to ``NUMBA_NUM_THREADS`` (default 2) so the peers compete on the
    same cores.
    """
    if _torch is None:
        return None
    _torch.set_num_threads(int(os.environ.get("NUMBA_NUM_THREADS", numba.config.NUMBA_NUM_THREADS)))
    return _torch


def to_torch(torch, a: np.ndarray):
    """Zero-copy torch tensor of a float32 / float16 / ml_dtypes.bfloat16 array (same dtype)."""
    if a.dtype == np.float32 or a.dtype == np.float16:
        return torch.from_numpy(a)
    if a.dtype.name == "bfloat16":  # torch.from_numpy does not know ml_dtypes: reinterpret bits
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    raise TypeError(f"to_torch: unsupported dtype {a.dtype}")


_RUNNER = r"""
import importlib, json, sys, time
sys.path.insert(0, sys.argv[1])
mod = importlib.import_module("compile_snippet")
if hasattr(mod, "setup"):
    mod.setup()
t0 = time.perf_counter()
mod.first_call()
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""


def compile_seconds(snippet: str, timeout: float = 300.0) -> tuple:
    """(first-call seconds with an empty cache, first-call seconds from the cache) in new processes.

    ``snippet`` is module source defining ``first_call()`` (timed) and optionally ``setup()``
    (untimed: data). Its top-level imports (numba, the package) are outside the timing; what is
    timed is compile (or cache load) plus one run of the call. Both runs share a fresh
    ``NUMBA_CACHE_DIR`` that is deleted afterwards.
    """
    tmp = tempfile.mkdtemp(prefix="asv_compile_")
    cache = os.path.join(tmp, "numba_cache")
    script = os.path.join(tmp, "compile_snippet.py")  # a real file: numba can cache its functions
    with open(script, "w") as f:
        f.write(snippet)
    # the child sees the parent's sys.path (asv strips PYTHONPATH; see __init__.py)
    env = dict(os.environ, NUMBA_CACHE_DIR=cache, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        out = []
        for _ in range(2):
            res = subprocess.run(
                [sys.executable, "-c", _RUNNER, tmp],
                env=env, capture_output=True, text=True, timeout=timeout, check=False,
            )
            if res.returncode != 0:
                raise RuntimeError(f"compile_seconds snippet failed:\n{res.stderr[-2000:]}")
            out.append(json.loads(res.stdout.strip().splitlines()[-1])["seconds"])
        return out[0], out[1]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
