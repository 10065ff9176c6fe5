"""Determinism, thread safety and memory stability of every strategy.

- Bits do not depend on the thread count: two subprocesses (NUMBA_NUM_THREADS=1 and =2) compute
  every strategy on the same seeded inputs -- including the split-KV flash decode, the two-level
  mean split over long rows, grouped MoE routing and the cube walk -- and report a SHA-256 of each
  output; the digests must be equal. (Float reductions are serial inside a tile task, so the
  thread that runs a task does not change its bits.)
- Repeated calls in one process give the same bits.
- Python threads calling different strategies at once (each inside its own ``trace()``, one of
  them under ``use_profile``) get the bits of serial calls, and each thread's trace holds only
  its own records. This runs in a subprocess too: a threading-layer crash fails the test instead
  of killing pytest.
- Repeated calls (with and without ``trace()``) do not grow the process's RSS after warm-up.
"""

from __future__ import annotations

import concurrent.futures
import gc
import hashlib
import json
import os
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import pypto_numba as pn
from pypto_numba import attention, embedding, gelu, linear, mean, moe, repeat_kv, rope

BF16 = ml_dtypes.bfloat16


def _normal(rng, shape, dtype=np.float32, scale=1.0, loc=0.0):
    return (rng.standard_normal(shape) * scale + loc).astype(np.float32).astype(dtype)


