"""Shared deployments by name: the one module that knows how a name maps to a Serve app, and
how a backend and a config become that app (:func:`build_application`).

A relayllm deployment named ``NAME`` is the Serve application ``relayllm-NAME`` holding one
Serve deployment called ``NAME``. Any driver connected to the cluster finds it by name.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from relayllm import compat, fit
from relayllm.config import ConfigModel
from relayllm.errors import (
    ConfigError,
    DeploymentConflictError,
    DeploymentNotFoundError,
    DeploymentStartError,
)
from relayllm.placement import PLACEMENT_FIELD, Placement, apply_placement
from relayllm.routing import ROUTING_FIELD, Routing, routing_options
from relayllm.serving.admission import AdmissionConfig
from relayllm.serving.control_state import drop_state
from relayllm.serving.http_config import HttpConfig

if TYPE_CHECKING:
    from ray.serve import Application
    from ray.serve.handle import DeploymentHandle

    from relayllm.backend import Backend
    from relayllm.serving.controller import Controller

logger = logging.getLogger(__name__)

APP_PREFIX = "relayllm-"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$")


class DeploymentConfig(ConfigModel):
    """One named, shareable engine. ``options`` are checked by the backend's own model."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Name processors use to find this deployment.")
    backend: str = Field(description="Backend name, e.g. 'vllm', 'openai', 'sglang'.")
    options: dict[str, Any] = Field(
        default_factory=dict, description="Backend options, checked by the backend's own model."
    )
    num_replicas: PositiveInt = Field(
        default=1, description="Replicas of the engine (ignored with autoscaling_config)."
    )
    max_ongoing_requests: PositiveInt = Field(
        default=8, description="Batches one replica works on at once: the global admission limit."
    )
    autoscaling_config: dict[str, Any] | None = Field(
        default=None,
        description="Serve's autoscaling_config (min_replicas, max_replicas, ...): replicas "
        "follow the load instead of num_replicas.",
    )
    ray_actor_options: dict[str, Any] | None = Field(
        default=None,
        description="Ray actor options of each replica (num_cpus, num_gpus, resources, ...), "
        "over the backend's own.",
    )
    startup_timeout_s: float = Field(
        default=900.0,
        gt=0,
        description="How long deploy() waits for the replicas to be running (model download "
        "and load included) before it fails.",
    )
    health_check_period_s: float = Field(
        default=10.0, gt=0, description="Serve's interval between health checks of a replica."
    )
    health_check_timeout_s: float = Field(
        default=30.0,
        gt=0,
        description="A health check unanswered this long marks the replica unhealthy "
        "(Serve replaces it).",
    )
    http: HttpConfig | None = Field(
        default=None,
        description="Serve an OpenAI-compatible HTTP API from these replicas too "
        "(interactive traffic on the engine the batch processors share).",
    )
    routing: Routing = ROUTING_FIELD
    placement: Placement = PLACEMENT_FIELD
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="How batch rows yield to interactive requests (deployments with http): "
        "the interactive TTFT target and the limits of the batch rows in the engine.",
    )

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _NAME.match(value):
            raise ValueError(
                "must start with a letter or digit and contain only letters, digits, '_', '.', '-'"
            )
        return value


@dataclass(frozen=True)
class DeploymentRef:
    """Where a named deployment lives in Serve."""

    name: str
    app_name: str
    deployment_name: str
    backend: str | None = None
    status: str | None = None

    def handle(self) -> DeploymentHandle[Any]:
        from ray import serve

        return serve.get_deployment_handle(self.deployment_name, self.app_name)


def app_name(name: str) -> str:
    return f"{APP_PREFIX}{name}"


def resolve(config: DeploymentConfig) -> tuple[type[Backend], BaseModel]:
    """The backend class and validated options for ``config``. No cluster is touched: bad
    config fails here, before any engine starts."""
    from relayllm.plugin.manager import get_registry

    backend = get_registry().get(config.backend)
    options = backend.parse_options(config.options)
    backend.check_requirements()
    backend.check_options(options)
    return backend, options


