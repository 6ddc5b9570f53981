"""relayllm rows -> SGLang engine inputs, as plain functions (no engine, no sglang import).

Requests: an OpenAI-style row becomes token ids (chat through the tokenizer's chat template),
SGLang sampling params and an optional LoRA name (:class:`EngineInput`). Pooling rows: a
classify text goes to ``async_encode`` (a sequence-classification model's head output comes
back as its ``embedding``), a score pair to SGLang's cross-encoder request (what
``Engine.rerank`` sends). A batch of inputs becomes ONE engine call in
:mod:`relayllm_sglang.calls`; what SGLang returns becomes relayllm results in
:mod:`relayllm_sglang.results`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from relayllm.adapters import (
    OPENAI_SAMPLING_PARAMS,
    Request,
    check_sampling_support,
    parse_response_format,
)
from relayllm_sglang.reasoning import ReasoningParserLike

# -- sampling params ---------------------------------------------------------------------------

#: OpenAI (and vLLM) names that SGLang spells differently.
RENAMED_SAMPLING_PARAMS = {
    "max_tokens": "max_new_tokens",
    "max_completion_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "seed": "sampling_seed",
}
#: OpenAI names (relayllm.rows.OPENAI_SAMPLING_PARAMS) not passed on as they are: taken
#: elsewhere (n, response_format, logprobs: see REQUEST_KEYS) or not done here (a row setting
#: one fails, naming it).
OPENAI_NOT_SHARED = frozenset(
    {"n", "response_format", "logprobs", "top_logprobs", "tools", "tool_choice",
     "reasoning_effort", "best_of", "suffix", "echo", "parallel_tool_calls"}
)  # fmt: skip
#: Engine names SGLang shares with vLLM.
ENGINE_SHARED_SAMPLING_PARAMS = (
    "top_k",
    "min_p",
    "stop_token_ids",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
)
#: Names both sides share: passed as they are.
SHARED_SAMPLING_PARAMS = (
    *sorted(OPENAI_SAMPLING_PARAMS - RENAMED_SAMPLING_PARAMS.keys() - OPENAI_NOT_SHARED),
    *ENGINE_SHARED_SAMPLING_PARAMS,
)
#: SGLang's name for structured output; ``response_format`` becomes it.
JSON_SCHEMA_PARAM = "json_schema"
#: SGLang-only sampling fields a row may set (a subset of SGLang's ``SamplingParams``).
SGLANG_EXTRA = frozenset(
    {
        "regex",
        "ebnf",
        "structural_tag",
        "no_stop_trim",
        "spaces_between_special_tokens",
        "min_new_tokens",
        "max_new_tokens",
    }
)
#: Row keys that are not sampling params here: logprobs go to ``async_generate``'s own
#: arguments, chat options to the chat template (see :func:`engine_input`).
REQUEST_KEYS = frozenset(
    {"logprobs", "top_logprobs", "prompt_logprobs", "chat_template_kwargs",
     "continue_final_message"}
)  # fmt: skip
#: Row keys this adapter accepts without the engine's field list.
TRANSLATED_SAMPLING_PARAMS = frozenset(
    {*RENAMED_SAMPLING_PARAMS, *SHARED_SAMPLING_PARAMS, *SGLANG_EXTRA, "n", "response_format",
     "structured_outputs"}
)  # fmt: skip
#: SamplingParams fields holding a grammar. The engine applies a row's grammar from the first
#: token (the adapter does not ask it to wait for the reasoning to end: ``require_reasoning``),
#: so such an answer holds no reasoning to split off.
GRAMMAR_PARAMS = frozenset({JSON_SCHEMA_PARAM, "regex", "ebnf", "structural_tag"})
#: ``structured_outputs`` forms -> SGLang's sampling fields (choice becomes a regex).
STRUCTURED_PARAMS = {"json": JSON_SCHEMA_PARAM, "regex": "regex", "choice": "regex",
                     "grammar": "ebnf"}  # fmt: skip
#: ``async_generate`` arguments for logprobs (one value per prompt).
LOGPROB_ARGS = ("return_logprob", "top_logprobs_num", "logprob_start_len")


def sglang_sampling_params(
    params: Mapping[str, Any], known: set[str] | None = None
) -> dict[str, Any]:
    """SGLang ``sampling_params`` for OpenAI-style ``params``.

    Names SGLang already uses pass through, so rows may also set SGLang-only knobs (``regex``,
    ``ebnf``... and, in the replica, any of ``known``: SamplingParams' field names).
    Anything else is this row's error (the shared policy,
    :func:`relayllm.adapters.check_sampling_support`) instead of a failure of the engine call.
    Raises ``ValueError``.
    """
    check_sampling_support("sglang", params, TRANSLATED_SAMPLING_PARAMS | set(known or ()))
    out: dict[str, Any] = {}
    for key, value in params.items():
        if value is None:
            continue
        if key == "n":
            if value != 1:
                raise ValueError(f"sampling_params.n must be 1 (one result per row), got {value!r}")
            continue
        if key == "response_format":
            schema = json_schema_of(value)
            if schema is not None:
                _put(out, JSON_SCHEMA_PARAM, schema, key)
            continue
        if key == "structured_outputs":
            ((form, spec),) = ((k, v) for k, v in value.items() if v is not None)
            if form == "choice":
                spec = "(" + "|".join(re.escape(c) for c in spec) + ")"
            elif form == "json" and not isinstance(spec, str):
                spec = json.dumps(spec)
            _put(out, STRUCTURED_PARAMS[form], spec, key)
            continue
        _put(out, RENAMED_SAMPLING_PARAMS.get(key, key), value, key)
    return out


def _put(out: dict[str, Any], name: str, value: Any, key: str) -> None:
    if name in out:
        raise ValueError(f"sampling_params.{key} sets {name!r}, which another key already sets")
    out[name] = value


def json_schema_of(response_format: Any) -> str | None:
    """SGLang's ``json_schema`` string for an OpenAI ``response_format`` (None for text)."""
    spec = parse_response_format(response_format)
    return None if spec is None else json.dumps(spec.schema_or_object())


