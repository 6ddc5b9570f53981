"""Reasoning separation (the ``reasoning_parser`` option): its validation, and how a chat answer
is split, without an engine.

sglang is not installed here, so the splitting tests hand the translation ``TagParser``: a small
parser of its own with the contract of SGLang's ``ReasoningParser.parse_non_stream`` (text
before the closing tag is reasoning; the answer starts inside the reasoning when told so). It
tests the adapter's wiring and its result shape, not SGLang's parsers; that the adapter calls
SGLang's parser by its real module, class, keywords and method is the contract test's
(test_contract_sglang.py).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import relayllm
from relayllm.adapters.source import SourceTree
from relayllm_sglang.backend import SGLangBackend, check_reasoning_parser
from relayllm_sglang.calls import serve_batch
from relayllm_sglang.options import engine_kwargs
from relayllm_sglang.reasoning import prompt_opens_reasoning, split_reasoning
from relayllm_sglang.results import generation_result
from relayllm_sglang.translate import EngineInput


def parse(**options):
    return SGLangBackend.parse_options({"model_path": "m", **options})


# -- the option --------------------------------------------------------------------------------


def test_the_option_takes_sglangs_names_and_reaches_the_engine():
    options = parse(reasoning_parser="deepseek-r1")
    # A ServerArgs field: the engine gets it too (it gates grammars on the reasoning's end).
    assert engine_kwargs(options)["reasoning_parser"] == "deepseek-r1"
    assert "reasoning_parser" not in engine_kwargs(parse())


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("qwen-3", r"reasoning_parser: .*'qwen-3' is not one of sglang's reasoning parsers "
         r"\(did you mean 'qwen3'\?\); known: apertus2509, "),
        ("deepseek_r1", r"reasoning_parser: .*\(did you mean 'deepseek-r1'\?\)"),  # vLLM's name
        ("auto", r"reasoning_parser: .*'auto' \(SGLang's server guessing the parser from the "
         r"chat template\) is not supported: name the model's parser"),
    ],
)  # fmt: skip
def test_an_unknown_parser_fails_at_config_time_naming_the_field(name, message):
    with pytest.raises(relayllm.ConfigError, match=message):
        parse(reasoning_parser=name)


def test_a_parser_in_server_args_is_refused_pointing_to_the_option():
    with pytest.raises(
        relayllm.ConfigError,
        match="server_args.reasoning_parser: set 'reasoning_parser' as an option of its own",
    ):
        parse(server_args={"reasoning_parser": "qwen3"})


def test_the_installed_sglangs_parsers_are_checked_at_deploy(sglang_source, tmp_path):
    check_reasoning_parser(parse(reasoning_parser="qwen3"), sglang_source)
    check_reasoning_parser(parse(), sglang_source)
    # An installed sglang (here: a source tree) that lacks a parser the pinned one has.
    module = Path(tmp_path, "sglang/srt/parser/reasoning_parser.py")
    module.parent.mkdir(parents=True)
    module.write_text('class ReasoningParser:\n    DetectorMap = {"deepseek-r1": object}\n')
    with pytest.raises(
        relayllm.ConfigError,
        match=r"reasoning_parser 'qwen3' is not one of sglang's reasoning parsers; "
        r"known: deepseek-r1$",
    ):
        check_reasoning_parser(parse(reasoning_parser="qwen3"), SourceTree(tmp_path))


# -- splitting an answer -----------------------------------------------------------------------


class TagParser:
    """A parser with the contract of SGLang's ``ReasoningParser`` (stream_reasoning=False) for
    ``<think>...</think>``: ``(reasoning, answer)``, "" for a missing part."""

    def __init__(self, forced: bool = False) -> None:
        self.forced = forced

    def parse_non_stream(self, full_text: str) -> tuple[str, str]:
        if not (self.forced or "<think>" in full_text):
            return "", full_text
        text = full_text.removeprefix("<think>")
        reasoning, closed, answer = text.partition("</think>")
        return (reasoning, answer) if closed else (text, "")


class Failing:
    def parse_non_stream(self, full_text: str) -> tuple[str, str]:
        raise ValueError("Unsupported model type: x")


def output(text):
    """An ``async_generate`` output as sglang returns it (see test_translate.py)."""
    return {
        "text": text,
        "meta_info": {
            "finish_reason": {"type": "stop", "matched": 2},
            "prompt_tokens": 5,
            "completion_tokens": 9,
        },
    }


CHAT = EngineInput("generate", input_ids=[1, 2], sampling_params={}, may_reason=True)


def test_split_reports_as_sglangs_server_does():
    assert split_reasoning(TagParser(), "<think>France.</think>Paris") == ("France.", "Paris")
    assert split_reasoning(TagParser(), "Paris") == (None, "Paris")  # no reasoning: None
    # Cut off while reasoning: the answer is empty, not None.
    assert split_reasoning(TagParser(forced=True), "France, so") == ("France, so", "")


def test_a_chat_answer_is_split_into_reasoning_content_and_the_answer():
    built = []

    def parser_for(item):
        built.append(item)
        return TagParser()

    result = generation_result(output("<think>France.</think>Paris"), CHAT, None, parser_for)
    assert result == {
        "generated_text": "Paris",
        "reasoning_content": "France.",
        "finish_reason": "stop",
        "num_input_tokens": 5,
        "num_generated_tokens": 9,
    }
    assert built == [CHAT]  # one parser per answer: SGLang's parsers keep state
    plain = generation_result(output("Paris"), CHAT, None, parser_for)
    assert plain["generated_text"] == "Paris" and plain["reasoning_content"] is None


def test_without_the_option_nothing_is_split():
    result = generation_result(output("<think>France.</think>Paris"), CHAT)
    assert result["generated_text"] == "<think>France.</think>Paris"
    assert "reasoning_content" not in result


def test_a_failing_parser_is_the_rows_error():
    result = generation_result(output("<think>x"), CHAT, None, lambda item: Failing())
    assert result == {
        "error": "sglang's reasoning parser failed on the answer: "
        "ValueError: Unsupported model type: x",
        "num_input_tokens": 5,
    }


def test_an_answer_shaped_by_a_grammar_is_left_whole():
    # engine_input gives such a row may_reason=False (test_translate.py): a grammar holds from
    # the first token, so the answer has no reasoning block, whatever it contains.
    text = '{"capital": "<think>"}'
    result = generation_result(
        output(text), EngineInput("generate", input_ids=[1]), None, lambda item: TagParser()
    )
    assert result["generated_text"] == text and "reasoning_content" not in result


@pytest.mark.parametrize(
    ("prompt_tail", "opens"),
    [
        ("<|im_start|>assistant\n<think>\n", True),  # the template opened the block
        ("<|im_start|>assistant\n<think>", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),  # thinking switched off
        ("<|im_start|>assistant\n", False),  # the model opens it itself, if it reasons
    ],
)
def test_a_prompt_that_opened_the_reasoning_block(prompt_tail, opens):
    assert prompt_opens_reasoning(prompt_tail, "<think>") is opens
    assert not prompt_opens_reasoning(prompt_tail, "")  # a parser without an opening tag


def test_serve_batch_splits_chat_rows_with_the_deployments_parser():
    async def generate(*, input_ids, sampling_params):
        return [output("<think>France.</think>Paris") for _ in input_ids]

    async def no_encode(**kwargs):
        raise AssertionError("no embedding rows were sent")

    def prepare(request):
        return EngineInput("generate", input_ids=[1], may_reason=request["task"] == "chat")

    requests = [{"task": "chat"}, {"task": "completion"}]
    chat, completion = asyncio.run(
        serve_batch(
            requests, prepare, generate, no_encode, reasoning_parser=lambda item: TagParser()
        )
    )
    assert (chat["reasoning_content"], chat["generated_text"]) == ("France.", "Paris")
    assert completion["generated_text"] == "<think>France.</think>Paris"
    assert "reasoning_content" not in completion
