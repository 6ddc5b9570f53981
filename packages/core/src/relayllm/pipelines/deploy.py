"""Deploy what a pipeline file declares, and shut down only what this run started: the
deployments' session (:func:`relayllm.deployments.session.deployed_configs`) with the
pipeline's own fit check (its engines, stage workers and tasks together).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from relayllm.deployments.session import OnDeploy, deployed_configs
from relayllm.pipelines.transforms import MAX_TASK_OPERATORS

if TYPE_CHECKING:
    from relayllm.pipelines.pipeline import Pipeline


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
    demands.append(fit.task_demand(MAX_TASK_OPERATORS))
    fit.check_fit_on_cluster(demands)


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
