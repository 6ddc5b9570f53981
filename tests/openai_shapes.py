"""Whether a response body is OpenAI's, shared by the tests of the HTTP doors (the front on
echo and on vLLM, the batch gateway's online routes): the ``openai`` package's type for the
route reads it (``model_validate``), and no field OpenAI's API reference requires is missing.

The ``openai`` package's types cannot say the second part alone: a field the schema requires
but allows to be null (``message.refusal``, a choice's ``logprobs``) is ``Optional[...] = None``
there, as an optional one is, so a body without it validates. :data:`REQUIRED_NULLABLE` lists
those fields, per type, as OpenAI's published OpenAPI description requires them; every other
field the type declares without a default is required by pydantic already. A ``null`` is
allowed only where the schema allows one: the fields listed here and those the type declares
``Optional`` of a scalar (a ``null`` where the schema expects an object or an array, such as
``tool_calls: null``, is a violation)."""

from __future__ import annotations

import base64
import json
import struct
import types
import typing
from typing import Any

CHAT = "/chat/completions"

#: (module, class) -> fields OpenAI's schema requires that may be null.
REQUIRED_NULLABLE: dict[tuple[str, str], frozenset[str]] = {
    ("openai.types.chat.chat_completion_message", "ChatCompletionMessage"): frozenset(
        {"content", "refusal"}
    ),
    ("openai.types.chat.chat_completion", "Choice"): frozenset({"logprobs"}),
    ("openai.types.chat.chat_completion", "ChoiceLogprobs"): frozenset({"content", "refusal"}),
    ("openai.types.chat.chat_completion_chunk", "Choice"): frozenset({"finish_reason"}),
    ("openai.types.chat.chat_completion_token_logprob", "ChatCompletionTokenLogprob"): frozenset(
        {"bytes"}
    ),
    ("openai.types.chat.chat_completion_token_logprob", "TopLogprob"): frozenset({"bytes"}),
    ("openai.types.completion_choice", "CompletionChoice"): frozenset({"logprobs"}),
    ("openai.types.shared.error_object", "ErrorObject"): frozenset({"code", "param"}),
}
#: (module, class) -> fields the schema does not require but allows to be null.
OPTIONAL_NULLABLE: dict[tuple[str, str], frozenset[str]] = {
    ("openai.types.chat.chat_completion_chunk", "Choice"): frozenset({"logprobs"}),
}


def problems(model: type, raw: Any, path: str = "") -> list[str]:
    """What keeps ``raw`` from being a ``model`` body as OpenAI sends it ([]: nothing)."""
    from pydantic import ValidationError

    try:
        model.model_validate(raw)
    except ValidationError as exc:
        return [f"{path or model.__name__}: {exc}"]
    return _walk(model, raw, path)


def _walk(model: type, raw: Any, path: str) -> list[str]:
    found: list[str] = []
    named = (model.__module__, model.__name__)
    nullable = REQUIRED_NULLABLE.get(named, frozenset())
    may_be_null = nullable | OPTIONAL_NULLABLE.get(named, frozenset())
    for name, field in model.model_fields.items():  # type: ignore[attr-defined]
        key = field.alias or name
        where = f"{path}.{key}" if path else key
        if key not in raw:
            if name in nullable:
                found.append(f"{where}: missing (OpenAI's schema requires it, null allowed)")
            continue
        value = raw[key]
        if value is None:
            if name not in may_be_null and _structured(field.annotation):
                found.append(f"{where}: null where the schema expects an object or array")
            continue
        for sub, item, at in _nested(field.annotation, value, where):
            found += _walk(sub, item, at)
    return found


