"""The echo backend's options: how it answers (echo or reverse, the features it offers, its
per-row delay, its pretend failures and hangs, its sampling), each checked when the deployment
config is made."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from relayllm.backend import BackendOptions
from relayllm.rows import (
    BASIC_FEATURES,
    TASKS,
    Task,
)

#: What the ``features`` option accepts: the optional features :func:`generate` implements.
ECHO_FEATURES = ("logprobs", "n", "structured_outputs.json", "structured_outputs.choice")


class EchoOptions(BackendOptions):
    mode: Literal["echo", "reverse"] = Field(
        default="echo",
        description="Answer with the prompt's words as they are, or in reverse order.",
    )
    delay_s: float = Field(default=0.0, ge=0, description="Sleep per call: models engine time.")
    delay_per_busy_row_s: float = Field(
        default=0.0,
        ge=0,
        description="Extra sleep per call for every row in the 'engine' at the call's start: "
        "models a busy engine answering slower (tests of the admission controller).",
    )
    fail_marker: str | None = Field(
        default=None, description="Rows whose text contains this fail with an engine error."
    )
    max_tokens_default: int | None = Field(
        default=None, gt=0, description="Truncate output to this many words if the row sets none."
    )
    # Fault injection, for tests of retries and start-up failures.
    fail_calls: int = Field(
        default=0, ge=0, description="The first N calls on each replica fail as a whole."
    )
    fail_start: bool = Field(default=False, description="The replica fails in its constructor.")
    engine_dies_after_rows: int | None = Field(
        default=None,
        ge=0,
        description="The replica's 'engine' dies (EngineFailedError) once it has computed this "
        "many rows, as a real engine killed mid-job does.",
    )
    engine_hangs_after_rows: int | None = Field(
        default=None,
        ge=0,
        description="The replica's 'engine' stops answering once it has computed this many "
        "rows (calls wait forever; its health probe reports it stopped), as a real engine "
        "stopped with SIGSTOP does.",
    )
    start_delay_s: float = Field(default=0.0, ge=0, description="Sleep in the constructor.")
    tasks: list[Task] = Field(
        default_factory=lambda: list(TASKS),
        description="What this deployment serves (EchoBackend.tasks_for), for tests of the check.",
    )
    sampling: bool = Field(
        default=False,
        description="Sample as an engine does: at temperature > 0 (the default when a row sets "
        "none) and top_p > 0.5 the answer's words are shuffled, reproducibly for a row's seed. "
        "Off: every answer is the greedy one.",
    )
    features: list[str] = Field(
        default=sorted(BASIC_FEATURES),
        description="The optional request features this deployment declares "
        "(EchoBackend.features_for): any of logprobs, n, structured_outputs.json, "
        "structured_outputs.choice.",
    )
    placement_group_cpus: float | None = Field(
        default=None,
        gt=0,
        description="Reserve a placement group (one bundle of this many CPUs) per replica, as "
        "a multi-device engine does: for tests that nothing is left behind.",
    )

    prefix_cache_blocks: int = Field(
        default=0,
        ge=0,
        description="Simulate an engine's prefix cache of this many blocks per replica "
        "(testing/echo_cache.py), reported as an engine reports its own: prefix-cache hits "
        "and queries, prompt tokens prefilled. 0: no cache, nothing reported.",
    )
    prefix_block_words: int = Field(
        default=16, gt=0, description="Words (echo's tokens) per block of the prefix cache."
    )

    @field_validator("features")
    @classmethod
    def _known_features(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(ECHO_FEATURES))
        if unknown:
            raise ValueError(f"echo cannot do {unknown}; it can do {', '.join(ECHO_FEATURES)}")
        return value


__all__ = ["ECHO_FEATURES", "EchoOptions"]
