"""relayllm: batch LLM inference on Ray Data with shared, named Ray Serve engines.

``import relayllm`` is light: Ray is imported when a deployment or dataset is touched, and
engine packages (vllm, sglang, torch, openai) only inside the adapters that use them.
"""

from relayllm.backend import Backend, BackendOptions, BackendRegistry
from relayllm.config import ProcessorConfig
from relayllm.deployments import (
    DeploymentConfig,
    DeploymentRef,
    control,
    deploy,
    get_deployment,
    list_deployments,
    shutdown,
)
from relayllm.errors import (
    ConfigError,
    ControlCallError,
    ControlRefusedError,
    DeploymentConflictError,
    DeploymentNotFoundError,
    DeploymentPausedError,
    DeploymentStartError,
    DuplicateBackendError,
    EngineFailedError,
    IncompatibleAdapterError,
    MissingDependencyError,
    RelayLLMError,
    ResourceFitError,
    RowError,
    UnknownBackendError,
    WeightUpdateAbortedError,
)
from relayllm.logs import configure_logging
from relayllm.plugin import NAME, hookimpl
from relayllm.processor import Processor, build_processor
from relayllm.serving.admission_config import AdmissionConfig
from relayllm.serving.controller import Controller
from relayllm.serving.http_config import HttpConfig

__version__ = "0.1.0"

# Loaded on first use: the pipelines package brings YAML and the run machinery along.
_LAZY = {
    "run_pipeline": "relayllm.pipelines.run",
    "RunSummary": "relayllm.pipelines.run",
    "run_batch_file": "relayllm.batch.run",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    if name == "BatchDeployment":  # adapter contract 2's replica, until contract 4
        import warnings

        from relayllm.backend import AdapterContractWarning
        from relayllm.plugin.legacy import BatchDeployment

        warnings.warn(
            "relayllm.BatchDeployment is adapter contract 2's replica: import it from "
            "relayllm.plugin.legacy until contract 4 removes it, or write a "
            "relayllm.adapters.Engine (contract 3)",
            AdapterContractWarning,
            stacklevel=2,
        )
        return BatchDeployment
    raise AttributeError(f"module 'relayllm' has no attribute {name!r}")


__all__ = [
    "NAME",
    "AdmissionConfig",
    "Backend",
    "BackendOptions",
    "BackendRegistry",
    "ConfigError",
    "ControlCallError",
    "ControlRefusedError",
    "Controller",
    "DeploymentConfig",
    "DeploymentConflictError",
    "DeploymentNotFoundError",
    "DeploymentPausedError",
    "DeploymentRef",
    "DeploymentStartError",
    "DuplicateBackendError",
    "EngineFailedError",
    "IncompatibleAdapterError",
    "HttpConfig",
    "MissingDependencyError",
    "Processor",
    "ProcessorConfig",
    "RelayLLMError",
    "ResourceFitError",
    "RowError",
    "RunSummary",
    "UnknownBackendError",
    "WeightUpdateAbortedError",
    "build_processor",
    "configure_logging",
    "control",
    "deploy",
    "get_deployment",
    "hookimpl",
    "list_deployments",
    "run_batch_file",
    "run_pipeline",
    "shutdown",
]
