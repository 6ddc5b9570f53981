"""OpenAI-style ``sampling_params`` -> keyword arguments of vLLM's ``SamplingParams``.

Pure (no vllm import), so it is tested without an engine. The OpenAI names the row protocol
promises are translated; vLLM's own sampling names (``top_k``, ``min_p``,
``repetition_penalty``, ...) pass through; anything else is an error that names the key,
never silently dropped.
"""

from __future__ import annotations

import json
from typing import Any

#: OpenAI names that vLLM spells the same way.
OPENAI_SAME_NAME = frozenset(
    {"temperature", "top_p", "max_tokens", "stop", "seed", "n", "presence_penalty",
     "frequency_penalty", "logit_bias", "logprobs"}
)  # fmt: skip
#: vLLM-only sampling fields a row may set (a subset of ``vllm.SamplingParams`` fields).
VLLM_EXTRA = frozenset(
    {"top_k", "min_p", "repetition_penalty", "min_tokens", "stop_token_ids", "ignore_eos",
     "skip_special_tokens", "include_stop_str_in_output", "bad_words", "allowed_token_ids"}
)  # fmt: skip


class SamplingParamsError(ValueError):
    """A row's sampling params cannot be expressed for vLLM."""


def to_vllm_kwargs(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(SamplingParams kwargs, StructuredOutputsParams kwargs or None) for one row."""
    kwargs: dict[str, Any] = {}
    structured: dict[str, Any] | None = None
    for key, value in params.items():
        if value is None:
            continue
        if key in OPENAI_SAME_NAME or key in VLLM_EXTRA:
            kwargs[key] = value
        elif key == "max_completion_tokens":  # the newer OpenAI name
            kwargs["max_tokens"] = value
        elif key == "response_format":
            structured = _structured(value)
        else:
            known = sorted(OPENAI_SAME_NAME | VLLM_EXTRA | {"response_format", "max_completion_tokens"})
            raise SamplingParamsError(
                f"sampling_params.{key} is not supported by the vllm backend; known: {', '.join(known)}"
            )
    if kwargs.get("n", 1) != 1:
        raise SamplingParamsError(f"sampling_params.n must be 1 (one row, one answer), got {kwargs['n']!r}")
    if kwargs.get("logprobs") is True:  # OpenAI's boolean; vLLM wants a count
        kwargs["logprobs"] = 1
    elif kwargs.get("logprobs") is False:
        kwargs.pop("logprobs")
    return kwargs, structured


def _structured(response_format: Any) -> dict[str, Any] | None:
    """OpenAI ``response_format`` -> vLLM structured-output constraint."""
    if not isinstance(response_format, dict):
        raise SamplingParamsError(f"sampling_params.response_format must be an object, got {response_format!r}")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise SamplingParamsError(f"response_format.json_schema.schema is not JSON: {exc}") from None
        if not isinstance(schema, dict):
            raise SamplingParamsError(
                "response_format of type 'json_schema' needs json_schema.schema (an object), "
                f"got {spec!r}"
            )
        return {"json": schema}
    raise SamplingParamsError(
        f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}"
    )


__all__ = ["OPENAI_SAME_NAME", "VLLM_EXTRA", "SamplingParamsError", "to_vllm_kwargs"]