def normalized_config(
    config: DeploymentConfig, backend: type[Backend], options: BaseModel
) -> dict[str, Any]:
    """The config as a replica reports it: options with their defaults filled in, and the
    tasks these options serve (so a stage can check its task without the backend's plugin)."""
    return {
        **config.model_dump(mode="json"),
        "options": options.model_dump(mode="json"),
        "tasks": sorted(backend.tasks_for(options)),
        "features": sorted(backend.features_for(options)),
    }


#: Seconds between a stopping replica's checks for calls still running.
SHUTDOWN_CHECK_PERIOD_S = 0.2
#: Seconds between checks of an application's status while it starts or is deleted.
POLL_S = 0.2


def build_application(
    backend: type[Backend], config: DeploymentConfig, options: BaseModel
) -> Application:
    """Turn a backend + config into a Serve application (pure: nothing runs yet)."""
    from ray import serve

    from relayllm.plugin import CONTRACT_VERSION

    # The replica gets the validated Options instance itself (typed), not a dict to re-parse.
    args: tuple[Any, ...] = (options, normalized_config(config, backend, options))
    if (backend.contract_version or 1) >= CONTRACT_VERSION:  # the core's replica, its engine
        from relayllm.serving.replica import Replica

        cls: type = Replica
        args = (backend.engine_class(), *args)
    else:  # contract 2: the adapter's BatchDeployment subclass (relayllm.plugin.legacy)
        cls = backend.deployment_class()
    deployment: Any = serve.deployment(cls)  # typed as a decorator factory by Ray's overloads
    deployment = deployment.options(**serve_options(backend, config, options))
    app: Application = deployment.bind(*args)
    return app


def serve_options(
    backend: type[Backend], config: DeploymentConfig, options: BaseModel
) -> dict[str, Any]:
    """The ``serve.deployment`` options of ``config``: replicas, resources, placement."""
    ongoing = config.max_ongoing_requests
    if config.http is not None:  # HTTP requests count in Serve's limit: never behind batches
        ongoing += config.http.max_concurrent_requests
    serve_options: dict[str, Any] = {
        "name": config.name,
        "max_ongoing_requests": ongoing,
        "health_check_period_s": config.health_check_period_s,
        "health_check_timeout_s": config.health_check_timeout_s,
        # One access-log line per batch drowns the job's own output; errors are still logged.
        "logging_config": {"enable_access_log": False},
        # How often a stopping replica checks for calls still running (Serve's default, 2 s,
        # is the least a shutdown or a redeploy takes even when no call is running).
        "graceful_shutdown_wait_loop_s": SHUTDOWN_CHECK_PERIOD_S,
        **routing_options(config.routing),
    }
    serve_options.update(backend.deployment_options(options))
    if config.autoscaling_config:
        serve_options["autoscaling_config"] = config.autoscaling_config
    else:
        serve_options["num_replicas"] = config.num_replicas
    return apply_placement(config, serve_options)  # ray_actor_options and placement


def unserved_task_message(name: str, backend: str, task: str, served: Any) -> str:
    return (
        f"deployment {name!r} (backend {backend!r}) does not serve task {task!r} with its "
        f"options; it serves {', '.join(sorted(served)) or 'nothing'}. Send {task!r} rows to "
        f"a deployment that serves it (vllm serves embeddings with options task: embed)."
    )


def check_task_served(
    name: str, task: str, timeout_s: float = 60.0, features: frozenset[str] = frozenset()
) -> tuple[str, frozenset[str]] | None:
    """Raise ConfigError if the running deployment ``name`` does not serve ``task`` or lacks
    one of ``features`` (rows.FEATURES). Returns (backend, the features it supports), None
    when the replica does not say."""
    from relayllm.rows import unsupported_features

    described = handle_for(name).describe.remote().result(timeout_s=timeout_s)
    served = described.get("tasks")
    if served is not None and task not in served:
        raise ConfigError(unserved_task_message(name, described.get("backend"), task, served))
    supported = described.get("features")
    if supported is None:
        return None
    problem = unsupported_features(described.get("backend"), features, supported)
    if problem:
        raise ConfigError(f"deployment {name!r}: {problem}")
    return described.get("backend"), frozenset(supported)


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
    _wait_running(ref, config.startup_timeout_s)
    return _with_status(ref)


