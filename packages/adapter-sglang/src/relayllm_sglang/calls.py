"""A batch of rows -> ONE SGLang engine call per kind of row, as plain functions (no engine,
no sglang import): the keyword arguments of ``Engine.async_generate`` (or ``async_encode``,
or a cross-encoder request) with a list per argument, and the batch served in order with
per-row errors as values.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from relayllm.adapters import ReplicaMetrics, Request, Result, describe_exception, error_result
from relayllm_sglang.results import (
    classify_result,
    embedding_result,
    generation_result,
    observe_meta,
    score_result,
)
from relayllm_sglang.translate import EngineInput, ParserFor


def generate_kwargs(inputs: Sequence[EngineInput]) -> dict[str, Any]:
    """Keyword arguments of one ``Engine.async_generate`` call serving every input.

    Request ids are left to SGLang: after a failed batch call SGLang aborts its requests
    asynchronously, and a retry reusing their ids could be caught by that abort.
    """
    kwargs: dict[str, Any] = {
        "input_ids": [i.input_ids for i in inputs],
        "sampling_params": [i.sampling_params or {} for i in inputs],
    }
    if any(i.lora for i in inputs):
        kwargs["lora_path"] = [i.lora for i in inputs]
    if any(i.top_logprobs is not None or i.prompt_logprobs is not None for i in inputs):
        kwargs["return_logprob"] = [
            i.top_logprobs is not None or i.prompt_logprobs is not None for i in inputs
        ]
        kwargs["top_logprobs_num"] = [
            max(i.top_logprobs or 0, i.prompt_logprobs or 0) for i in inputs
        ]
        # 0: from the prompt's first token; -1: the answer only.
        kwargs["logprob_start_len"] = [0 if i.prompt_logprobs is not None else -1 for i in inputs]
    priorities = [i.priority for i in inputs if i.priority is not None]
    if priorities:
        # SGLang takes one priority per call and, by default, runs higher values first
        # (server_args enable_priority_scheduling turns its priority scheduling on): the
        # call's most urgent row, negated.
        kwargs["priority"] = -min(priorities)
    return kwargs


def encode_kwargs(inputs: Sequence[EngineInput]) -> dict[str, Any]:
    """Keyword arguments of one ``Engine.async_encode`` call serving every input."""
    kwargs: dict[str, Any] = {"prompt": [i.text for i in inputs]}
    if any(i.lora for i in inputs):
        kwargs["lora_path"] = [i.lora for i in inputs]
    return kwargs


#: The ``EmbeddingReqInput`` field that makes SGLang tokenize ``text`` as (query, document)
#: pairs for a cross-encoder (with its separator and token type ids), as ``Engine.rerank``
#: and the HTTP server's ``/v1/rerank`` set it.
CROSS_ENCODER_FLAG = "is_cross_encoder_request"


def rerank_kwargs(inputs: Sequence[EngineInput]) -> dict[str, Any]:
    """Fields of one ``EmbeddingReqInput`` scoring every input's (query, document) pair.

    ``Engine.rerank`` builds the same request, but runs it with ``run_until_complete``, which
    cannot be called from the replica's running event loop; the deployment awaits the
    request through the engine's tokenizer manager instead, as ``async_encode`` does.
    """
    kwargs: dict[str, Any] = {
        "text": [list(i.pair or ("", "")) for i in inputs],
        CROSS_ENCODER_FLAG: True,
    }
    if any(i.lora for i in inputs):
        kwargs["lora_path"] = [i.lora for i in inputs]
    return kwargs


async def serve_batch(
    requests: Sequence[Request],
    prepare: Callable[[Request], EngineInput],
    generate: Callable[..., Awaitable[Any]],
    encode: Callable[..., Awaitable[Any]],
    decode: Callable[[int], str] | None = None,
    *,
    rerank: Callable[..., Awaitable[Any]] | None = None,
    labels: Mapping[int, str] | None = None,
    metrics: ReplicaMetrics | None = None,
    reasoning_parser: ParserFor | None = None,
) -> list[Result]:
    """One result per request, in order: ``prepare`` each row (its ``ValueError`` is that row's
    error), then ONE ``generate(**generate_kwargs(...))`` call for the chat and completion rows,
    ONE ``encode(**encode_kwargs(...))`` call for the embedding rows (and one for the classify
    rows) and ONE ``rerank(**rerank_kwargs(...))`` call for the score rows, concurrently.
    ``generate``/``encode`` are the engine's ``async_generate``/``async_encode``; ``rerank``
    runs a cross-encoder request; ``labels`` are the classifier's ``id2label``; each generated
    output's figures go to ``metrics`` (:func:`observe_meta`); ``reasoning_parser`` splits
    chat answers (see :func:`generation_result`)."""
    results: list[Result | None] = [None] * len(requests)
    batches: dict[str, list[tuple[int, EngineInput]]] = {
        "generate": [],
        "encode": [],
        "classify": [],
        "score": [],
    }
    for i, request in enumerate(requests):
        try:
            item = prepare(request)
        except Exception as exc:  # this row cannot be served; the others go on
            results[i] = error_result(describe_exception(exc))
            continue
        batches[item.kind].append((i, item))

    async def one_generate_call(items: Sequence[EngineInput]) -> Any:
        return await generate(**generate_kwargs(items))

    async def one_encode_call(items: Sequence[EngineInput]) -> Any:
        return await encode(**encode_kwargs(items))

    async def one_rerank_call(items: Sequence[EngineInput]) -> Any:
        if rerank is None:
            raise RuntimeError("this deployment does not score (query, document) pairs")
        return await rerank(**rerank_kwargs(items))

    generated, encoded, classified, scored = await asyncio.gather(
        call_per_batch(one_generate_call, [item for _, item in batches["generate"]]),
        call_per_batch(one_encode_call, [item for _, item in batches["encode"]]),
        call_per_batch(one_encode_call, [item for _, item in batches["classify"]]),
        call_per_batch(one_rerank_call, [item for _, item in batches["score"]]),
    )
    for (i, item), output in zip(batches["generate"], generated, strict=False):
        results[i] = generation_result(output, item, decode, reasoning_parser)
        if metrics is not None and isinstance(output, Mapping):
            observe_meta(metrics, output.get("meta_info") or {})
    for (i, _), output in zip(batches["encode"], encoded, strict=False):
        results[i] = embedding_result(output)
    for (i, _), output in zip(batches["classify"], classified, strict=False):
        results[i] = classify_result(output, labels)
    for (i, _), output in zip(batches["score"], scored, strict=False):
        results[i] = score_result(output)
    return [r if r is not None else error_result("no result for this row") for r in results]


async def call_per_batch(
    call: Callable[[Sequence[Any]], Awaitable[Any]], items: Sequence[Any]
) -> list[dict[str, Any] | BaseException]:
    """Run ``call`` once for all ``items``; one output (or exception) per item, in order.

    SGLang validates a batch as a whole: one prompt longer than the context fails the entire
    ``async_generate`` call. Then each item is called on its own, concurrently, so only the
    rows that fail carry an error and the others still get their answers.
    """
    if not items:
        return []
    try:
        outputs = _as_list(await call(items))
        if len(outputs) != len(items):
            raise RuntimeError(f"sglang returned {len(outputs)} outputs for {len(items)} prompts")
        return outputs
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if len(items) == 1:
            return [exc]
    singles = await asyncio.gather(*(call([item]) for item in items), return_exceptions=True)
    out: list[dict[str, Any] | BaseException] = []
    for single in singles:
        if isinstance(single, asyncio.CancelledError):
            raise single
        out.append(single if isinstance(single, BaseException) else _as_list(single)[0])
    return out


def _as_list(outputs: Any) -> list[dict[str, Any]]:
    return [outputs] if isinstance(outputs, Mapping) else list(outputs)


__all__ = [
    "CROSS_ENCODER_FLAG",
    "call_per_batch",
    "encode_kwargs",
    "generate_kwargs",
    "rerank_kwargs",
    "serve_batch",
]
