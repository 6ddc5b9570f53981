"""Running an OpenAI Batch API file of any size: read from disk in blocks, never whole in the
driver. :func:`run_batch_file` is the library's entry point (``relayllm batch`` calls it): the
files and the routing checked before the cluster is touched, the deployments up (started or
reused), then the scanned file's groups run by :func:`relayllm.batch.ray_job.run_scanned`.

The batch's parts, each in a module of its own: the driver's scan
(:mod:`relayllm.batch.scan`), the Ray Data job (:mod:`relayllm.batch.ray_job`), scoring
lines as rows of pairs (:mod:`relayllm.batch.pairs`) and the stop that reaches the stage
workers on every node (:mod:`relayllm.batch.stop`). Their public names are importable from
here too.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayllm.batch.format import default_deployment
from relayllm.batch.output import request_counts
from relayllm.batch.ray_job import groups_of, run_scanned
from relayllm.batch.scan import Done, read_done, scan_batch_file
from relayllm.blocks import stage_batch
from relayllm.errors import ConfigError
from relayllm.pipelines.progress import Progress, renamed
from relayllm.rows import Task

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from relayllm.deployments import DeploymentConfig


@dataclass(frozen=True)
class BatchCounts:
    """OpenAI's ``request_counts`` for a whole file (a resumed run's earlier lines included),
    and where the lines went."""

    total: int
    completed: int
    failed: int
    output: str
    errors: str
    #: Each deployment's ``prompt_tokens`` and ``completion_tokens`` over the lines this run
    #: wrote (a resumed run's earlier lines not included; scoring lines not counted).
    tokens: dict[str, dict[str, int]] = field(default_factory=dict)

    def request_counts(self) -> dict[str, int]:
        return request_counts(self.total, self.completed, self.failed)


@dataclass(frozen=True)
class BatchPlan:
    """What is about to run: the (deployment, task) groups in order, the lines of each."""

    groups: list[tuple[str, Task, int]]
    already_done: int  # lines a resumed run found in its files and does not run again

    @property
    def to_run(self) -> int:
        return sum(lines for _, _, lines in self.groups)


class BatchProgress(Progress):
    """What a batch run shows as it goes (connecting and deploying: :class:`Progress`)."""

    def running(self, plan: BatchPlan) -> AbstractContextManager[Any]:
        """Held while the groups run, one after another."""
        return contextlib.nullcontext()


def run_batch_file(
    path: str | os.PathLike[str],
    *,
    deployment: str | None = None,
    pipeline: str | os.PathLike[str] | None = None,
    output: str | os.PathLike[str],
    errors: str | os.PathLike[str] | None = None,
    resume: bool = False,
    retry_errors: bool = False,
    batch_size: int = 64,
    concurrency: int = 1,
    address: str | None = None,
    progress: BatchProgress | None = None,
    hooks: BatchProgress | None = None,
) -> BatchCounts:
    """Run an OpenAI Batch API file; every line ends up in ``output`` or ``errors`` (default:
    ``OUTPUT.errors.jsonl``), each failure with its reason.

    Exactly one of ``deployment`` (a running deployment's name) or ``pipeline`` (a YAML file
    whose ``deployments:`` are started, or reused, for the run and the ones this call started
    shut down after; a pipeline file or one that declares only deployments). A body's
    ``model`` naming one of them routes its line there. ``resume`` keeps the lines already in
    both files and runs only the others (by ``custom_id``); ``retry_errors`` with it runs the
    errors file's lines again. Everything that can be wrong with the files is found before the
    cluster is touched. ``progress``: a display of the run as it goes (:class:`BatchProgress`;
    ``hooks=``, its old name, until the next release).
    """
    if (deployment is None) == (pipeline is None):
        raise ConfigError("give exactly one of deployment= (a running one) or pipeline= (a file)")
    if retry_errors and not resume:
        raise ConfigError("retry_errors goes with resume: it runs the errors file's lines again")
    if hooks is not None:  # progress='s old name, until the next release
        progress = progress or renamed("run_batch_file(hooks=)", "progress=", hooks)
    progress = progress or BatchProgress()
    output, errors = str(output), str(errors or default_errors_path(str(output)))
    # Read (and a line cut short by a kill trimmed) before the input scan: it skips those.
    done = read_done(output, errors, retry_errors) if resume else Done()
    scan = scan_batch_file(str(path), stage_batch(batch_size), done)
    fields = {"batch_size": batch_size, "concurrency": concurrency}
    declared = None
    if pipeline is not None:
        from relayllm.deployments.file import load_deployments

        declared = load_deployments(pipeline)
        declared.check_backends()
        names = declared.names
        default = default_deployment(names)
        groups_of(scan, names, default)  # routing errors before the cluster
    progress.connect(address)
    with _deployments(declared, deployment, fields, address, progress) as (names, default):
        groups = groups_of(scan, names, default)
        plan = BatchPlan(
            [(d, t, sum(scan.key_lines[k] for k in keys)) for (d, t), keys in groups.items()],
            scan.already,
        )
        mode = "a" if resume else "w"
        try:
            with (
                open(output, mode, encoding="utf-8") as out,
                open(errors, mode, encoding="utf-8") as err,
                progress.running(plan),
            ):
                tokens: dict[str, dict[str, int]] = {}
                counts = run_scanned(scan, names, default, out, err, fields, done, tokens=tokens)
        except (TimeoutError, ConnectionError):
            raise  # OSErrors too, but from the cluster, not the files
        except OSError as exc:  # opening or writing the files (a full disk)
            where = exc.filename or f"{output} or {errors}"
            raise ConfigError(f"cannot write {where}: {exc.strerror or exc}") from None
    return BatchCounts(
        counts["total"], counts["completed"], counts["failed"], output, errors, tokens
    )


@contextlib.contextmanager
def _deployments(
    declared: Any,
    deployment: str | None,
    fields: dict[str, Any],
    address: str | None,
    progress: Progress,
) -> Iterator[tuple[list[str], str | None]]:
    """The deployments to route to and the default one, up for the run."""
    from relayllm import deployments

    if declared is None:
        running = [r.name for r in deployments.list_deployments(address=address)]
        if deployment not in running:
            from relayllm.errors import DeploymentNotFoundError

            raise DeploymentNotFoundError(deployments.not_found_message(str(deployment), running))
        yield running, deployment
        return
    from relayllm.deployments.session import deployed_configs

    def fits(running: set[str]) -> None:
        _check_fit(declared.deployments, running, fields)

    warm_ups: list[StageWarmUp] = []

    def fits_then_warm(running: set[str]) -> None:
        fits(running)
        if any(d.name not in running for d in declared.deployments):  # an engine will start
            warm_ups.append(StageWarmUp.start(fields))  # after the check: it reserves CPU

    names = declared.names
    with deployed_configs(
        declared.deployments, fits=fits_then_warm, address=address, on_deploy=progress.deploying
    ):
        for warm_up in warm_ups:
            warm_up.join()
        yield names, default_deployment(names)


class StageWarmUp:
    """While an engine starts (tens of seconds, one core busy importing it): a tiny Ray Data
    job whose tasks import what the batch's read and stage tasks import, on a thread of the
    driver. The batch's own tasks then run in worker processes that have those modules
    already, Ray Data's helper actors are up, and the driver has imported Ray Data: the rows
    start moving seconds sooner once the engine is ready
    (docs/experiments/batch-vs-vllm-run-batch.md).
    Best effort: a failure is logged and the batch runs as it would have."""

    def __init__(self, workers: int) -> None:
        import threading

        self.thread = threading.Thread(
            target=self._run, args=(workers,), name="relayllm-stage-warm-up", daemon=True
        )

    @classmethod
    def start(cls, fields: dict[str, Any]) -> StageWarmUp:
        from relayllm.config import ProcessorConfig
        from relayllm.processor import stage_workers

        workers, _, _ = stage_workers(ProcessorConfig(deployment="warm-up", **fields))
        warm_up = cls(workers + 1)  # the stage's tasks and the read task
        warm_up.thread.start()
        return warm_up

    def _run(self, workers: int) -> None:
        try:
            import ray.data

            from relayllm.fit import TASK_NUM_CPUS

            dataset = ray.data.range(workers, override_num_blocks=workers).map_batches(
                _import_stage_modules,
                batch_size=None,
                num_cpus=TASK_NUM_CPUS,
                compute=ray.data.TaskPoolStrategy(size=workers),
            )
            dataset.context.enable_progress_bars = False
            for _ in dataset.iter_batches(batch_size=None):
                pass
        except Exception:  # the batch runs without it
            logger.debug("the stage warm-up failed", exc_info=True)

    def join(self, timeout_s: float = 30.0) -> None:
        """Wait for it (normally done long before the engine), at most ``timeout_s``: the
        batch's own job starts after it, not beside it."""
        self.thread.join(timeout_s)


