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

Pure Python: no engine import, so adapters' translations are unit-tested without an engine.
Supported engine releases are declared on the backend (``Backend.supported_versions``) and
checked by :mod:`relayllm.versions`.
"""

from __future__ import annotations

from relayllm.adapters.options import OptionsError, options_error, parse_options
from relayllm.adapters.sampling import (
    StructuredOutput,
    UnsupportedParameter,
    check_sampling_support,
    did_you_mean,
    parse_response_format,
)
from relayllm.adapters.tasks import ROW_TASKS, ModelTask, row_tasks
from relayllm.errors import CallFailedError, EngineFailedError
from relayllm.fit import replica_count
from relayllm.rows import Request, Result, error_result
from relayllm.serving.engine import Engine, EngineContext
from relayllm.stage.calls import CHARS_PER_TOKEN, estimated_tokens

__all__ = [
    "CHARS_PER_TOKEN",
    "ROW_TASKS",
    "CallFailedError",
    "Engine",
    "EngineContext",
    "EngineFailedError",
    "ModelTask",
    "OptionsError",
    "Request",
    "Result",
    "StructuredOutput",
    "UnsupportedParameter",
    "check_sampling_support",
    "did_you_mean",
    "error_result",
    "estimated_tokens",
    "options_error",
    "parse_options",
    "parse_response_format",
    "replica_count",
    "row_tasks",
]
