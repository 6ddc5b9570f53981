"""A batch input file's input tokens per ``model``, estimated from its text without a tokenizer."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import IO, Any

from relayllm import bounded_json

#: A token is about this many bytes of text (OpenAI's rule of thumb for English): the gateway
#: estimates a batch's tokens without the deployment's tokenizer.
BYTES_PER_TOKEN = 4


def estimate_tokens(source: IO[bytes]) -> dict[str, int]:
    """A batch input file's estimated input tokens per ``model``: each line's prompt text
    (message contents, ``prompt``, ``input``) in UTF-8 bytes / :data:`BYTES_PER_TOKEN`,
    rounded up. Lines that do not parse count nothing (validation fails them)."""
    tokens: dict[str, int] = {}
    for raw in source:
        try:
            body = bounded_json.loads(raw)["body"]  # too deep, not UTF-8: a ValueError
            model = str(body.get("model") or "")
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
        text = sum(len(part.encode("utf-8")) for part in _texts(body))
        tokens[model] = tokens.get(model, 0) + math.ceil(text / BYTES_PER_TOKEN)
    return tokens


def _texts(body: dict[str, Any]) -> Iterable[str]:
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            yield from (p["text"] for p in content if isinstance(p, dict) and "text" in p)
    for name in ("prompt", "input"):
        value = body.get(name)
        if isinstance(value, str):
            yield value
        elif isinstance(value, list):
            yield from (v for v in value if isinstance(v, str))


__all__ = ["BYTES_PER_TOKEN", "estimate_tokens"]
