"""How echo follows a row's sampling params: deterministic, checkable answers (the properties
the conformance kit checks), kept apart from the echo engine so each reads on its own."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Mapping
from typing import Any

from relayllm.adapters.sampling import parse_response_format
from relayllm.rows import Result

#: echo's "model": its most likely next word holds this share of the probability, so a nucleus
#: (``top_p``) no larger holds that word alone and sampling is greedy.
ECHO_TOP_WORD_P = 0.5
#: The longest array echo builds for a JSON schema's ``minItems``.
ECHO_MAX_ITEMS = 1024


def generate(
    words: list[str],
    params: Mapping[str, Any],
    *,
    sampling: bool = False,
    max_tokens_default: int | None = None,
) -> Result:
    """Echo's answer to a text row whose greedy answer is ``words``, following ``params`` as
    an engine does (the properties the conformance kit checks): ``n`` samples (the first one
    also in the row's own fields, ``num_generated_tokens`` their sum), each cut by
    ``max_tokens`` and ``stop``, with ``logprobs`` when asked. Raises ``ValueError`` for a
    ``response_format`` it cannot read."""
    n = params.get("n") or 1
    samples = [_sample(words, params, i, sampling, max_tokens_default) for i in range(n)]
    result: Result = {
        **samples[0],  # type: ignore[typeddict-item]
        "num_generated_tokens": sum(s["num_generated_tokens"] for s in samples),
    }
    if n > 1:
        result["samples"] = samples
    return result


def _sample(
    words: list[str], params: Mapping[str, Any], index: int, sampling: bool, default: int | None
) -> dict[str, Any]:
    structured = _structured_text(words, params)
    if structured is not None:
        out = structured.split()
    else:
        out = list(words)
        if (params.get("presence_penalty") or 0) > 0 or (params.get("frequency_penalty") or 0) > 0:
            out = list(dict.fromkeys(out))  # a penalised word is not said twice
        if sampling and _samples(params):
            seed = params.get("seed")
            # A string seed hashes the same in every process (an int seed would too, but
            # each of the n samples needs its own stream).
            rng = random.Random(f"{seed}/{index}") if seed is not None else random.Random()
            rng.shuffle(out)
    limit = params.get("max_tokens") or params.get("max_completion_tokens") or default
    finish = "stop"
    if limit and len(out) > limit:
        out, finish = out[:limit], "length"
    text = " ".join(out)
    stop = params.get("stop") or []
    hits = [(text.find(s), s) for s in ([stop] if isinstance(stop, str) else stop) if s in text]
    if hits:
        at, string = min(hits)
        out = text[: at + len(string)].split()  # the words generated up to the stop string
        text, finish = text[:at], "stop"
    sample: dict[str, Any] = {
        "generated_text": text,
        "finish_reason": finish,
        "num_generated_tokens": len(out),
    }
    top = _top_logprobs(params)
    if top is not None:
        sample["logprobs"] = [_logprob_entry(w, top) for w in out]
    return sample


def _samples(params: Mapping[str, Any]) -> bool:
    """Whether the row samples (else it is greedy): temperature > 0 (OpenAI's default is 1)
    and a nucleus larger than echo's most likely word."""
    temperature = params.get("temperature")
    top_p = params.get("top_p")
    return (1.0 if temperature is None else temperature) > 0 and (
        1.0 if top_p is None else top_p
    ) > ECHO_TOP_WORD_P


def _top_logprobs(params: Mapping[str, Any]) -> int | None:
    """How many alternatives each logprobs entry lists, or None when none were asked for.
    Chat: ``logprobs: true`` plus ``top_logprobs: k``; completions: ``logprobs: k``."""
    asked, top = params.get("logprobs"), params.get("top_logprobs")
    if asked is True or (top and asked is None):
        return int(top or 0)
    if isinstance(asked, int) and not isinstance(asked, bool):
        return asked
    return None


def _logprob_entry(word: str, top: int) -> dict[str, Any]:
    best = math.log(ECHO_TOP_WORD_P)
    alternatives = [{"token": word, "logprob": best}]
    alternatives += [{"token": f"<alt{j}>", "logprob": best - j} for j in range(1, top)]
    return {"token": word, "logprob": best, "top_logprobs": alternatives[:top]}


def _structured_text(words: list[str], params: Mapping[str, Any]) -> str | None:
    """The answer a structured-output row gets (JSON for a schema, one of the choices), or
    None for a free-text row."""
    structured = params.get("structured_outputs")
    if isinstance(structured, Mapping) and structured.get("choice"):
        choices = list(structured["choice"])
        return next((c for c in choices if c in words), choices[0])
    schema: Any = None
    if isinstance(structured, Mapping) and structured.get("json") is not None:
        schema = structured["json"]
        schema = json.loads(schema) if isinstance(schema, str) else schema
    elif params.get("response_format") is not None:
        parsed = parse_response_format(params["response_format"])
        schema = parsed.schema_or_object() if parsed is not None else None
    if schema is None:
        return None
    return json.dumps(_instance(schema, words))


def _instance(schema: Mapping[str, Any], words: list[str]) -> Any:
    """A value valid for ``schema`` (the common JSON-schema keywords), built from ``words``."""
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object" or (kind is None and "properties" in schema):
        properties = schema.get("properties") or {}
        return {name: _instance(sub, words) for name, sub in properties.items()}
    if kind == "array":
        count = int(schema.get("minItems", 0))
        if count > ECHO_MAX_ITEMS:  # a conforming answer would not fit any max_tokens
            raise ValueError(f"minItems {count}: echo answers arrays of {ECHO_MAX_ITEMS} at most")
        return [_instance(schema.get("items") or {}, words)] * count
    if kind == "integer":
        return len(words)
    if kind == "number":
        return float(len(words))
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return words[0] if words else "echo"


__all__ = ["ECHO_TOP_WORD_P", "generate"]
