"""Exceptions users see. Each message says what to do next."""

from __future__ import annotations

from typing import Any


class RelayLLMError(Exception):
    """Base class of every relayllm error."""


class ConfigError(RelayLLMError, ValueError):
    """A configuration is invalid; raised before any engine starts."""


class UnknownBackendError(ConfigError):
    """No installed plugin registers the requested backend name."""


class DuplicateBackendError(RelayLLMError):
    """Two plugins register the same backend name."""


class IncompatibleAdapterError(ConfigError):
    """An adapter was built for an adapter contract this relayllm does not implement; its
    backend is refused when it registers, with what to upgrade."""


class MissingDependencyError(RelayLLMError, ImportError):
    """A backend's engine package is not installed."""


class DeploymentNotFoundError(RelayLLMError, LookupError):
    """No running deployment has the requested name."""


class DeploymentConflictError(RelayLLMError):
    """A running deployment has the requested name but a different config."""


class DeploymentStartError(RelayLLMError):
    """A deployment failed to start or did not become healthy in time."""


class RowError(RelayLLMError):
    """A row failed and the processor runs with ``on_error="raise"``."""


class ResourceFitError(ConfigError):
    """A deployment's replicas, or what a pipeline runs at once, do not fit on the Ray cluster;
    raised before any engine starts, naming what is short and what to change."""


class EngineFailedError(RelayLLMError):
    """Raised inside a replica when its engine as a whole has failed (died, hung): the call
    fails, not its rows, so the stage retries it on the replica Serve starts instead."""


class CallFailedError(RelayLLMError):
    """Raised by an engine's ``run_batch`` when a call as a whole failed for a passing reason
    (its transport, an engine that asks to be called again): the call fails, not its rows, and
    the stage retries it; unlike :class:`EngineFailedError` the replica keeps serving."""


class ControlRefusedError(RelayLLMError):
    """A control call (pause, sleep, tokenize, ...) the deployment's backend or device cannot
    do; raised before anything changes, naming the backend and the call."""

    def __init__(self, backend: str, call: str, reason: str, deployment: str | None = None):
        # Every argument in ``args``: the error crosses process boundaries by pickle.
        super().__init__(backend, call, reason, deployment)
        self.backend, self.call, self.reason, self.deployment = backend, call, reason, deployment

    def __str__(self) -> str:
        where = f" (deployment {self.deployment!r})" if self.deployment else ""
        return (
            f"backend {self.backend!r} cannot do the control call {self.call!r}{where}: "
            f"{self.reason}; nothing was changed"
        )


class ControlCallError(RelayLLMError):
    """A control call a replica accepted but could not complete (a checkpoint that is not
    there or not the model's, an adapter that does not load): the replica's own error."""

    def __init__(self, call: str, replica: str, reason: str, deployment: str | None = None):
        super().__init__(call, replica, reason, deployment)
        self.call, self.replica, self.reason, self.deployment = call, replica, reason, deployment

    def __str__(self) -> str:
        where = f" of deployment {self.deployment!r}" if self.deployment else ""
        return (
            f"the control call {self.call!r} failed on replica {self.replica}{where}: {self.reason}"
        )


class WeightUpdateAbortedError(ControlCallError):
    """A weight update that was aborted on every replica (a replica that could not load the
    checkpoint, digests that disagree, no decision in time): the deployment serves the
    committed version, :attr:`committed_version`; :attr:`replicas` is each replica's state
    after the abort (``rolled back``, ``retired``...)."""

    def __init__(
        self,
        version: str,
        committed_version: str | None,
        replicas: dict[str, dict[str, Any]],
        reason: str,
        deployment: str | None = None,
    ):
        super().__init__("update_weights", "(every replica)", reason, deployment)
        self.args = (version, committed_version, replicas, reason, deployment)
        self.version, self.committed_version, self.replicas = version, committed_version, replicas

    def __str__(self) -> str:
        where = f" of deployment {self.deployment!r}" if self.deployment else ""
        return (
            f"the weight update to version {self.version!r}{where} was aborted on every "
            f"replica: {self.reason}; it serves version {self.committed_version!r}"
        )


class DeploymentPausedError(RelayLLMError):
    """An interactive request reached a paused deployment (the HTTP front answers 503 with
    Retry-After); batch rows wait instead."""


def describe_exception(exc: BaseException, *, causes: int = 0) -> str:
    """An exception as one line for a row's ``error`` or a message: ``Type: text`` (the type
    alone when the text is empty), followed by up to ``causes`` of its ``__cause__`` chain as
    ``" <- Type: text"`` (for wrapper errors whose cause is the useful part). Adapters use it
    too, so every backend's rows read alike."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) <= causes:
        seen.add(id(current))
        text = str(current).strip()
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__
    return " <- ".join(parts)