# -- prompts -----------------------------------------------------------------------------------


def chat_input_ids(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    template_kwargs: Mapping[str, Any] | None = None,
    prefill: bool = False,
) -> list[int]:
    """Token ids of a chat, rendered with the tokenizer's chat template (the one the engine
    loaded, including a ``chat_template`` option), given the row's ``chat_template_kwargs``;
    ``prefill`` continues the last (assistant) message instead of starting a new turn. Ids,
    not text, so the template's own special tokens are not doubled by a second
    tokenization."""
    rendered = tokenizer.apply_chat_template(
        messages,
        tokenize=True,
        **{
            **(template_kwargs or {}),
            "add_generation_prompt": not prefill,
            "continue_final_message": prefill,
        },
    )
    if isinstance(rendered, Mapping):  # transformers 5 returns a BatchEncoding
        rendered = rendered["input_ids"]
    return [int(t) for t in rendered]


def completion_input_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of a plain prompt, tokenized as SGLang tokenizes text (special tokens added)."""
    return [int(t) for t in tokenizer.encode(prompt)]


#: The ``task`` option (:attr:`SGLangOptions.model_task`) each row task needs.
MODEL_TASK = {
    "chat": "generate",
    "completion": "generate",
    "embedding": "embed",
    "classify": "classify",
    "score": "score",
}
#: How a deployment of each ``task`` option is described in a row's error.
MODEL_KIND = {
    "generate": "a generation model",
    "embed": "an embedding model",
    "classify": "a sequence-classification model",
    "score": "a cross-encoder",
}


@dataclass(frozen=True)
class EngineInput:
    """One row, ready for the engine."""

    #: generate: ``async_generate``; encode (embedding) and classify: ``async_encode``;
    #: score: a cross-encoder request (see :func:`rerank_kwargs`).
    kind: Literal["generate", "encode", "classify", "score"]
    input_ids: list[int] | None = None  # generate
    text: str | None = None  # encode, classify
    pair: tuple[str, str] | None = None  # score: (query, document)
    sampling_params: dict[str, Any] | None = None
    lora: str | None = None
    top_logprobs: int | None = None  # logprobs of the answer, with k alternatives
    prompt_logprobs: int | None = None  # logprobs of the prompt, with k alternatives
    priority: int | None = None  # relayllm's (lower runs first); see generate_kwargs
    #: A chat whose answer no grammar constrains: a reasoning parser may split it.
    may_reason: bool = False


#: Builds SGLang's reasoning parser for one row's answer (a parser keeps per-answer state).
ParserFor = Callable[[EngineInput], ReasoningParserLike]


def engine_input(
    request: Request,
    tokenizer: Any,
    *,
    lora_names: frozenset[str] = frozenset(),
    base_model_names: frozenset[str] = frozenset(),
    model_task: str = "generate",
    sampling_names: set[str] | None = None,
) -> EngineInput:
    """What the engine gets for one request to a deployment whose ``task`` option is
    ``model_task``. Raises ``ValueError`` (the row's error) when the row cannot be served
    here."""
    task = request["task"]
    lora = lora_of(request.get("model"), lora_names, base_model_names)
    needed = MODEL_TASK[task]
    if needed != model_task:
        raise ValueError(
            f"this sglang deployment serves {MODEL_KIND[model_task]}; task {task!r} needs "
            f"{MODEL_KIND[needed]} (deploy one with options task: {needed})"
        )
    if task == "embedding":
        return EngineInput("encode", text=request["input"], lora=lora)
    if task == "classify":
        return EngineInput("classify", text=request["text"], lora=lora)
    if task == "score":
        return EngineInput("score", pair=(request["query"], request["document"]), lora=lora)
    row = dict(request.get("sampling_params") or {})
    extra = {k: row.pop(k) for k in REQUEST_KEYS if k in row}
    params = sglang_sampling_params(row, sampling_names)
    if task == "chat":
        ids = chat_input_ids(
            tokenizer,
            request["messages"],
            extra.get("chat_template_kwargs"),
            bool(extra.get("continue_final_message")),
        )
    else:
        ids = completion_input_ids(tokenizer, request["prompt"])
    logprobs, top = extra.get("logprobs"), extra.get("top_logprobs")
    # OpenAI chat: logprobs true + top_logprobs k; completions: logprobs k.
    k: int | None = None
    if logprobs is True or (logprobs is None and top):
        k = top or 0
    elif isinstance(logprobs, int) and not isinstance(logprobs, bool):
        k = logprobs
    return EngineInput(
        "generate",
        input_ids=ids,
        sampling_params=params,
        lora=lora,
        top_logprobs=k,
        prompt_logprobs=extra.get("prompt_logprobs"),
        priority=request.get("priority"),
        may_reason=task == "chat" and not GRAMMAR_PARAMS & params.keys(),
    )


def lora_of(model: Any, lora_names: frozenset[str], base_model_names: frozenset[str]) -> str | None:
    """The LoRA adapter a row's ``model`` names; None for the base model."""
    if model is None or model in base_model_names:
        return None
    if model in lora_names:
        return model
    known = ", ".join(sorted(lora_names)) or "none (set the lora_paths option)"
    raise ValueError(f"model {model!r} is not a LoRA adapter of this deployment; adapters: {known}")


__all__ = [
    "EngineInput",
    "GRAMMAR_PARAMS",
    "JSON_SCHEMA_PARAM",
    "LOGPROB_ARGS",
    "MODEL_KIND",
    "MODEL_TASK",
    "ParserFor",
    "RENAMED_SAMPLING_PARAMS",
    "REQUEST_KEYS",
    "SHARED_SAMPLING_PARAMS",
    "STRUCTURED_PARAMS",
    "TRANSLATED_SAMPLING_PARAMS",
    "chat_input_ids",
    "completion_input_ids",
    "engine_input",
    "json_schema_of",
    "lora_of",
    "sglang_sampling_params",
]
