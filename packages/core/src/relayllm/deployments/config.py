"""A deployment's config, and what it builds: the checked backend and options
(:func:`resolve`), Serve's options for its replicas (:func:`serve_options`), the Serve
application (:func:`build_application`) and what its replicas reserve
(:func:`engine_demand`). Pure: nothing here touches a cluster or starts an engine.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator

from relayllm import fit
from relayllm.configbase import ConfigModel
from relayllm.placement import PLACEMENT_FIELD, Placement, apply_placement
from relayllm.routing import ROUTING_FIELD, Routing, routing_options
from relayllm.serving.admission_config import AdmissionConfig
from relayllm.serving.http_config import HttpConfig

if TYPE_CHECKING:
    from ray.serve import Application

    from relayllm.backend import Backend

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
    start_attempts: PositiveInt | None = Field(
        default=None,
        description="How many replica starts may fail (the engine does not load) before the "
        "deployment fails to start, with the last start's error. Unset: Serve's own count (3 "
        "per replica, at most 20). It counts until a replica of this configuration first "
        "runs; later replacements are always started again.",
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
        **routing_options(config.routing, replicas=fit.replica_count(config.model_dump(), "max")),
    }
    serve_options.update(backend.deployment_options(options))
    if config.start_attempts is not None:
        serve_options["max_constructor_retry_count"] = config.start_attempts
    if config.autoscaling_config:
        serve_options["autoscaling_config"] = config.autoscaling_config
    else:
        serve_options["num_replicas"] = config.num_replicas
    return apply_placement(config, serve_options)  # ray_actor_options and placement


def engine_demand(config: DeploymentConfig) -> fit.Demand:
    """What ``config``'s replicas reserve at start (pure: no cluster, no engine; the engine
    package need not be installed here)."""
    from relayllm.plugin.manager import get_registry

    backend = get_registry().get(config.backend)
    options = backend.parse_options(config.options)
    return fit.engine_demand(config.name, serve_options(backend, config, options))


__all__ = [
    "SHUTDOWN_CHECK_PERIOD_S",
    "DeploymentConfig",
    "build_application",
    "engine_demand",
    "normalized_config",
    "resolve",
    "serve_options",
]
