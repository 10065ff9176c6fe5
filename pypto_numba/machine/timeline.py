"""The pipe model's schedule as a Chrome / Perfetto trace (``Plan.timeline``, ``Trace.timeline``).

The slices are machine/pipes.py's own schedule (:func:`~pypto_numba.machine.pipes.kernel_schedule`
per kernel, :func:`~pypto_numba.machine.pipes.task_slices` per task): the timeline's makespan is
``Cost.estimate(model="pipes")``. Kernels run one after the other, each behind its launch.

Tracks, named as PyPTO's swimlanes (npu-facts 5.1, 5.4: ``merged_swimlane.json`` for tasks per
core, ``trace_core<N>.json`` for the pipes inside a core):

- process "chip": thread "kernels" (one slice per kernel, its "launch" nested in it), "GM" (the
  chip's shared HBM + L2 time of the kernel) and "AICPU" (the dispatch of its tasks over the
  scheduler threads). A kernel ends when the slowest of cores, GM and AICPU does, so a
  memory- or schedule-bound kernel shows its GM or AICPU slice reaching past the cores' last task;
- one process per core that has a task, "AIC i" (cube and mixed kernels) or "AIV i" (vector
  kernels; a mixed kernel's vector half runs on the two AIVs of its AIC), with thread "tasks"
  (a slice per task, then an "AICPU" gap: the per-task completion + resolve + schedule time) and
  one thread per pipe: MTE2, MTE1, CUBE, VECTOR, FIXPIPE, MTE3 (a slice per tile step; "L0C
  drain" is the exposed part of the cube's drain after the last tile).

In a mixed kernel MTE2, MTE1, CUBE and FIXPIPE run on the AIC and VECTOR on both AIVs; MTE3 on
the first AIV. Every slice is a trace-event ``"X"`` event (``ts``, ``dur`` in microseconds,
rounded to the nanosecond); ``"M"`` events name the processes and threads. Big kernels keep their
tile slices for the first waves only (``max_slices``) and their task slices for as many waves as
fit; the rest of each core's tasks is one "tasks w..n" slice (``otherData`` says which).
"""

from __future__ import annotations

import dataclasses
import json

from . import isa, pipes

CHIP_PID = 1
AIC_PID, AIV_PID = 100, 1000     # + core index
GROUP_PIDS = 10000               # pid offset per group in :meth:`Timeline.combine`
TASKS_TID = 0
PIPE_TID = {p: i + 1 for i, p in enumerate(pipes.PIPES)}
CHIP_TIDS = {"kernels": 0, "GM": 1, "AICPU": 2}
MAX_SLICES = 100_000             # tile slices per timeline (the rest of each kernel as task slices)
MAX_TASK_SLICES = 50_000         # task slices per timeline (the rest: one slice per core)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


