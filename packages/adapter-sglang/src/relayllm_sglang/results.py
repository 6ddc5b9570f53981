"""SGLang outputs -> relayllm results, as plain functions (no engine, no sglang import).

The dicts SGLang returns, with their ``meta_info``, become relayllm results, engine aborts
included; chat answers are split into ``reasoning_content`` and the answer by a reasoning
parser the deployment passes in; pooled outputs become embeddings, class probabilities and
scores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relayllm.adapters import ReplicaMetrics, Result, describe_exception, error_result
from relayllm_sglang.reasoning import split_reasoning
from relayllm_sglang.translate import EngineInput, ParserFor

#: ``meta_info`` keys holding (logprob, token id, text) tuples, and their top-k lists.
OUTPUT_LOGPROBS, OUTPUT_TOP_LOGPROBS = "output_token_logprobs", "output_top_logprobs"
INPUT_LOGPROBS, INPUT_TOP_LOGPROBS = "input_token_logprobs", "input_top_logprobs"
#: The ``meta_info`` keys read from SGLang outputs.
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
FINISH_REASON = "finish_reason"
#: Prompt tokens found in SGLang's radix (prefix) cache, and the request's whole time.
CACHED_TOKENS = "cached_tokens"
E2E_LATENCY = "e2e_latency"
#: SGLang finish-reason types -> relayllm ``finish_reason``; "abort" becomes the row's error.
FINISH_REASONS = {"stop": "stop", "length": "length"}
ABORT = "abort"


def observe_meta(metrics: ReplicaMetrics, meta: Mapping[str, Any]) -> None:
    """What SGLang's ``meta_info`` tells of the engine, into the replica's metrics: prefix-cache
    hits (``cached_tokens`` of ``prompt_tokens``) and the request's latency. SGLang's own
    Prometheus metrics (its ``enable_metrics`` server arg) are its, outside Ray's."""
    prompt, cached = meta.get(PROMPT_TOKENS), meta.get(CACHED_TOKENS)
    if isinstance(prompt, int) and isinstance(cached, int) and prompt > 0:
        metrics.add_prefix_cache(prompt, cached)
    latency = meta.get(E2E_LATENCY)
    if isinstance(latency, (int, float)) and latency > 0:
        metrics.observe_latency(float(latency))


def generation_result(
    output: Mapping[str, Any] | BaseException,
    item: EngineInput | None = None,
    decode: Callable[[int], str] | None = None,
    reasoning_parser: ParserFor | None = None,
) -> Result:
    """A relayllm result for one ``async_generate`` output (or the exception of its call);
    ``item`` says whether logprobs were asked, ``decode`` turns their token ids into text;
    with ``reasoning_parser`` (the deployment's ``reasoning_parser`` option), a chat answer
    free of a grammar is split into ``reasoning_content`` and the answer."""
    if isinstance(output, BaseException):
        return error_result(describe_exception(output))
    meta = output.get("meta_info") or {}
    prompt_tokens = meta.get(PROMPT_TOKENS)
    reason = meta.get(FINISH_REASON)
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind == ABORT:
        message = reason.get("message") if isinstance(reason, Mapping) else None
        return error_result(
            f"sglang aborted the request: {message or 'no reason given'}",
            num_input_tokens=prompt_tokens,
        )
    text = output.get("text")
    if not isinstance(text, str):
        return error_result(
            f"sglang returned no text (finish reason {kind!r})", num_input_tokens=prompt_tokens
        )
    result: Result = {
        "generated_text": text,
        "finish_reason": FINISH_REASONS.get(kind, kind),
        "num_input_tokens": prompt_tokens,
        "num_generated_tokens": meta.get(COMPLETION_TOKENS),
    }
    if reasoning_parser is not None and item is not None and item.may_reason:
        try:
            reasoning, answer = split_reasoning(reasoning_parser(item), text)
        except Exception as exc:  # this row's error, as SGLang's server fails that request
            return error_result(
                f"sglang's reasoning parser failed on the answer: {describe_exception(exc)}",
                num_input_tokens=prompt_tokens,
            )
        result["generated_text"] = answer
        result["reasoning_content"] = reasoning
    if item is not None and item.top_logprobs is not None:
        result["logprobs"] = logprob_entries(
            meta.get(OUTPUT_LOGPROBS), meta.get(OUTPUT_TOP_LOGPROBS), item.top_logprobs, decode
        )
    if item is not None and item.prompt_logprobs is not None:
        result["prompt_logprobs"] = logprob_entries(
            meta.get(INPUT_LOGPROBS), meta.get(INPUT_TOP_LOGPROBS), item.prompt_logprobs, decode
        )
    return result


