"""OpenAI request bodies -> rows, and row results -> OpenAI response bodies: the one
translation both front doors use (the HTTP front, :mod:`relayllm.serving.http_front`, and
batch files, :mod:`relayllm.batch.format`), so a body gets the same answer through either.

A body's fields other than its input (``messages`` / ``prompt`` / ``input``), its routing
(``model``), its transport (``stream``) and OpenAI bookkeeping that changes no answer travel to
the engine as the row's ``sampling_params`` (``priority`` and ``prompt_cache_key``, the routing
key, are moved onto the row's request by :func:`relayllm.rows.build_request`): OpenAI's own names
(:data:`relayllm.rows.OPENAI_SAMPLING_PARAMS`) and an engine's extensions alike (vLLM's
``top_k``, ``min_p``, ``chat_template_kwargs``...). The backend refuses, by name and on that
row only, a name it cannot do; nothing is dropped on the way.

Every response body has two fields OpenAI's does not, at the top level: ``weight_version``,
the version of the weights that produced the answer (``relayllm.control(name).update_weights``;
null before any update), and ``engine_s``, the answer's engine time in seconds (the row's
share of its replica's busy time, :data:`relayllm.rows.outputs.ENGINE_S`; what the batch
service's usage ledger charges). A body answering several inputs (embeddings, score, rerank)
gives the version they share (null if a weight update fell between them) and their engine
times summed.

Plain dicts in OpenAI's shapes (every field its schema requires; the ``openai`` package's
types read them), so neither door needs the ``openai`` package to build them.
"""

from __future__ import annotations

import base64
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from relayllm.rows import (
    EMBEDDING,
    ENGINE_S,
    FINISH_REASON,
    GENERATED_TEXT,
    INPUT_COLUMN,
    LOGPROBS,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    REASONING_CONTENT,
    SAMPLES,
    SCORE,
    TEXT_TASKS,
    TOOL_CALLS,
    WEIGHT_VERSION,
    Task,
)

#: Body fields each door reads itself: the input, the routing, the transport.
DOOR_FIELDS = frozenset({"model", "messages", "prompt", "input", "stream", "stream_options"})
#: OpenAI fields accepted and left unused: they change no answer.
UNUSED_FIELDS = frozenset(
    {
        "user",
        "metadata",
        "store",
        "service_tier",
        "safety_identifier",
        "encoding_format",  # the embeddings door reads it for the response
        "dimensions",
    }
)
#: A row's result (``relayllm.rows.Result``) or one of its samples.
Row = Mapping[str, Any]
#: The finish reasons OpenAI's types allow; an engine's own (abort...) reads as a plain stop.
FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})


# -- body -> row ---------------------------------------------------------------------------


def sampling_params(task: Task, body: dict[str, Any]) -> dict[str, Any]:
    """The row's ``sampling_params`` for a request body (with ``priority``, which the row
    protocol moves onto the request). A field set to null means OpenAI's default, so it is
    left out; ``max_completion_tokens`` is the newer name of ``max_tokens``."""
    if task not in TEXT_TASKS:  # a pooling request samples nothing: only its priority
        return {"priority": body["priority"]} if body.get("priority") is not None else {}
    params = {
        k: v
        for k, v in body.items()
        if v is not None and k not in DOOR_FIELDS and k not in UNUSED_FIELDS
    }
    if "max_completion_tokens" in params:
        params.setdefault("max_tokens", params.pop("max_completion_tokens"))
    if task == "chat" and params.get("logprobs") is False:
        # Chat's "no logprobs"; a completions count of 0 asks for the chosen tokens' own.
        params.pop("logprobs")
    return params


def single_input(task: Task, body: dict[str, Any]) -> tuple[Any, str | None]:
    """A body's input as one row's (a chat's messages, or the one prompt / input: a list of
    exactly one is that one), and why it cannot be one row's (None when it can). Messages
    are checked where every row is (:func:`relayllm.rows.build_request`)."""
    key = INPUT_COLUMN[task]
    value = body.get(key)
    if task == "chat":
        return value, None
    if isinstance(value, list) and len(value) == 1:
        value = value[0]
    if not isinstance(value, str) or not value:
        return value, f"'{key}' must be a non-empty string (or a list of exactly one)"
    return value, None


# -- result -> response --------------------------------------------------------------------


def completion_body(task: Task, result: Row, model: str, request_id: str) -> dict[str, Any]:
    """The ``chat.completion`` (chat) or ``text_completion`` body for a row that succeeded:
    one choice per sample (n > 1), else the row's own columns as the one choice."""
    samples: list[Any] = list(result.get(SAMPLES) or ()) or [result]
    chat = task == "chat"
    choose = _chat_choice if chat else _completion_choice
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choose(i, s) for i, s in enumerate(samples)],
        "usage": usage(result),
        WEIGHT_VERSION: result.get(WEIGHT_VERSION),
        ENGINE_S: result.get(ENGINE_S),
    }


def embeddings_body(
    results: Sequence[Row], model: str, encoding_format: str | None = None
) -> dict[str, Any]:
    """The embeddings ``list`` body, one item per input; ``encoding_format="base64"`` (what
    the openai client asks for by default) packs each vector as little-endian float32."""

    def encode(vector: list[float]) -> Any:
        if encoding_format != "base64":
            return vector
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()

    tokens = sum(r.get(NUM_INPUT_TOKENS) or 0 for r in results)
    return {
        "object": "list",
        "data": [
            {
                "object": "embedding",
                "index": i,
                "embedding": encode(list(r.get(EMBEDDING) or [])),
            }
            for i, r in enumerate(results)
        ],
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        WEIGHT_VERSION: shared_weight_version(results),
        ENGINE_S: summed_engine_s(results),
    }