@dataclasses.dataclass
class Timeline:
    """A modelled schedule: trace-event dicts (``.events``), its makespan in seconds and the profile.

    ``to_json()`` / ``save(path)`` write the Chrome trace-event format (``{"traceEvents": [...]}``),
    which chrome://tracing and https://ui.perfetto.dev open."""

    events: list
    seconds: float
    profile: str = ""
    notes: list = dataclasses.field(default_factory=list)

    @property
    def microseconds(self) -> float:
        return self.seconds * 1e6

    def tracks(self) -> dict:
        """(pid, tid) -> "process / thread" names, from the metadata events."""
        procs = {e["pid"]: e["args"]["name"] for e in self.events if e["ph"] == "M" and e["name"] == "process_name"}
        return {(e["pid"], e["tid"]): f"{procs.get(e['pid'], e['pid'])} / {e['args']['name']}"
                for e in self.events if e["ph"] == "M" and e["name"] == "thread_name"}

    def to_dict(self) -> dict:
        return {"traceEvents": self.events, "displayTimeUnit": "ns",
                "otherData": {"model": "pipes", "profile": self.profile, "makespan_us": self.seconds * 1e6,
                              "notes": list(self.notes)}}

    def to_json(self, indent=None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def save(self, path) -> str:
        """Write the trace JSON to ``path``; returns the path."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
        return str(path)

    @classmethod
    def combine(cls, groups) -> "Timeline":
        """Several timelines side by side in one trace: ``groups`` is ((label, Timeline), ...);
        each becomes a group of processes named "label: chip", "label: AIV 0", ..., all from ts 0."""
        events, notes, profiles = [], [], []
        for g, (label, tl) in enumerate(groups):
            for e in tl.events:
                e = dict(e, pid=e["pid"] + g * GROUP_PIDS)
                if e["ph"] == "M" and e["name"] == "process_name":
                    e["args"] = {"name": f"{label}: {e['args']['name']}"}
                elif e["ph"] == "M" and e["name"] == "process_sort_index":
                    e["args"] = {"sort_index": e["args"]["sort_index"] + g * GROUP_PIDS}
                events.append(e)
            notes += tl.notes  # they name their kernels
            profiles.append(tl.profile)
        seconds = max((tl.seconds for _, tl in groups), default=0.0)
        return cls(events, seconds, ", ".join(dict.fromkeys(profiles)), notes)


class _Builder:
    def __init__(self):
        self.slices = []     # (pid, tid, name, start, end, cat, args)
        self.procs = {}      # pid -> name
        self.threads = {}    # (pid, tid) -> name

    def add(self, pid, tid, thread, name, start, end, cat, **args):
        self.threads.setdefault((pid, tid), thread)
        self.slices.append((pid, tid, name, start, end, cat, args))

    def events(self) -> list:
        out = []
        for pid, name in sorted(self.procs.items()):
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "ts": 0, "args": {"name": name}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "ts": 0,
                        "args": {"sort_index": pid}})
        for (pid, tid), name in sorted(self.threads.items()):
            out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}})
            out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "ts": 0,
                        "args": {"sort_index": tid}})
        rows = []
        for pid, tid, name, start, end, cat, args in self.slices:
            a, b = _ns(start), _ns(end)
            rows.append((pid, tid, a, -b, name, cat, args))
        rows.sort(key=lambda r: r[:4])  # per track by start, an enclosing slice before what it holds
        for pid, tid, a, b, name, cat, args in rows:
            out.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": tid, "ts": a / 1000,
                        "dur": (-b - a) / 1000, "args": args})
        return out


def _core_pids(unit: str, core: int, per: int) -> dict:
    """pipe (and "tasks") -> the pids of the cores that run it for task slot ``core`` (``per``
    AIVs to an AIC)."""
    if unit == "vector":
        return dict.fromkeys(("tasks",) + pipes.PIPES, (AIV_PID + core,))
    aic = (AIC_PID + core,)
    if unit == "cube":
        return dict.fromkeys(("tasks",) + pipes.PIPES, aic)
    aivs = tuple(AIV_PID + core * per + i for i in range(per))
    out = dict.fromkeys(("MTE2", "MTE1", "CUBE", "FIXPIPE"), aic)
    out.update(tasks=aic + aivs, VECTOR=aivs, MTE3=aivs[:1])
    return out


def _kernel(b: _Builder, name: str, sched, t0: float, tile_budget: int, task_budget: int, per: int, notes: list):
    chip = CHIP_PID
    end = t0 + sched.seconds
    b.add(chip, CHIP_TIDS["kernels"], "kernels", name, t0, end, "kernel", tasks=sched.tasks, waves=sched.waves,
          tiles=sched.tiles, cores=sched.cores)
    b.add(chip, CHIP_TIDS["kernels"], "kernels", "launch", t0, t0 + sched.launch, "launch")
    body = t0 + sched.launch
    if sched.gm_chip > 0:
        b.add(chip, CHIP_TIDS["GM"], "GM", f"{name}: GM (HBM + L2)", body, body + sched.gm_chip, "gm")
    b.add(chip, CHIP_TIDS["AICPU"], "AICPU", f"{name}: dispatch {sched.tasks} tasks", body, body + sched.schedule,
          "aicpu")
    slices = list(pipes.task_slices(sched.step, sched.tiles))
    period = sched.task_seconds + sched.task_gap
    per_task = len(slices) * (1 + (sched.unit == "mixed"))
    active = sched.active
    tile_waves = min(sched.waves, max(1, tile_budget // max(per_task * active, 1)))
    task_waves = min(sched.waves, max(tile_waves, task_budget // max(2 * active, 1)))
    if tile_waves < sched.waves:
        notes.append(f"{name}: tile slices for the first {tile_waves} of {sched.waves} waves")
    if task_waves < sched.waves:
        notes.append(f"{name}: task slices for the first {task_waves} of {sched.waves} waves")
    pipeline = max((z for *_, z in slices), default=0.0)  # the last tile's end; the drain follows
    for core in range(active):
        where = _core_pids(sched.unit, core, per)
        for pid in {p for pids in where.values() for p in pids}:
            b.procs[pid] = f"AIC {pid - AIC_PID}" if pid < AIV_PID else f"AIV {pid - AIV_PID}"
        for wave in range(task_waves):
            task = wave * sched.cores + core
            if task >= sched.tasks:
                break
            s, s_next = body + wave * period, body + (wave + 1) * period
            for pid in where["tasks"]:
                b.add(pid, TASKS_TID, "tasks", f"{name} task {task}", s, s + sched.task_seconds, "task",
                      task=task, wave=wave)
                b.add(pid, TASKS_TID, "tasks", "AICPU", s + sched.task_seconds, s_next, "aicpu", task=task)
            if wave >= tile_waves:
                continue
            for pipe, tile, a, z in slices:
                for pid in where[pipe]:
                    b.add(pid, PIPE_TID[pipe], pipe, f"tile {tile}", s + a, s + z, pipe, task=task, tile=tile)
            if sched.exposed > 0:
                for pid in where["FIXPIPE"]:
                    b.add(pid, PIPE_TID["FIXPIPE"], "FIXPIPE", "L0C drain", s + pipeline,
                          s + pipeline + sched.exposed, "FIXPIPE", task=task)
        rest = sum(1 for w in range(task_waves, sched.waves) if w * sched.cores + core < sched.tasks)
        if rest:
            s = body + task_waves * period
            for pid in where["tasks"]:
                b.add(pid, TASKS_TID, "tasks", f"{name} tasks of waves {task_waves}..{task_waves + rest - 1}",
                      s, body + (task_waves + rest) * period, "task", tasks=rest)
    return end


def kernel_schedules(kernels, profile=None, dtype: str = "bf16", variant: str = None) -> list:
    """((name, Cost), ...) -> [(name, profile, pipes.Schedule), ...], one per kernel: a Cost that
    holds several kernels (its ``kernel_costs()``) gives "name #i" for each."""
    from .profile import load_profile

    prof = load_profile(profile)
    variant = isa.check_variant(variant)
    runs = []
    for name, cost in kernels:
        parts = cost.kernel_costs()
        for i, k in enumerate(parts):
            work = k.work if k.work is not None else pipes.work_of_cost(k, dtype)
            runs.append((name if len(parts) == 1 else f"{name} #{i}", prof,
                         pipes.kernel_schedule(k, work, prof, variant)))
    return runs


def schedules_timeline(runs, max_slices: int = MAX_SLICES, max_task_slices: int = MAX_TASK_SLICES) -> Timeline:
    """The timeline of :func:`kernel_schedules`' kernels, run one after the other."""
    b = _Builder()
    b.procs[CHIP_PID] = "chip"
    notes = []
    budget = max_slices // max(len(runs), 1)
    t = 0.0
    for name, prof, sched in runs:
        t = _kernel(b, name, sched, t, budget, max_task_slices // max(len(runs), 1),
                    max(prof.vector_cores // prof.cube_cores, 1), notes)
    # the estimate's own sum, kernel by kernel, so that the two are the same float
    seconds = sum(sched.seconds for *_, sched in runs)
    profiles = ", ".join(dict.fromkeys(prof.name for _, prof, _ in runs))
    return Timeline(b.events(), seconds, profiles, notes)


def kernels_timeline(kernels, profile=None, dtype: str = "bf16", variant: str = None,
                     max_slices: int = MAX_SLICES) -> Timeline:
    """The timeline of ``kernels``, ((name, Cost), ...) run in order. The makespan is the pipe
    model's, ``sum(cost.estimate(profile, dtype).seconds)``; ``max_slices`` bounds the tile slices."""
    return schedules_timeline(kernel_schedules(kernels, profile, dtype, variant), max_slices)


def plan_timeline(plan, profile=None, variant: str = None) -> Timeline:
    """A :class:`~pypto_numba.machine.plan.Plan`'s kernels as a timeline (its profile unless ``profile``)."""
    where = plan.where
    return kernels_timeline([(f"{where}: {k.name}", k.cost) for k in plan.kernels], profile or plan.profile,
                            plan.dtype, variant)
