"""OpenAI-style ``sampling_params`` -> keyword arguments of vLLM's ``SamplingParams``.

Pure (no vllm import), so it is tested without an engine. The OpenAI names the row protocol
promises are translated; vLLM's own sampling names (``top_k``, ``min_p``,
``repetition_penalty``, ...) pass through; anything else is an error that names the key,
never silently dropped.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from relayllm.adapters import (
    OPENAI_SAMPLING_PARAMS,
    UnsupportedParameter,
    check_sampling_support,
    parse_response_format,
)

#: OpenAI names (relayllm.rows.OPENAI_SAMPLING_PARAMS) this adapter translates below...
OPENAI_TRANSLATED = frozenset(
    {"max_completion_tokens", "response_format", "top_logprobs", "tools", "tool_choice"}
)
#: ...and those vLLM's offline engine does not do: a row setting one fails, naming it.
OPENAI_UNSUPPORTED = frozenset(
    {"reasoning_effort", "best_of", "suffix", "echo", "parallel_tool_calls"}
)
#: OpenAI names that vLLM spells the same way: the rest.
OPENAI_SAME_NAME = OPENAI_SAMPLING_PARAMS - OPENAI_TRANSLATED - OPENAI_UNSUPPORTED
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


#: Row keys that shape the prompt (chat template, tools) rather than the sampling.
CHAT_KEYS = frozenset({"tools", "tool_choice", "chat_template_kwargs", "continue_final_message"})
#: Every sampling_params key a row may set on this backend.
SUPPORTED = (
    OPENAI_SAME_NAME
    | VLLM_EXTRA
    | CHAT_KEYS
    | {
        "response_format",
        "max_completion_tokens",
        "top_logprobs",
        "prompt_logprobs",
        "structured_outputs",
    }
)


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
        if key in OPENAI_SAME_NAME or key in VLLM_EXTRA or key == "prompt_logprobs":
            kwargs[key] = value
        elif key == "max_completion_tokens":  # the newer OpenAI name
            kwargs["max_tokens"] = value
        elif key == "response_format":
            structured = _structured(value)
        elif key == "structured_outputs":
            if structured is not None:
                raise SamplingParamsError(
                    "give one of sampling_params.response_format and structured_outputs"
                )
            structured = _structured_outputs(value)
    # OpenAI chat: ``logprobs: true`` plus ``top_logprobs: k`` alternatives; completions:
    # ``logprobs: k``. vLLM's ``logprobs`` is k (it always adds the chosen token).
    top = params.get("top_logprobs")
    if kwargs.get("logprobs") is True or (top and kwargs.get("logprobs") is None):
        kwargs["logprobs"] = top or 0
    elif kwargs.get("logprobs") is False:
        kwargs.pop("logprobs")
    plan = tool_plan(params)
    if plan is not None and plan.forced is not None:
        if structured is not None:
            raise SamplingParamsError(
                f"tool_choice {plan.mode!r} forces the answer's format; drop "
                f"response_format / structured_outputs from the row"
            )
        structured = {"json": plan.forced}
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


def _structured_outputs(value: Any) -> dict[str, Any]:
    """``structured_outputs: {json|choice|regex|grammar: ...}`` (checked by the row protocol)
    -> ``StructuredOutputsParams`` kwargs: the same names."""
    ((form, spec),) = ((k, v) for k, v in value.items() if v is not None)
    if form == "json" and isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise SamplingParamsError(f"structured_outputs.json is not JSON: {exc}") from None
    return {form: spec}


def chat_template_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """What the chat template is given: the row's ``chat_template_kwargs``, its ``tools``, and
    -- assistant prefill -- ``continue_final_message`` instead of a new generation prompt."""
    prefill = bool(params.get("continue_final_message"))
    kwargs = dict(params.get("chat_template_kwargs") or {})
    kwargs.update(add_generation_prompt=not prefill, continue_final_message=prefill)
    plan = tool_plan(params)
    if plan is not None:
        kwargs["tools"] = plan.tools
    return kwargs


@dataclass(frozen=True)
class ToolPlan:
    """How a row's ``tools`` / ``tool_choice`` are served."""

    mode: str  # "auto" (a tool parser reads the text), "required" or "named"
    tools: list[dict[str, Any]]
    #: The JSON schema structured output forces for "required" / "named" (None: "auto").
    forced: dict[str, Any] | None = None
    name: str | None = None  # the named tool


