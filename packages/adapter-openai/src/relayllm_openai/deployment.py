"""The engine: rows to an OpenAI-compatible endpoint through one shared gate.

Imported only in the Serve replica (through ``OpenAIBackend.engine_class``): it is the one
module that imports the ``openai`` client. The core's replica wraps it (adapter contract 3).
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import openai
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from relayllm.adapters import (
    BATCH_PRIORITY,
    INTERACTIVE_PRIORITY,
    OPENAI_SAMPLING_PARAMS,
    Engine,
    Request,
    Result,
    UnsupportedParameter,
    check_sampling_support,
    error_result,
    estimated_tokens,
    replica_count,
)
from relayllm_openai.options import FEATURE_FIELDS, OpenAIOptions
from relayllm_openai.rate_gate import RateGate, class_budgets
from relayllm_openai.retrying import (
    BackoffHonouringRetryAfter,
    MalformedResponse,
    describe_failure,
    is_retryable,
    retry_after_s,
)
from relayllm_openai.translate import (
    classify_result,
    embedding_result,
    generation_result,
    score_result,
)

logger = logging.getLogger(__name__)

#: Sent as the key to endpoints that need none: the openai client refuses to start without one.
NO_KEY = "EMPTY"


class OpenAIEngine(Engine):
    backend_name = "openai"
    retire_when_hung = False  # a slow endpoint is not helped by a new replica
    # Serve calls its check every few seconds and restarts a replica that fails it. An outage
    # of the external endpoint is not this replica's fault: restarting would drop the rate
    # limiter's state and the rows in flight, which retry on their own. So: no HTTP there.
    probed_by_serve = False

    options: OpenAIOptions

    def refusal(self, call: str) -> str | None:
        """Every control call is refused: an OpenAI-compatible endpoint's API has no pause,
        cache, sleep or tokenizer calls, and holding rows here would not pause its engine."""
        return (
            f"an OpenAI-compatible endpoint offers no {call!r} through its API; "
            "control the engine behind it directly"
        )

    def start(self) -> None:
        options = self.options
        deployment = self.context.deployment
        key_env = options.api_key_env
        key = os.environ.get(key_env) if key_env else None
        if key_env and not key:
            raise RuntimeError(
                f"the environment variable {key_env} (options.api_key_env) is not set in this "
                "Serve replica; export it before starting Ray so the replica inherits it"
            )
        self._secret = key
        self._client = openai.AsyncOpenAI(
            api_key=key or NO_KEY,
            base_url=options.base_url,
            organization=options.organization,
            default_headers=options.headers or None,
            timeout=options.timeout_s,
            max_retries=0,  # retries are ours (retrying.py): one policy, one place
        )
        # Batch rows and interactive (HTTP front) requests each have a budget of their own.
        share = options.interactive_share if deployment.get("http") else 0.0
        gates = [
            RateGate(**budget, replicas=replica_count(deployment, "max"))
            for budget in class_budgets(options, share)
        ]
        # The provider's rate limits, per traffic class (the replica's admission control is
        # the latency controller of an HTTP front and another thing).
        self._batch_gate = gates[0]
        self._interactive_gate = gates[-1]
        self.attempts = 0  # HTTP requests sent for rows, retries included
        self.retries = 0
        self._models: list[str] = []  # what the endpoint listed at the last health()
        logger.info(
            "openai deployment %r: model %s at %s, budget per replica %s",
            deployment.get("name"),
            options.model,
            self.base_url,
            self._batch_gate.describe(),
        )

    @property
    def base_url(self) -> str:
        return str(self._client.base_url).rstrip("/")

    # -- rows ---------------------------------------------------------------------------------

    async def run_request(self, request: Request) -> Result:
        try:  # the policy every adapter shares: an unsupported name fails this row, unsent
            check_sampling_support(
                "openai",
                request.get("sampling_params") or {},
                OPENAI_SAMPLING_PARAMS
                | set(self.options.extra_sampling_params)
                | {FEATURE_FIELDS[f] for f in self.options.features if f in FEATURE_FIELDS},
            )
        except UnsupportedParameter as exc:
            return error_result(f"{exc} (or list it in options.extra_sampling_params)")
        estimate = estimated_tokens(request)
        attempts = 0
        interactive = request.get("priority", BATCH_PRIORITY) <= INTERACTIVE_PRIORITY
        gate = self._interactive_gate if interactive else self._batch_gate

        async def attempt() -> Result:
            nonlocal attempts
            attempts += 1
            self.attempts += 1
            async with gate.slot(estimate):
                began = time.monotonic()
                result = await self._send(request)
            # The endpoint's answer time, as this replica sees it (info()["metrics"]).
            self.context.metrics.observe_latency(time.monotonic() - began)
            return result

        try:
            async for try_ in AsyncRetrying(
                stop=stop_after_attempt(self.options.max_retries + 1),
                wait=BackoffHonouringRetryAfter(),
                retry=retry_if_exception(is_retryable),
                before_sleep=self._before_retry,
                reraise=True,
            ):
                with try_:
                    result = await attempt()
        except Exception as exc:  # the row's failure is the row's value, never a lost row
            return error_result(
                self._redact(describe_failure(exc, attempts, self.options.timeout_s))
            )
        used = (result.get("num_input_tokens") or 0) + (result.get("num_generated_tokens") or 0)
        gate.settle(estimate, used or None)
        return result

    def _before_retry(self, state: RetryCallState) -> None:
        self.retries += 1
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after_s(exc)
        if isinstance(exc, openai.RateLimitError) and asked:
            self._batch_gate.pause(asked)  # the endpoint's limit covers both classes
            self._interactive_gate.pause(asked)
        logger.warning(
            "retrying a request to %s in %.2fs: %s",
            self.base_url,
            state.upcoming_sleep,
            self._redact(describe_failure(exc, 1, self.options.timeout_s)) if exc else "?",
        )

    async def _send(self, request: Request) -> Result:
        task = request["task"]
        model = request.get("model") or self.options.model
        # Sampling params go in the JSON body as they are (OpenAI names, plus the extras
        # options.extra_sampling_params allows, such as vLLM's top_k).
        params = dict(request.get("sampling_params") or {})
        if params.get("continue_final_message"):  # a vLLM server wants both said
            params["add_generation_prompt"] = False
        try:
            if task == "chat":
                response = await self._client.chat.completions.create(
                    model=model, messages=request["messages"], extra_body=params
                )
            elif task == "completion":
                response = await self._client.completions.create(
                    model=model, prompt=request["prompt"], extra_body=params
                )
            elif task == "embedding":
                response = await self._client.embeddings.create(
                    model=model, input=request["input"], encoding_format="float"
                )
                return embedding_result(response)
            elif task == "classify":  # vLLM's server: POST /classify, next to /v1
                body = {"model": model, "input": request["text"]}
                return classify_result(await self._post_root("classify", body))
            else:  # score, vLLM's server: POST /score
                body = {"model": model, "text_1": request["query"], "text_2": request["document"]}
                return score_result(await self._post_root("score", body))
        except json.JSONDecodeError as exc:
            raise MalformedResponse(f"the endpoint answered with malformed JSON: {exc}") from None
        return generation_result(response, task)

    async def _post_root(self, endpoint: str, body: dict[str, Any]) -> Any:
        """POST to one of vLLM's pooling endpoints, served at the server's root (beside
        ``/v1``), through the client (so retries, the key and the timeout apply)."""
        root = str(self._client.base_url).rstrip("/").removesuffix("/v1")
        return await self._client.post(f"{root}/{endpoint}", body=body, cast_to=object)

    # -- health and info ----------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """Lists the endpoint's models: proves it answers and takes the key, spends no tokens."""
        try:
            page = await self._client.models.list()
        except Exception as exc:
            raise RuntimeError(
                self._redact(describe_failure(exc, 1, self.options.timeout_s))
            ) from None
        self._models = [m.id for m in getattr(page, "data", [])]
        return {"model": self.options.model, "model_listed": self.options.model in self._models}

    def info(self) -> dict[str, Any]:
        return {
            "model": self.options.model,
            "base_url": self.base_url,
            "limits": self._batch_gate.describe(),
            "interactive_limits": self._interactive_gate.describe(),
            "attempts": self.attempts,
            "retries": self.retries,
        }

    def _redact(self, text: str) -> str:
        # Belt and braces: an endpoint may echo a header back in its error message.
        return text.replace(self._secret, "[redacted]") if self._secret else text


__all__ = ["NO_KEY", "OpenAIEngine"]