def cases():
    """name -> (zero-argument call, expected number of kernels or None). Fixed seeded inputs; sizes
    give every kernel several tile tasks per thread."""
    rng = np.random.default_rng(1130)
    x = _normal(rng, (64, 4099), scale=2.0)
    xb = x.astype(BF16)
    long_rows = _normal(rng, (2, 300_001), loc=0.5)  # few rows, many tiles: the two-level split
    cols = _normal(rng, (20_000, 33), np.float16, loc=0.5)  # dim=0: strided layout, split too
    S, H, D = 64, 8, 128
    rx = _normal(rng, (S, H, D), BF16)
    cos, sin = (t.astype(BF16) for t in rope.cos_sin(np.arange(S), D, 1e6))
    rw = _normal(rng, (D,), BF16, 0.1, 1.0)
    q, k, v = _normal(rng, (1, 8, 70, 64)), _normal(rng, (1, 2, 300, 64)), _normal(rng, (1, 2, 300, 64))
    qd, kd, vd = (_normal(rng, (1, 8, 1, 128), BF16), _normal(rng, (1, 2, 5000, 128), BF16),
                  _normal(rng, (1, 2, 5000, 128), BF16))
    kv_len = np.array([4321])
    logits = _normal(rng, (512, 256))
    bias = _normal(rng, (256,), scale=0.1)
    eo, ew = _normal(rng, (512, 8, 300), BF16), np.abs(_normal(rng, (512, 8)))
    lx, lw, lb = _normal(rng, (100, 300), BF16), _normal(rng, (200, 300), BF16, 0.05), _normal(rng, (200,), BF16)
    emb, ids = _normal(rng, (1000, 96)), rng.integers(0, 1000, (16, 33)).astype(np.int32)
    return {
        "gelu.tanh": (lambda: gelu.tanh(x), 1),
        "gelu.erf.bf16": (lambda: gelu.erf(xb), 1),
        "mean.sum_div.long_rows": (lambda: mean.sum_div(long_rows), 2),
        "mean.sum_div.dim0.fp16": (lambda: mean.sum_div(cols, dim=0), 2),
        "mean.sum_div.rows": (lambda: mean.sum_div(x), 1),
        "rope.standard": (lambda: rope.standard(rx, cos, sin), 1),
        "rope.interleaved": (lambda: rope.interleaved(rx, *(np.repeat(t[..., : t.shape[-1] // 2], 2, -1) for t in (cos, sin))), 1),
        "rope.rmsnorm": (lambda: rope.rmsnorm(rx, rw), 1),
        "rope.fused_rmsnorm": (lambda: rope.fused_rmsnorm(rx, rw, cos, sin), 1),
        "rope.cos_sin": (lambda: rope.cos_sin(np.arange(1000), 128, 1e6), 1),
        "attention.standard": (lambda: attention.standard(q, k, v, causal=True), 3),
        "attention.online": (lambda: attention.online(q, k, v, causal=True, kv_tile=64), 1),
        "attention.online.compensated": (lambda: attention.online(q, k, v, pv="compensated", kv_tile=64), 1),
        "attention.flash": (lambda: attention.flash(q, k, v, causal=True, kv_tile=64, q_tile=16, num_splits=1), 1),
        "attention.flash.split_prefill": (lambda: attention.flash(q, k, v, causal=True, kv_tile=64, q_tile=16), 2),
        "attention.flash.split_kv_decode": (lambda: attention.flash(qd, kd, vd, kv_len=kv_len, return_lse=True), 2),
        "attention.online.decode_expand_clone": (lambda: attention.online(qd, kd, vd, kv_len=kv_len, gqa="expand_clone"), 3),
        "repeat_kv.expand_clone": (lambda: repeat_kv.expand_clone(k, 4), 1),
        "moe.sigmoid_gating": (lambda: moe.sigmoid_gating(logits, 8, bias=bias, n_group=8, topk_group=4,
                                                          routed_scaling_factor=2.5), 1),
        "moe.softmax_gating": (lambda: moe.softmax_gating(logits, 8, renormalize=True), 1),
        "moe.combine": (lambda: moe.combine(eo, ew), 1),
        "linear.matmul_add": (lambda: linear.matmul_add(lx, lw, lb), 2),
        "linear.fused_bias": (lambda: linear.fused_bias(lx, lw, lb), 1),
        "embedding.gather": (lambda: embedding.gather(emb, ids), 1),
        "embedding.index_select": (lambda: embedding.index_select(emb, ids[0]), 1),
    }


def digest(result) -> str:
    parts = result if isinstance(result, tuple) else (result,)
    h = hashlib.sha256()
    for a in parts:
        a = np.ascontiguousarray(a)
        h.update(str((a.dtype.str, a.shape)).encode())
        h.update(a.view(np.uint8).tobytes())
    return h.hexdigest()


def run_bits() -> dict:
    """Every case: digest of the first call, whether 3 calls agree bit for bit, kernels run."""
    out = {}
    for name, (call, _) in cases().items():
        with pn.trace() as t:
            first = digest(call())
        repeats = {digest(call()) for _ in range(2)}
        out[name] = {"digest": first, "repeat_ok": repeats == {first}, "kernels": t.total.kernels}
    return out


# --- Python threads ------------------------------------------------------------------------------

THREAD_CASES = ("gelu.tanh", "mean.sum_div.long_rows", "rope.fused_rmsnorm", "attention.online",
                "attention.flash.split_kv_decode", "moe.sigmoid_gating", "linear.fused_bias",
                "embedding.gather", "attention.standard", "mean.sum_div.dim0.fp16")


def run_threads(workers: int = 4, rounds: int = 3) -> dict:
    """Serial digests, then the same calls from ``workers`` Python threads at once (each in its own
    trace; every other task under use_profile("ascend950")); reports mismatches and trace leaks."""
    table = cases()
    serial = {name: digest(table[name][0]()) for name in THREAD_CASES}
    with pn.use_profile("ascend950"):
        serial950 = {name: digest(table[name][0]()) for name in THREAD_CASES}
    problems = []

    def task(i, name):
        want_profile = "ascend950" if i % 2 else "ascend910b"
        with pn.trace() as t:
            if i % 2:
                with pn.use_profile("ascend950"):
                    got = digest(table[name][0]())
            else:
                got = digest(table[name][0]())
        records = [(f"{r.op}.{r.strategy}", r.profile) for r in t.records]
        return name, got, records, want_profile

    jobs = [(i, name) for i in range(rounds) for name in THREAD_CASES]
    jobs = [(i + j, name) for j, (i, name) in enumerate(jobs)]
    with pn.trace() as outer:  # the main thread's trace must not see the workers' calls
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(lambda a: task(*a), jobs))
    for name, got, records, want_profile in results:
        if got != (serial950 if want_profile == "ascend950" else serial)[name]:
            problems.append(f"{name} on {want_profile}: bits differ from the serial call")
        op = ".".join(name.split(".")[:2])
        expected_ops = {op} | ({"repeat_kv.expand_clone"} if "expand_clone" in name else set())
        if not records or {r[0] for r in records} - expected_ops:
            problems.append(f"{name}: its trace holds {records}")
        if any(p != want_profile for _, p in records):
            problems.append(f"{name}: ran on {records} instead of {want_profile}")
    if outer.records:
        problems.append(f"the main thread's trace holds the workers' records: {len(outer.records)}")
    return {"problems": problems, "calls": len(results)}


def child_env(threads: int) -> dict:
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(pn.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["NUMBA_NUM_THREADS"] = str(threads)
    env.pop("PYPTO_NUMBA_PROFILE", None)
    return env


def _spawn(mode: str, threads: int):
    return subprocess.Popen([sys.executable, __file__, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=child_env(threads))


def _collect(proc, what):
    out, err = proc.communicate(timeout=900)
    assert proc.returncode == 0, f"{what} worker died (rc={proc.returncode}): {err[-3000:]}"
    return json.loads(out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def workers():
    """The three subprocess runs, started together once one run has put every kernel in the cache.

    They must all run the same machine code: a parallel kernel numba compiles in the process and
    the same kernel loaded from its cache can differ in the last bits of a float reduction that
    LLVM vectorised (machine/jit.py), so children that compiled for themselves while others loaded
    the cache would compare two compilations, not two thread counts.
    """
    _collect(_spawn("bits", 2), "warm-up")
    procs = {"bits1": _spawn("bits", 1), "bits2": _spawn("bits", 2), "threads": _spawn("threads", 2)}
    return {name: _collect(p, name) for name, p in procs.items()}


def test_bits_do_not_depend_on_thread_count(workers):
    one, two = workers["bits1"], workers["bits2"]
    assert one.keys() == two.keys() == cases().keys()
    differ = [name for name in one if one[name]["digest"] != two[name]["digest"]]
    assert not differ, f"NUMBA_NUM_THREADS=1 and =2 give different bits for {differ}"


def test_repeated_calls_are_bit_identical(workers):
    for run in ("bits1", "bits2"):
        bad = [name for name, r in workers[run].items() if not r["repeat_ok"]]
        assert not bad, f"{run}: repeated calls differ for {bad}"


def test_the_split_paths_are_taken(workers):
    """The cases meant to cover the split paths really run them (else the test proves nothing)."""
    for name, (_, kernels) in cases().items():
        assert workers["bits2"][name]["kernels"] == kernels, name


def test_python_threads_get_serial_bits_and_own_traces(workers):
    r = workers["threads"]
    assert r["calls"] == 3 * len(THREAD_CASES)
    assert not r["problems"], r["problems"]


# --- memory ---------------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_repeated_calls_do_not_grow_rss():
    rng = np.random.default_rng(5)
    x, rows = _normal(rng, (64, 1000)), _normal(rng, (2, 50_000))
    q, k, v = _normal(rng, (1, 8, 1, 64), BF16), _normal(rng, (1, 2, 2000, 64), BF16), _normal(rng, (1, 2, 2000, 64), BF16)
    logits = _normal(rng, (64, 256))
    calls = (
        lambda: gelu.tanh(x),
        lambda: mean.sum_div(rows),  # two kernels: GM workspace for the partials
        lambda: attention.flash(q, k, v, return_lse=True),  # split-KV: partials + combine
        lambda: moe.sigmoid_gating(logits, 8, n_group=8, topk_group=4),
    )

    def burst(n, traced):
        for _ in range(n):
            for call in calls:
                if traced:
                    with pn.trace() as t:
                        call()
                    assert len(t.records) == 1
                else:
                    call()

    burst(30, False)  # warm-up: kernels loaded, allocator pools at their working size
    burst(30, True)
    gc.collect()
    before = _rss_bytes()
    burst(200, False)
    burst(200, True)
    gc.collect()
    grown = _rss_bytes() - before
    assert grown < 20 * 2**20, f"RSS grew by {grown / 2**20:.1f} MiB over 400 calls of {len(calls)} strategies"


if __name__ == "__main__":
    result = run_bits() if sys.argv[1] == "bits" else run_threads()
    print(json.dumps(result))
