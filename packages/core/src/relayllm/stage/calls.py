"""How the stage groups a batch's rows into calls: by count, or by an estimated token budget.

Count-based calls (``batch_size`` rows each) hold an in-flight slot until their slowest row
is done, so one call of long prompts with long answers can take many times as long as its
neighbours and a call of 64 long rows can need more engine memory than the engine has room for
at once. With ``ProcessorConfig.token_budget`` a call also closes when the estimated tokens of
its rows would pass the budget: long rows travel in small calls, short rows in full ones.

The estimate is deliberately cheap (no tokenizer in the stage): about four characters a token
for the prompt (English text on BPE vocabularies), plus the answer the row allows (its
``max_tokens``) when it sets one. It only decides where calls split; nothing is truncated or
refused because of it. Rate budgets charge the same estimate (:mod:`relayllm.adapters`
re-exports it), so a row costs one number everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from relayllm.rows import Request, request_text

#: Characters per token assumed for prompt text.
CHARS_PER_TOKEN = 4

T = TypeVar("T")


def estimated_tokens(request: Request) -> int:
    """Prompt tokens (characters / 4, at least 1) plus the answer the row allows: its
    ``max_tokens`` (or ``max_completion_tokens``), none for an embedding."""
    prompt = -(-len(request_text(request)) // CHARS_PER_TOKEN) or 1
    if request.get("task") == "embedding":
        return prompt
    params: Any = request.get("sampling_params") or {}
    limit = params.get("max_tokens") or params.get("max_completion_tokens")
    return prompt + (limit if isinstance(limit, int) and limit > 0 else 0)


def split_into_calls(
    pending: Sequence[tuple[T, Request]], batch_size: int, token_budget: int | None
) -> list[list[tuple[T, Request]]]:
    """Consecutive groups of at most ``batch_size`` rows and, with a budget, at most
    ``token_budget`` estimated tokens (a row over the budget on its own travels alone)."""
    if token_budget is None:
        return [list(pending[k : k + batch_size]) for k in range(0, len(pending), batch_size)]
    calls: list[list[tuple[T, Request]]] = []
    call: list[tuple[T, Request]] = []
    tokens = 0
    for item in pending:
        cost = estimated_tokens(item[1])
        if call and (len(call) == batch_size or tokens + cost > token_budget):
            calls.append(call)
            call, tokens = [], 0
        call.append(item)
        tokens += cost
    if call:
        calls.append(call)
    return calls


__all__ = ["CHARS_PER_TOKEN", "estimated_tokens", "split_into_calls"]
