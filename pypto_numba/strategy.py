"""The strategy registry, the run protocol that counts what kernels do, and ``trace()``.

Every public strategy function is registered with :func:`register` and runs its kernels inside a
:class:`Launch`, which checks the counted work against the plan's kernels and records the call in
every active :func:`trace`. The convention that ties kernels to plans: **every kernel returns the
tuple** ``(tasks, gm_read_bytes, gm_write_bytes, vector_ops, cube_flops)``, counted with integer
``prange`` reductions at the points where the kernel moves or computes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import time

from .exact import exact_active, exact_aware
from .interop import torch_aware
from .machine.cost import Cost
from .machine.plan import Plan

_SPECS: dict = {}  # op name -> its OpSpec (pypto_numba.lab.spec), in the order the ops are imported

# The seed document's recommendation per op, op -> (preferred, alternative, criterion), from each
# op's OpSpec. Measurements in compare/advise are set against these.
SEED: dict = {}


def register_op(spec):
    """Add an op's OpSpec (called when the spec is created, at the end of its module)."""
    _SPECS[spec.name] = spec
    SEED[spec.name] = tuple(spec.seed)


def __getattr__(name):
    if name == "OPS":  # the op names, in the order pypto_numba/__init__.py imports the ops
        return tuple(_SPECS)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def spec(op: str, who: str = None):
    """The OpSpec of ``op``; an unknown op raises PyptoNumbaError (prefixed ``who:`` when given)."""
    if op not in _SPECS:
        from .errors import PyptoNumbaError

        raise PyptoNumbaError(f"{who}: unknown op {op!r}; known: {', '.join(_SPECS)}" if who else
                              f"unknown op {op!r}; known ops: {', '.join(_SPECS)}")
    return _SPECS[op]


def specs() -> list:
    """Every op's OpSpec, in order."""
    return list(_SPECS.values())


@dataclasses.dataclass(frozen=True)
class Strategy:
    """A registered strategy: its op, name, public function and plan function."""

    op: str
    name: str
    fn: object
    plan: object
    summary: str = ""

    @property
    def qualname(self) -> str:
        return f"{self.op}.{self.name}"

    @property
    def recommended(self) -> bool:
        """Whether the seed document recommends this strategy for its op."""
        return SEED.get(self.op, (None,))[0] == self.name

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


_REGISTRY: dict = {}


def register(op: str, name: str, *, plan, summary: str = ""):
    """Decorator registering ``fn`` as strategy ``op.name``; attaches ``fn.plan`` and ``fn.strategy``.

    The registered function is ``fn`` wrapped by :func:`~pypto_numba.exact.exact_aware` (inputs
    widened to fp32 under ``use_exact()``), then by :func:`~pypto_numba.interop.torch_aware` (CPU
    torch tensors in, torch tensors out; ``functools.wraps`` keeps the name, docstring and signature).
    """

    def wrap(fn):
        fn = exact_aware(fn, f"{op}.{name}")  # fp32-widened inputs under use_exact() (pypto_numba/exact.py)
        fn = torch_aware(fn, f"{op}.{name}")  # torch tensors in and out (pypto_numba/interop.py)
        entry = Strategy(op=op, name=name, fn=fn, plan=plan, summary=summary or (fn.__doc__ or "").strip().split("\n")[0])
        _REGISTRY.setdefault(op, {})[name] = entry
        fn.plan = plan
        fn.strategy = entry
        return fn

    return wrap


def strategies(op: str = None):
    """The registry. ``strategies()`` -> {op: [Strategy, ...]}; ``strategies(op)`` -> [Strategy, ...].

    Each Strategy has ``.name``, ``.fn``, ``.plan``, ``.summary`` and ``.recommended`` (the seed's
    choice); ``SEED[op]`` holds the seed's preferred/alternative/criterion.
    """
    if op is None:
        return {o: list(_REGISTRY[o].values()) for o in _SPECS if o in _REGISTRY}
    if op not in _REGISTRY:
        from .errors import PyptoNumbaError

        raise PyptoNumbaError(f"unknown op {op!r}; known ops: {', '.join(o for o in _SPECS if o in _REGISTRY)}")
    return list(_REGISTRY[op].values())


def get(op: str, name: str) -> Strategy:
    """The strategy ``op.name``."""
    for entry in strategies(op):
        if entry.name == name:
            return entry
    from .errors import PyptoNumbaError

    raise PyptoNumbaError(
        f"unknown strategy {op}.{name}; {op} has: {', '.join(e.name for e in strategies(op))}"
    )


# ---------------------------------------------------------------------------------------------
# trace


@dataclasses.dataclass(frozen=True)
class Record:
    """One call of a strategy: what it ran on, what it counted, what its plan predicted."""

    op: str
    strategy: str
    shapes: tuple
    dtype: str
    cost: Cost
    planned: Cost
    seconds: float
    profile: str
    params: dict = dataclasses.field(default_factory=dict)
    plan: Plan = dataclasses.field(default=None, repr=False, compare=False)  # the kernels' plan
    exact: bool = False  # run under use_exact(): fp32 storage, priced as fp32 (pypto_numba/exact.py)


