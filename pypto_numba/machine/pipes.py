"""The per-pipe NPU time model (``Cost.estimate(model="pipes")``, the default).

Each kernel's tasks run in waves over the cube cores (a cube or mixed kernel: one AIC with its
two AIVs) or the vector cores. A task walks ``tiles`` tile steps; each step keeps six pipes
busy, the way PyPTO's swimlanes name them (time per tile step):

- MTE2    GM -> UB (vector) / GM -> L1 (cube): load bytes / min(bw(transfer), chip share)
- MTE1    L1 -> L0A / L0B: tune.l0_tile's C_load / tiles
- CUBE    MAD: tune.l0_tile's C_mad / tiles
- VECTOR  vector instructions: machine/isa.py, PTO-ISA ``slope * n + bias`` per issue
- FIXPIPE L0C -> out: tune.l0_tile's C_drain (its exposed part once per task)
- MTE3    UB -> GM: store bytes / min(bw(transfer), chip share)

Double-buffered tiles overlap the pipes: ``t_task = sum(step) + (tiles - 1) * max(step) +
exposed drain`` (the first tile fills every pipe, the last drains them; in between the slowest
pipe sets the pace). ``bw(B) = peak * B / (k + B)`` is PTO-ISA's size-dependent fit (npu-facts
8.6), so small transfers run below peak. All active cores share the chip: a core gets at most
``chip rate / active cores``; reads of bytes the kernel has read before (``gm_read_bytes -
gm_unique_bytes``) come from the L2 at ``l2_bytes_per_s`` when the distinct bytes fit the L2, the
first read of each byte (and every read when they do not fit) from HBM, writes go to HBM.

    t_kernel = launch + max(waves * (t_task + aicpu_task), t_gm_chip, tasks * aicpu_task / threads)

with launch = stitch + submit latency and aicpu_task = completion + resolve + schedule cycles
(npu-facts 5.2). The bound is the pipe with the most busy time ("memory" for MTE2/MTE3,
"cube" for CUBE, "vector", "mte1", "fixpipe"), or "memory" when the chip's shared GM time wins,
"schedule" when the AICPUs do, "launch" when the launch overhead exceeds the rest, "occupancy"
when fewer than half the cores have a task. docs/model.md gives the equations and the sources.

:func:`kernel_schedule` computes this once per kernel (:class:`Schedule`: per-step pipe times,
task time, waves, GM and AICPU times); :func:`kernel_estimate` is its makespan and
machine/timeline.py draws it, with :func:`task_slices` giving each task's tile slices.

The per-task inputs (:class:`Work`) come from the plan (:func:`work_of_plan`): explicit fields
of KernelPlan where the plan sets them, otherwise generic defaults derived from its tasks, buffers,
GM bytes, cube FLOPs and vector ops. A bare Cost without a plan gets :func:`work_of_cost`.
"""

from __future__ import annotations

import dataclasses
import math

from . import isa

PIPES = ("MTE2", "MTE1", "CUBE", "VECTOR", "FIXPIPE", "MTE3")
GIB = 1024 ** 3
ITEMSIZE = {"fp32": 4, "bf16": 2, "fp16": 2, "int32": 4, "int64": 8, "int8": 1, "uint8": 1, "bool": 1}
DEFAULT_TILE_BYTES = 32768  # a Cost without buffers: 32 KiB tiles ("good tile sizes 16-64 KB", npu-facts 4.1)
BOUND_OF_PIPE = {"MTE2": "memory", "MTE3": "memory", "CUBE": "cube", "VECTOR": "vector",
                 "MTE1": "mte1", "FIXPIPE": "fixpipe"}


@dataclasses.dataclass(frozen=True)
class Work:
    """One kernel's per-task inputs of the pipe model (plan-only: kernels do not count these)."""

    unit: str                 # "vector", "cube" or "mixed"
    tasks: int
    tiles: int                # tile steps per task
    load_bytes: float         # MTE2 bytes per tile step
    load_transfer: float      # bytes of one GM read transfer (the size the bandwidth fit takes)
    store_bytes: float        # bytes written to GM per tile step
    store_transfer: float
    gm_unique_bytes: int      # distinct GM bytes the kernel reads
    cube: tuple = ()          # (M, N, K, operand dtype) of one task's matmul; () without cube work
    vector: tuple = ()        # ((kind, dtype, elements per task), ...) (kinds: machine/isa.py)
    vector_elems: int = 0     # elements per vector instruction (the UB tile)
    vector_cols: int = 0      # cols of that tile (the fitted rows' key)
    l0_shape: tuple = ()      # (m0, k0, n0) of the plan's L0 tiles (the "sim" model's cube ops)


