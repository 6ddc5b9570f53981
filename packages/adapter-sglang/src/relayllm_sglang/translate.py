"""relayllm rows <-> SGLang engine calls, as plain functions (no engine, no sglang import).

Requests: an OpenAI-style row becomes token ids (chat through the tokenizer's chat template),
SGLang sampling params and an optional LoRA name; a batch becomes the keyword arguments of ONE
``Engine.async_generate`` (or ``async_encode``) call with a list per argument. Pooling rows: a
classify text goes to ``async_encode`` (a sequence-classification model's head output comes
back as its ``embedding``), a score pair to SGLang's cross-encoder request (what
``Engine.rerank`` sends). Responses: the dicts SGLang returns, with their ``meta_info``, become
relayllm results, engine aborts included; chat answers are split into ``reasoning_content`` and
the answer by a reasoning parser the deployment passes in.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from relayllm.adapters import check_sampling_support, parse_response_format
from relayllm.errors import describe_exception
from relayllm.rows import OPENAI_SAMPLING_PARAMS, Request, Result, error_result
from relayllm.serving.metrics import ReplicaMetrics
from relayllm_sglang.reasoning import ReasoningParserLike, split_reasoning

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
#: ``meta_info`` keys holding (logprob, token id, text) tuples, and their top-k lists.
OUTPUT_LOGPROBS, OUTPUT_TOP_LOGPROBS = "output_token_logprobs", "output_top_logprobs"
INPUT_LOGPROBS, INPUT_TOP_LOGPROBS = "input_token_logprobs", "input_top_logprobs"


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


# -- one call per batch ------------------------------------------------------------------------


def generate_kwargs(inputs: Sequence[EngineInput]) -> dict[str, Any]:
    """Keyword arguments of one ``Engine.async_generate`` call serving every input.

    Request ids are left to SGLang: after a failed batch call SGLang aborts its requests
    asynchronously, and a retry reusing their ids could be caught by that abort.
    """
    kwargs: dict[str, Any] = {
        "input_ids": [i.input_ids for i in inputs],
        "sampling_params": [i.sampling_params or {} for i in inputs],
    }
    if any(i.lora for i in inputs):
        kwargs["lora_path"] = [i.lora for i in inputs]
    if any(i.top_logprobs is not None or i.prompt_logprobs is not None for i in inputs):
        kwargs["return_logprob"] = [
            i.top_logprobs is not None or i.prompt_logprobs is not None for i in inputs
        ]
        kwargs["top_logprobs_num"] = [
            max(i.top_logprobs or 0, i.prompt_logprobs or 0) for i in inputs
        ]
        # 0: from the prompt's first token; -1: the answer only.
        kwargs["logprob_start_len"] = [0 if i.prompt_logprobs is not None else -1 for i in inputs]
    priorities = [i.priority for i in inputs if i.priority is not None]
    if priorities:
        # SGLang takes one priority per call and, by default, runs higher values first
        # (server_args enable_priority_scheduling turns its priority scheduling on): the
        # call's most urgent row, negated.
        kwargs["priority"] = -min(priorities)
    return kwargs


def encode_kwargs(inputs: Sequence[EngineInput]) -> dict[str, Any]:
    """Keyword arguments of one ``Engine.async_encode`` call serving every input."""
    kwargs: dict[str, Any] = {"prompt": [i.text for i in inputs]}
    if any(i.lora for i in inputs):
        kwargs["lora_path"] = [i.lora for i in inputs]
    return kwargs


#: The ``EmbeddingReqInput`` field that makes SGLang tokenize ``text`` as (query, document)
#: pairs for a cross-encoder (with its separator and token type ids), as ``Engine.rerank``
#: and the HTTP server's ``/v1/rerank`` set it.
CROSS_ENCODER_FLAG = "is_cross_encoder_request"


def rerank_kwargs(inputs: Sequence[EngineInput]) -> dict[str, Any]:
    """Fields of one ``EmbeddingReqInput`` scoring every input's (query, document) pair.

    ``Engine.rerank`` builds the same request, but runs it with ``run_until_complete``, which
    cannot be called from the replica's running event loop; the deployment awaits the
    request through the engine's tokenizer manager instead, as ``async_encode`` does.
    """
    kwargs: dict[str, Any] = {
        "text": [list(i.pair or ("", "")) for i in inputs],
        CROSS_ENCODER_FLAG: True,
    }
    if any(i.lora for i in inputs):
        kwargs["lora_path"] = [i.lora for i in inputs]
    return kwargs


async def serve_batch(
    requests: Sequence[Request],
    prepare: Callable[[Request], EngineInput],
    generate: Callable[..., Awaitable[Any]],
    encode: Callable[..., Awaitable[Any]],
    decode: Callable[[int], str] | None = None,
    *,
    rerank: Callable[..., Awaitable[Any]] | None = None,
    labels: Mapping[int, str] | None = None,
    metrics: ReplicaMetrics | None = None,
    reasoning_parser: ParserFor | None = None,
) -> list[Result]:
    """One result per request, in order: ``prepare`` each row (its ``ValueError`` is that row's
    error), then ONE ``generate(**generate_kwargs(...))`` call for the chat and completion rows,
    ONE ``encode(**encode_kwargs(...))`` call for the embedding rows (and one for the classify
    rows) and ONE ``rerank(**rerank_kwargs(...))`` call for the score rows, concurrently.
    ``generate``/``encode`` are the engine's ``async_generate``/``async_encode``; ``rerank``
    runs a cross-encoder request; ``labels`` are the classifier's ``id2label``; each generated
    output's figures go to ``metrics`` (:func:`observe_meta`); ``reasoning_parser`` splits
    chat answers (see :func:`generation_result`)."""
    results: list[Result | None] = [None] * len(requests)
    batches: dict[str, list[tuple[int, EngineInput]]] = {
        "generate": [],
        "encode": [],
        "classify": [],
        "score": [],
    }
    for i, request in enumerate(requests):
        try:
            item = prepare(request)
        except Exception as exc:  # this row cannot be served; the others go on
            results[i] = error_result(describe_exception(exc))
            continue
        batches[item.kind].append((i, item))

    async def one_generate_call(items: Sequence[EngineInput]) -> Any:
        return await generate(**generate_kwargs(items))

    async def one_encode_call(items: Sequence[EngineInput]) -> Any:
        return await encode(**encode_kwargs(items))

    async def one_rerank_call(items: Sequence[EngineInput]) -> Any:
        if rerank is None:
            raise RuntimeError("this deployment does not score (query, document) pairs")
        return await rerank(**rerank_kwargs(items))

    generated, encoded, classified, scored = await asyncio.gather(
        call_per_batch(one_generate_call, [item for _, item in batches["generate"]]),
        call_per_batch(one_encode_call, [item for _, item in batches["encode"]]),
        call_per_batch(one_encode_call, [item for _, item in batches["classify"]]),
        call_per_batch(one_rerank_call, [item for _, item in batches["score"]]),
    )
    for (i, item), output in zip(batches["generate"], generated, strict=False):
        results[i] = generation_result(output, item, decode, reasoning_parser)
        if metrics is not None and isinstance(output, Mapping):
            observe_meta(metrics, output.get("meta_info") or {})
    for (i, _), output in zip(batches["encode"], encoded, strict=False):
        results[i] = embedding_result(output)
    for (i, _), output in zip(batches["classify"], classified, strict=False):
        results[i] = classify_result(output, labels)
    for (i, _), output in zip(batches["score"], scored, strict=False):
        results[i] = score_result(output)
    return [r if r is not None else error_result("no result for this row") for r in results]


async def call_per_batch(
    call: Callable[[Sequence[Any]], Awaitable[Any]], items: Sequence[Any]
) -> list[dict[str, Any] | BaseException]:
    """Run ``call`` once for all ``items``; one output (or exception) per item, in order.

    SGLang validates a batch as a whole: one prompt longer than the context fails the entire
    ``async_generate`` call. Then each item is called on its own, concurrently, so only the
    rows that fail carry an error and the others still get their answers.
    """
    if not items:
        return []
    try:
        outputs = _as_list(await call(items))
        if len(outputs) != len(items):
            raise RuntimeError(f"sglang returned {len(outputs)} outputs for {len(items)} prompts")
        return outputs
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        if len(items) == 1:
            return [exc]
    singles = await asyncio.gather(*(call([item]) for item in items), return_exceptions=True)
    out: list[dict[str, Any] | BaseException] = []
    for single in singles:
        if isinstance(single, asyncio.CancelledError):
            raise single
        out.append(single if isinstance(single, BaseException) else _as_list(single)[0])
    return out


def _as_list(outputs: Any) -> list[dict[str, Any]]:
    return [outputs] if isinstance(outputs, Mapping) else list(outputs)


# -- responses ---------------------------------------------------------------------------------

#: The ``meta_info`` keys read from SGLang outputs.
PROMPT_TOKENS = "prompt_tokens"
COMPLETION_TOKENS = "completion_tokens"
FINISH_REASON = "finish_reason"
#: Prompt tokens found in SGLang's radix (prefix) cache, and the request's whole time.
CACHED_TOKENS = "cached_tokens"
E2E_LATENCY = "e2e_latency"
#: SGLang finish-reason types -> relayllm ``finish_reason``; "abort" becomes the row's error.
FINISH_REASONS = {"stop": "stop", "length": "length"}
ABORT = "abort"


def observe_meta(metrics: ReplicaMetrics, meta: Mapping[str, Any]) -> None:
    """What SGLang's ``meta_info`` tells of the engine, into the replica's metrics: prefix-cache
    hits (``cached_tokens`` of ``prompt_tokens``) and the request's latency. SGLang's own
    Prometheus metrics (its ``enable_metrics`` server arg) are its, outside Ray's."""
    prompt, cached = meta.get(PROMPT_TOKENS), meta.get(CACHED_TOKENS)
    if isinstance(prompt, int) and isinstance(cached, int) and prompt > 0:
        metrics.add_prefix_cache(prompt, cached)
    latency = meta.get(E2E_LATENCY)
    if isinstance(latency, (int, float)) and latency > 0:
        metrics.observe_latency(float(latency))


