"""Deploy what a run declares, and at its end stop only what this run started.

:func:`deployed_configs` is the one owner of that lifecycle: ``relayllm run`` and
:func:`relayllm.run_pipeline` (through :func:`relayllm.pipelines.deploy.deployed`, which adds
the pipeline's fit check), ``relayllm batch --config`` and :func:`relayllm.run_batch_file`
go through it. (``relayllm serve`` deploys a file's deployments and leaves them up: it needs
no session.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager

from relayllm.deployments.config import DeploymentConfig
from relayllm.deployments.lifecycle import deploy, shutdown
from relayllm.deployments.names import list_deployments

#: ``on_deploy(config, running)`` is called for each deployment before it is deployed
#: (``running``: one of that name is already up and is reused); the context manager it returns
#: is held while the deployment starts, e.g. a progress display's phase.
OnDeploy = Callable[[DeploymentConfig, bool], AbstractContextManager[object]]


@contextlib.contextmanager
def deployed_configs(
    configs: Sequence[DeploymentConfig],
    *,
    fits: Callable[[set[str]], None],
    address: str | None = None,
    keep: bool = False,
    on_deploy: OnDeploy | None = None,
) -> Iterator[list[str]]:
    """Start (or reuse by name and config) every deployment of ``configs`` and yield the
    names this call started; on exit shut those down unless ``keep`` (deployments that were
    running before are never stopped). ``fits(running)`` checks, before any engine starts,
    that what will run fits next to the ones running."""
    running = {r.name for r in list_deployments(address=address)}
    fits(running)
    started: list[str] = []
    try:
        for config in configs:
            reused = config.name in running
            with on_deploy(config, reused) if on_deploy else contextlib.nullcontext():
                deploy(config, address=address)  # a reused one: checks its config
            if not reused:
                started.append(config.name)
        yield started
    finally:
        if not keep:
            for name in started:
                shutdown(name, address=address)


__all__ = ["OnDeploy", "deployed_configs"]
