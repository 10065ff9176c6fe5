"""A second estimator: the hicann PyPTO simulator's per-tile-op cycle formula (``model="sim"``).

npu-facts 5.2 (``hicann/pypto: framework/src/cost_model/simulation/arch/PipeSimulatorFast.cpp`` and
``arch/A2A3/PostSimulatorA2A3.h``): one tile op of ``bytes`` (dtype bytes x the product of its
last two dims, the smaller operand) costs

    cycles = floor((a * bytes * pr * 1e-6 + b) * 2000) + 1

at the simulator's 2 GHz (pr = 1 for fp32 DIV/EXP/LN/SQRT, else 2), plus 1400 cycles of GM read
latency per COPY_IN and 300 per COPY_OUT; ops outside the (a, b) table take ``latency +
2 * repeats - 1`` (256-B repeats). The simulator's per-core pipes (MTE-in, MTE1, vector ALU,
cube, MTE-out) run side by side, so a task overlaps them as :mod:`machine/pipes` does
(``sum + (tiles - 1) * max``); tasks go in waves over the cores, with the launch and AICPU
costs of npu-facts 5.2. Unlike the pipes model, the simulator's formula knows no HBM or L2
sharing between cores (its L2 model is a 20 MB cache with hit/miss latencies, not a bandwidth)
and no size-dependent transfer rate beyond the fixed COPY_IN latency: where the two disagree,
that is why. PTO-ISA's fitted costs are the pipes model's inputs, not part of this one.

A tile op's size is the plan's tile: ``Work.vector_elems`` for vector ops, the load / store
transfer for COPY_IN / COPY_OUT, the plan's L0 tiles (``Work.l0_shape``) for L1_TO_L0A/B and
A_MUL_B; the op count per task follows from the elements, bytes and FLOPs per task.
"""

from __future__ import annotations

import math

from . import isa

# npu-facts 5.2: (a, b) for the tile ops the vector mix and the cube use, beyond isa.HICANN_AB
SIM_AB = dict(isa.HICANN_AB, COPY_IN=(2.613, 0.00241), COPY_OUT=(3.2883, 0.00195),
              L1_TO_L0A=(1.12719, 0.015), L1_TO_L0B=(2.05893, 0.012), A_MUL_B=(3.91153, 0.0107),
              A_MULACC_B=(3.90376, 0.0103))
COPY_IN_LATENCY = 1400   # npu-facts 5.2: cycles of GM read latency per COPY_IN
COPY_OUT_LATENCY = 300   # npu-facts 5.2: per COPY_OUT
# PTO instruction -> the simulator's tile op (scalar forms as MULS, the one scalar row it lists)
SIM_OP = {"TADD": "ADD", "TSUB": "SUB", "TMUL": "MUL", "TDIV": "DIV", "TDIVS": "DIV", "TEXP": "EXP",
          "TTANH": "EXP", "TLOG": "LN", "TSQRT": "SQRT", "TMULS": "MULS", "TADDS": "MULS", "TMINS": "MULS",
          "TMAXS": "MULS", "TNEG": "NEG", "TCVT": "CAST", "TROWEXPAND": "EXPAND", "TEXPAND": "EXPAND",
          "TRECIP": "RECIPROCAL", "TROWSUM": "ROWSUMLINE", "TROWMAX": "ROWMAX_SINGLE",
          "TCOLSUM": "ROWSUMLINE", "TCOLMAX": "ROWMAX_SINGLE", "TMAX": "ADD", "TSEL": "ADD", "TABS": "ADD"}
SIM_LATENCY = {"TRSQRT": "UB_RSQRT"}


def op_cycles(name: str, nbytes: float, fp32: bool = True) -> float:
    """Simulator cycles of one tile op ``name`` over ``nbytes`` (npu-facts 5.2)."""
    a, b = SIM_AB[name]
    pr = 1 if (name in isa.HICANN_PR1 and fp32) else 2
    return math.floor((a * nbytes * pr * 1e-6 + b) * isa.HICANN_CYCLES_PER_US) + 1


