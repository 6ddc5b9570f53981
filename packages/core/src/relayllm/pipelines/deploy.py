"""Deploy what a pipeline file declares, and shut down only what this run started.

:func:`deployed` is the one owner of that lifecycle: ``relayllm run``, ``relayllm batch
--config`` and :func:`relayllm.run_pipeline` all go through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from relayllm.pipelines.transforms import task_operators

if TYPE_CHECKING:
    from relayllm.deployments import DeploymentConfig
    from relayllm.pipelines.pipeline import Pipeline

#: ``on_deploy(config, running)`` is called for each deployment before it is deployed
#: (``running``: one of that name is already up and is reused); the context manager it returns
#: is held while the deployment starts, e.g. a progress display's phase.
OnDeploy = Callable[["DeploymentConfig", bool], AbstractContextManager[object]]


def check_fit(pipeline: Pipeline, running: set[str] | None = None) -> None:
    """Fail before any engine starts if the pipeline's engines (those not ``running``
    already), stage actors and tasks cannot all be scheduled at once on the cluster.
    Needs a connection to Ray; :class:`relayllm.ResourceFitError` says what to change."""
    from relayllm import fit
    from relayllm.deployments import engine_demand
    from relayllm.processor import stage_workers

    running = running or set()
    demands = [engine_demand(d) for d in pipeline.spec.deployments if d.name not in running]
    for step in pipeline.spec.steps:
        config = step.processor_config()
        workers, _, cpus = stage_workers(config)
        demands.append(fit.stage_demand(step.name, cpus, workers, config.compute))
    demands.append(fit.task_demand(task_operators(pipeline)))
    free, total, nodes = fit.cluster_view()
    fit.check_fit(demands, free, total, nodes)


def deployed(
    pipeline: Pipeline,
    *,
    address: str | None = None,
    keep: bool = False,
    on_deploy: OnDeploy | None = None,
) -> AbstractContextManager[list[str]]:
    """Start (or reuse by name and config) every deployment of ``pipeline`` and yield the names
    this call started; on exit shut those down unless ``keep`` (deployments that were running
    before are never stopped). First checks that the whole pipeline fits on the cluster
    (:func:`check_fit`), before any engine starts."""
    return deployed_configs(
        pipeline.spec.deployments,
        fits=lambda running: check_fit(pipeline, running),
        address=address,
        keep=keep,
        on_deploy=on_deploy,
    )


@contextlib.contextmanager
def deployed_configs(
    configs: Sequence[DeploymentConfig],
    *,
    fits: Callable[[set[str]], None],
    address: str | None = None,
    keep: bool = False,
    on_deploy: OnDeploy | None = None,
) -> Iterator[list[str]]:
    """:func:`deployed` for any list of deployments (a batch file's, say): ``fits(running)``
    checks, before any engine starts, that what will run fits next to the ones running."""
    from relayllm import deployments

    running = {r.name for r in deployments.list_deployments(address=address)}
    fits(running)
    started: list[str] = []
    try:
        for config in configs:
            reused = config.name in running
            with on_deploy(config, reused) if on_deploy else contextlib.nullcontext():
                deployments.deploy(config, address=address)  # a reused one: checks its config
            if not reused:
                started.append(config.name)
        yield started
    finally:
        if not keep:
            for name in started:
                deployments.shutdown(name, address=address)
