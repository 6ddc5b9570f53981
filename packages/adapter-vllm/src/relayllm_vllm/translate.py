"""OpenAI-style ``sampling_params`` -> keyword arguments of vLLM's ``SamplingParams``.

Pure (no vllm import), so it is tested without an engine. The OpenAI names the row protocol
promises are translated; vLLM's own sampling names (``top_k``, ``min_p``,
``repetition_penalty``, ...) pass through; anything else is an error that names the key,
never silently dropped.
"""

from __future__ import annotations

from typing import Any

from relayllm.adapters import UnsupportedParameter, check_sampling_support, parse_response_format

#: OpenAI names that vLLM spells the same way.
OPENAI_SAME_NAME = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "stop",
        "seed",
        "n",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
    }
)
#: vLLM-only sampling fields a row may set (a subset of ``vllm.SamplingParams`` fields).
VLLM_EXTRA = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "min_tokens",
        "stop_token_ids",
        "ignore_eos",
        "skip_special_tokens",
        "include_stop_str_in_output",
        "bad_words",
        "allowed_token_ids",
    }
)


#: Every sampling_params key a row may set on this backend.
SUPPORTED = OPENAI_SAME_NAME | VLLM_EXTRA | {"response_format", "max_completion_tokens"}


class SamplingParamsError(UnsupportedParameter):
    """A row's sampling params cannot be expressed for vLLM."""


def to_vllm_kwargs(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(SamplingParams kwargs, StructuredOutputsParams kwargs or None) for one row."""
    try:
        check_sampling_support("vllm", params, SUPPORTED)  # the policy every adapter shares
    except UnsupportedParameter as exc:
        raise SamplingParamsError(str(exc)) from None
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
    if kwargs.get("n", 1) != 1:
        raise SamplingParamsError(
            f"sampling_params.n must be 1 (one row, one answer), got {kwargs['n']!r}"
        )
    if kwargs.get("logprobs") is True:  # OpenAI's boolean; vLLM wants a count
        kwargs["logprobs"] = 1
    elif kwargs.get("logprobs") is False:
        kwargs.pop("logprobs")
    return kwargs, structured


def _structured(response_format: Any) -> dict[str, Any] | None:
    """OpenAI ``response_format`` -> vLLM structured-output constraint."""
    try:
        spec = parse_response_format(response_format)
    except ValueError as exc:
        raise SamplingParamsError(str(exc)) from None
    if spec is None:
        return None
    return {"json_object": True} if spec.kind == "json_object" else {"json": spec.schema}


__all__ = ["OPENAI_SAME_NAME", "SUPPORTED", "VLLM_EXTRA", "SamplingParamsError", "to_vllm_kwargs"]
