"""``pypto-numba report``: the strategy pages in ``strategies/``, regenerated from the code.

The package, by concern: ``scenarios`` (scenarios.toml), ``pricing`` (plans per scenario and sweep
point), ``markdown`` (tables and pages), ``charts`` (SVG), ``measuring`` (compare() runs),
``check`` (``--check``) and ``driver`` (:func:`generate`, the progress bar). Nothing in it is per
op: an op's scenarios are its rows in scenarios.toml, its advise keywords come from its OP spec.

Input: ``strategies/scenarios.toml`` (canonical model shapes per op). Output, in the same folder:

- ``strategy-comparison.md``: the seed's summary table (op, preferred, alternative, deciding
  criterion) with ``advise()``'s choice per scenario beside it, then every scenario's strategies
  with estimated NPU time, GM bytes, kernels, workspace and UB peak from their plans, then a
  measured section (compare() on small shapes: PASS/FAIL, errors, CPU time);
- ``<op>.md`` per op: per scenario the advice and its reasons, the plan table, a sweep over the
  scenario's axis (GM bytes and estimated NPU time per strategy, where a plan stops fitting with
  its TileError message) and the measured precision per strategy and dtype;
- ``charts/<scenario>-sweep.svg`` (plans only) and ``charts/<scenario>-precision.svg`` (measured).

Two kinds of content, kept apart so that CI can check the pages:

- plan-derived (tables, advice, sweep charts): a pure function of the code, the profile and the
  scenarios, byte-deterministic (SVG with a fixed hash salt, no date, text kept as text);
- measured (CPU time, precision, precision charts): lives between ``<!-- measured:begin ID -->``
  and ``<!-- measured:end ID -->`` markers. CPU time varies from run to run and precision depends
  on the BLAS build for the cube ops, so ``--check`` ignores these sections.

``--check`` regenerates the plan-derived content in memory (no kernel runs) and fails when a
page differs outside its measured sections; when matplotlib is importable and is the version that
wrote the committed sweep charts, the charts are compared byte for byte too (the markdown already
holds every number the charts plot, so ``--check`` needs no matplotlib). ``--no-measure`` rewrites
the plan-derived content and keeps the measured sections already on disk.

Every profile number comes from the default profile (``ascend910b``), whatever
``PYPTO_NUMBA_PROFILE`` says, so that the pages do not depend on the environment.
"""

from .charts import (
    COLORS,
    PLOT_HINT,
    RC,
    axis_x,
    precision_svg,
    svg_matplotlib_version,
    sweep_svg,
    _sweep_svg,
)
from .check import MEASURED_RE, _check, old_measured, strip_measured
from .driver import Progress, generate
from .markdown import (
    CHARTS,
    HEADER,
    NOT_MEASURED,
    PAGE,
    PLAN_HEAD,
    cell,
    fit_lines,
    fmt_bytes,
    fmt_call,
    fmt_us,
    measured_block,
    measured_lines,
    measured_table,
    op_page,
    plan_rows,
    short_error,
    summary_measured,
    summary_page,
    sweep_table,
    table,
)
from .measuring import Run, environment_line, measure
from .pricing import Point, PlanResult, Priced, advise_or_none, plan_scenario, price_all
from .scenarios import Scenario, Sweep, at, load_scenarios