def _import_stage_modules(batch: Any) -> Any:
    """A warm-up task: the modules a batch's read and stage tasks import."""
    import pyarrow  # noqa: F401

    import relayllm.stage.udf  # noqa: F401  (this module's own imports came with the call)

    return batch


def _check_fit(configs: list[DeploymentConfig], running: set[str], fields: dict[str, Any]) -> None:
    """The engines not running yet, the stage and the read task fit on the cluster at once
    (groups run one after another: one stage at a time)."""
    from relayllm import fit
    from relayllm.config import ProcessorConfig
    from relayllm.deployments import engine_demand
    from relayllm.processor import stage_workers

    config = ProcessorConfig(deployment=configs[0].name, **fields)
    workers, _, cpus = stage_workers(config)
    demands = [engine_demand(d) for d in configs if d.name not in running]
    demands.append(fit.stage_demand("batch", cpus, workers, config.compute))
    demands.append(fit.task_demand(1))
    fit.check_fit_on_cluster(demands)


def default_errors_path(output: str) -> str:
    """``OUT.jsonl`` -> ``OUT.errors.jsonl``, next to it."""
    path = Path(output)
    return str(path.with_name(path.name.removesuffix(".jsonl") + ".errors.jsonl"))


def __getattr__(name: str) -> object:
    if name == "BatchHooks":
        return renamed(f"{__name__}.BatchHooks", "BatchProgress", BatchProgress)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BatchCounts",
    "BatchProgress",
    "BatchPlan",
    "StageWarmUp",
    "default_errors_path",
    "run_batch_file",
]
