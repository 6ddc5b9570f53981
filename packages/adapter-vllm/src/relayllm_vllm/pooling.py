"""Pooling rows on a vLLM engine: embeddings, class probabilities, cross-encoder scores.

A mixin of :class:`~relayllm_vllm.engine.VLLMEngine` (its engine life is there, its text
generation in :mod:`relayllm_vllm.generation`); imported only inside a replica.
"""

from __future__ import annotations

from typing import Any

from relayllm.adapters import Result
from relayllm_vllm.options import VLLMOptions


class Pooling:
    """Rows of a pooling model (``task`` embed, classify or score), and the plain prompt every
    kind of row renders through."""

    #: vLLM's ``AsyncLLM`` (None only on a replica stopped before vLLM on purpose).
    engine: Any
    options: VLLMOptions
    model_config: Any
    #: The version of the weights loaded by the last update_weights (None: the engine's own).
    weight_version: str | None

    async def _render_completion(self, text: str) -> Any:
        from vllm.renderers.inputs.preprocess import parse_model_prompt

        renderer = self.engine.renderer
        parsed = parse_model_prompt(self.model_config, {"prompt": text})
        (prompt,) = await renderer.render_cmpl_async([parsed], renderer.default_cmpl_tok_params)
        return self._salted(prompt)

    def _salted(self, prompt: Any) -> Any:
        """The prompt in the prefix-cache namespace of the weights it will run on: after a
        weight update no row reuses a block the old weights computed (vLLM's ``cache_salt``
        is part of a prompt's first block hash), while rows of one version still share theirs.
        No salt before the first update: the engine's own weights."""
        if self.weight_version is not None and isinstance(prompt, dict):
            prompt["cache_salt"] = f"relayllm-weights:{self.weight_version}"
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


__all__ = ["Pooling"]
