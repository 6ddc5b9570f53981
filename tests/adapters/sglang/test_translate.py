"""Request and response translation, and one-call-per-batch, without an engine.

The SGLang outputs below have the shape sglang 0.5.23's TokenizerManager returns (``text`` and
``meta_info`` with ``prompt_tokens``, ``completion_tokens`` and a ``finish_reason`` dict made by
the ``FINISH_*.to_json()`` classes); the contract test checks those names in the real source.
Where a test needs ``async_generate``, it passes a plain async function that answers like it:
the engine itself only runs in the ``gpu`` tests.
"""

from __future__ import annotations

import asyncio
import json
import math
import re

import pytest

from relayllm_sglang.calls import (
    call_per_batch,
    encode_kwargs,
    generate_kwargs,
    rerank_kwargs,
    serve_batch,
)
from relayllm_sglang.results import (
    classify_result,
    embedding_result,
    generation_result,
    id2label,
    score_result,
)
from relayllm_sglang.source import sampling_param_fields
from relayllm_sglang.translate import (
    EngineInput,
    chat_input_ids,
    completion_input_ids,
    engine_input,
    sglang_sampling_params,
)

# -- a real (tiny) Hugging Face tokenizer with a chat template --------------------------------

WORDS = [
    "<unk>",
    "<s>",
    "<|user|>",
    "<|assistant|>",
    "<|system|>",
    "</turn>",
    "hello",
    "world",
    "say",
    "paris",
    "capital",
    "of",
    "france",
]
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "<|{{ m['role'] }}|> {{ m['content'] }} </turn> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer():
    """transformers + tokenizers at the versions sglang 0.5.23 pins; the BOS token is added on
    plain encoding, like Llama-style tokenizers, so a doubled BOS would show."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, unk_token="<unk>", bos_token="<s>", chat_template=TEMPLATE
    )


def ids(*words):
    return [WORDS.index(w) for w in words]


def test_chat_uses_the_template_and_adds_bos_once(tokenizer):
    messages = [
        {"role": "system", "content": "say hello"},
        {"role": "user", "content": "capital of france"},
    ]
    got = chat_input_ids(tokenizer, messages)
    assert got == ids(
        "<s>",
        "<|system|>",
        "say",
        "hello",
        "</turn>",
        "<|user|>",
        "capital",
        "of",
        "france",
        "</turn>",
        "<|assistant|>",
    )
    # Rendering to text and letting the engine tokenize it would add a second BOS.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert tokenizer.encode(text)[:2] == ids("<s>", "<s>")


def test_completion_is_tokenized_as_the_engine_would(tokenizer):
    assert completion_input_ids(tokenizer, "hello world") == ids("<s>", "hello", "world")


# -- sampling params ---------------------------------------------------------------------------


def test_openai_names_become_sglang_names():
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    got = sglang_sampling_params(
        {
            "max_tokens": 32,
            "temperature": 0.0,
            "top_p": 0.9,
            "stop": ["\n"],
            "seed": 3,
            "n": 1,
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": schema},
            },
            "top_k": 5,
            "regex": "[a-z]+",
        }
    )
    assert got == {
        "max_new_tokens": 32,
        "temperature": 0.0,
        "top_p": 0.9,
        "stop": ["\n"],
        "sampling_seed": 3,
        "json_schema": json.dumps(schema),
        "top_k": 5,
        "regex": "[a-z]+",
    }


def test_response_format_variants():
    assert sglang_sampling_params({"response_format": {"type": "text"}}) == {}
    assert json.loads(
        sglang_sampling_params({"response_format": {"type": "json_object"}})["json_schema"]
    ) == {"type": "object"}
    assert sglang_sampling_params({"max_completion_tokens": 5, "min_tokens": 2}) == {
        "max_new_tokens": 5,
        "min_new_tokens": 2,
    }
    assert sglang_sampling_params({"temperature": None}) == {}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "schema"),
        ({"response_format": {"type": "yaml"}}, "response_format.type"),
        ({"response_format": "json"}, "response_format"),
        ({"n": 2}, "sampling_params.n"),
        ({"logprobs": True}, "logprobs"),
        ({"max_tokens": 5, "max_new_tokens": 6}, "max_new_tokens"),
    ],
)
def test_params_sglang_cannot_take_fail_the_row(params, message):
    with pytest.raises(ValueError, match=message):
        sglang_sampling_params(params)


def test_unknown_name_fails_with_a_suggestion_when_names_are_known(sglang_source):
    known = sampling_param_fields(sglang_source)
    with pytest.raises(ValueError, match=r"temprature.*did you mean 'temperature'"):
        sglang_sampling_params({"temprature": 0.5}, known)
    assert sglang_sampling_params({"max_tokens": 4, "ebnf": "root ::= 'a'"}, known) == {
        "max_new_tokens": 4,
        "ebnf": "root ::= 'a'",
    }


# -- rows -> engine inputs ---------------------------------------------------------------------


def chat_request(text="hello", **extra):
    return {
        "request_id": "r",
        "task": "chat",
        "messages": [{"role": "user", "content": text}],
        **extra,
    }


def test_engine_input_per_task(tokenizer):
    chat = engine_input(chat_request(sampling_params={"max_tokens": 3}), tokenizer)
    assert chat.kind == "generate" and chat.sampling_params == {"max_new_tokens": 3}
    assert chat.input_ids == ids("<s>", "<|user|>", "hello", "</turn>", "<|assistant|>")
    completion = engine_input({"task": "completion", "prompt": "say hello"}, tokenizer)
    assert completion.input_ids == ids("<s>", "say", "hello") and completion.lora is None
    embed = engine_input({"task": "embedding", "input": "paris"}, tokenizer, model_task="embed")
    assert embed == EngineInput("encode", text="paris")
    classify = engine_input({"task": "classify", "text": "paris"}, tokenizer, model_task="classify")
    assert classify == EngineInput("classify", text="paris")
    pair = {"task": "score", "query": "capital of france", "document": "paris"}
    score = engine_input(pair, tokenizer, model_task="score")
    assert score == EngineInput("score", pair=("capital of france", "paris"))


@pytest.mark.parametrize(
    ("request_", "model_task", "message"),
    [
        (
            {"task": "embedding", "input": "x"},
            "generate",
            "serves a generation model; task 'embedding' needs an embedding model "
            "(deploy one with options task: embed)",
        ),
        (None, "embed", "serves an embedding model; task 'chat' needs a generation model"),
        (
            {"task": "classify", "text": "x"},
            "embed",
            "task 'classify' needs a sequence-classification model (deploy one with options "
            "task: classify)",
        ),
        (
            {"task": "score", "query": "q", "document": "d"},
            "classify",
            "serves a sequence-classification model; task 'score' needs a cross-encoder",
        ),
        ({"task": "embedding", "input": "x"}, "score", "serves a cross-encoder"),
    ],
)
def test_engine_input_rejects_what_the_model_cannot_do(tokenizer, request_, model_task, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        engine_input(request_ or chat_request(), tokenizer, model_task=model_task)


def test_lora_adapter_chosen_by_the_model_column(tokenizer):
    names = {"lora_names": frozenset({"sql"}), "base_model_names": frozenset({"org/base"})}
    assert engine_input(chat_request(model="sql"), tokenizer, **names).lora == "sql"
    assert engine_input(chat_request(model="org/base"), tokenizer, **names).lora is None
    with pytest.raises(ValueError, match=r"'poetry' is not a LoRA adapter.*adapters: sql"):
        engine_input(chat_request(model="poetry"), tokenizer, **names)


def test_one_call_carries_the_whole_batch_as_lists():
    rows = [
        EngineInput("generate", input_ids=[1, 2], sampling_params={"max_new_tokens": 2}),
        EngineInput("generate", input_ids=[3], sampling_params={"temperature": 0.0}, lora="sql"),
    ]
    assert generate_kwargs(rows) == {
        "input_ids": [[1, 2], [3]],
        "sampling_params": [{"max_new_tokens": 2}, {"temperature": 0.0}],
        "lora_path": [None, "sql"],
    }
    assert "lora_path" not in generate_kwargs(rows[:1])
    assert encode_kwargs([EngineInput("encode", text="a"), EngineInput("encode", text="b")]) == {
        "prompt": ["a", "b"]
    }


def test_the_priority_travels_as_sglangs_one_per_call_higher_first():
    rows = [
        EngineInput("generate", input_ids=[1], sampling_params={}, priority=10),
        EngineInput("generate", input_ids=[2], sampling_params={}, priority=0),
    ]
    assert generate_kwargs(rows)["priority"] == 0  # the most urgent row of the call
    assert generate_kwargs(rows[:1])["priority"] == -10  # batch below interactive's 0
    assert "priority" not in generate_kwargs([EngineInput("generate", input_ids=[1])])


# -- SGLang outputs -> rows --------------------------------------------------------------------


def output(text, finish, prompt_tokens=7, completion_tokens=3):
    return {
        "text": text,
        "meta_info": {
            "id": "abc",
            "finish_reason": finish,
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "cached_tokens": 0,
        },
    }


def test_finished_outputs():
    assert generation_result(output("Paris.", {"type": "stop", "matched": 2})) == {
        "generated_text": "Paris.",
        "finish_reason": "stop",
        "num_input_tokens": 7,
        "num_generated_tokens": 3,
    }
    assert (
        generation_result(output("The capital", {"type": "length", "length": 3}))["finish_reason"]
        == "length"
    )


def test_abort_outputs_become_the_row_error():
    too_long = {
        "type": "abort",
        "message": (
            "The input (9000 tokens) is longer than the model's context length (8192 tokens)."
        ),
        "status_code": 400,
        "err_type": "BadRequestError",
    }
    result = generation_result(output("", too_long, completion_tokens=0))
    assert result["error"].startswith("sglang aborted the request: The input (9000 tokens)")
    assert "generated_text" not in result and result["num_input_tokens"] == 7
    assert generation_result({"meta_info": {"finish_reason": {"type": "abort"}}})["error"] == (
        "sglang aborted the request: no reason given"
    )


def test_missing_text_and_exceptions_are_errors_not_empty_answers():
    assert "no text" in generation_result({"meta_info": {"finish_reason": None}})["error"]
    assert generation_result(ValueError("boom")) == {"error": "ValueError: boom"}


def test_embedding_outputs():
    assert embedding_result({"embedding": [0.5, 1], "meta_info": {"prompt_tokens": 2}}) == {
        "embedding": [0.5, 1.0],
        "num_input_tokens": 2,
    }
    assert (
        embedding_result({"embedding": [], "meta_info": {}})["error"]
        == "sglang returned no embedding"
    )
    assert (
        "aborted"
        in embedding_result({"meta_info": {"finish_reason": {"type": "abort", "message": "x"}}})[
            "error"
        ]
    )


# -- one engine call per batch, and per-row errors when SGLang rejects the batch --------------


class ScriptedGenerate:
    """Answers like ``Engine.async_generate`` with lists: one output per prompt; rejects the
    whole call with ValueError when any prompt is longer than ``context`` (as SGLang does)."""

    def __init__(self, context=8):
        self.context = context
        self.calls = []

    async def __call__(self, *, input_ids, sampling_params, lora_path=None):
        self.calls.append(len(input_ids))
        await asyncio.sleep(0)
        for prompt in input_ids:
            if len(prompt) >= self.context:
                raise ValueError(
                    f"The input ({len(prompt)} tokens) is longer than the model's context "
                    f"length ({self.context} tokens)."
                )
        return [
            output(
                f"answer {len(p)}",
                {"type": "length", "length": sp.get("max_new_tokens", 1)},
                prompt_tokens=len(p),
                completion_tokens=sp.get("max_new_tokens", 1),
            )
            for p, sp in zip(input_ids, sampling_params, strict=True)
        ]


async def no_encode(**kwargs):
    raise AssertionError("no embedding rows were sent")


def prepare(request):
    if request.get("bad"):
        raise ValueError("sampling_params.n must be 1")
    return EngineInput(
        "generate",
        input_ids=list(range(request["n_tokens"])),
        sampling_params={"max_new_tokens": 2},
    )


def test_a_batch_is_one_engine_call_with_results_in_order():
    engine = ScriptedGenerate()
    requests = [{"n_tokens": n} for n in (3, 1, 5, 2)]
    results = asyncio.run(serve_batch(requests, prepare, engine, no_encode))
    assert engine.calls == [4]
    assert [r["num_input_tokens"] for r in results] == [3, 1, 5, 2]
    assert not any(r.get("error") for r in results)
    assert [r["generated_text"] for r in results] == [
        "answer 3",
        "answer 1",
        "answer 5",
        "answer 2",
    ]


def test_meta_info_feeds_the_replicas_prefix_cache_and_latency_figures():
    from relayllm.serving.metrics import ReplicaMetrics

    async def cached(*, input_ids, sampling_params, lora_path=None):
        outputs = [output("a", {"type": "stop"}, prompt_tokens=len(p)) for p in input_ids]
        for out, hit in zip(outputs, (2, 0), strict=True):
            out["meta_info"].update(cached_tokens=hit, e2e_latency=0.25)
        return outputs

    metrics = ReplicaMetrics("d", "sglang")
    requests = [{"n_tokens": 4}, {"n_tokens": 4}]
    asyncio.run(serve_batch(requests, prepare, cached, no_encode, metrics=metrics))
    summary = metrics.summary()
    assert summary["prefix_cache_hit_rate"] == 0.25 and summary["prefix_cache_queries"] == 8
    assert summary["latency_s"] == {"p50": 0.25, "p99": 0.25, "count": 2}


def test_a_rejected_batch_is_resent_row_by_row_so_only_bad_rows_fail():
    engine = ScriptedGenerate(context=8)
    requests = [{"n_tokens": 3}, {"n_tokens": 20}, {"bad": True}, {"n_tokens": 4}]
    results = asyncio.run(serve_batch(requests, prepare, engine, no_encode))
    assert engine.calls == [3, 1, 1, 1]  # the batch (3 valid rows), then each row alone
    assert results[0]["generated_text"] == "answer 3" and results[3]["generated_text"] == "answer 4"
    assert "longer than the model's context length" in results[1]["error"]
    assert results[2] == {"error": "ValueError: sampling_params.n must be 1"}


def test_embedding_and_generation_rows_in_one_batch():
    async def encode(*, prompt, lora_path=None):
        return [{"embedding": [float(len(p))], "meta_info": {"prompt_tokens": 1}} for p in prompt]

    def prep(request):
        if "input" in request:
            return EngineInput("encode", text=request["input"])
        return prepare(request)

    results = asyncio.run(
        serve_batch(
            [{"input": "abc"}, {"n_tokens": 2}, {"input": "a"}], prep, ScriptedGenerate(), encode
        )
    )
    assert results[0]["embedding"] == [3.0] and results[2]["embedding"] == [1.0]
    assert results[1]["generated_text"] == "answer 2"


def test_wrong_number_of_outputs_is_not_silently_misaligned():
    async def short(items):
        return (
            [output("x", {"type": "stop"})]
            if len(items) > 1
            else [output(f"only {items[0]}", {"type": "stop"})]
        )

    got = asyncio.run(call_per_batch(short, ["a", "b"]))
    assert [g["text"] for g in got] == ["only a", "only b"]


def test_a_single_failing_row_is_not_retried():
    calls = []

    async def failing(items):
        calls.append(list(items))
        raise RuntimeError("engine died")

    got = asyncio.run(call_per_batch(failing, ["a"]))
    assert calls == [["a"]] and isinstance(got[0], RuntimeError)
    assert asyncio.run(call_per_batch(failing, [])) == []


# -- the request/response surface: prefill, template kwargs, logprobs, structured forms -------


def test_prefill_and_template_kwargs_reach_the_template(tokenizer):
    prefill = [
        {"role": "user", "content": "capital of france"},
        {"role": "assistant", "content": "paris"},
    ]
    got = chat_input_ids(tokenizer, prefill, prefill=True)
    # The assistant's message is continued: no closing </turn>, no new assistant turn.
    assert got == ids(
        "<s>", "<|user|>", "capital", "of", "france", "</turn>", "<|assistant|>", "paris"
    )
    request = chat_request(sampling_params={"chat_template_kwargs": {"x": 1}, "max_tokens": 2})
    assert engine_input(request, tokenizer).sampling_params == {"max_new_tokens": 2}


def test_logprobs_go_to_generate_arguments_and_come_back_as_rows(tokenizer):
    chat = engine_input(
        chat_request(sampling_params={"logprobs": True, "top_logprobs": 2}), tokenizer
    )
    cmpl = engine_input(
        {"task": "completion", "prompt": "say hello", "sampling_params": {"prompt_logprobs": 1}},
        tokenizer,
    )
    plain = engine_input(chat_request(), tokenizer)
    assert (chat.top_logprobs, chat.prompt_logprobs, cmpl.prompt_logprobs) == (2, None, 1)
    kwargs = generate_kwargs([chat, cmpl, plain])
    assert kwargs["return_logprob"] == [True, True, False]
    assert kwargs["top_logprobs_num"] == [2, 1, 0]
    assert kwargs["logprob_start_len"] == [-1, 0, -1]
    meta = output("paris", {"type": "stop"})
    meta["meta_info"]["output_token_logprobs"] = [(-0.5, 9, None)]
    meta["meta_info"]["output_top_logprobs"] = [[(-0.5, 9, None), (-1.5, 6, None), (-2.0, 7, None)]]
    row = generation_result(meta, chat, decode=lambda i: WORDS[i])
    assert row["logprobs"] == [
        {
            "token": "paris",
            "logprob": -0.5,
            "top_logprobs": [
                {"token": "paris", "logprob": -0.5},
                {"token": "hello", "logprob": -1.5},
            ],
        }
    ]
    assert "logprobs" not in generation_result(meta, plain)


@pytest.mark.parametrize(
    "form, value, name, sent",
    [
        ("choice", ["a.b", "c"], "regex", r"(a\.b|c)"),
        ("regex", "[0-9]+", "regex", "[0-9]+"),
        ("grammar", 'root ::= "x"', "ebnf", 'root ::= "x"'),
        ("json", {"type": "object"}, "json_schema", '{"type": "object"}'),
    ],
)
def test_structured_output_forms(form, value, name, sent):
    assert sglang_sampling_params({"structured_outputs": {form: value}}) == {name: sent}


def test_only_chats_free_of_a_grammar_may_reason(tokenizer):
    """Whether a reasoning parser may split the answer (the reasoning_parser option)."""
    assert engine_input(chat_request(), tokenizer).may_reason
    assert not engine_input({"task": "completion", "prompt": "say hello"}, tokenizer).may_reason
    # A grammar holds from the first token (the engine is not asked to wait for the reasoning
    # to end), so a structured answer has no reasoning block.
    for params in (
        {"response_format": {"type": "json_object"}},
        {"structured_outputs": {"choice": ["paris", "lyon"]}},
        {"regex": "[a-z]+"},
        {"ebnf": 'root ::= "x"'},
    ):
        assert not engine_input(chat_request(sampling_params=params), tokenizer).may_reason


# -- pooling tasks: classify (async_encode of a classifier) and score (a cross-encoder) -------


def pooled(embedding, prompt_tokens=5):
    """One output as sglang 0.5.23's TokenizerManager returns it for an embedding request
    (``BatchEmbeddingOutput``): ``embedding`` is ``embeddings[i]`` of the pooler's tensor after
    ``.tolist()`` -- a list of class logits for a classifier, one float for a cross-encoder
    whose pooler squeezed its single label -- and a ``meta_info`` without completion counts."""
    return {
        "embedding": embedding,
        "meta_info": {
            "id": "0f1e",
            "finish_reason": {"type": "length", "length": 0},
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
        },
    }


def test_classify_outputs_become_label_and_probs_as_sglangs_classify_endpoint_makes_them():
    result = classify_result(pooled([0.0, math.log(3.0)]), {0: "negative", 1: "positive"})
    assert result["label"] == "positive" and result["num_input_tokens"] == 5
    assert result["probs"] == pytest.approx([0.25, 0.75])
    # No id2label: the class index, as the vLLM backend gives it.
    assert classify_result(pooled([2.0, 1.0, -1.0]))["label"] == "0"
    # Large logits do not overflow.
    assert classify_result(pooled([1000.0, 0.0]))["probs"] == pytest.approx([1.0, 0.0])
    # A single-label head squeezed to one number: one class, probability 1.
    assert classify_result(pooled(0.3), {0: "LABEL_0"}) == {
        "label": "LABEL_0",
        "probs": [1.0],
        "num_input_tokens": 5,
    }


def test_score_outputs_become_the_pairs_relevance():
    assert score_result(pooled(0.875, prompt_tokens=9)) == {"score": 0.875, "num_input_tokens": 9}
    # Some heads keep the label axis: one label is still one score.
    assert score_result(pooled([-1.5]))["score"] == -1.5
    many = score_result(pooled([0.1, 0.9]))["error"]
    assert "returned 2 values for the pair" in many and "num_labels == 1" in many


@pytest.mark.parametrize("parse", [classify_result, score_result])
def test_pooling_failures_are_row_errors(parse):
    abort = {"meta_info": {"finish_reason": {"type": "abort", "message": "too long"}}}
    assert parse(abort) == {"error": "sglang aborted the request: too long"}
    assert "sglang returned no" in parse(pooled([]))["error"]
    assert "sglang returned no" in parse(pooled(None))["error"]
    assert "sglang returned no" in parse(pooled(["x"]))["error"]
    assert parse(ValueError("boom")) == {"error": "ValueError: boom"}


def test_id2label_reads_the_models_config():
    class Config:
        id2label = {"0": "neg", 1: "pos"}  # JSON keys are strings until transformers converts

    assert id2label(Config()) == {0: "neg", 1: "pos"}
    assert id2label(object()) == {}


def test_score_rows_are_one_cross_encoder_request_with_the_pairs():
    items = [
        EngineInput("score", pair=("capital of france", "paris")),
        EngineInput("score", pair=("capital of france", "lyon"), lora="a"),
    ]
    assert rerank_kwargs(items) == {
        "text": [["capital of france", "paris"], ["capital of france", "lyon"]],
        "is_cross_encoder_request": True,
        "lora_path": [None, "a"],
    }
    assert "lora_path" not in rerank_kwargs(items[:1])


def test_pooling_rows_are_one_engine_call_per_kind_with_results_in_order():
    calls = []

    async def encode(*, prompt, lora_path=None):
        calls.append(("encode", list(prompt)))
        return [pooled([len(p) - 2.0, 0.0]) for p in prompt]

    async def rerank(*, text, is_cross_encoder_request, lora_path=None):
        calls.append(("rerank", [list(pair) for pair in text]))
        assert is_cross_encoder_request is True
        return [pooled(1.0 / len(document)) for _, document in text]

    def prep(request):
        if "text" in request:
            return EngineInput("classify", text=request["text"])
        return EngineInput("score", pair=(request["query"], request["document"]))

    requests = [
        {"text": "abc"},
        {"query": "q", "document": "ab"},
        {"text": "z"},
        {"query": "q", "document": "abcd"},
    ]
    results = asyncio.run(
        serve_batch(
            requests, prep, ScriptedGenerate(), encode, rerank=rerank, labels={0: "x", 1: "y"}
        )
    )
    assert sorted(calls) == [("encode", ["abc", "z"]), ("rerank", [["q", "ab"], ["q", "abcd"]])]
    assert [results[0]["label"], results[2]["label"]] == ["x", "y"]
    assert [results[1]["score"], results[3]["score"]] == [0.5, 0.25]


def test_a_rejected_pair_batch_is_resent_pair_by_pair():
    async def rerank(*, text, is_cross_encoder_request):
        if any(len(document) > 3 for _, document in text):
            raise ValueError("The input (12 tokens) is longer than the model's context length")
        return [pooled(0.5) for _ in text]

    def prep(request):
        return EngineInput("score", pair=("q", request["document"]))

    results = asyncio.run(
        serve_batch(
            [{"document": "ok"}, {"document": "far too long"}],
            prep,
            ScriptedGenerate(),
            no_encode,
            rerank=rerank,
        )
    )
    assert results[0] == {"score": 0.5, "num_input_tokens": 5}
    assert "longer than the model's context length" in results[1]["error"]
