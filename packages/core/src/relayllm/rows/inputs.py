"""The row protocol's inputs: which columns each task reads, what a request for one row looks
like, the optional request features a backend may lack. (The checks that turn a bad row into
its error, and the request built: :mod:`relayllm.rows.requests`; the output columns:
:mod:`relayllm.rows.outputs`.)"""

from __future__ import annotations

from typing import Any, Literal, TypedDict, get_args

Task = Literal["chat", "completion", "embedding", "classify", "score"]
#: Every task, in the order the docs list them.
TASKS: tuple[Task, ...] = get_args(Task)
#: What a text-generating deployment serves (an embedding deployment serves ``embedding``).
TEXT_TASKS: frozenset[Task] = frozenset({"chat", "completion"})
#: Tasks a pooling model serves: one vector, class probabilities, or a relevance score.
POOLING_TASKS: frozenset[Task] = frozenset({"embedding", "classify", "score"})

#: The column each task reads its input from. ``score`` reads a (query, document) pair: the
#: query here, the document from :data:`EXTRA_INPUT_COLUMNS` (one row per pair, so a rerank
#: of N documents is N rows sharing a query).
INPUT_COLUMN: dict[Task, str] = {
    "chat": "messages",
    "completion": "prompt",
    "embedding": "input",
    "classify": "text",
    "score": "query",
}
#: Further input columns a task reads (each a non-empty string, sent under its own name).
EXTRA_INPUT_COLUMNS: dict[Task, tuple[str, ...]] = {"score": ("document",)}
#: The task a given input column implies (a pipeline step's template key, say).
TASK_OF_INPUT: dict[str, Task] = {column: task for task, column in INPUT_COLUMN.items()}
SAMPLING_PARAMS_COLUMN = "sampling_params"
MODEL_COLUMN = "model"
#: OpenAI's own request parameters that shape an answer: what a row's ``sampling_params``
#: may set under OpenAI's names. Every adapter reads the names from here and adds its engine's
#: own (top_k, min_p...); a body's other OpenAI fields (user, metadata...) change no answer.
OPENAI_SAMPLING_PARAMS = frozenset(
    {"temperature", "top_p", "max_tokens", "max_completion_tokens", "stop", "seed", "n",
     "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "top_logprobs",
     "response_format", "reasoning_effort", "best_of", "suffix", "echo", "tools",
     "tool_choice", "parallel_tool_calls"}
)  # fmt: skip

# -- features: what a request may ask beyond text in, text out ----------------------------
# A backend declares the ones it can do (``Backend.features_for(options)``); a processor or a
# pipeline step asking for one it cannot do is refused before any engine starts.
LOGPROBS_FEATURE = "logprobs"  # logprobs / top_logprobs
PROMPT_LOGPROBS_FEATURE = "prompt_logprobs"
N_FEATURE = "n"  # n > 1 samples per row
TOOLS_FEATURE = "tools"  # tools / tool_choice in, tool_calls out
CHAT_TEMPLATE_KWARGS_FEATURE = "chat_template_kwargs"
CONTINUE_FEATURE = "continue_final_message"  # assistant prefill
#: Structured output forms: ``response_format`` (json) and ``structured_outputs`` (the rest).
STRUCTURED_FORMS = ("json", "choice", "regex", "grammar")
FEATURES: tuple[str, ...] = (
    LOGPROBS_FEATURE,
    PROMPT_LOGPROBS_FEATURE,
    N_FEATURE,
    TOOLS_FEATURE,
    CHAT_TEMPLATE_KWARGS_FEATURE,
    CONTINUE_FEATURE,
    *(f"structured_outputs.{form}" for form in STRUCTURED_FORMS),
)
#: What a backend that declares nothing supports (the protocol before features existed).
BASIC_FEATURES: frozenset[str] = frozenset({"structured_outputs.json"})


def features_of(params: Any) -> frozenset[str]:
    """The features a request's ``sampling_params`` ask for (see :data:`FEATURES`)."""
    if not isinstance(params, dict):
        return frozenset()
    wanted: set[str] = set()
    if params.get("logprobs") or params.get("top_logprobs"):
        wanted.add(LOGPROBS_FEATURE)
    if params.get("prompt_logprobs") is not None:
        wanted.add(PROMPT_LOGPROBS_FEATURE)
    if isinstance(params.get("n"), int) and params["n"] > 1:
        wanted.add(N_FEATURE)
    if params.get("tools") or params.get("tool_choice") not in (None, "none"):
        wanted.add(TOOLS_FEATURE)
    if params.get("chat_template_kwargs"):
        wanted.add(CHAT_TEMPLATE_KWARGS_FEATURE)
    if params.get("continue_final_message"):
        wanted.add(CONTINUE_FEATURE)
    response_format = params.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        wanted.add("structured_outputs.json")
    structured = params.get("structured_outputs")
    if isinstance(structured, dict):
        wanted.update(f"structured_outputs.{k}" for k, v in structured.items() if v is not None)
    return frozenset(wanted)


def unsupported_features(backend: str, wanted: Any, supported: Any) -> str | None:
    """The error for the first feature of ``wanted`` not in ``supported``, or None."""
    missing = sorted(set(wanted) - set(supported))
    if not missing:
        return None
    return (
        f"backend {backend!r} does not support {', '.join(missing)}; it supports "
        f"{', '.join(sorted(supported)) or 'none of the optional features'}"
    )


class Request(TypedDict, total=False):
    """What the stage sends to a deployment for one row."""

    request_id: str
    task: Task
    messages: list[dict[str, Any]]  # chat
    prompt: str  # completion
    input: str  # embedding
    text: str  # classify
    query: str  # score, with document
    document: str
    sampling_params: dict[str, Any]
    model: str | None  # LoRA adapter name, where the backend has one
    priority: int  # lower runs first (vLLM's convention); see relayllm.serving.traffic
    prompt_cache_key: str  # OpenAI's: the row's affinity key (relayllm.stage.affinity)


def request_text(request: Request, *, roles: bool = False) -> str:
    """The text of a request: its prompt or input, or its messages' text parts joined.

    ``roles=True`` keeps each message's role, for ordering rows by shared prefix (two chats
    with equal text but different roles are different prompts)."""
    if "messages" in request:
        parts: list[str] = []
        for message in request["messages"]:
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(
                    str(p["text"]) for p in content if isinstance(p, dict) and p.get("text")
                )
            text = content if isinstance(content, str) else ""
            parts.append(f"{message.get('role')}\x01{text}" if roles else text)
        return ("\x00" if roles else " ").join(parts)
    if "query" in request:  # score: the shared query first, so a rerank's rows sort together
        return f"{request['query']} {request.get('document') or ''}"
    return request.get("prompt") or request.get("input") or request.get("text") or ""


__all__ = [
    "Task",
    "TASKS",
    "TEXT_TASKS",
    "POOLING_TASKS",
    "INPUT_COLUMN",
    "EXTRA_INPUT_COLUMNS",
    "TASK_OF_INPUT",
    "SAMPLING_PARAMS_COLUMN",
    "MODEL_COLUMN",
    "OPENAI_SAMPLING_PARAMS",
    "LOGPROBS_FEATURE",
    "PROMPT_LOGPROBS_FEATURE",
    "N_FEATURE",
    "TOOLS_FEATURE",
    "CHAT_TEMPLATE_KWARGS_FEATURE",
    "CONTINUE_FEATURE",
    "STRUCTURED_FORMS",
    "FEATURES",
    "BASIC_FEATURES",
    "features_of",
    "unsupported_features",
    "Request",
    "request_text",
]
