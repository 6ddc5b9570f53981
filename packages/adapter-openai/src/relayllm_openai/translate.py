"""OpenAI responses -> relayllm results, as plain functions (no client call)."""

from __future__ import annotations

from typing import Any

from relayllm.rows import Result
from relayllm_openai.retrying import MalformedResponse


def generation_result(response: Any, choice: Any, text: str | None) -> Result:
    usage = getattr(response, "usage", None)
    return {
        "generated_text": text if text is not None else "",
        "finish_reason": choice.finish_reason,
        "num_input_tokens": getattr(usage, "prompt_tokens", None),
        "num_generated_tokens": getattr(usage, "completion_tokens", None),
    }


def first_choice(response: Any) -> Any:
    choices = getattr(response, "choices", None)
    if not choices:
        raise MalformedResponse(f"the endpoint answered without choices: {_preview(response)}")
    return choices[0]


def embedding_result(response: Any) -> Result:
    data = getattr(response, "data", None)
    if not data or not isinstance(getattr(data[0], "embedding", None), list):
        raise MalformedResponse(f"the endpoint answered without an embedding: {_preview(response)}")
    usage = getattr(response, "usage", None)
    return {
        "embedding": data[0].embedding,
        "num_input_tokens": getattr(usage, "prompt_tokens", None),
    }


def _preview(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = ["embedding_result", "first_choice", "generation_result"]