def tool_plan(params: dict[str, Any]) -> ToolPlan | None:
    """None when the row offers no tools (or ``tool_choice: none``). ``required`` and a named
    tool are forced with structured output, as vLLM's server does: the answer is a JSON list
    of ``{"name", "parameters"}`` (required) or the named tool's arguments."""
    tools = [t for t in params.get("tools") or [] if isinstance(t, dict)]
    choice = params.get("tool_choice") or "auto"
    if not tools or choice == "none":
        return None
    if choice == "auto":
        return ToolPlan("auto", tools)
    if choice == "required":
        calls = [
            {
                "type": "object",
                "properties": {
                    "name": {"type": "string", "enum": [_function(t)["name"]]},
                    "parameters": _function(t).get("parameters") or {"type": "object"},
                },
                "required": ["name", "parameters"],
            }
            for t in tools
        ]
        schema = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
        return ToolPlan("required", tools, schema)
    name = _function(choice)["name"] if isinstance(choice, dict) else str(choice)
    match = [t for t in tools if _function(t)["name"] == name]
    if not match:
        raise SamplingParamsError(
            f"tool_choice names {name!r}, which is not one of the row's tools "
            f"({', '.join(_function(t)['name'] for t in tools)})"
        )
    parameters = _function(match[0]).get("parameters") or {"type": "object"}
    return ToolPlan("named", tools, parameters, name)


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    return tool.get("function") or {}


def forced_tool_calls(text: str, plan: ToolPlan) -> list[dict[str, Any]] | None:
    """The tool calls in the text structured output forced (None if it is not complete JSON,
    e.g. cut by ``max_tokens``: the row keeps its text, ``finish_reason`` says why)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if plan.mode == "named":
        return [tool_call(plan.name or "", value)]
    if not isinstance(value, list):
        return None
    return [tool_call(c.get("name", ""), c.get("parameters")) for c in value if isinstance(c, dict)]


def tool_call(name: str, arguments: Any) -> dict[str, Any]:
    """One call in OpenAI's shape (``arguments`` is a JSON string)."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {
        "id": f"chatcmpl-tool-{uuid.uuid4().hex}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def token_logprobs(
    token_ids: Sequence[int], positions: Iterable[Any] | None, top: int
) -> list[dict[str, Any]] | None:
    """vLLM logprobs (per position, a dict token id -> ``Logprob(logprob, rank,
    decoded_token)``) -> the row's ``logprobs``: the chosen token, its logprob and the ``top``
    most likely alternatives by rank. A position without an entry (a prompt's first token)
    has a null logprob."""
    if positions is None:
        return None
    out: list[dict[str, Any]] = []
    for token_id, entries in zip(token_ids, positions, strict=False):
        if not entries:
            out.append({"token": None, "logprob": None, "top_logprobs": []})
            continue
        chosen = entries.get(token_id)
        ranked = sorted(
            (e for e in entries.values() if e.rank is not None and e.rank <= top),
            key=lambda e: e.rank,
        )
        out.append(
            {
                "token": chosen.decoded_token if chosen else None,
                "logprob": float(chosen.logprob) if chosen else None,
                "top_logprobs": [
                    {"token": e.decoded_token, "logprob": float(e.logprob)} for e in ranked
                ],
            }
        )
    return out


__all__ = [
    "CHAT_KEYS",
    "OPENAI_SAME_NAME",
    "SUPPORTED",
    "VLLM_EXTRA",
    "SamplingParamsError",
    "ToolPlan",
    "chat_template_kwargs",
    "forced_tool_calls",
    "to_vllm_kwargs",
    "token_logprobs",
    "tool_call",
    "tool_plan",
]
