"""Running a pipeline: :func:`run_pipeline`, the one entry point of the library, ``relayllm
run`` and ``relayllm demo``.

Order of a run: load and check the file, the backends and the input, open the output (and
with ``resume`` read what is already there), all before the cluster is touched; then connect,
deploy (:func:`relayllm.pipelines.deploy.deployed`), run the steps and write every finished
block as it arrives; shut down what the run started.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from relayllm.pipelines.progress import Progress, renamed
from relayllm.pipelines.transforms import (
    FIRST_ERROR,
    build_steps,
    step_prefix,
    visible_rows,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from ray.data import Dataset

    from relayllm.pipelines.pipeline import Pipeline


@dataclass
class StepStats:
    name: str
    deployment: str
    rows: int = 0
    errors: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    engine_s: float = 0.0  # the step's rows' engine time (what the usage ledger charges)
    first_start: float = float("inf")
    last_end: float = 0.0

    @property
    def wall_s(self) -> float:
        return max(self.last_end - self.first_start, 0.0) if self.rows else 0.0

    def rate(self, amount: int) -> float:
        return amount / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class RunSummary:
    steps: list[StepStats]
    rows: int = 0
    errors: int = 0
    wall_s: float = 0.0
    output: str | None = None
    already_done: int = 0  # rows a resumed run found in its output and did not run again
    started: list[str] = field(default_factory=list)
    startup_s: float = 0.0  # loading, checking, connecting and deploying: before the first row
    # The engines' figures over the run (engine time, prefix cache), by deployment.
    engines: dict[str, dict[str, Any]] = field(default_factory=dict)


Sink = Callable[[list[dict[str, Any]]], None]


def execute(
    pipeline: Pipeline,
    dataset: Dataset,
    sink: Sink,
    progress: Callable[[RunSummary], None] | None = None,
) -> RunSummary:
    """Run the steps and hand every finished block of rows to ``sink`` (input order);
    ``progress`` sees the summary so far after each block."""
    from relayllm.data_context import keep_input_order

    keep_input_order()
    steps = pipeline.spec.steps
    summary = RunSummary([StepStats(s.name, s.deployment) for s in steps])
    start = time.time()
    output = build_steps(pipeline, dataset)
    # A dataset runs with the copy of the DataContext taken when it was created (open_dataset
    # ran before this function): input order must be set on that copy.
    keep_input_order(output.context)
    for batch in output.iter_batches(batch_format="pyarrow", batch_size=None):
        count(batch, summary)
        sink(visible_rows(batch))
        summary.rows += batch.num_rows
        if progress:
            progress(summary)
    summary.wall_s = time.time() - start
    return summary


def count(batch: pa.Table, summary: RunSummary) -> None:
    """Add a finished block's numbers (the steps' hidden columns) to ``summary``: column
    arithmetic, so the driver does no per-row work but writing the rows."""
    import pyarrow.compute as pc

    def total(name: str) -> Any:
        return pc.sum(batch.column(name)).as_py() or 0

    for i, stats in enumerate(summary.steps):
        p = step_prefix(i)
        stats.rows += batch.num_rows
        stats.errors += total(f"{p}failed")
        stats.input_tokens += total(f"{p}in")
        stats.output_tokens += total(f"{p}out")
        stats.engine_s += float(total(f"{p}engine"))
        if batch.num_rows:
            stats.first_start = min(stats.first_start, pc.min(batch.column(f"{p}t0")).as_py())
            stats.last_end = max(stats.last_end, pc.max(batch.column(f"{p}t1")).as_py())
    summary.errors += batch.num_rows - batch.column(FIRST_ERROR).null_count


class RunProgress(Progress):
    """What a pipeline run shows as it goes (connecting and deploying: :class:`Progress`)."""

    @contextlib.contextmanager
    def running(
        self, pipeline: Pipeline, total: int | None, already_done: int
    ) -> Iterator[Callable[[RunSummary], None] | None]:
        """Held while the steps run; yields a callback that sees the summary after each block."""
        yield None


def run_pipeline(
    pipeline: Pipeline | str | os.PathLike[str],
    *,
    input: str | None = None,
    output: str | None = None,
    limit: int | None = None,
    resume: bool = False,
    retry_errors: bool = False,
    keep_deployments: bool = False,
    address: str | None = None,
    sink: Sink | None = None,
    progress: RunProgress | None = None,
    hooks: RunProgress | None = None,
) -> RunSummary:
    """Run a pipeline: its steps, in order, on its deployments; returns the per-step summary.

    ``pipeline`` is a pipeline file's path or a loaded :class:`~relayllm.pipelines.Pipeline`.
    ``input`` reads rows from a path instead of the file's input; ``output`` writes them to a
    path (``"-"``: stdout) instead of the file's ``output:``. With ``sink`` (a callable given
    each finished block of rows) and no ``output``, rows go to ``sink`` only; with both, to
    both. ``limit`` runs the first N rows. ``resume`` keeps the rows already in the (JSONL)
    output and runs only the others (see :mod:`relayllm.pipelines.resume`); ``retry_errors``
    with it runs the rows recorded with an error again. Deployments already running under the
    same name and config are reused; the ones this run starts are shut down at the end unless
    ``keep_deployments``. ``address``: the Ray cluster (default ``RAY_ADDRESS``, else a
    local one). ``progress``: a display of the run as it goes (:class:`RunProgress`;
    ``hooks=``, its old name, until the next release).
    """
    from relayllm.errors import ConfigError
    from relayllm.pipelines import resume as resuming
    from relayllm.pipelines.inputs import check_input, count_rows, open_dataset
    from relayllm.pipelines.load import load_pipeline
    from relayllm.pipelines.outputs import open_writer, output_target, stdout_sink
    from relayllm.pipelines.pipeline import Pipeline

    startup = time.monotonic()
    if hooks is not None:  # progress='s old name, until the next release
        progress = progress or renamed("run_pipeline(hooks=)", "progress=", hooks)
    progress = progress or RunProgress()
    if retry_errors and not resume:
        raise ConfigError(
            "--retry-errors goes with --resume: it re-runs the error rows of an output"
        )
    if not isinstance(pipeline, Pipeline):
        pipeline = load_pipeline(pipeline)
    pipeline.check_backends()
    plan = check_input(pipeline, input)  # the one input check: files, rows, columns
    target = None if sink is not None and output is None else output_target(pipeline, output)
    ids, done = resuming.RowIds(None), set[Any]()
    if resume:
        ids, done = resuming.prepare(pipeline, plan, target, retry_errors)
    writer = open_writer(target, append=resume) if target else None
    sinks = [s for s in (writer, sink) if s is not None] or [stdout_sink]

    def write(rows: list[dict[str, Any]]) -> None:
        for each in sinks:
            each(rows)

    try:
        progress.connect(address)
        dataset = open_dataset(pipeline, input, limit, plan=plan)
        if done:
            dataset = resuming.skip_done(dataset, ids, done)
        total = count_rows(pipeline, plan, limit)
        if total is not None and done:
            total = max(total - len(done), 0)
        summary = _run_deployed(
            pipeline, dataset, write, progress, address, keep_deployments, total, len(done), startup
        )
    finally:
        if writer is not None:
            writer.close()
    summary.output = target.path if target else None
    summary.already_done = len(done)
    return summary


def _run_deployed(
    pipeline: Pipeline,
    dataset: Any,
    write: Callable[[list[dict[str, Any]]], None],
    progress: RunProgress,
    address: str | None,
    keep: bool,
    total: int | None,
    already_done: int,
    startup: float,
) -> RunSummary:
    """The steps run on the pipeline's deployments (started here when not running already),
    with the engines' figures read before and after."""
    from relayllm.pipelines import engine_figures
    from relayllm.pipelines.deploy import deployed

    with deployed(pipeline, address=address, keep=keep, on_deploy=progress.deploying) as started:
        startup_s = time.monotonic() - startup
        names = [d.name for d in pipeline.spec.deployments]
        costs = engine_figures.hour_costs()  # a bad price fails before the run, not after
        before = engine_figures.snapshot(names)
        with progress.running(pipeline, total, already_done) as on_block:
            summary = execute(pipeline, dataset, write, progress=on_block)
        after = engine_figures.snapshot(names)
        summary.engines = engine_figures.delta(before, after, costs)
    summary.started = started
    summary.startup_s = startup_s
    return summary


def __getattr__(name: str) -> object:
    if name == "RunHooks":
        return renamed(f"{__name__}.RunHooks", "RunProgress", RunProgress)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
