"""OpenAI responses -> relayllm results, as plain functions (no client call)."""

from __future__ import annotations

from typing import Any

from relayllm.adapters import Result
from relayllm_openai.retrying import MalformedResponse


def generation_result(response: Any, task: str) -> Result:
    """A chat or completion response -> the row's result: the first choice in the row's own
    columns, every choice in ``samples`` when there are several (``n``), and the endpoint's
    ``prompt_logprobs`` (a vLLM server extra) when it sent them."""
    first_choice(response)
    usage = getattr(response, "usage", None)
    samples = [_sample(choice, task) for choice in response.choices]
    result: dict[str, Any] = {
        **samples[0],
        "num_input_tokens": getattr(usage, "prompt_tokens", None),
        "num_generated_tokens": getattr(usage, "completion_tokens", None),
    }
    if len(samples) > 1:
        result["samples"] = samples
    prompt_logprobs = _extra(response, "prompt_logprobs")
    if prompt_logprobs is not None:
        result["prompt_logprobs"] = _vllm_prompt_logprobs(prompt_logprobs)
    return result  # type: ignore[return-value]


def _sample(choice: Any, task: str) -> dict[str, Any]:
    sample: dict[str, Any] = {"finish_reason": choice.finish_reason}
    logprobs = getattr(choice, "logprobs", None)
    if task == "chat":
        message = choice.message
        sample["generated_text"] = message.content
        calls = getattr(message, "tool_calls", None)
        if calls:
            sample["tool_calls"] = [
                {
                    "id": c.id,
                    "type": c.type,
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        # vLLM's server says ``reasoning`` (older ones ``reasoning_content``).
        reasoning = _extra(message, "reasoning_content")
        if reasoning is None:
            reasoning = _extra(message, "reasoning")
        if reasoning is not None:
            sample["reasoning_content"] = reasoning
        if logprobs is not None and getattr(logprobs, "content", None) is not None:
            sample["logprobs"] = [
                {
                    "token": t.token,
                    "logprob": t.logprob,
                    "top_logprobs": [
                        {"token": a.token, "logprob": a.logprob} for a in t.top_logprobs or []
                    ],
                }
                for t in logprobs.content
            ]
        if sample["generated_text"] is None and not calls:
            sample["generated_text"] = ""
        return sample
    sample["generated_text"] = choice.text if choice.text is not None else ""
    if logprobs is not None and getattr(logprobs, "tokens", None) is not None:
        tops = logprobs.top_logprobs or [None] * len(logprobs.tokens)
        sample["logprobs"] = [
            {
                "token": token,
                "logprob": logprob,
                "top_logprobs": [
                    {"token": k, "logprob": v}
                    for k, v in sorted((top or {}).items(), key=lambda kv: -kv[1])
                ],
            }
            for token, logprob, top in zip(
                logprobs.tokens, logprobs.token_logprobs, tops, strict=False
            )
        ]
    return sample


def _extra(obj: Any, name: str) -> Any:
    """A field the ``openai`` types do not declare (kept by pydantic as an extra)."""
    value = getattr(obj, name, None)
    if value is None:
        value = (getattr(obj, "model_extra", None) or {}).get(name)
    return value


def _vllm_prompt_logprobs(positions: list[Any]) -> list[dict[str, Any]]:
    """vLLM's ``prompt_logprobs`` (per prompt token, ``{token_id: {logprob, rank,
    decoded_token}}``, the first one null) -> the row's shape. vLLM lists the prompt's own
    token first, then the k most likely ones (k+1 entries unless the prompt's token is one
    of the k, so a rank below the entry count means it is)."""
    out: list[dict[str, Any]] = []
    for entries in positions:
        if not entries:
            out.append({"token": None, "logprob": None, "top_logprobs": []})
            continue
        values = list(entries.values())
        chosen = values[0]
        k = len(values) if (chosen.get("rank") or 0) < len(values) else len(values) - 1
        ranked = sorted(
            (e for e in values if (e.get("rank") or 0) <= k), key=lambda e: e.get("rank") or 0
        )
        out.append(
            {
                "token": chosen.get("decoded_token"),
                "logprob": chosen.get("logprob"),
                "top_logprobs": [
                    {"token": e.get("decoded_token"), "logprob": e.get("logprob")} for e in ranked
                ],
            }
        )
    return out


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


def classify_result(body: Any) -> Result:
    """vLLM's ``/classify`` response (``data[0]``: ``label``, ``probs``) -> the row's columns."""
    data = body.get("data") if isinstance(body, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    if not isinstance(first, dict) or not isinstance(first.get("probs"), list):
        raise MalformedResponse(
            f"the endpoint answered without class probabilities: {_preview(body)}"
        )
    return {
        "label": first.get("label"),
        "probs": [float(p) for p in first["probs"]],
        "num_input_tokens": (body.get("usage") or {}).get("prompt_tokens"),
    }


def score_result(body: Any) -> Result:
    """vLLM's ``/score`` response (``data[0].score``) -> the row's ``score``."""
    data = body.get("data") if isinstance(body, dict) else None
    first = data[0] if isinstance(data, list) and data else None
    score = first.get("score") if isinstance(first, dict) else None
    if not isinstance(score, (int, float)) or isinstance(score, bool):
        raise MalformedResponse(f"the endpoint answered without a score: {_preview(body)}")
    return {
        "score": float(score),
        "num_input_tokens": (body.get("usage") or {}).get("prompt_tokens"),
    }


def _preview(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "classify_result",
    "embedding_result",
    "first_choice",
    "generation_result",
    "score_result",
]
