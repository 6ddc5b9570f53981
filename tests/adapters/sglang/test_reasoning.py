"""Reasoning separation (the ``reasoning_parser`` option): its validation."""

from __future__ import annotations

from pathlib import Path

import pytest

import relayllm
from relayllm_sglang.backend import SGLangBackend, check_reasoning_parser
from relayllm_sglang.options import engine_kwargs
from relayllm_sglang.source import SourceTree


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
        ("qwen-3", r"reasoning_parser\n.*'qwen-3' is not one of sglang's reasoning parsers "
         r"\(did you mean 'qwen3'\?\); known: apertus2509, "),
        ("deepseek_r1", r"reasoning_parser\n.*\(did you mean 'deepseek-r1'\?\)"),  # vLLM's name
        ("auto", r"reasoning_parser\n.*'auto' \(SGLang's server guessing the parser from the "
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