def _args(annotation: Any) -> list[Any]:
    """The types an annotation allows, ``Optional``/``Union``/``Annotated`` opened."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [a for arg in typing.get_args(annotation) for a in _args(arg)]
    if origin is typing.Annotated:
        return _args(typing.get_args(annotation)[0])
    return [annotation]


def _is_model(kind: Any) -> bool:
    return isinstance(kind, type) and hasattr(kind, "model_fields")


def _structured(annotation: Any) -> bool:
    kinds = [k for k in _args(annotation) if k is not type(None)]
    return any(_is_model(k) or typing.get_origin(k) in (list, dict) for k in kinds)


def _nested(annotation: Any, value: Any, path: str) -> list[tuple[type, Any, str]]:
    """The (model, raw value, path) pairs of the nested objects a field holds, where one
    model type reads them (a union of several is left to ``model_validate``)."""
    kinds = [k for k in _args(annotation) if k is not type(None)]
    models = [k for k in kinds if _is_model(k)]
    if len(models) == 1 and isinstance(value, dict):
        return [(models[0], value, path)]
    lists = [typing.get_args(k)[0] for k in kinds if typing.get_origin(k) is list]
    if len(lists) == 1 and isinstance(value, list):
        inner = [k for k in _args(lists[0]) if _is_model(k)]
        if len(inner) == 1:
            return [
                (inner[0], v, f"{path}[{i}]") for i, v in enumerate(value) if isinstance(v, dict)
            ]
    return []


def answers(model: str, many: int = 2048) -> list[tuple[str, dict[str, Any] | None, str]]:
    """(path, body, route) of requests every OpenAI door answers 200 on echo (with the
    ``logprobs`` and ``n`` features); a streamed one is checked chunk by chunk. ``many``:
    the inputs of the large embeddings requests (OpenAI's most, 2048, by default)."""
    return [
        (
            CHAT,
            {"model": model, "messages": [{"role": "user", "content": "one two three"}]},
            "chat",
        ),
        # The body the fuzz found with no answer: one developer message, empty, no max_tokens.
        (CHAT, {"model": model, "messages": [{"role": "developer", "content": ""}]}, "chat"),
        (
            CHAT,
            {
                "model": model,
                "messages": [{"role": "user", "content": "a b c"}],
                "logprobs": True,
                "top_logprobs": 2,
                "n": 2,
                "max_tokens": 2,
            },
            "chat",
        ),
        (
            CHAT,
            {
                "model": model,
                "messages": [{"role": "user", "content": "a b"}],
                "stream": True,
                "stream_options": {"include_usage": True},
            },
            "chat",
        ),
        (
            CHAT,
            {"model": model, "messages": [{"role": "developer", "content": ""}], "stream": True},
            "chat",
        ),
        ("/completions", {"model": model, "prompt": "x y z", "logprobs": 2, "n": 2}, "completion"),
        ("/completions", {"model": model, "prompt": "x y", "stream": True}, "completion"),
        (
            "/embeddings",
            {"model": model, "input": "aa bbb", "encoding_format": "float"},
            "embedding",
        ),
        # Large inputs, once without an answer: OpenAI's most inputs per request, in both formats.
        (
            "/embeddings",
            {"model": model, "input": ["aa b"] * many, "encoding_format": "float"},
            "embedding",
        ),
        (
            "/embeddings",
            {"model": model, "input": ["aa b"] * many, "encoding_format": "base64"},
            "embedding",
        ),
        ("/models", None, "models"),
    ]


def refusals(model: str) -> list[tuple[str, str, dict[str, Any] | None, int]]:
    """(method, path, body, status) of requests a door refuses, each with OpenAI's envelope
    (echo's ``fail_marker`` is ``POISON``)."""
    return [
        ("POST", CHAT, {"model": model, "messages": [{"role": "nobody", "content": "x"}]}, 400),
        ("POST", CHAT, {"model": model, "messages": [{"role": "user", "content": "POISON"}]}, 400),
        ("POST", "/embeddings", {"model": model, "input": ["a"] * 2049}, 400),
        # OpenAI's most choices is 128: more once kept the engine building them
        ("POST", "/completions", {"model": model, "prompt": "a", "n": 129}, 400),
        ("POST", CHAT, {"model": model, "messages": [], "stream": True}, 400),
        ("POST", "/nowhere", {}, 404),
        ("GET", CHAT, None, 405),
    ]


def answer_problems(route: str, body: dict[str, Any] | None, text: str) -> list[str]:
    """What keeps the 200 answer ``text`` to ``body`` from being OpenAI's for ``route``."""
    if body is not None and body.get("stream"):
        events = sse_events(text)
        if not events or events[-1] != "[DONE]":
            return [f"the stream does not end with [DONE]: {events!r}"]
        found = [p for event in events[:-1] for p in chunk_problems(route, event)]
        finishes = [c.get("finish_reason") for e in events[:-1] for c in e.get("choices", [])]
        if not finishes or finishes[-1] is None:
            found.append(f"the last choice has no finish_reason: {events!r}")
        return found
    answer = json.loads(text)
    if route == "embedding" and body is not None and body.get("encoding_format") == "base64":
        answer = embeddings_as_floats(answer)
    found = problems(response_type(route), answer)
    if route == "embedding" and body is not None:
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        if [d.get("index") for d in answer.get("data", [])] != list(range(len(inputs))):
            found.append("data: not one embedding per input, in order")
    return found


def embeddings_as_floats(body: dict[str, Any]) -> dict[str, Any]:
    """An embeddings body with ``encoding_format: base64`` decoded as the openai client
    decodes it (little-endian float32), for ``CreateEmbeddingResponse``."""
    data = []
    for item in body["data"]:
        packed = base64.b64decode(item["embedding"])
        data.append({**item, "embedding": list(struct.unpack(f"<{len(packed) // 4}f", packed))})
    return {**body, "data": data}


def sse_events(text: str) -> list[Any]:
    """The ``data:`` events of a server-sent stream, parsed (``[DONE]`` as the string)."""
    events = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[len("data: ") :]
            events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def response_type(route: str, streamed: bool = False) -> type:
    """The ``openai`` type of a 200 body of ``route`` (a chunk's when ``streamed``)."""
    from openai.pagination import SyncPage
    from openai.types import Completion, CreateEmbeddingResponse, Model
    from openai.types.chat import ChatCompletion, ChatCompletionChunk

    return {
        ("chat", False): ChatCompletion,
        ("chat", True): ChatCompletionChunk,
        ("completion", False): Completion,
        ("completion", True): Completion,
        ("embedding", False): CreateEmbeddingResponse,
        ("models", False): SyncPage[Model],
    }[(route, streamed)]


def chunk_problems(route: str, chunk: Any) -> list[str]:
    """What keeps ``chunk`` (one event of a stream) from being OpenAI's. A completions chunk
    before the last part has ``finish_reason`` null, as OpenAI's streams send it, which
    ``Completion`` (the type of a whole answer) does not allow: that field is only checked
    to be there."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletionChunk

    if route == "chat":
        return problems(ChatCompletionChunk, chunk)
    choices = chunk.get("choices") if isinstance(chunk, dict) else None
    if not isinstance(choices, list):
        return problems(Completion, chunk)
    missing = [
        f"choices[{i}].finish_reason: missing"
        for i, c in enumerate(choices)
        if "finish_reason" not in c
    ]
    last = [{**c, "finish_reason": c.get("finish_reason") or "stop"} for c in choices]
    return missing + problems(Completion, {**chunk, "choices": last})


def error_problems(status: int, raw: Any) -> list[str]:
    """What keeps ``raw`` from being OpenAI's error envelope."""
    from openai.types.shared import ErrorObject

    if not isinstance(raw, dict) or set(raw) != {"error"}:
        return [f"{status}: not OpenAI's envelope {{'error': {{...}}}}: {raw!r}"]
    return problems(ErrorObject, raw["error"], "error")


__all__ = [
    "CHAT",
    "answer_problems",
    "answers",
    "refusals",
    "OPTIONAL_NULLABLE",
    "REQUIRED_NULLABLE",
    "chunk_problems",
    "embeddings_as_floats",
    "error_problems",
    "problems",
    "response_type",
    "sse_events",
]
