"""Starting and stopping deployments: :func:`deploy` (start, or reuse the running one of
the same name and config; another config under the name is an error with a diff),
:func:`wait_running` and :func:`shutdown`.
"""

from __future__ import annotations

import difflib
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from relayllm import compat, fit
from relayllm.deployments.config import (
    DeploymentConfig,
    build_application,
    normalized_config,
    resolve,
    serve_options,
)
from relayllm.deployments.names import DeploymentRef, app_name, get_deployment, list_deployments
from relayllm.errors import DeploymentConflictError, DeploymentStartError
from relayllm.serving.control_state import drop_state

if TYPE_CHECKING:
    from pydantic import BaseModel

    from relayllm.backend import Backend

logger = logging.getLogger(__name__)

#: Seconds between checks of an application's status while it starts or is deleted.
POLL_S = 0.2


def deploy(config: DeploymentConfig, *, address: str | None = None) -> DeploymentRef:
    """Start the deployment, or reuse the running one of the same name and config."""
    from ray import serve

    from relayllm.cluster import connect

    backend, options = resolve(config)
    wanted = normalized_config(config, backend, options)
    connect(address)
    ref = DeploymentRef(config.name, app_name(config.name), config.name, config.backend)
    if ref.app_name in serve.status().applications:
        running = ref.handle().describe.remote().result(timeout_s=config.startup_timeout_s)
        if running == wanted:
            logger.info("reusing running deployment %r", config.name)
            return _with_status(ref)
        raise DeploymentConflictError(
            f"a deployment named {config.name!r} is running with a different config; "
            f"shut it down first (relayllm.shutdown({config.name!r})) or pick another name.\n"
            + _diff(running, wanted)
        )
    _check_fits(backend, config, options)
    route_prefix = None
    if config.http is not None:
        from relayllm.cluster import ensure_http_proxy

        ensure_http_proxy(config.http.host, config.http.port)
        route_prefix = config.http.prefix_for(config.name)
    app = build_application(backend, config, options)
    drop_state(config.name)  # a new deployment of the name starts unpaused, whatever ran before
    # Submitted without waiting (serve.run() has no time limit), so the start-up is bounded.
    compat.run_application(app, ref.app_name, route_prefix=route_prefix)
    wait_running(ref, config.startup_timeout_s)
    return _with_status(ref)


def _check_fits(backend: type[Backend], config: DeploymentConfig, options: BaseModel) -> None:
    """Fail before anything starts when the replicas ask for more than the cluster's nodes
    have (not what is free: a replica may wait for running work to end)."""
    demand = fit.engine_demand(config.name, serve_options(backend, config, options))
    _, total, nodes = fit.cluster_view()
    fit.check_fit([demand], None, total, nodes, subject=f"deployment {config.name!r}")


def wait_running(ref: DeploymentRef, timeout_s: float) -> None:
    """Wait until ``ref``'s application runs; one that fails to start, or is not running
    within ``timeout_s``, is deleted and raises :class:`DeploymentStartError` with Serve's
    reason (the batch service's gateway starts the same way)."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        app = serve.status().applications.get(ref.app_name)
        status = str(app.status) if app else "MISSING"
        if status.endswith("RUNNING"):
            return
        if status.endswith(("DEPLOY_FAILED", "UNHEALTHY", "MISSING")):
            message = app.message if app else "the application disappeared"
            details = ""
            if app:
                details = "; ".join(
                    d.message for d in app.deployments.values() if getattr(d, "message", "")
                )
            _delete_quietly(ref.app_name)
            raise DeploymentStartError(
                f"deployment {ref.name!r} failed to start: {details or message or status}"
            )
        if time.monotonic() > deadline:
            _delete_quietly(ref.app_name)
            raise DeploymentStartError(
                f"deployment {ref.name!r} did not start within {timeout_s:.0f}s "
                f"(status {status}); raise startup_timeout_s if the engine is just slow"
            )
        time.sleep(POLL_S)


def _delete_quietly(app: str) -> None:
    try:
        _delete(app)
    except Exception:  # cleanup after a failure must not hide the failure
        logger.exception("could not delete %s", app)


def _with_status(ref: DeploymentRef) -> DeploymentRef:
    return next((running for running in list_deployments() if running.name == ref.name), ref)


def shutdown(name: str | None = None, *, address: str | None = None) -> list[str]:
    """Stop the named deployment (or every relayllm deployment); returns the names stopped."""

    refs = [get_deployment(name, address=address)] if name else list_deployments(address=address)
    for ref in refs:
        replicas = _replica_actors(ref)
        _delete(ref.app_name)
        _wait_gone(replicas)
        drop_state(ref.name)  # its replicas are gone: so is their control state
    return [ref.name for ref in refs]


def _replica_actors(ref: DeploymentRef) -> list[str]:
    """The actor names of a deployment's replicas (none known: an unhealthy deployment)."""
    try:
        return [actor for _, actor in compat.running_replicas(ref.app_name, ref.deployment_name)]
    except Exception:
        return []


def _wait_gone(actors: list[str], timeout_s: float = 30.0) -> None:
    """Until the replica actors are dead, so what they held is free when ``shutdown``
    returns: the application leaves Serve's status before its replicas' processes exit, and
    a deploy right after (the next run's fit check) would count their resources as taken."""
    import ray

    deadline = time.monotonic() + timeout_s
    for actor in actors:
        while time.monotonic() < deadline:
            try:
                ray.get_actor(actor, namespace="serve")  # Serve's actors' namespace
            except ValueError:
                break
            time.sleep(POLL_S)


def _delete(app: str, timeout_s: float = 60.0) -> None:
    """Delete a Serve application and wait until it is gone. (``serve.delete`` waits too, but
    checks once a second: most of a quick shutdown's time.)"""
    from ray import serve

    serve.delete(app, _blocking=False)
    deadline = time.monotonic() + timeout_s
    while app in serve.status().applications:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Serve application {app!r} still there after {timeout_s:.0f}s")
        time.sleep(POLL_S)


def _diff(running: dict[str, Any], wanted: dict[str, Any]) -> str:
    a = json.dumps(running, indent=2, sort_keys=True).splitlines()
    b = json.dumps(wanted, indent=2, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "running", "requested", lineterm=""))


__all__ = ["POLL_S", "deploy", "shutdown", "wait_running"]
