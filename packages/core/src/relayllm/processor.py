"""Processors: ``Dataset -> Dataset`` callables that send rows to a named deployment (their
config: :mod:`relayllm.config`)."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any

from relayllm.config import ProcessorConfig, RowFn

if TYPE_CHECKING:
    from ray.data import Dataset


class Processor:
    """Apply with ``processor(dataset)``; lazy like any Ray Data transform."""

    def __init__(
        self,
        config: ProcessorConfig,
        preprocess: RowFn | None = None,
        postprocess: RowFn | None = None,
    ) -> None:
        self.config = config
        self.preprocess = preprocess
        self.postprocess = postprocess
        # Part of every request id, so ids never collide across processors or actors.
        self.processor_id = uuid.uuid4().hex[:12]

    def __call__(self, dataset: Dataset) -> Dataset:
        from ray.data import ActorPoolStrategy, TaskPoolStrategy

        from relayllm.stage.tasks import serve_stage
        from relayllm.stage.udf import ServeStage

        config = self.config
        status = _app_status(config.deployment)
        if status == "RUNNING":
            # A task or feature the running deployment cannot serve fails here, before Ray Data
            # starts a stage (a pool of actors would retry the constructor that raises it).
            _check_served(config)
        stage_kwargs = {
            # One id per application to a dataset: the deployment tells a job's first call
            # from a running job's next one by it (admission's restart).
            "run_id": uuid.uuid4().hex,
            # Running as the job is planned: a stage that finds it gone later (shut down
            # mid-job) fails its rows instead of the job; a name never seen still raises.
            "deployment_seen": status is not None,
            "config": config,
            "processor_id": self.processor_id,
            "preprocess": self.preprocess,
            "postprocess": self.postprocess,
        }
        workers, calls_per_worker, cpus_per_worker = stage_workers(config)
        # preprocess and postprocess run inside the stage (see stage.py): one operator, rows
        # converted from and to Arrow once per batch instead of once per row function.
        common: dict[str, Any] = {
            # One Ray Data batch fills a worker's in-flight slots; the stage splits it into calls.
            "batch_size": config.batch_size * calls_per_worker,
            "batch_format": "pyarrow",
            "zero_copy_batch": True,
            "num_cpus": cpus_per_worker,
        }
        if config.compute == "actors":
            return dataset.map_batches(
                ServeStage,
                fn_constructor_kwargs=stage_kwargs,
                compute=ActorPoolStrategy(size=workers),
                **common,
            )
        _quiet_expected_ray_warnings()
        task_fn: Any = serve_stage  # Ray Data types a one-argument function; fn_kwargs: the rest
        return dataset.map_batches(
            task_fn,
            fn_kwargs=stage_kwargs,
            compute=TaskPoolStrategy(size=workers),
            # Ray Data fuses consecutive task operators into one task, which would run a
            # pipeline's steps one after the other on each block instead of side by side;
            # an operator with a ray_remote_args_fn is never fused.
            ray_remote_args_fn=_no_extra_remote_args,
            **common,
        )

    def __repr__(self) -> str:
        return f"Processor(deployment={self.config.deployment!r}, task={self.config.task!r})"


#: How long the driver waits for a running deployment to describe itself before a job.
DESCRIBE_TIMEOUT_S = 60.0


def _check_served(config: ProcessorConfig) -> None:
    """The running deployment serves the task and features of ``config``; a replica that
    does not answer in time is named as what was waited for (Serve's own TimeoutError says
    only "Timed out resolving to ObjectRef")."""
    from relayllm.deployments import check_task_served
    from relayllm.rows import features_of

    features = features_of(config.sampling_params)
    try:
        check_task_served(config.deployment, config.task, DESCRIBE_TIMEOUT_S, features)
    except TimeoutError as exc:
        raise TimeoutError(
            f"no replica of deployment {config.deployment!r} answered within "
            f"{DESCRIBE_TIMEOUT_S:.0f} s when asked which tasks it serves (before the job "
            f"starts); Serve lists it as running. `relayllm status` shows its replicas. "
            f"({exc or type(exc).__name__})"
        ) from exc


def _running(deployment: str) -> bool:
    """Whether ``deployment`` runs now (False when that cannot be told: Serve not started)."""
    return _app_status(deployment) is not None


def _app_status(deployment: str) -> str | None:
    """The Serve application status of ``deployment`` (``RUNNING``, ``DEPLOYING``...), None
    when it is not there or that cannot be told (Serve not started, driver not connected)."""
    import ray

    if not ray.is_initialized():  # not connected yet: this check must not connect the driver
        return None
    try:
        from ray import serve

        from relayllm.deployments import app_name

        app = serve.status().applications.get(app_name(deployment))
    except Exception:  # the controller unreachable: the stages check again when they start
        return None
    return None if app is None else str(getattr(app.status, "value", app.status))


def stage_workers(config: ProcessorConfig) -> tuple[int, int, float]:
    """How many stage actors or tasks run at once, the calls each keeps in flight, and the
    CPUs each reserves.

    An actor takes the next Ray Data batch's calls as its slots free. A task works on one
    batch and waits for every call of it before the next, so its pre/postprocessing never
    overlaps its own calls: two tasks per unit of concurrency, sharing the unit's calls in
    flight and its CPUs, get that overlap back with the same calls and CPUs reserved. With
    ``order_by_prefix`` a unit keeps one task: the rows sorted together are one Ray Data
    batch, and halving it would halve how many rows can share a call's prefix."""
    if config.compute == "actors":
        return config.concurrency, config.max_in_flight_batches, config.num_cpus
    per_unit = 2 if config.max_in_flight_batches >= 2 and not config.order_by_prefix else 1
    return (
        config.concurrency * per_unit,
        config.max_in_flight_batches // per_unit,
        config.num_cpus / per_unit,
    )


def _quiet_expected_ray_warnings() -> None:
    """Two warnings Ray Data prints for the stage as tasks on every run, neither news to its
    user: that a small input (fewer blocks than the stage's tasks) launches fewer tasks than
    allowed, and that ``ray_remote_args_fn`` -- which keeps a pipeline's steps from fusing
    (see ``Processor.__call__``) -- is deprecated for Ray 2.64, a move for relayllm to make
    (docs/architecture.md), not the user."""
    import warnings

    warnings.filterwarnings(
        "ignore",
        message=r"The maximum number of concurrent tasks for 'MapBatches\(serve_stage\)'",
        category=UserWarning,
    )
    warnings.filterwarnings(  # attributed to this module's map_batches call only
        "ignore", message=r"`ray_remote_args_fn` is deprecated", module=r"relayllm\.processor"
    )


def _no_extra_remote_args() -> dict[str, Any]:
    return {}


def build_processor(
    config: ProcessorConfig,
    preprocess: RowFn | None = None,
    postprocess: RowFn | None = None,
) -> Processor:
    """A processor for ``config``. Pure: nothing touches the cluster until the dataset runs."""
    if not isinstance(config, ProcessorConfig):
        raise TypeError(f"build_processor takes a ProcessorConfig, got {type(config).__name__}")
    return Processor(config, preprocess, postprocess)


__all__ = ["Processor", "build_processor", "stage_workers"]
