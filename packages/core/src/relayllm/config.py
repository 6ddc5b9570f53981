"""A processor's settings, on the strict base every config model shares
(:mod:`relayllm.configbase`, re-exported here). :class:`ProcessorSettings` is how a processor
talks to its deployment: :class:`ProcessorConfig` and a pipeline step both inherit it,
so every setting is declared, described and validated once.

Below the stage and the deployments on purpose: it imports neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import (
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    field_validator,
)

from relayllm import env
from relayllm.configbase import (
    ConfigModel,
)
from relayllm.rows import Task, check_sampling_params
from relayllm.serving.traffic import BATCH_PRIORITY, INTERACTIVE_PRIORITY

#: A processor's preprocess or postprocess: one row in, one row out.
RowFn = Callable[[dict[str, Any]], dict[str, Any]]


def default_transport() -> Literal["grpc", "actor"]:
    """The default of ``ProcessorConfig.transport`` (read when a config is made, in the
    driver)."""
    return env.SERVE_TRANSPORT.get()


class ProcessorSettings(ConfigModel):
    """How a processor talks to its deployment: what a pipeline step sets too."""

    batch_size: PositiveInt = Field(default=64, description="Rows per call to the deployment.")
    token_budget: PositiveInt | None = Field(
        default=None,
        description="Also close a call when its rows' estimated tokens (prompt characters / 4, "
        "plus each row's max_tokens) would pass this: long rows travel in small calls. "
        "None: calls of batch_size rows.",
    )
    concurrency: PositiveInt = Field(
        default=1,
        description="Units of stage work: two stage tasks at once each, or one stage actor "
        "(compute='actors'); see stage_workers.",
    )
    compute: Literal["actors", "tasks"] = Field(
        default="tasks",
        description="How Ray Data runs the stage: 'tasks' (Ray's reused worker processes, "
        "which keep the deployment handle between runs: no process starts per run) or "
        "'actors' (an actor per unit of concurrency, started with the run: a little faster "
        "on long runs against a very fast deployment).",
    )
    max_in_flight_batches: PositiveInt = Field(
        default=4,
        description="Calls one unit of concurrency keeps outstanding (split between its two "
        "tasks, or all on its actor).",
    )
    timeout_s: float = Field(default=600.0, gt=0, description="Limit on one call.")
    max_retries: NonNegativeInt = Field(
        default=3,
        description="Retries of a failed call (backoff with jitter) before its rows fail.",
    )
    on_error: Literal["record", "raise"] = Field(
        default="record",
        description="A failed row: 'record' its error in the row's error column and go on, or "
        "'raise' RowError and stop the job.",
    )
    id_column: str | None = Field(
        default=None,
        description="Input column that identifies a row in error messages (and, without "
        "affinity_column, its affinity key).",
    )
    affinity_column: str | None = Field(
        default=None,
        description="Input column whose value is a row's affinity key: under routing "
        "'affinity' the rows of one key prefer one replica, across steps and processors "
        "(a pipeline sets its own lineage column). None: id_column, else the row's prompt "
        "prefix. A row's prompt_cache_key comes first; with order_by_prefix the prefix does.",
    )
    num_cpus: float = Field(
        default=0.25,
        gt=0,
        description="CPUs reserved per unit of concurrency (split between its two tasks); "
        "the stage mostly waits on I/O.",
    )
    transport: Literal["grpc", "actor"] = Field(
        default_factory=default_transport,
        description="How the stage calls the deployment: 'grpc' (Serve's gRPC transport, "
        "falling back to actor calls on a gRPC error) or 'actor' (actor calls from the start). "
        f"Default: ${env.SERVE_TRANSPORT.name}, else 'grpc'.",
    )
    priority: int = Field(
        default=BATCH_PRIORITY,
        description="Scheduling priority of this processor's rows in engines that schedule by "
        f"priority (lower runs first; HTTP requests get {INTERACTIVE_PRIORITY}). A row's "
        "sampling_params.priority overrides it.",
    )
    order_by_prefix: bool = Field(
        default=False,
        description="Sort each Ray Data batch by prompt text before splitting it into calls, so "
        "rows sharing a long prefix (system prompt, few-shot block) travel together and the "
        "engine's prefix cache hits; output row order is unchanged.",
    )
    local_image_files: bool = Field(
        default=True,
        description="Whether a chat row's image_url part may name a file of the stage's "
        "workers (a file:// URL or an absolute path). False (what the batch service's lines "
        "run with): such a part fails its row, with one error whether the file exists or "
        "not; http(s) and data: URLs are read either way.",
    )
    remote_image_hosts: list[str] | None = Field(
        default=None,
        description="The hosts a chat row's http(s) image_url may name (exact names, and "
        "every redirect's); None: any host; an empty list: none (only data: URLs and local "
        "files). The batch service sets it from its image_hosts setting (default: none).",
    )

    def settings(self) -> dict[str, Any]:
        """The settings alone (what a :class:`ProcessorConfig` takes from a step)."""
        return {name: getattr(self, name) for name in ProcessorSettings.model_fields}


class ProcessorConfig(ProcessorSettings):
    """How a processor talks to its deployment."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    deployment: str = Field(description="Name of a running relayllm deployment.")
    task: Task = Field(
        default="chat", description="What the rows ask of the deployment; picks the input column."
    )
    sampling_params: dict[str, Any] = Field(
        default_factory=dict,
        description="Sampling parameters of every row (OpenAI names); a row's own "
        "sampling_params column overrides them key by key.",
    )

    @field_validator("sampling_params")
    @classmethod
    def _valid_params(cls, value: dict[str, Any]) -> dict[str, Any]:
        problem = check_sampling_params(value)
        if problem:
            raise ValueError(problem)
        return value


__all__ = [
    "ProcessorConfig",
    "ProcessorSettings",
    "RowFn",
    "default_transport",
]