def generation_result(
    output: Mapping[str, Any] | BaseException,
    item: EngineInput | None = None,
    decode: Callable[[int], str] | None = None,
    reasoning_parser: ParserFor | None = None,
) -> Result:
    """A relayllm result for one ``async_generate`` output (or the exception of its call);
    ``item`` says whether logprobs were asked, ``decode`` turns their token ids into text;
    with ``reasoning_parser`` (the deployment's ``reasoning_parser`` option), a chat answer
    free of a grammar is split into ``reasoning_content`` and the answer."""
    if isinstance(output, BaseException):
        return error_result(describe_exception(output))
    meta = output.get("meta_info") or {}
    prompt_tokens = meta.get(PROMPT_TOKENS)
    reason = meta.get(FINISH_REASON)
    kind = reason.get("type") if isinstance(reason, Mapping) else reason
    if kind == ABORT:
        message = reason.get("message") if isinstance(reason, Mapping) else None
        return error_result(
            f"sglang aborted the request: {message or 'no reason given'}",
            num_input_tokens=prompt_tokens,
        )
    text = output.get("text")
    if not isinstance(text, str):
        return error_result(
            f"sglang returned no text (finish reason {kind!r})", num_input_tokens=prompt_tokens
        )
    result: Result = {
        "generated_text": text,
        "finish_reason": FINISH_REASONS.get(kind, kind),
        "num_input_tokens": prompt_tokens,
        "num_generated_tokens": meta.get(COMPLETION_TOKENS),
    }
    if reasoning_parser is not None and item is not None and item.may_reason:
        try:
            reasoning, answer = split_reasoning(reasoning_parser(item), text)
        except Exception as exc:  # this row's error, as SGLang's server fails that request
            return error_result(
                f"sglang's reasoning parser failed on the answer: {describe_exception(exc)}",
                num_input_tokens=prompt_tokens,
            )
        result["generated_text"] = answer
        result["reasoning_content"] = reasoning
    if item is not None and item.top_logprobs is not None:
        result["logprobs"] = logprob_entries(
            meta.get(OUTPUT_LOGPROBS), meta.get(OUTPUT_TOP_LOGPROBS), item.top_logprobs, decode
        )
    if item is not None and item.prompt_logprobs is not None:
        result["prompt_logprobs"] = logprob_entries(
            meta.get(INPUT_LOGPROBS), meta.get(INPUT_TOP_LOGPROBS), item.prompt_logprobs, decode
        )
    return result