def _cdiv(a, b) -> int:
    return -(-int(a) // int(b))


def _a16(n) -> int:
    return _cdiv(max(int(n), 1), 16) * 16


def _by_level(buffers, level):
    return [b for b in buffers if b.level == level]


def _cube_task(kp, reads_task: float, flops_task: float):
    """(M, N, K, dtype) of one cube task and the distinct bytes of the walk, from the L1 operand
    buffers (a_l1 [mL1, kL1], b_l1 [nL1, kL1]; else the first two L1 buffers, else L0A/L0B).

    A task reads its A rows and B rows over the whole K: ``reads = K * (m * a + N * b)`` and does
    ``flops = 2 * m * N * K`` (m <= mL1 valid rows, N = nL1), so ``K = (reads - a * flops / (2N)) /
    (b * N)``. The walk's grid (rows x cols of tasks) is not in KernelPlan: with m < 0.75 mL1
    (decode: all rows in one task row) it is 1 x tasks; otherwise we take it square. Plans that know the
    distinct bytes set ``gm_unique_bytes``."""
    l1 = _by_level(kp.buffers, "L1")
    named = {b.name: b for b in l1}
    a_buf, b_buf = named.get("a_l1"), named.get("b_l1")
    if a_buf is None or b_buf is None:
        pair = l1[:2] if len(l1) >= 2 else _by_level(kp.buffers, "L0A")[:1] + _by_level(kp.buffers, "L0B")[:1]
        if len(pair) < 2:
            return (128, 128, max(16, round(flops_task / (2 * 128 * 128))), "bf16"), None
        a_buf, b_buf = pair
    dtype = a_buf.dtype if a_buf.dtype in ("fp32", "bf16", "fp16") else "bf16"
    M, N = a_buf.shape[0], b_buf.shape[0]
    a, b = ITEMSIZE[a_buf.dtype], ITEMSIZE[b_buf.dtype]
    K = (reads_task - a * flops_task / (2 * N)) / (b * N)
    if K < 1:
        K = flops_task / (2 * M * N)
    K = max(K, 1.0)
    rows = min(max(flops_task / (2 * N * K), 1.0), M)
    if rows < 0.75 * M:  # a decode walk: dead rows in its one row of tasks
        grid = (1, kp.tasks)
    else:
        side = math.sqrt(kp.tasks)
        grid = (side, side)
    unique = K * (grid[0] * rows * a + grid[1] * N * b)
    # K is inferred (a bias row adds a few bytes per task): nearest fractal multiple
    return (_a16(rows), _a16(N), max(16, round(K / 16) * 16), dtype), unique


def work_of_plan(kp) -> Work:
    """The pipe model's inputs of one :class:`~pypto_numba.machine.plan.KernelPlan`."""
    tasks = max(int(kp.tasks), 1)
    reads, writes = kp.gm_read_bytes / tasks, kp.gm_write_bytes / tasks
    ub, l1 = _by_level(kp.buffers, "UB"), _by_level(kp.buffers, "L1")
    staged = l1 if kp.unit != "vector" and l1 else ub
    # a tile step loads every staged (L1) operand buffer once, or (UB) the largest buffer
    if staged is l1:
        step = sum(b.nbytes for b in l1)
        transfer = step / len(l1)
    else:
        step = max((b.nbytes for b in ub), default=DEFAULT_TILE_BYTES)
        transfer = step
    if kp.load_bytes:
        transfer = step = kp.load_bytes
    # a step less than 5 % full (a bias row, a tail) is not a step of its own
    tiles = kp.tiles_per_task or max(1, math.ceil(max(reads, writes) / step - 0.05))
    if kp.store_bytes:
        store_transfer = kp.store_bytes
    else:
        store_transfer = min(max(writes / tiles, 1.0), transfer) if writes else 0.0
    unique = kp.gm_unique_bytes
    cube = ()
    if kp.cube_flops:
        flops_task = kp.cube_flops / tasks
        if kp.cube_task:
            M, N, K = kp.cube_task
            cube, walk_unique = (_a16(M), _a16(N), _a16(K), _cube_dtype(kp)), None
        else:
            cube, walk_unique = _cube_task(kp, reads, flops_task)
        if unique is None and kp.unit == "cube" and walk_unique is not None:
            unique = walk_unique
    if unique is None:
        unique = kp.gm_read_bytes
    if kp.vector_mix:
        mix = kp.vector_mix
    else:
        mix = ((isa.GENERIC, "fp32", kp.vector_ops),) if kp.vector_ops else ()
    l0a, l0b = _by_level(kp.buffers, "L0A"), _by_level(kp.buffers, "L0B")
    l0_shape = (l0a[0].shape[0], l0a[0].shape[-1], l0b[0].shape[0]) if l0a and l0b else ()
    widest = max(ub, key=lambda b: b.nbytes, default=None)
    elems = kp.vector_tile_elems or (math.prod(widest.shape) if widest else DEFAULT_TILE_BYTES // 4)
    cols = kp.vector_cols or (widest.shape[-1] if widest else elems)
    return Work(
        unit=kp.unit, tasks=tasks, tiles=int(tiles),
        load_bytes=reads / tiles, load_transfer=float(min(transfer, max(reads / tiles, 1.0))),
        store_bytes=writes / tiles, store_transfer=float(store_transfer),
        gm_unique_bytes=int(min(max(unique, 0), kp.gm_read_bytes)),
        cube=cube, vector=tuple((kind, dt, n / tasks) for kind, dt, n in mix),
        vector_elems=int(elems), vector_cols=int(cols), l0_shape=l0_shape,
    )


def _cube_dtype(kp) -> str:
    for b in kp.buffers:
        if b.level in ("L1", "L0A") and b.dtype in ("fp32", "bf16", "fp16"):
            return b.dtype
    return "bf16"


def work_of_cost(cost, dtype: str = "bf16") -> Work:
    """Generic inputs for a Cost that carries no plan: 32 KiB tiles, every byte read once, an
    output-square cube task of 128 x 128."""
    tasks = max(cost.tasks, 1)
    reads, writes = cost.gm_read_bytes / tasks, cost.gm_write_bytes / tasks
    unit = "cube" if cost.cube_flops else "vector"
    tiles = max(1, _cdiv(max(reads, writes, 1), DEFAULT_TILE_BYTES))
    cube = ()
    if cost.cube_flops:
        K = cost.cube_flops / tasks / (2 * 128 * 128)
        cube = (128, 128, _a16(K), dtype if dtype in ("fp32", "bf16", "fp16") else "bf16")
    return Work(
        unit=unit, tasks=tasks, tiles=tiles,
        load_bytes=reads / tiles, load_transfer=float(min(DEFAULT_TILE_BYTES, max(reads / tiles, 1.0))),
        store_bytes=writes / tiles, store_transfer=float(min(DEFAULT_TILE_BYTES, max(writes / tiles, 1.0))),
        gm_unique_bytes=cost.gm_unique_bytes or cost.gm_read_bytes, cube=cube,
        vector=((isa.GENERIC, "fp32", cost.vector_ops / tasks),) if cost.vector_ops else (),
        vector_elems=DEFAULT_TILE_BYTES // 4, vector_cols=DEFAULT_TILE_BYTES // 4,
    )


def transfer_rate(peak_gibs: float, k_bytes: float, nbytes: float) -> float:
    """PTO-ISA's fitted per-core bandwidth in bytes/s of one ``nbytes`` transfer:
    ``peak * B / (k + B)`` GiB/s (npu-facts 8.6)."""
    if nbytes <= 0:
        return peak_gibs * GIB
    return peak_gibs * GIB * nbytes / (k_bytes + nbytes)


_L0_CACHE = {}


def _l0_tile(M, N, K, dtype, prof):
    """tune.l0_tile, kept per shape and the profile's cube numbers (the search is exhaustive)."""
    key = (M, N, K, dtype, prof.name, prof.cube_model, prof.l0a_bytes, prof.l0b_bytes, prof.l0c_bytes,
           prof.cube_fractal, prof.clock_hz)
    tile = _L0_CACHE.get(key)
    if tile is None:
        from ..tune import l0_tile

        if len(_L0_CACHE) > 4096:
            _L0_CACHE.clear()
        tile = _L0_CACHE[key] = l0_tile(M, N, K, dtype, profile=prof)
    return tile


def task_seconds(step: dict, tiles: int, exposed: float = 0.0) -> float:
    """One task's time: the makespan of :func:`task_slices` in closed form,
    ``sum(step) + (tiles - 1) * max(step) + exposed``."""
    return sum(step.values()) + (tiles - 1) * max(step.values()) + exposed


def task_slices(step: dict, tiles: int):
    """The per-tile schedule of one task: ``(pipe, tile, start, end)`` in seconds from the task's
    start, pipes in PIPES order, zero-time pipes left out.

    Double-buffered tiles as a flow shop: tile t enters a pipe when it has left the previous pipe
    and the pipe has finished tile t - 1, ``start(t, i) = max(end(t, i - 1), end(t - 1, i))``.
    With the same step times for every tile its makespan is :func:`task_seconds` (the longest
    path crosses every pipe once and the slowest pipe ``tiles - 1`` more times); the exposed L0C
    drain follows the last tile."""
    done = dict.fromkeys(PIPES, 0.0)  # when each pipe finished the previous tile
    for tile in range(tiles):
        ready = 0.0  # when this tile left the previous pipe
        for pipe in PIPES:
            seconds = step.get(pipe, 0.0)
            if seconds <= 0:
                continue
            start = max(ready, done[pipe])
            ready = done[pipe] = start + seconds
            yield pipe, tile, start, ready


@dataclasses.dataclass(frozen=True)
class Schedule:
    """The pipe model's schedule of one kernel: per-step pipe times, the task and its waves.

    ``launch`` precedes the body; tasks run in ``waves`` over ``cores`` (wave w starts at
    ``w * (task_seconds + task_gap)``, the AICPU's per-task time ``task_gap`` after each task);
    the chip's shared GM (``gm_chip``) and the AICPUs' dispatch (``schedule``) run beside them.
    ``seconds`` (the estimate) is the makespan ``launch + max(cores, gm_chip, schedule)``."""

    unit: str
    cores: int
    tasks: int
    waves: int
    tiles: int
    step: dict               # pipe -> seconds per tile step
    exposed: float           # exposed L0C drain per task (after the last tile)
    task_seconds: float
    task_gap: float          # AICPU seconds per task (completion + resolve + schedule)
    launch: float
    gm_chip: float
    schedule: float
    busy: dict               # pipe -> busy seconds per task
    extra: dict              # the estimate row's other entries (L2, vector instructions, L0 tile)

    @property
    def cores_seconds(self) -> float:
        return self.waves * (self.task_seconds + self.task_gap)

    @property
    def body(self) -> float:
        return max(self.cores_seconds, self.gm_chip, self.schedule)

    @property
    def seconds(self) -> float:
        return self.launch + self.body

    @property
    def active(self) -> int:
        return min(self.tasks, self.cores)

    def row(self) -> dict:
        """The estimate row of :meth:`Cost.estimate` (seconds, bound, per-pipe busy seconds, ...)."""
        t_cores, t_gm, t_sched, body = self.cores_seconds, self.gm_chip, self.schedule, self.body
        pipe = max(PIPES, key=lambda p: self.busy[p])
        if self.launch >= body:
            bound = "launch"
        elif body == t_gm and t_gm > t_cores:
            bound = "memory"
        elif body == t_sched and t_sched > t_cores:
            bound = "schedule"
        elif self.active < self.cores / 2:
            bound = "occupancy"
        else:
            bound = BOUND_OF_PIPE[pipe]
        return {
            "seconds": self.launch + body, "bound": bound, "pipe": pipe, "pipes": dict(self.busy),
            "task_seconds": self.task_seconds, "waves": self.waves, "tasks": self.tasks, "tiles": self.tiles,
            "cores": self.cores, "occupancy": self.active / self.cores, "launch": self.launch,
            "gm_chip": t_gm, "schedule": t_sched, **self.extra,
        }


def kernel_schedule(cost, work: Work, prof, variant: str = isa.DEFAULT_VARIANT) -> Schedule:
    """The pipe model's schedule of one kernel (:class:`Schedule`; its makespan is the estimate)."""
    rates = prof.pipes
    cube_side = work.unit in ("cube", "mixed")
    cores = prof.cube_cores if cube_side else prof.vector_cores
    tasks, tiles = work.tasks, work.tiles
    active = min(tasks, cores)
    waves = _cdiv(tasks, cores)

    # the chip's shared GM: distinct bytes from HBM, re-reads from L2 when the distinct bytes fit
    reads, writes = cost.gm_read_bytes, cost.gm_write_bytes
    unique = min(work.gm_unique_bytes, reads)
    fits = unique <= rates.l2_bytes
    l2_reads = reads - unique if fits else 0
    t_read = (reads - l2_reads) / rates.hbm_bytes_per_s + l2_reads / rates.l2_bytes_per_s
    t_write = writes / rates.hbm_bytes_per_s
    t_gm = t_read + t_write
    read_share = (reads / t_read / active) if t_read > 0 else math.inf
    write_share = rates.hbm_bytes_per_s / active

    if work.unit == "vector":
        in_peak, in_k = rates.gm_to_ub_peak_gibs, rates.gm_to_ub_k_bytes
    else:
        in_peak, in_k = rates.gm_to_l1_peak_gibs, rates.gm_to_l1_k_bytes
    bw_in = min(transfer_rate(in_peak, in_k, work.load_transfer), read_share)
    step = dict.fromkeys(PIPES, 0.0)
    step["MTE2"] = work.load_bytes / bw_in if work.load_bytes else 0.0

    exposed = drain = 0.0
    l0 = None
    if work.cube:
        M, N, K, dtype = work.cube
        l0 = _l0_tile(M, N, K, dtype, prof)
        clock = l0.clock_hz
        step["MTE1"] = l0.load / clock / tiles
        step["CUBE"] = l0.mad / clock / tiles
        drain = l0.drain / clock
        exposed = (l0.wall - max(l0.load, l0.mad)) / clock

    vec = {}
    if work.vector:
        vec = isa.mix_seconds(work.vector, work.vector_elems, work.vector_cols, prof.clock_hz, variant,
                              rates.vector_slope_scale)
        share = (prof.vector_cores / prof.cube_cores) if work.unit == "mixed" else 1.0  # 1:2 AIC:AIV
        step["VECTOR"] = sum(vec.values()) / share / tiles

    if work.store_bytes:
        if work.unit == "cube":  # the cube writes through FIXPIPE; its GM side shares the HBM
            step["FIXPIPE"] = work.store_bytes / write_share
        else:
            out = transfer_rate(rates.ub_to_gm_peak_gibs, rates.ub_to_gm_k_bytes, work.store_transfer)
            step["MTE3"] = work.store_bytes / min(out, write_share)

    busy = {p: step[p] * tiles for p in PIPES}
    busy["FIXPIPE"] += drain
    return Schedule(
        unit=work.unit, cores=cores, tasks=tasks, waves=waves, tiles=tiles, step=step, exposed=exposed,
        task_seconds=task_seconds(step, tiles, exposed), task_gap=rates.task_s,
        launch=max(cost.kernels, 1) * rates.launch_s, gm_chip=t_gm,
        schedule=tasks * rates.task_s / rates.aicpu_threads, busy=busy,
        extra={"l2_fits": fits, "l2_read_bytes": l2_reads, "gm_unique_bytes": unique,
               "vector_instructions": vec, "l0_tile": l0.shape if l0 is not None else None},
    )


def kernel_estimate(cost, work: Work, prof, variant: str = isa.DEFAULT_VARIANT) -> dict:
    """The pipe model's time of one kernel: seconds, bound, per-pipe busy seconds and the terms
    (the makespan of :func:`kernel_schedule`)."""
    return kernel_schedule(cost, work, prof, variant).row()
