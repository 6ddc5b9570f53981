"""Shared deployments by name: the concept in one package.

- :mod:`~relayllm.deployments.config`: ``DeploymentConfig`` and what it builds (the backend's
  checked options, Serve's options, the application, what its replicas reserve); pure.
- :mod:`~relayllm.deployments.names`: how a name maps to a Serve application, the running
  names, lookup (``get_deployment``, ``handle_for``, ``control``).
- :mod:`~relayllm.deployments.lifecycle`: ``deploy`` (start, or reuse the same config) and
  ``shutdown``.
- :mod:`~relayllm.deployments.session`: deploy a list of deployments and, at the end, stop
  only the ones this session started (``relayllm run``, ``batch`` and ``serve``).
- :mod:`~relayllm.deployments.file`: the ``deployments:`` section of a YAML file.

The names below import from ``relayllm.deployments``; the session and the file do not load
with it (the file reader is the pipeline file's).
"""

from __future__ import annotations

from relayllm.deployments.config import (
    DeploymentConfig,
    build_application,
    engine_demand,
    normalized_config,
    resolve,
    serve_options,
)
from relayllm.deployments.lifecycle import deploy, shutdown, wait_running
from relayllm.deployments.names import (
    APP_PREFIX,
    DeploymentRef,
    app_name,
    check_task_served,
    control,
    get_deployment,
    handle_for,
    list_deployments,
    not_found_message,
    running_names,
    unserved_task_message,
)
from relayllm.serving.http_config import HttpConfig

__all__ = [
    "APP_PREFIX",
    "DeploymentConfig",
    "DeploymentRef",
    "HttpConfig",
    "app_name",
    "build_application",
    "check_task_served",
    "control",
    "deploy",
    "engine_demand",
    "get_deployment",
    "handle_for",
    "list_deployments",
    "normalized_config",
    "not_found_message",
    "resolve",
    "running_names",
    "serve_options",
    "shutdown",
    "unserved_task_message",
    "wait_running",
]