class Trace:
    """Records of every strategy call made while the trace was active."""

    def __init__(self):
        self.records = []

    @property
    def total(self) -> Cost:
        """The summed counted Cost of all records."""
        return sum((r.cost for r in self.records), Cost())

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.records)

    def __len__(self):
        return len(self.records)

    def timeline(self, profile=None, variant: str = None):
        """The pipe model's schedule of every recorded call, in call order, as a Chrome / Perfetto
        trace (:class:`~pypto_numba.machine.timeline.Timeline`). Each call is priced on the profile it
        ran with unless ``profile`` is given; the makespan is the sum of
        ``record.cost.estimate(profile or record.profile, record.dtype).seconds``."""
        from .errors import PyptoNumbaError
        from .machine.timeline import kernel_schedules, schedules_timeline

        if not self.records:
            raise PyptoNumbaError("trace.timeline: the trace recorded no call; run a strategy inside "
                                  "`with pypto_numba.trace() as t:` first")
        runs = []
        for r in self.records:
            names = [k.name for k in r.plan.kernels] if r.plan is not None else []
            kernels = [(f"{r.op}.{r.strategy}: " + (names[j] if j < len(names) else f"kernel {j}"), k)
                       for j, k in enumerate(r.cost.kernel_costs())]
            runs += kernel_schedules(kernels, profile or r.profile, r.dtype, variant)
        return schedules_timeline(runs)


_TRACES: contextvars.ContextVar = contextvars.ContextVar("pypto_numba_traces", default=())


@contextlib.contextmanager
def trace():
    """``with trace() as t:`` records every strategy call in ``t.records`` (nested traces too)."""
    t = Trace()
    token = _TRACES.set(_TRACES.get() + (t,))
    try:
        yield t
    finally:
        _TRACES.reset(token)


# ---------------------------------------------------------------------------------------------
# running kernels


class Launch:
    """Runs one call of a strategy: collects each kernel's counted work, then records the call.

    ``with Launch(plan, shapes) as run: run.count(kernel(...))`` -- one ``count`` per kernel, in
    the order of ``plan.kernels``. Buffer peaks come from the plan's kernel (the kernels run with
    the plan's tiles); tasks, GM bytes, vector ops and cube FLOPs come from the kernel itself.
    """

    def __init__(self, plan: Plan, shapes):
        self.plan = plan
        self._shapes = shapes  # normalised only when a trace records the call (see shapes)
        self._costs = []
        self._extra_workspace = 0

    def count(self, counted, *, workspace_bytes: int = 0):
        """Record the next kernel's counters ``(tasks, gm_read, gm_write, vector_ops, cube_flops)``."""
        if len(self._costs) >= len(self.plan.kernels):
            raise RuntimeError(f"{self.plan.where}: more kernels ran than the plan declares")
        values = tuple(map(int, counted))
        if len(values) != 5 or min(values) < 0 or workspace_bytes < 0:  # e.g. an overflowed counter
            raise RuntimeError(f"{self.plan.where}: bad count {values}, workspace {workspace_bytes}")
        # kept raw: the Cost is built only when a trace asks for it (this runs on every call)
        self._costs.append((values, int(workspace_bytes)))

    def workspace(self, nbytes: int):
        """Extra GM workspace of the call that no single kernel owns (e.g. a contiguous copy)."""
        self._extra_workspace += int(nbytes)

    @property
    def shapes(self) -> tuple:
        """The call's input shapes, as tuples of ints."""
        return tuple(tuple(map(int, s)) for s in self._shapes)

    @property
    def counted(self) -> Cost:
        costs = []
        for index, ((tasks, gm_read, gm_write, vector_ops, cube_flops), workspace) in enumerate(self._costs):
            costs.append(dataclasses.replace(
                self.plan.kernels[index].cost,  # buffer peaks: the kernel runs with the plan's tiles
                tasks=tasks,
                gm_read_bytes=gm_read,
                gm_write_bytes=gm_write,
                vector_ops=vector_ops,
                cube_flops=cube_flops,
                workspace_bytes=workspace,
            ))
        total = sum(costs, Cost())
        if self._extra_workspace:
            total = dataclasses.replace(total, workspace_bytes=total.workspace_bytes + self._extra_workspace)
        return total

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, exc_type, exc, tb):
        seconds = time.perf_counter() - self._t0
        if exc_type is not None:
            return False
        traces = _TRACES.get()
        if traces:
            record = Record(
                op=self.plan.op,
                strategy=self.plan.strategy,
                shapes=self.shapes,
                dtype=self.plan.dtype,
                cost=self.counted,
                planned=self.plan.cost,
                seconds=seconds,
                profile=self.plan.profile.name,
                params=dict(self.plan.params),
                plan=self.plan,
                exact=exact_active(),
            )
            for t in traces:
                t.records.append(record)
        return False

