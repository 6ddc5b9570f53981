"""Reasoning separation: which parsers a config may name, and splitting an answer with one.

No sglang import here: the deployment builds SGLang's own ``ReasoningParser`` for each chat row
and hands it to :func:`split_reasoning` (through :func:`relayllm_sglang.calls.serve_batch`).

The parser names are the keys of ``ReasoningParser.DetectorMap`` in the sglang release the
adapter pins (``SGLANG_VERSION``; its server's ``--reasoning-parser`` choices), copied here
because importing sglang pulls in a CUDA torch and the machine that validates a config often
has no GPU. The API contract test compares them with the pinned wheel's registry, so a new pin
that adds or renames a parser fails CI until they are updated; at deploy time the installed
sglang's registry is checked as well.
"""

from __future__ import annotations

from typing import Protocol

from relayllm.adapters import did_you_mean

REASONING_PARSERS = frozenset(
    {
        "apertus2509",
        "beam",
        "cohere_command4",
        "deepseek-r1",
        "deepseek-v3",
        "deepseek-v4",
        "deepseek-v41",
        "dots",
        "gemma4",
        "gigachat35",
        "glm45",
        "gpt-oss",
        "granite_thinking_parser",
        "hunyuan",
        "inkling",
        "interns1",
        "iquest_q1",
        "k2_horizon",
        "kimi",
        "kimi_k2",
        "kimi_k3",
        "ling3",
        "mimo",
        "minimax",
        "minimax-append-think",
        "minimax-m3",
        "mistral",
        "muse",
        "nanbeige",
        "nemotron_3",
        "poolside_v1",
        "qwen3",
        "qwen3-thinking",
        "response_template",
        "step3",
        "step3p5",
    }
)

#: SGLang's server also takes this, and then guesses the parser from the chat template; the
#: adapter splits each answer itself, so it needs the parser named.
AUTO = "auto"


def reasoning_parser_problem(name: str, known: frozenset[str] | set[str]) -> str | None:
    """Why ``name`` is not a reasoning parser of ``known`` (an sglang release's), or None."""
    if name in known:
        return None
    if name == AUTO:
        return (
            f"{AUTO!r} (SGLang's server guessing the parser from the chat template) is not "
            "supported: name the model's parser, e.g. 'deepseek-r1' or 'qwen3'"
        )
    return (
        f"{name!r} is not one of sglang's reasoning parsers{did_you_mean(name, known)}; "
        f"known: {', '.join(sorted(known))}"
    )


class ReasoningParserLike(Protocol):
    """What the adapter uses of SGLang's ``ReasoningParser`` (one per answer: it keeps state)."""

    def parse_non_stream(self, full_text: str) -> tuple[str | None, str | None]: ...


def split_reasoning(parser: ReasoningParserLike, text: str) -> tuple[str | None, str]:
    """``(reasoning_content, answer)`` of a chat answer, as SGLang's server reports them for a
    non-streamed chat completion: no reasoning is None, and the answer is a string even when
    the model only reasoned (its text cut off before the reasoning ended)."""
    reasoning, answer = parser.parse_non_stream(text)
    return reasoning or None, answer or ""


def prompt_opens_reasoning(prompt_tail: str, think_start: str) -> bool:
    """Whether the rendered prompt ends with the reasoning block's opening tag.

    Chat templates of thinking models often end the prompt with the opening tag (``<think>``
    and a newline), so the answer starts inside the reasoning and carries no opening tag; the
    parser must then be told the answer starts in reasoning (``force_reasoning``), which
    SGLang's server decides from its chat-template detection and the request instead.
    """
    start = think_start.strip()
    return bool(start) and prompt_tail.rstrip().endswith(start)


__all__ = [
    "AUTO",
    "REASONING_PARSERS",
    "ReasoningParserLike",
    "prompt_opens_reasoning",
    "reasoning_parser_problem",
    "split_reasoning",
]
