"""The row tasks one engine serves, from the kind of model it runs.

vLLM and SGLang (and any engine with the same split) run one kind of model per engine: a
generation model serves text, a pooling model embeddings, class probabilities or relevance
scores. Their ``task`` option takes the same four words, mapped here once.
"""

from __future__ import annotations

from typing import Literal

from relayllm.rows import TEXT_TASKS, Task

#: What a deployment's model is for (an adapter's ``task`` option).
ModelTask = Literal["generate", "embed", "classify", "score"]

#: Model task -> the row tasks a deployment of that model serves.
ROW_TASKS: dict[str, frozenset[Task]] = {
    "generate": TEXT_TASKS,
    "embed": frozenset({"embedding"}),
    "classify": frozenset({"classify"}),
    "score": frozenset({"score"}),
}


def row_tasks(model_task: str) -> frozenset[Task]:
    """The row tasks a model of ``model_task`` serves (``generate``: chat and completion)."""
    try:
        return ROW_TASKS[model_task]
    except KeyError:
        known = ", ".join(ROW_TASKS)
        raise ValueError(f"unknown model task {model_task!r}; known: {known}") from None


__all__ = ["ROW_TASKS", "ModelTask", "row_tasks"]
