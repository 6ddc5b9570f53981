"""Deployments by name: the one place that knows how a name maps to a Serve application,
which relayllm deployments run, and how a driver or a worker finds one.

A relayllm deployment named ``NAME`` is the Serve application ``relayllm-NAME`` holding one
Serve deployment called ``NAME``. Any driver connected to the cluster finds it by name. An
application of another kind that a plugin starts beside them (the batch service's gateways)
is ``relayllm-KIND:NAME``: one prefix for everything relayllm runs in Serve.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relayllm.errors import ConfigError, DeploymentNotFoundError

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle

    from relayllm.serving.controller import Controller

APP_PREFIX = "relayllm-"
#: Between an application's kind and its name (``relayllm-gateway:NAME``). A deployment's name
#: holds no ``:`` (DeploymentConfig's rule), so no application passes for the other kind.
KIND_MARK = ":"


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


def app_name(name: str, *, kind: str | None = None) -> str:
    """The Serve application of the deployment ``name``, or of a ``kind`` of application a
    plugin starts."""
    return f"{APP_PREFIX}{name}" if kind is None else f"{APP_PREFIX}{kind}{KIND_MARK}{name}"


def name_of(app: str, *, kind: str | None = None) -> str | None:
    """The name of the deployment (or of the ``kind`` of application) a Serve application
    holds, None for any other application."""
    if not app.startswith(APP_PREFIX):
        return None
    rest = app[len(APP_PREFIX) :]
    if kind is None:
        return None if KIND_MARK in rest else rest
    head = f"{kind}{KIND_MARK}"
    return rest[len(head) :] if rest.startswith(head) else None


def running_names(applications: Iterable[str] | None = None) -> list[str]:
    """The relayllm deployments among ``applications`` (default: Serve's now; no connect,
    for code that runs in the cluster), sorted."""
    if applications is None:
        from ray import serve

        applications = serve.status().applications
    return sorted(name for name in map(name_of, applications) if name is not None)


def list_deployments(*, address: str | None = None) -> list[DeploymentRef]:
    """Every relayllm deployment running on the cluster (Serve is not started to list them)."""
    from ray import serve

    from relayllm.cluster import connect

    connect(address, start_serve=False)
    refs = []
    for app, status in sorted(serve.status().applications.items()):
        name = name_of(app)
        if name is not None:
            state = str(status.status).rsplit(".", 1)[-1]
            refs.append(DeploymentRef(name, app, name, None, state))
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
        raise DeploymentNotFoundError(not_found_message(name, running_names(apps)))
    return serve.get_deployment_handle(name, app_name(name))


def not_found_message(name: str, running: list[str]) -> str:
    listed = ", ".join(running) if running else "none"
    return (
        f"no relayllm deployment named {name!r} is running; running deployments: {listed}. "
        f"Start it with relayllm.deploy(DeploymentConfig(name={name!r}, ...))."
    )


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


__all__ = [
    "APP_PREFIX",
    "KIND_MARK",
    "DeploymentRef",
    "app_name",
    "check_task_served",
    "control",
    "get_deployment",
    "handle_for",
    "list_deployments",
    "name_of",
    "not_found_message",
    "running_names",
    "unserved_task_message",
]
