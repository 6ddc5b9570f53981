"""The adapter SDK: the one namespace adapters import from.

- :class:`Engine`: the contract an adapter implements (adapter contract 3): ``start``,
  ``run_batch`` (or ``run_request``), ``stream``, ``info``, ``health``, ``stop``, and the
  optional control capabilities; :class:`EngineContext` is what the replica hands it.
  :class:`EngineFailedError` (the engine as a whole is gone) and :class:`CallFailedError`
  (this call failed, retry it) are what ``run_batch`` raises besides per-row errors.

And what every adapter shares, so the in-repo ones (and third-party ones) speak one dialect:

- :mod:`.sampling`: the policy for a sampling parameter a backend does not support
  (:func:`check_sampling_support`), ``response_format`` parsed once
  (:func:`parse_response_format`), and :func:`did_you_mean` for a misspelled name.
- :mod:`.options`: invalid options as an :class:`OptionsError` that names fields and reasons,
  never the values (a value may be a secret).
- :mod:`.tasks`: the row tasks an engine serves from the kind of model it runs.
- :mod:`.source`: an engine release's source read with ``ast`` (installed, or a wheel fetched
  with :func:`~relayllm.adapters.source.fetch_wheel`), for deploy-time checks and API contract
  tests; imported on use, not here.
- :func:`replica_count`: how many replicas a deployment runs (the one rule, from
  :mod:`relayllm.fit`), for budgets a deployment splits between its replicas.
- :func:`estimated_tokens`: what a row costs before its usage is known, the same number the
  stage splits calls by.

And the rest of the core an adapter touches, so it imports nothing else (a unit test keeps the
three adapters and the example to ``relayllm.adapters`` and the kit's ``relayllm.testing``):
:class:`Backend` and :class:`BackendOptions` with :data:`hookimpl` to register them; the row
protocol's names (:data:`TASKS`, :data:`FEATURES`, :data:`OPENAI_SAMPLING_PARAMS`,
:func:`request_text`); the errors an adapter raises or reports (:class:`RelayLLMError`, their
root, :class:`ConfigError`, :class:`ControlRefusedError`, :class:`MissingDependencyError`,
:func:`describe_exception`);
the traffic classes' engine priorities; the shared retry back-off; :class:`ReplicaMetrics`;
:mod:`relayllm.env`, the reader of every ``RELAYLLM_*`` variable, as ``env``.
A plugin's command takes its options and progress from :mod:`.commands`.

Pure Python: no engine import, so adapters' translations are unit-tested without an engine.
Supported engine releases are declared on the backend (``Backend.supported_versions``) and
checked by :mod:`relayllm.versions`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from relayllm import env
from relayllm.adapters.options import OptionsError, options_error, parse_options
from relayllm.adapters.sampling import (
    StructuredOutput,
    UnsupportedParameter,
    check_sampling_support,
    parse_response_format,
)
from relayllm.adapters.tasks import ROW_TASKS, ModelTask, row_tasks
from relayllm.configbase import did_you_mean
from relayllm.errors import (
    CallFailedError,
    ConfigError,
    ControlRefusedError,
    EngineFailedError,
    MissingDependencyError,
    RelayLLMError,
    describe_exception,
)
from relayllm.fit import replica_count
from relayllm.plugin import hookimpl
from relayllm.rows import (
    FEATURES,
    OPENAI_SAMPLING_PARAMS,
    TASKS,
    Request,
    Result,
    Task,
    error_result,
    request_text,
)
from relayllm.serving.engine import Engine, EngineContext
from relayllm.serving.traffic import BATCH_PRIORITY, INTERACTIVE_PRIORITY
from relayllm.stage.calls import CHARS_PER_TOKEN, estimated_tokens

if TYPE_CHECKING:
    from relayllm.backend import Backend, BackendOptions
    from relayllm.retry import INITIAL_BACKOFF_S, MAX_BACKOFF_S
    from relayllm.serving.metrics import ReplicaMetrics

# Loaded on first use: relayllm.backend imports this package (a cycle if imported here), and
# the retry policy and the metrics are an engine's, not a registration's.
_LAZY = {
    "Backend": "relayllm.backend",
    "BackendOptions": "relayllm.backend",
    "INITIAL_BACKOFF_S": "relayllm.retry",
    "MAX_BACKOFF_S": "relayllm.retry",
    "ReplicaMetrics": "relayllm.serving.metrics",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'relayllm.adapters' has no attribute {name!r}")


__all__ = [
    "env",
    "BATCH_PRIORITY",
    "CHARS_PER_TOKEN",
    "FEATURES",
    "INITIAL_BACKOFF_S",
    "INTERACTIVE_PRIORITY",
    "MAX_BACKOFF_S",
    "OPENAI_SAMPLING_PARAMS",
    "ROW_TASKS",
    "RelayLLMError",
    "TASKS",
    "Backend",
    "BackendOptions",
    "CallFailedError",
    "ConfigError",
    "ControlRefusedError",
    "Engine",
    "EngineContext",
    "EngineFailedError",
    "MissingDependencyError",
    "ModelTask",
    "OptionsError",
    "ReplicaMetrics",
    "Request",
    "Result",
    "StructuredOutput",
    "Task",
    "UnsupportedParameter",
    "check_sampling_support",
    "describe_exception",
    "did_you_mean",
    "error_result",
    "estimated_tokens",
    "hookimpl",
    "options_error",
    "parse_options",
    "parse_response_format",
    "replica_count",
    "request_text",
    "row_tasks",
]