def logprob_entries(
    chosen: Any, tops: Any, k: int, decode: Callable[[int], str] | None
) -> list[dict[str, Any]] | None:
    """SGLang's ``(logprob, token_id, text)`` tuples -> the row's logprobs (token text from
    ``decode`` where SGLang sent none)."""
    if chosen is None:
        return None

    def text(entry: Sequence[Any]) -> str | None:
        if len(entry) > 2 and entry[2] is not None:
            return entry[2]
        return decode(entry[1]) if decode is not None else None

    tops = tops or [None] * len(chosen)
    return [
        {
            "token": text(entry),
            "logprob": entry[0],
            "top_logprobs": [{"token": text(t), "logprob": t[0]} for t in (top or [])[:k]],
        }
        for entry, top in zip(chosen, tops, strict=False)
    ]


def embedding_result(output: Mapping[str, Any] | BaseException) -> Result:
    """A relayllm result for one ``async_encode`` output."""
    if isinstance(output, BaseException):
        return error_result(describe_exception(output))
    meta = output.get("meta_info") or {}
    reason = meta.get(FINISH_REASON)
    if isinstance(reason, Mapping) and reason.get("type") == ABORT:
        return error_result(
            f"sglang aborted the request: {reason.get('message') or 'no reason given'}"
        )
    vector = output.get("embedding")
    if not isinstance(vector, Sequence) or not vector:
        return error_result("sglang returned no embedding")
    return {"embedding": [float(x) for x in vector], "num_input_tokens": meta.get(PROMPT_TOKENS)}