def score_body(pairs: Sequence[Row], model: str, request_id: str) -> dict[str, Any]:
    """vLLM's ``/v1/score`` body: one score per (query, document) pair, in order."""
    return {
        "id": f"score-{request_id}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": [{"index": i, "object": "score", "score": r[SCORE]} for i, r in enumerate(pairs)],
        "usage": _pooling_usage(pairs),
        WEIGHT_VERSION: shared_weight_version(pairs),
        ENGINE_S: summed_engine_s(pairs),
    }


def rerank_body(
    pairs: Sequence[Row], documents: list[str], top_n: int, model: str, request_id: str
) -> dict[str, Any]:
    """vLLM's ``/v1/rerank`` body: the documents best first, the first ``top_n`` (0: all)."""
    ranked = sorted(range(len(pairs)), key=lambda i: pairs[i][SCORE], reverse=True)
    return {
        "id": f"rerank-{request_id}",
        "model": model,
        "usage": _pooling_usage(pairs),
        "results": [
            {
                "index": i,
                "document": {"text": documents[i]},
                "relevance_score": pairs[i][SCORE],
            }
            for i in (ranked[:top_n] if top_n else ranked)
        ],
        WEIGHT_VERSION: shared_weight_version(pairs),
        ENGINE_S: summed_engine_s(pairs),
    }


def shared_weight_version(rows: Sequence[Row]) -> str | None:
    """The weight version every row of a many-input answer has (None if they differ)."""
    versions = {r.get(WEIGHT_VERSION) for r in rows}
    return versions.pop() if len(versions) == 1 else None


def summed_engine_s(rows: Sequence[Row]) -> float | None:
    """The engine time of a many-input answer: its rows' (None if none has any)."""
    times = [float(t) for t in (r.get(ENGINE_S) for r in rows) if t is not None]
    return sum(times) if times else None


def usage(result: Row) -> dict[str, int]:
    prompt = result.get(NUM_INPUT_TOKENS) or 0
    generated = result.get(NUM_GENERATED_TOKENS) or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": generated,
        "total_tokens": prompt + generated,
    }


def finish_reason(reason: Any, task: Task = "chat") -> str:
    """OpenAI's name for ``reason`` (a text completion's choice calls no tools)."""
    allowed = FINISH_REASONS if task == "chat" else FINISH_REASONS - {"tool_calls", "function_call"}
    return reason if reason in allowed else "stop"


def _pooling_usage(rows: Sequence[Row]) -> dict[str, int]:
    tokens = sum(r.get(NUM_INPUT_TOKENS) or 0 for r in rows)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _chat_choice(index: int, sample: Row) -> dict[str, Any]:
    """A chat choice: tool calls in ``message.tool_calls``, vLLM's ``reasoning_content`` on the
    message, logprobs in ``logprobs.content``; ``refusal``, which OpenAI's schema requires,
    null (the model refused nothing)."""
    text, calls = sample.get(GENERATED_TEXT), sample.get(TOOL_CALLS)
    text = "" if text is None and not calls else text
    message: dict[str, Any] = {"role": "assistant", "content": text, "refusal": None}
    if calls:
        message["tool_calls"] = calls
    if sample.get(REASONING_CONTENT) is not None:
        message["reasoning_content"] = sample[REASONING_CONTENT]
    logprobs = sample.get(LOGPROBS)
    return {
        "index": index,
        "message": message,
        "finish_reason": finish_reason(sample.get(FINISH_REASON)),
        "logprobs": (
            None
            if logprobs is None
            else {"content": [_token_logprob(t) for t in logprobs], "refusal": None}
        ),
    }


def _completion_choice(index: int, sample: Row) -> dict[str, Any]:
    """A completions choice, its logprobs as the completions API's parallel lists."""
    logprobs = sample.get(LOGPROBS)
    lists = None
    if logprobs is not None:
        offsets, at = [], 0
        for entry in logprobs:
            offsets.append(at)
            at += len(entry.get("token") or "")
        lists = {
            "tokens": [t.get("token") for t in logprobs],
            "token_logprobs": [t.get("logprob") for t in logprobs],
            "top_logprobs": [
                {a["token"]: a["logprob"] for a in t.get("top_logprobs") or []} for t in logprobs
            ],
            "text_offset": offsets,
        }
    return {
        "index": index,
        "text": sample.get(GENERATED_TEXT) or "",
        "finish_reason": finish_reason(sample.get(FINISH_REASON), "completion"),
        "logprobs": lists,
    }


def _token_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A row's logprob entry in OpenAI's chat shape (with the token's UTF-8 bytes)."""

    def one(token: str | None, logprob: float | None) -> dict[str, Any]:
        token = token or ""
        return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}

    out = one(entry.get("token"), entry.get("logprob"))
    out["top_logprobs"] = [
        one(a.get("token"), a.get("logprob")) for a in entry.get("top_logprobs") or []
    ]
    return out


__all__ = [
    "DOOR_FIELDS",
    "FINISH_REASONS",
    "UNUSED_FIELDS",
    "completion_body",
    "embeddings_body",
    "finish_reason",
    "rerank_body",
    "sampling_params",
    "score_body",
    "shared_weight_version",
    "single_input",
    "usage",
]
