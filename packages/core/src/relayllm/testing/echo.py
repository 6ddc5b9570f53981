"""The echo backend: a real Serve deployment with no model.

It exists for contract tests and for measuring relayllm's own overhead; it is registered only
when asked for (:func:`relayllm.testing.enable_echo_backend` or ``RELAYLLM_ECHO_BACKEND=1``),
never as a user-facing backend by default. Tokens are whitespace-separated words.

Echo honours the sampling parameters the row protocol promises in a deterministic, checkable
way (:func:`generate`), since it is the reference adapter of the conformance kit: ``max_tokens``
and ``stop`` cut its words, ``n`` gives n samples, ``logprobs``/``top_logprobs`` give one entry
per word, ``response_format`` and ``structured_outputs.choice`` give a conforming answer, and
a presence or frequency penalty drops repeated words. With the ``sampling`` option on,
``temperature``, ``top_p`` and ``seed`` decide whether and how its words are shuffled.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import time
from typing import Any, cast

from pydantic import BaseModel

from relayllm.backend import Backend
from relayllm.errors import CallFailedError, EngineFailedError
from relayllm.plugin import hookimpl
from relayllm.rows import (
    TASKS,
    Request,
    Result,
    Task,
    error_result,
    request_text,
)
from relayllm.serving.engine import Engine
from relayllm.serving.identity import replica_id
from relayllm.serving.replica import Replica
from relayllm.stage.images import has_images, image_sizes
from relayllm.testing.echo_cache import PrefixCache
from relayllm.testing.echo_options import ECHO_FEATURES, EchoOptions
from relayllm.testing.echo_text import generate

EMBEDDING_SIZE = 8  # echo "embeds" a text as the lengths of its first 8 words
#: echo "classifies" a text by its length: ``long`` from this many words on.
ECHO_LONG = 4
ECHO_LABELS = ("short", "long")
#: echo's "checkpoint": a directory with this file, ``{"tag": "..."}``; after a weight update
#: every text answer starts with ``[tag]`` (:func:`write_echo_checkpoint`).
ECHO_WEIGHTS_FILE = "echo_weights.json"


class EchoEngine(Engine):
    """Echo's "engine": answers from the prompt's words, in the replica's process."""

    backend_name = "echo"

    options: EchoOptions

    def start(self) -> None:
        options = self.options
        time.sleep(options.start_delay_s)  # models an engine loading its weights
        if options.fail_start:
            raise RuntimeError("echo engine failed to start (fail_start=True)")
        self.stopped = False
        self.calls = 0  # run_batch calls (the fail_calls fault counts them)
        self.rows = 0  # rows answered (the engine_*_after_rows faults count them)
        self.busy_rows = 0  # rows inside run_batch now (the echo 'engine' load)
        self._thawed = asyncio.Event()  # cleared by a pause in ``keep`` mode
        self._thawed.set()
        self.weights_tag: str | None = None  # echo's "weights" (update_weights)
        blocks, words = options.prefix_cache_blocks, options.prefix_block_words
        self.prefix_cache = PrefixCache(blocks, words) if blocks else None

    # -- control calls: echo's 'engine' pauses and tokenizes (words, as everywhere in echo) ----

    async def pause(self, mode: str) -> None:
        """``wait``: nothing to add (the replica holds new rows and waits for the rows in the
        engine); ``keep``: the rows in the engine stop before they answer."""
        if mode == "keep":
            self._thawed.clear()

    async def resume(self) -> None:
        self._thawed.set()

    async def tokenize(self, text: str) -> list[int]:
        """Each word as the integer of its UTF-8 bytes: reversible without a vocabulary, so
        any replica detokenizes what another tokenized."""
        return [int.from_bytes(word.encode(), "big") for word in text.split()]

    async def detokenize(self, ids: list[int]) -> str:
        words = [int(i).to_bytes((int(i).bit_length() + 7) // 8, "big").decode() for i in ids]
        return " ".join(words)

    async def load_adapter(self, name: str, path: str) -> None:
        """Echo's 'adapter' is any directory: rows naming it get ``<name>`` before their words
        (a missing directory fails, as an engine's load does)."""
        if not os.path.isdir(path):
            raise FileNotFoundError(f"no adapter directory at {path}")

    async def update_weights(self, path: str, version: str) -> None:
        """Echo's "weights" are the tag of an echo checkpoint (:data:`ECHO_WEIGHTS_FILE` in
        ``path``): text answers start with ``[tag]`` from now on. A directory without one fails
        the update, as an engine fails on a checkpoint that is not its model's."""
        file = os.path.join(path, ECHO_WEIGHTS_FILE)
        try:
            with open(file) as handle:
                data = json.load(handle)
            tag = data["tag"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(
                f"{path} is not an echo checkpoint ({ECHO_WEIGHTS_FILE}): {exc}"
            ) from None
        replica = replica_id()
        await asyncio.sleep(float(data.get("load_s_by", {}).get(str(replica), 0)))
        if replica in data.get("unreadable_by", []):  # as a copy this replica cannot read
            raise PermissionError(errno.EACCES, "Permission denied (on this replica)", file)
        self.weights_tag = str(data.get("tag_by", {}).get(replica, tag))

    async def weights_digest(self) -> str:
        """Echo's weight checker: a digest of the tag it holds (a checkpoint whose ``tag_by``
        gives this replica another tag makes it disagree with the others)."""
        tag = "" if self.weights_tag is None else self.weights_tag
        return "echo:" + hashlib.sha256(tag.encode()).hexdigest()

    def stop(self) -> None:
        """What the conformance kit calls to check that health() reports a stopped engine
        (and what a retiring replica calls)."""
        self.stopped = True

    async def health(self) -> None:
        if self.stopped:
            raise RuntimeError("the echo engine was stopped (stop_engine)")
        if self._hung():  # what vLLM's probe finds for a stopped EngineCore process
            raise EngineFailedError("echo engine hung (engine_hangs_after_rows)")

    def _hung(self) -> bool:
        hangs_after = self.options.engine_hangs_after_rows
        return hangs_after is not None and self.rows >= hangs_after

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        self.calls += 1
        if self.calls <= self.options.fail_calls:
            raise CallFailedError(f"injected failure of call {self.calls}")
        metrics = self.context.metrics
        delay = self.options.delay_s + self.options.delay_per_busy_row_s * self.busy_rows
        self.busy_rows += len(requests)
        # The engine figures a backend reports (relayllm.serving.metrics): echo's 'engine' runs
        # every row it holds (no queue), and a call's rows take its whole time.
        metrics.set_queue(waiting=0, running=self.busy_rows)
        began = time.monotonic()
        try:
            if delay:
                await asyncio.sleep(delay)
            await self._thawed.wait()  # paused in ``keep`` mode: frozen until resumed
        finally:
            self.busy_rows -= len(requests)
            metrics.set_queue(waiting=0, running=self.busy_rows)
        metrics.observe_latency(time.monotonic() - began)
        if self._hung():
            await asyncio.Event().wait()  # never answers: only the health check gets it out
        dies_after = self.options.engine_dies_after_rows
        if dies_after is not None and self.rows >= dies_after:
            raise EngineFailedError(f"echo engine died (engine_dies_after_rows={dies_after})")
        answers = [self._answer(r) for r in requests]
        self.rows += len(requests)
        if self.prefix_cache is not None:
            self._count_prefix_cache(requests, answers)
        return answers

    def _count_prefix_cache(self, requests: list[Request], answers: list[Result]) -> None:
        """The simulated cache's figures, through the counters an engine's adapter feeds."""
        queries = hits = generated = 0
        for request in requests:
            words = request_text(request).split()
            queries += len(words)
            hits += self.prefix_cache.lookup(words)  # type: ignore[union-attr]
        for answer in answers:
            generated += answer.get("num_generated_tokens") or 0
        self.context.metrics.add_prefix_cache(queries, hits)
        self.context.metrics.add_engine_step(queries - hits, generated)

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
        if request.get("model") in self.context.adapters:  # a LoRA adapter loaded at runtime
            out = [f"<{request['model']}>", *out]
        if self.weights_tag is not None:  # the weights of the last update
            out = [f"[{self.weights_tag}]", *out]
        params = request.get("sampling_params", {})
        try:
            result = generate(
                out,
                params,
                sampling=self.options.sampling,
                max_tokens_default=self.options.max_tokens_default,
            )
        except ValueError as exc:
            return error_result(f"echo engine cannot follow the row's sampling_params: {exc}")
        return {**result, "num_input_tokens": len(words)}

    def info(self) -> dict[str, Any]:
        return {"model": f"echo-{self.options.mode}", "device": "cpu"}


def EchoDeployment(options: EchoOptions, deployment: dict[str, Any]) -> Replica:
    """The core's replica around an echo engine, built in this process: what unit tests call
    (no Serve; the replica follows no control state until told, through ``follower.apply``)."""
    return Replica(EchoEngine, options, deployment)


class EchoBackend(Backend):
    name = "echo"
    contract_version = 3
    Options = EchoOptions
    tasks = frozenset(TASKS)
    features = frozenset(ECHO_FEATURES)

    @classmethod
    def features_for(cls, options: BaseModel) -> frozenset[str]:
        return frozenset(cast(EchoOptions, options).features)

    @classmethod
    def tasks_for(cls, options: BaseModel) -> frozenset[Task]:
        return frozenset(cast(EchoOptions, options).tasks)

    @classmethod
    def engine_class(cls) -> type[Engine]:
        return EchoEngine

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


def write_echo_checkpoint(
    directory: str | os.PathLike[str],
    tag: str,
    *,
    unreadable_by: list[str] | tuple[str, ...] = (),
    tag_by: dict[str, str] | None = None,
    load_s_by: dict[str, float] | None = None,
) -> str:
    """Write an echo checkpoint (answers after the update start with ``[tag]``) to
    ``directory``; returns its path. Faults set from outside the replicas, by replica id:
    ``unreadable_by``, the replicas that cannot read it (their load fails); ``tag_by``, a
    replica -> the tag it loads instead (weights that landed wrong there: its digest
    differs from the others'); ``load_s_by``, a replica -> the seconds its load takes."""
    os.makedirs(directory, exist_ok=True)
    data: dict[str, Any] = {"tag": tag}
    if unreadable_by:
        data["unreadable_by"] = list(unreadable_by)
    if tag_by:
        data["tag_by"] = dict(tag_by)
    if load_s_by:
        data["load_s_by"] = dict(load_s_by)
    with open(os.path.join(directory, ECHO_WEIGHTS_FILE), "w") as handle:
        json.dump(data, handle)
    return os.fspath(directory)


@hookimpl
def relayllm_register_backends(registry) -> None:
    registry.add(EchoBackend)


__all__ = [
    "ECHO_WEIGHTS_FILE",
    "EchoBackend",
    "EchoDeployment",
    "EchoEngine",
    "write_echo_checkpoint",
]