def _pooled(output: Mapping[str, Any] | BaseException, what: str) -> tuple[list[float], Any]:
    """The numbers a pooling model's head gave for one row (its ``embedding``: a list, or one
    number when SGLang's cross-encoder pooler squeezed a single label), and the prompt's
    token count. Raises ``ValueError`` with the row's error."""
    if isinstance(output, BaseException):
        raise ValueError(describe_exception(output))
    meta = output.get("meta_info") or {}
    reason = meta.get(FINISH_REASON)
    if isinstance(reason, Mapping) and reason.get("type") == ABORT:
        raise ValueError(
            f"sglang aborted the request: {reason.get('message') or 'no reason given'}"
        )
    value = output.get("embedding")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [float(value)], meta.get(PROMPT_TOKENS)
    if isinstance(value, Sequence) and not isinstance(value, str) and value:
        try:
            return [float(x) for x in value], meta.get(PROMPT_TOKENS)
        except (TypeError, ValueError):
            pass
    raise ValueError(f"sglang returned no {what} (embedding {value!r:.80})")


def softmax(logits: Sequence[float]) -> list[float]:
    """Class probabilities of a classifier's logits (shifted by the largest, so no overflow)."""
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def classify_result(
    output: Mapping[str, Any] | BaseException, labels: Mapping[int, str] | None = None
) -> Result:
    """A classify row's result from one ``async_encode`` output of a sequence-classification
    model: its head's logits, made probabilities and a label as SGLang's own ``/v1/classify``
    makes them (softmax, the most likely class's name from the model's ``id2label``)."""
    try:
        logits, prompt_tokens = _pooled(output, "class scores")
    except ValueError as exc:
        return error_result(str(exc))
    probs = softmax(logits)
    best = max(range(len(probs)), key=probs.__getitem__)
    return {
        "label": str((labels or {}).get(best, best)),
        "probs": probs,
        "num_input_tokens": prompt_tokens,
    }


def score_result(output: Mapping[str, Any] | BaseException) -> Result:
    """A score row's result from one cross-encoder output: its single label's value (SGLang
    applies the model's own activation, e.g. a sigmoid a sentence-transformers config names)."""
    try:
        values, prompt_tokens = _pooled(output, "score")
    except ValueError as exc:
        return error_result(str(exc))
    if len(values) != 1:
        return error_result(
            f"sglang returned {len(values)} values for the pair: task 'score' needs a "
            "cross-encoder, a sequence-classification model with one label (num_labels == 1)"
        )
    return {"score": values[0], "num_input_tokens": prompt_tokens}


def id2label(hf_config: Any) -> dict[int, str]:
    """A classifier's class names by index, from its Hugging Face config (empty if none)."""
    mapping = getattr(hf_config, "id2label", None) or {}
    try:
        return {int(k): str(v) for k, v in mapping.items()}
    except (AttributeError, TypeError, ValueError):
        return {}


__all__ = [
    "ABORT",
    "CACHED_TOKENS",
    "E2E_LATENCY",
    "COMPLETION_TOKENS",
    "CROSS_ENCODER_FLAG",
    "MODEL_KIND",
    "MODEL_TASK",
    "FINISH_REASON",
    "FINISH_REASONS",
    "GRAMMAR_PARAMS",
    "INPUT_LOGPROBS",
    "INPUT_TOP_LOGPROBS",
    "JSON_SCHEMA_PARAM",
    "LOGPROB_ARGS",
    "OUTPUT_LOGPROBS",
    "OUTPUT_TOP_LOGPROBS",
    "ParserFor",
    "REQUEST_KEYS",
    "STRUCTURED_PARAMS",
    "logprob_entries",
    "PROMPT_TOKENS",
    "RENAMED_SAMPLING_PARAMS",
    "SHARED_SAMPLING_PARAMS",
    "TRANSLATED_SAMPLING_PARAMS",
    "EngineInput",
    "call_per_batch",
    "chat_input_ids",
    "classify_result",
    "completion_input_ids",
    "embedding_result",
    "encode_kwargs",
    "engine_input",
    "generate_kwargs",
    "generation_result",
    "id2label",
    "json_schema_of",
    "lora_of",
    "rerank_kwargs",
    "score_result",
    "observe_meta",
    "serve_batch",
    "sglang_sampling_params",
    "softmax",
]
