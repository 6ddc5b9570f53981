"""The echo backend: a real Serve deployment with no model.

It exists for contract tests and for measuring relayllm's own overhead; it is registered only
when asked for (:func:`relayllm.testing.enable_echo_backend` or ``RELAYLLM_ECHO_BACKEND=1``),
never as a user-facing backend by default. Tokens are whitespace-separated words.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from relayllm.backend import Backend, BackendOptions
from relayllm.errors import EngineFailedError
from relayllm.plugin import hookimpl
from relayllm.rows import TASKS, Request, Result, Task, error_result, request_text
from relayllm.serving.replica import BatchDeployment
from relayllm.stage.images import has_images, image_sizes

EMBEDDING_SIZE = 8  # echo "embeds" a text as the lengths of its first 8 words
#: echo "classifies" a text by its length: ``long`` from this many words on.
ECHO_LONG = 4
ECHO_LABELS = ("short", "long")


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
    placement_group_cpus: float | None = Field(
        default=None,
        gt=0,
        description="Reserve a placement group (one bundle of this many CPUs) per replica, as "
        "a multi-device engine does: for tests that nothing is left behind.",
    )


class EchoDeployment(BatchDeployment):
    backend_name = "echo"

    options: EchoOptions

    def __init__(self, options: EchoOptions, deployment: dict[str, Any]) -> None:
        super().__init__(options, deployment)
        time.sleep(options.start_delay_s)  # models an engine loading its weights
        if options.fail_start:
            raise RuntimeError("echo engine failed to start (fail_start=True)")
        self.stopped = False
        self.busy_rows = 0  # rows inside run_batch now (the echo 'engine' load)

    def stop_engine(self) -> None:
        """What the conformance kit calls to check that health() reports a stopped engine
        (and what a retiring replica calls: :meth:`BatchDeployment.stop_engine`)."""
        self.stopped = True

    async def engine_health(self) -> None:
        if self.stopped:
            raise RuntimeError("the echo engine was stopped (stop_engine)")
        if self._hung():  # what vLLM's probe finds for a stopped EngineCore process
            raise EngineFailedError("echo engine hung (engine_hangs_after_rows)")

    def _hung(self) -> bool:
        hangs_after = self.options.engine_hangs_after_rows
        return hangs_after is not None and self.rows >= hangs_after

    async def process_batch(self, requests: list[Request], job: str | None = None) -> list[Result]:
        if self.calls < self.options.fail_calls:
            self.calls += 1
            raise ConnectionError(f"injected failure of call {self.calls}")
        return await super().process_batch(requests, job)

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        delay = self.options.delay_s + self.options.delay_per_busy_row_s * self.busy_rows
        self.busy_rows += len(requests)
        # The engine figures a backend reports (relayllm.serving.metrics): echo's 'engine' runs
        # every row it holds (no queue), and a call's rows take its whole time.
        self.metrics.set_queue(waiting=0, running=self.busy_rows)
        began = time.monotonic()
        try:
            if delay:
                await asyncio.sleep(delay)
        finally:
            self.busy_rows -= len(requests)
            self.metrics.set_queue(waiting=0, running=self.busy_rows)
        self.metrics.observe_latency(time.monotonic() - began)
        if self._hung():
            await asyncio.Event().wait()  # never answers: only the health check gets it out
        dies_after = self.options.engine_dies_after_rows
        if dies_after is not None and self.rows >= dies_after:
            raise EngineFailedError(f"echo engine died (engine_dies_after_rows={dies_after})")
        return [self._answer(r) for r in requests]

    def _answer(self, request: Request) -> Result:
        text = request_text(request)
        marker = self.options.fail_marker
        if marker and marker in text:
            return error_result(f"echo engine refused the row: it contains {marker!r}")
        words = text.split()
        if request["task"] == "embedding":
            vector = ([float(len(w)) for w in words] + [0.0] * EMBEDDING_SIZE)[:EMBEDDING_SIZE]
            return {"embedding": vector, "num_input_tokens": len(words)}
        if request["task"] == "classify":  # "long" past ECHO_LONG words, with a margin
            long = min(1.0, len(words) / (2 * ECHO_LONG))
            probs = [1.0 - long, long]
            label = ECHO_LABELS[probs.index(max(probs))]
            return {"label": label, "probs": probs, "num_input_tokens": len(words)}
        if request["task"] == "score":  # the share of the document's words in the query
            query = set(request.get("query", "").split())
            document = request.get("document", "").split()
            share = sum(w in query for w in document) / len(document) if document else 0.0
            return {"score": share, "num_input_tokens": len(query) + len(document)}
        if request["task"] == "chat" and has_images(request.get("messages")):
            try:  # what reached the engine: each image's size, as words of the answer
                words += [f"<image:{w}x{h}>" for w, h in image_sizes(request["messages"])]
            except ValueError as exc:
                return error_result(f"echo engine cannot read an image: {exc}")
        out = list(reversed(words)) if self.options.mode == "reverse" else words
        params = request.get("sampling_params", {})
        limit = params.get("max_tokens") or self.options.max_tokens_default
        finish = "stop"
        if limit and len(out) > limit:
            out, finish = out[:limit], "length"
        return {
            "generated_text": " ".join(out),
            "finish_reason": finish,
            "num_input_tokens": len(words),
            "num_generated_tokens": len(out),
        }

    async def chat_stream(self, request: dict[str, Any]):
        """The streaming one-row method ``ray.data.llm``'s Serve stage calls (benchmarks)."""
        kwargs = {k: v for k, v in request.items() if k not in ("request_id", "idx_in_batch")}
        kwargs.setdefault("task", "chat")
        yield self._answer(kwargs)  # type: ignore[arg-type]

    def engine_info(self) -> dict[str, Any]:
        return {"model": f"echo-{self.options.mode}", "device": "cpu"}


class EchoBackend(Backend):
    name = "echo"
    contract_version = 2
    Options = EchoOptions
    tasks = frozenset(TASKS)

    @classmethod
    def tasks_for(cls, options: BaseModel) -> frozenset[Task]:
        return frozenset(cast(EchoOptions, options).tasks)

    @classmethod
    def deployment_class(cls) -> type[BatchDeployment]:
        return EchoDeployment

    @classmethod
    def deployment_options(cls, options: BaseModel) -> dict[str, Any]:
        options = cast(EchoOptions, options)
        # No model, so no CPU reserved: the echo replica must never starve the stage actors.
        if options.placement_group_cpus:
            return {
                "ray_actor_options": {"num_cpus": 0},
                "placement_group_bundles": [{"CPU": options.placement_group_cpus}],
            }
        return {"ray_actor_options": {"num_cpus": 0}}


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(EchoBackend)
