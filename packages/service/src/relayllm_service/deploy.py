"""Starting the batch service on a cluster (``relayllm serve``): a file's deployments, then the
gateway on Serve's HTTP proxy (which starts the runner); listing and stopping gateways."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relayllm_service.errors import ServiceError
from relayllm_service.settings import ServiceSettings, gateway_name_of
from relayllm_service.tenancy.projects import Keys

logger = logging.getLogger(__name__)

#: The Serve deployment's name inside a gateway's application.
GATEWAY_DEPLOYMENT = "gateway"


@dataclass(frozen=True)
class GatewayRef:
    """A gateway on the cluster: its Serve application, base URL and what it knows."""

    name: str
    app_name: str
    status: str
    url: str | None = None  # the one clients are told: the gateway's own server's, if on
    unfinished: int | None = None  # batches not in a final status
    state_dir: str | None = None
    proxy_url: str | None = None  # through Serve's HTTP proxy


def deploy_gateway(
    settings: ServiceSettings,
    keys: Keys,
    *,
    address: str | None = None,
    timeout_s: float = 120.0,
) -> GatewayRef:
    """Start the gateway ``settings`` describes, or reuse the running one with the same
    settings and keys (another one of the same name is replaced)."""
    from ray import serve

    from relayllm import compat
    from relayllm.cluster import connect, ensure_http_proxy
    from relayllm.compat import HEAD_RESOURCE
    from relayllm.deployments import DeploymentRef, wait_running
    from relayllm_service.gateway.app import GatewayReplica
    from relayllm_service.runner.actor import stop_runner

    connect(address)
    ensure_http_proxy(settings.host, settings.port)
    if settings.app_name in serve.status().applications:
        running = _describe(settings.app_name) or {}
        if (running.get("settings"), running.get("keys")) == _wanted(settings, keys):
            logger.info("reusing the running gateway %r", settings.name)
            return _ref(settings.app_name)
        # Replaced: its runner goes too (the new gateway starts one with its settings).
        for state_dir in {running.get("settings", {}).get("state_dir"), settings.state_dir}:
            if state_dir:
                stop_runner(ServiceSettings(state_dir=state_dir).runner_name)
    deployment: Any = serve.deployment(GatewayReplica)
    app = deployment.options(
        name=GATEWAY_DEPLOYMENT,
        num_replicas=1,
        max_ongoing_requests=256,
        ray_actor_options={"num_cpus": 0, "resources": settings.node_resources or HEAD_RESOURCE},
        logging_config={"enable_access_log": False},
    ).bind(settings, keys)
    compat.run_application(app, settings.app_name, route_prefix=settings.route_prefix)
    ref = DeploymentRef(settings.name, settings.app_name, GATEWAY_DEPLOYMENT, None)
    wait_running(ref, timeout_s)
    return _ref(settings.app_name)


def serve_file(
    path: str | os.PathLike[str],
    settings: ServiceSettings,
    keys: Keys,
    *,
    address: str | None = None,
    on_deploy: Callable[[str, str], None] | None = None,
) -> GatewayRef:
    """Deploy (or reuse) the deployments a YAML file declares and the gateway; they stay up
    after this returns (``relayllm shutdown`` and :func:`shutdown_gateway` stop them).
    ``on_deploy(name, status)`` after each one is up."""
    from relayllm.cluster import connect, ensure_http_proxy
    from relayllm.deployments import deploy
    from relayllm.deployments.file import load_deployments

    declared = load_deployments(path)
    declared.check_backends()
    connect(address)
    # Before any application exists: Serve can still be restarted with its proxy.
    ensure_http_proxy(settings.host, settings.port)
    for config in declared.deployments:
        ref = deploy(config, address=address)
        if on_deploy is not None:
            on_deploy(ref.name, ref.status or "RUNNING")
    return deploy_gateway(settings, keys, address=address)


def list_gateways(*, address: str | None = None, timeout_s: float = 30.0) -> list[GatewayRef]:
    """The batch service gateways on the cluster (the running ones with their URL; each
    given ``timeout_s`` to describe itself; Serve is not started to list them)."""
    from ray import serve

    from relayllm.cluster import connect

    connect(address, start_serve=False)
    found = []
    for app in sorted(serve.status().applications):
        if gateway_name_of(app) is not None:
            found.append(_ref(app, timeout_s))
    return found


def shutdown_gateway(
    name: str | None = None,
    *,
    address: str | None = None,
    stop_runner: bool = True,
    timeout_s: float = 60.0,
) -> list[str]:
    """Stop the gateway ``name`` (every gateway when None) and, with ``stop_runner``, the
    runners no remaining gateway uses (batches in progress resume when a gateway on the same
    state starts again)."""
    from ray import serve

    from relayllm_service.runner import actor as runners

    gateways = list_gateways(address=address)
    stopped = [g for g in gateways if name is None or g.name == name]
    if stop_runner:
        for runner in runners_to_stop(stopped, [g for g in gateways if g not in stopped]):
            runners.stop_runner(runner)
    for ref in stopped:
        serve.delete(ref.app_name, _blocking=False)  # all at once, then wait for them
    deadline = time.monotonic() + timeout_s
    while any(r.app_name in serve.status().applications for r in stopped):
        if time.monotonic() > deadline:
            raise ServiceError(f"the gateways did not stop within {timeout_s:.0f}s")
        time.sleep(0.2)
    return [r.name for r in stopped]


def runners_to_stop(
    stopped: list[GatewayRef],
    remaining: list[GatewayRef],
    running: Callable[[], list[str]] | None = None,
) -> list[str]:
    """The runner names to stop with the ``stopped`` gateways: theirs, unless a ``remaining``
    gateway uses the same state. A stopped gateway that could not describe itself (unhealthy)
    names no state: then every runner running (``running()``, found by name in the runners'
    namespace) that no remaining gateway uses, unless a remaining gateway cannot tell its
    state either (then nothing unknown is stopped: it might be that one's)."""
    runner = lambda state_dir: ServiceSettings(state_dir=state_dir).runner_name  # noqa: E731
    keep = {runner(g.state_dir) for g in remaining if g.state_dir}
    names = {runner(g.state_dir) for g in stopped if g.state_dir}
    if any(not g.state_dir for g in stopped):
        if any(not g.state_dir for g in remaining):
            logger.warning("a gateway did not tell its state: its runner is left running")
        else:
            names.update((running or _running_runners)())
    return sorted(names - keep)


def _running_runners() -> list[str]:
    """The runners' actor names running on the cluster (named in their own namespace)."""
    import ray

    from relayllm_service.runner.actor import RUNNER_NAMESPACE

    prefix = ServiceSettings().runner_name.rsplit("-", 1)[0] + "-"
    return sorted(
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor.get("namespace") == RUNNER_NAMESPACE and actor["name"].startswith(prefix)
    )


def _wanted(settings: ServiceSettings, keys: Keys) -> tuple[dict[str, Any], str]:
    return settings.model_dump(mode="json"), keys.fingerprint


def _describe(app: str, timeout_s: float = 30.0) -> dict[str, Any] | None:
    from ray import serve

    try:
        handle = serve.get_deployment_handle(GATEWAY_DEPLOYMENT, app)
        described: dict[str, Any] = handle.describe.remote().result(timeout_s=timeout_s)
        return described
    except Exception:  # a sick gateway: replaced, or listed with its status
        logger.warning("gateway %s did not describe itself", app, exc_info=True)
        return None


def _ref(app: str, timeout_s: float = 30.0) -> GatewayRef:
    from ray import serve

    status = serve.status().applications.get(app)
    text = str(status.status).rsplit(".", 1)[-1] if status else "MISSING"
    name = gateway_name_of(app) or app
    described = _describe(app, timeout_s) if text == "RUNNING" else None
    if not described:
        return GatewayRef(name, app, text)
    settings = described["settings"]
    return GatewayRef(
        name,
        app,
        text,
        described.get("url"),
        described.get("unfinished"),
        settings.get("state_dir"),
        described.get("proxy_url"),
    )


__all__ = [
    "GATEWAY_DEPLOYMENT",
    "GatewayRef",
    "deploy_gateway",
    "list_gateways",
    "runners_to_stop",
    "serve_file",
    "shutdown_gateway",
]