def _check_fits(backend: type[Backend], config: DeploymentConfig, options: BaseModel) -> None:
    """Fail before anything starts when the replicas ask for more than the cluster's nodes
    have (not what is free: a replica may wait for running work to end)."""
    demand = fit.engine_demand(config.name, serve_options(backend, config, options))
    _, total, nodes = fit.cluster_view()
    fit.check_fit([demand], None, total, nodes, subject=f"deployment {config.name!r}")


def engine_demand(config: DeploymentConfig) -> fit.Demand:
    """What ``config``'s replicas reserve at start (pure: no cluster, no engine; the engine
    package need not be installed here)."""
    from relayllm.plugin.manager import get_registry

    backend = get_registry().get(config.backend)
    options = backend.parse_options(config.options)
    return fit.engine_demand(config.name, serve_options(backend, config, options))


def _wait_running(ref: DeploymentRef, timeout_s: float) -> None:
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


def list_deployments(*, address: str | None = None) -> list[DeploymentRef]:
    """Every relayllm deployment running on the cluster (Serve is not started to list them)."""
    from ray import serve

    from relayllm.cluster import connect

    connect(address, start_serve=False)
    refs = []
    for app, status in sorted(serve.status().applications.items()):
        if not app.startswith(APP_PREFIX):
            continue
        name = app[len(APP_PREFIX) :]
        refs.append(DeploymentRef(name, app, name, None, str(status.status).rsplit(".", 1)[-1]))
    return refs


def get_deployment(name: str, *, address: str | None = None) -> DeploymentRef:
    """The running deployment called ``name``; the error lists the running ones."""
    running = list_deployments(address=address)
    for ref in running:
        if ref.name == name:
            return ref
    raise DeploymentNotFoundError(not_found_message(name, [r.name for r in running]))


def control(name: str, *, address: str | None = None) -> Controller:
    """The control plane of the running deployment ``name`` (the error lists the running
    ones): ``pause``/``resume``/``is_paused``, ``reset_prefix_cache``, ``sleep``/``wake_up``,
    ``tokenize``/``detokenize``, runtime LoRA adapters and ``update_weights``, each on every
    replica."""
    from relayllm.serving.controller import Controller

    ref = get_deployment(name, address=address)  # connects; lists the running ones
    return Controller(name, ref.app_name, ref.deployment_name)


def handle_for(name: str) -> DeploymentHandle[Any]:
    """A handle to the running deployment ``name`` (from inside any Ray worker)."""
    from ray import serve

    apps = serve.status().applications
    if app_name(name) not in apps:
        running = sorted(a[len(APP_PREFIX) :] for a in apps if a.startswith(APP_PREFIX))
        raise DeploymentNotFoundError(not_found_message(name, running))
    return serve.get_deployment_handle(name, app_name(name))


def not_found_message(name: str, running: list[str]) -> str:
    listed = ", ".join(running) if running else "none"
    return (
        f"no relayllm deployment named {name!r} is running; running deployments: {listed}. "
        f"Start it with relayllm.deploy(DeploymentConfig(name={name!r}, ...))."
    )


def shutdown(name: str | None = None, *, address: str | None = None) -> list[str]:
    """Stop the named deployment (or every relayllm deployment); returns the names stopped."""

    names = [name] if name else [r.name for r in list_deployments(address=address)]
    if name:
        get_deployment(name, address=address)  # a clear error for an unknown name
    for each in names:
        _delete(app_name(each))
        drop_state(each)  # its replicas are gone: so is their control state
    return names


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


__all__ = [
    "APP_PREFIX",
    "DeploymentConfig",
    "DeploymentRef",
    "HttpConfig",
    "app_name",
    "build_application",
    "control",
    "deploy",
    "engine_demand",
    "get_deployment",
    "handle_for",
    "list_deployments",
    "not_found_message",
    "resolve",
    "serve_options",
    "shutdown",
]
