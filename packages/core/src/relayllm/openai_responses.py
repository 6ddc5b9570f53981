"""OpenAI's Responses API, text in and text out, as a chat: a ``/v1/responses`` body read as the
chat request it asks for, and the chat's answer as a ``response`` object (for batch files'
``/v1/responses`` lines)."""

from __future__ import annotations

import time
from typing import Any

from relayllm.openai_body import UNUSED_FIELDS, Row
from relayllm.rows import (
    ENGINE_S,
    FINISH_REASON,
    GENERATED_TEXT,
    NUM_GENERATED_TOKENS,
    NUM_INPUT_TOKENS,
    WEIGHT_VERSION,
)

#: What a ``/v1/responses`` body may hold (text in, text out): these are read or ignored;
#: anything else (tools, reasoning, previous_response_id...) refuses the line.
RESPONSES_FIELDS = (
    frozenset(
        {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "text"}
    )
    | UNUSED_FIELDS
)


def responses_as_chat(body: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """A ``/v1/responses`` body (text in, text out) as the chat body it asks for, or why it
    cannot be one: ``instructions`` becomes a system message, ``input`` (a string, or
    messages whose content is a string or ``input_text`` parts) the messages,
    ``max_output_tokens`` ``max_tokens``."""
    unknown = sorted(k for k, v in body.items() if k not in RESPONSES_FIELDS and v is not None)
    if unknown:
        return {}, f"{unknown} are not supported in a /v1/responses line (text in, text out)"
    fmt = (body.get("text") or {}).get("format") if isinstance(body.get("text"), dict) else None
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "text"):
        return {}, "only text.format {'type': 'text'} is supported in a /v1/responses line"
    messages: list[dict[str, Any]] = []
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            return {}, "'instructions' must be a string"
        messages.append({"role": "system", "content": body["instructions"]})
    given = body.get("input")
    if isinstance(given, str) and given:
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list) and given:
        for i, item in enumerate(given):
            if not isinstance(item, dict) or item.get("type", "message") != "message":
                return {}, f"input[{i}] must be a message (text in, text out)"
            content = item.get("content")
            if isinstance(content, list):
                texts = [p.get("text") for p in content if isinstance(p, dict)]
                kinds = {p.get("type") for p in content if isinstance(p, dict)}
                if len(texts) != len(content) or not kinds <= {"input_text", "output_text"}:
                    return {}, f"input[{i}].content must be text parts (text in, text out)"
                content = "".join(t for t in texts if isinstance(t, str))
            if item.get("role") not in ("user", "assistant", "system", "developer"):
                return {}, f"input[{i}].role must be user, assistant, system or developer"
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": content})
    else:
        return {}, "'input' must be a non-empty string or list of messages"
    chat = {k: body[k] for k in ("model", "temperature", "top_p") if body.get(k) is not None}
    if body.get("max_output_tokens") is not None:
        chat["max_tokens"] = body["max_output_tokens"]
    chat["messages"] = messages
    return chat, None


def responses_body(result: Row, model: str, request_id: str) -> dict[str, Any]:
    """The ``response`` object for a text row that succeeded (one output message)."""
    prompt = result.get(NUM_INPUT_TOKENS) or 0
    generated = result.get(NUM_GENERATED_TOKENS) or 0
    cut = result.get(FINISH_REASON) == "length"
    return {
        "id": f"resp_{request_id}",
        "object": "response",
        WEIGHT_VERSION: result.get(WEIGHT_VERSION),
        ENGINE_S: result.get(ENGINE_S),
        "created_at": int(time.time()),
        "status": "incomplete" if cut else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "error": None,
        "model": model,
        "output": [
            {
                "type": "message",
                "id": f"msg_{request_id}",
                "status": "incomplete" if cut else "completed",
                "role": "assistant",
                "content": [
                    {
                        "type": "output_text",
                        "text": result.get(GENERATED_TEXT) or "",
                        "annotations": [],
                    }
                ],
            }
        ],
        "parallel_tool_calls": False,
        "tool_choice": "none",
        "tools": [],
        "usage": {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": generated,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + generated,
        },
    }


__all__ = ["RESPONSES_FIELDS", "responses_as_chat", "responses_body"]