def _vector_cycles(instr: str, dtype: str, elements: float, per_op: int) -> float:
    nbytes = 4 if dtype in ("fp32", "bf16") else 2
    ops = math.ceil(elements / max(per_op, 1))
    per = elements / ops * nbytes
    if instr in SIM_LATENCY:
        return ops * (isa.HICANN_LATENCY[SIM_LATENCY[instr]] + 2 * math.ceil(per / isa.REPEAT_BYTES) - 1)
    return ops * op_cycles(SIM_OP.get(instr, "ADD"), per, nbytes == 4)


def kernel_estimate(cost, work, prof, variant: str = isa.DEFAULT_VARIANT) -> dict:
    """The simulator formula's time of one kernel: seconds, bound, per-pipe busy seconds."""
    rates = prof.pipes
    clock = rates.sim_clock_hz
    cores = prof.cube_cores if work.unit in ("cube", "mixed") else prof.vector_cores
    tasks, tiles = work.tasks, work.tiles
    waves = -(-tasks // cores)
    step = dict.fromkeys(("MTE2", "MTE1", "CUBE", "VECTOR", "MTE3"), 0.0)
    if work.load_bytes:
        loads = max(1, round(work.load_bytes / max(work.load_transfer, 1.0)))
        step["MTE2"] = loads * (op_cycles("COPY_IN", work.load_bytes / loads) + COPY_IN_LATENCY) / clock
    if work.store_bytes:
        stores = max(1, round(work.store_bytes / max(work.store_transfer, 1.0)))
        step["MTE3"] = stores * (op_cycles("COPY_OUT", work.store_bytes / stores) + COPY_OUT_LATENCY) / clock
    if work.cube:
        M, N, K, dtype = work.cube
        m0, k0, n0 = work.l0_shape or (min(M, 128), min(K, 64), min(N, 128))
        ab = 4 if dtype == "fp32" else 2
        mads = M * N * K / (m0 * k0 * n0)  # L0 tile ops per task
        step["MTE1"] = mads * (op_cycles("L1_TO_L0A", m0 * k0 * ab) + op_cycles("L1_TO_L0B", k0 * n0 * ab)) / clock / tiles
        step["CUBE"] = mads * op_cycles("A_MULACC_B", min(m0 * k0, k0 * n0) * ab) / clock / tiles
    if work.vector:
        cycles = 0.0
        for kind, dtype, elements in work.vector:
            for instr, count in isa.expand(kind, variant):
                cycles += _vector_cycles(instr, dtype, elements * count, work.vector_elems)
        share = (prof.vector_cores / prof.cube_cores) if work.unit == "mixed" else 1.0
        step["VECTOR"] = cycles / clock / share / tiles
    t_task = sum(step.values()) + (tiles - 1) * max(step.values())
    busy = {p: s * tiles for p, s in step.items()}
    t_cores = waves * (t_task + rates.task_s)
    t_sched = tasks * rates.task_s / rates.aicpu_threads
    body = max(t_cores, t_sched)
    launch = max(cost.kernels, 1) * rates.launch_s
    pipe = max(busy, key=busy.get)
    if launch >= body:
        bound = "launch"
    elif t_sched > t_cores:
        bound = "schedule"
    elif min(tasks, cores) < cores / 2:
        bound = "occupancy"
    else:
        bound = {"MTE2": "memory", "MTE3": "memory", "CUBE": "cube", "VECTOR": "vector", "MTE1": "mte1"}[pipe]
    return {"seconds": launch + body, "bound": bound, "pipe": pipe, "pipes": busy, "task_seconds": t_task,
            "waves": waves, "tasks": tasks, "tiles": tiles, "cores": cores, "launch": launch, "schedule": t_sched}