def logprob_entries(
    chosen: Any, tops: Any, k: int, decode: Callable[[int], str] | None
) -> list[dict[str, Any]] | None:
    """SGLang's ``(logprob, token_id, text)`` tuples -> the row's logprobs (token text from
    ``decode`` where SGLang sent none)."""
    if chosen is None:
        return None

    def text(entry: Sequence[Any]) -> str | None:
        if len(entry) > 2 and entry[2] is not None:
            return entry[2]
        return decode(entry[1]) if decode is not None else None

    tops = tops or [None] * len(chosen)
    return [
        {
            "token": text(entry),
            "logprob": entry[0],
            "top_logprobs": [{"token": text(t), "logprob": t[0]} for t in (top or [])[:k]],
        }
        for entry, top in zip(chosen, tops, strict=False)
    ]


def embedding_result(output: Mapping[str, Any] | BaseException) -> Result:
    """A relayllm result for one ``async_encode`` output."""
    if isinstance(output, BaseException):
        return error_result(describe_exception(output))
    meta = output.get("meta_info") or {}
    reason = meta.get(FINISH_REASON)
    if isinstance(reason, Mapping) and reason.get("type") == ABORT:
        return error_result(
            f"sglang aborted the request: {reason.get('message') or 'no reason given'}"
        )
    vector = output.get("embedding")
    if not isinstance(vector, Sequence) or not vector:
        return error_result("sglang returned no embedding")
    return {"embedding": [float(x) for x in vector], "num_input_tokens": meta.get(PROMPT_TOKENS)}


def _pooled(output: Mapping[str, Any] | BaseException, what: str) -> tuple[list[float], Any]:
    """The numbers a pooling model's head gave for one row (its ``embedding``: a list, or one
    number when SGLang's cross-encoder pooler squeezed a single label), and the prompt's
    token count. Raises ``ValueError`` with the row's error."""
    if isinstance(output, BaseException):
        raise ValueError(describe_exception(output))
    meta = output.get("meta_info") or {}
    reason = meta.get(FINISH_REASON)
    if isinstance(reason, Mapping) and reason.get("type") == ABORT:
        raise ValueError(
            f"sglang aborted the request: {reason.get('message') or 'no reason given'}"
        )
    value = output.get("embedding")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)], meta.get(PROMPT_TOKENS)
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        try:
            return [float(x) for x in value], meta.get(PROMPT_TOKENS)
        except (TypeError, ValueError):
            pass
    raise ValueError(f"sglang returned no {what} (embedding {value!r:.80})")


def softmax(logits: Sequence[float]) -> list[float]:
    """Class probabilities of a classifier's logits (shifted by the largest, so no overflow)."""
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def classify_result(
    output: Mapping[str, Any] | BaseException, labels: Mapping[int, str] | None = None
) -> Result:
    """A classify row's result from one ``async_encode`` output of a sequence-classification
    model: its head's logits, made probabilities and a label as SGLang's own ``/v1/classify``
    makes them (softmax, the most likely class's name from the model's ``id2label``)."""
    try:
        logits, prompt_tokens = _pooled(output, "class scores")
    except ValueError as exc:
        return error_result(str(exc))
    probs = softmax(logits)
    best = max(range(len(probs)), key=probs.__getitem__)
    return {
        "label": str((labels or {}).get(best, best)),
        "probs": probs,
        "num_input_tokens": prompt_tokens,
    }


def score_result(output: Mapping[str, Any] | BaseException) -> Result:
    """A score row's result from one cross-encoder output: its single label's value (SGLang
    applies the model's own activation, e.g. a sigmoid a sentence-transformers config names)."""
    try:
        values, prompt_tokens = _pooled(output, "score")
    except ValueError as exc:
        return error_result(str(exc))
    if len(values) != 1:
        return error_result(
            f"sglang returned {len(values)} values for the pair: task 'score' needs a "
            "cross-encoder, a sequence-classification model with one label (num_labels == 1)"
        )
    return {"score": values[0], "num_input_tokens": prompt_tokens}


def id2label(hf_config: Any) -> dict[int, str]:
    """A classifier's class names by index, from its Hugging Face config (empty if none)."""
    mapping = getattr(hf_config, "id2label", None) or {}
    try:
        return {int(k): str(v) for k, v in mapping.items()}
    except (AttributeError, TypeError, ValueError):
        return {}


__all__ = [
    "ABORT",
    "CACHED_TOKENS",
    "COMPLETION_TOKENS",
    "E2E_LATENCY",
    "FINISH_REASON",
    "FINISH_REASONS",
    "INPUT_LOGPROBS",
    "INPUT_TOP_LOGPROBS",
    "OUTPUT_LOGPROBS",
    "OUTPUT_TOP_LOGPROBS",
    "PROMPT_TOKENS",
    "classify_result",
    "embedding_result",
    "generation_result",
    "id2label",
    "logprob_entries",
    "observe_meta",
    "score_result",
    "softmax",
]
