"""Deploy what a pipeline file declares, and shut down only what this run started.

:func:`deployed` is the one owner of that lifecycle: ``relayllm run``, ``relayllm batch
--config`` and :func:`relayllm.run_pipeline` all go through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from relayllm.pipelines.transforms import task_operators

if TYPE_CHECKING:
    from relayllm.deployments import DeploymentConfig
    from relayllm.pipelines.load import Pipeline

#: ``on_deploy(config, running)`` is called for each deployment before it is deployed
#: (``running``: one of that name is already up and is reused); the context manager it returns
#: is held while the deployment starts, e.g. a progress display's phase.
OnDeploy = Callable[["DeploymentConfig", bool], AbstractContextManager[object]]


def check_fit(pipeline: Pipeline, running: set[str] | None = None) -> None:
    """Fail before any engine starts if the pipeline's engines (those not ``running``
    already), stage actors and tasks cannot all be scheduled at once on the cluster.
    Needs a connection to Ray; :class:`relayllm.ResourceFitError` says what to change."""
    from relayllm import resources
    from relayllm.processor import stage_workers

    running = running or set()
    demands = [
        resources.engine_demand(d) for d in pipeline.spec.deployments if d.name not in running
    ]
    for step in pipeline.spec.steps:
        config = step.processor_config()
        workers, _, cpus = stage_workers(config)
        demands.append(resources.stage_demand(step.name, cpus, workers, config.compute))
    demands.append(resources.task_demand(task_operators(pipeline)))
    free, total, nodes = resources.cluster_view()
    resources.check_fit(demands, free, total, nodes)


@contextlib.contextmanager
def deployed(
    pipeline: Pipeline,
    *,
    address: str | None = None,
    keep: bool = False,
    on_deploy: OnDeploy | None = None,
) -> Iterator[list[str]]:
    """Start (or reuse by name and config) every deployment of ``pipeline`` and yield the names
    this call started; on exit shut those down unless ``keep`` (deployments that were running
    before are never stopped). First checks that the whole pipeline fits on the cluster
    (:func:`check_fit`), before any engine starts."""
    from relayllm import deployments

    running = {r.name for r in deployments.list_deployments(address=address)}
    check_fit(pipeline, running)
    started: list[str] = []
    try:
        for config in pipeline.spec.deployments:
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
