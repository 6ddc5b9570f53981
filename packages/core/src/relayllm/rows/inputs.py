"""The row protocol's inputs: which columns each task reads, what a request for one row looks
like, the optional request features a backend may lack, and the checks that turn a bad row
into its error before anything is sent. (The output columns: :mod:`relayllm.rows.outputs`.)"""

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


_ROLES = {"system", "user", "assistant", "tool", "developer"}


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


def _drop_none(value: Any) -> Any:
    """Arrow struct columns give every row every key (missing ones as None): drop those."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def check_messages(messages: Any) -> str | None:
    """Why ``messages`` is not an OpenAI chat message list, or None if it is one."""
    if not isinstance(messages, list) or not messages:
        return f"'messages' must be a non-empty list of messages, got {_short(messages)}"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return (
                f"messages[{i}] must be an object with 'role' and 'content', got {_short(message)}"
            )
        role = message.get("role")
        if role not in _ROLES:
            return f"messages[{i}].role must be one of {sorted(_ROLES)}, got {_short(role)}"
        content = message.get("content")
        if not isinstance(content, (str, list)):
            return (
                f"messages[{i}].content must be a string or a list of parts, got {_short(content)}"
            )
        if isinstance(content, str):
            problem = check_text(content)
            if problem:
                return f"messages[{i}].content {problem}"
    return None


def check_text(text: str) -> str | None:
    """Why ``text`` cannot travel as UTF-8 (a lone surrogate, say), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"is not valid UTF-8 text ({exc.reason} at position {exc.start})"
    return None


def check_sampling_params(params: Any) -> str | None:
    """Why ``params`` are not valid OpenAI-style sampling params, or None.

    Only the names the design promises are type-checked here; other keys pass through to the
    backend, which may reject them (and then the row gets the backend's error).
    """
    if not isinstance(params, dict):
        return f"'sampling_params' must be an object, got {_short(params)}"
    checks = {
        "temperature": lambda v: _num(v) and v >= 0,
        "top_p": lambda v: _num(v) and 0 < v <= 1,
        "max_tokens": lambda v: _int(v) and v > 0,
        "seed": _int,
        "n": lambda v: _int(v) and v > 0,
        "stop": lambda v: (
            isinstance(v, str) or (isinstance(v, list) and all(isinstance(s, str) for s in v))
        ),
        "response_format": lambda v: isinstance(v, dict) and isinstance(v.get("type"), str),
        # OpenAI's chat ``logprobs`` is a boolean, its completions ``logprobs`` a count.
        "logprobs": lambda v: isinstance(v, bool) or (_int(v) and 0 <= v <= 20),
        "top_logprobs": lambda v: _int(v) and 0 <= v <= 20,
        "prompt_logprobs": lambda v: _int(v) and 0 <= v <= 20,
        "tools": lambda v: isinstance(v, list) and all(_tool(t) for t in v),
        "tool_choice": lambda v: v in ("none", "auto", "required") or _named_tool(v),
        "chat_template_kwargs": lambda v: isinstance(v, dict),
        "continue_final_message": lambda v: isinstance(v, bool),
        "structured_outputs": _structured,
        "priority": _int,  # not a sampling param: moved to the request (build_request)
        "prompt_cache_key": lambda v: isinstance(v, str),  # moved to the request too
    }
    for key, ok in checks.items():
        if key in params and not ok(params[key]):
            return f"sampling_params.{key} is invalid: {_short(params[key])}"
    return None


def _tool(v: Any) -> bool:
    """An OpenAI tool: ``{"type": "function", "function": {"name": ..., ...}}``."""
    if not isinstance(v, dict):
        return False
    function = v.get("function")
    return (
        v.get("type") == "function"
        and isinstance(function, dict)
        and isinstance(function.get("name"), str)
    )


def _named_tool(v: Any) -> bool:
    """``{"type": "function", "function": {"name": ...}}``: this tool must be called."""
    return _tool(v)


def _structured(v: Any) -> bool:
    """``structured_outputs``: exactly one of ``json`` (a schema), ``choice`` (strings),
    ``regex`` or ``grammar`` (an EBNF/Lark grammar string)."""
    if not isinstance(v, dict):
        return False
    given = {k: x for k, x in v.items() if x is not None}
    if len(given) != 1 or not set(given) <= set(STRUCTURED_FORMS):
        return False
    ((form, value),) = given.items()
    if form == "choice":
        return isinstance(value, list) and bool(value) and all(isinstance(c, str) for c in value)
    if form == "json":
        return isinstance(value, (dict, str))
    return isinstance(value, str) and bool(value)


def build_request(
    task: Task,
    value: Any,
    sampling_params: dict[str, Any],
    row_sampling_params: Any,
    model: Any,
    request_id: str,
    extras: dict[str, Any] | None = None,
) -> Request | str:
    """One row's request, or the reason the row cannot be sent (becomes its ``error``).
    ``extras``: the row's values of the task's :data:`EXTRA_INPUT_COLUMNS`."""
    column = INPUT_COLUMN[task]
    if value is None:
        return f"row has no '{column}' column value (required for task '{task}')"
    value = _drop_none(value)
    if task == "chat":
        problem = check_messages(value)
        if problem:
            return problem
    elif not isinstance(value, str) or not value:
        return f"'{column}' must be a non-empty string, got {_short(value)}"
    else:
        problem = check_text(value)
        if problem:
            return f"'{column}' {problem}"
    extra_values: dict[str, str] = {}
    for name in EXTRA_INPUT_COLUMNS.get(task, ()):
        extra = (extras or {}).get(name)
        if not isinstance(extra, str) or not extra:
            return f"'{name}' must be a non-empty string (task '{task}'), got {_short(extra)}"
        problem = check_text(extra)
        if problem:
            return f"'{name}' {problem}"
        extra_values[name] = extra
    params = sampling_params
    if task in POOLING_TASKS - {"embedding"} and (params or row_sampling_params):
        return f"task '{task}' takes no sampling_params (it samples nothing)"
    if row_sampling_params is not None:
        row_params = _drop_none(row_sampling_params)
        problem = check_sampling_params(row_params)
        if problem:
            return problem
        params = {**sampling_params, **row_params}
    if params.get("continue_final_message") and (
        task != "chat" or value[-1].get("role") != "assistant"
    ):
        return (
            "sampling_params.continue_final_message needs a chat whose last message is the "
            "assistant's start of an answer (role 'assistant') to continue"
        )
    request: Request = {
        "request_id": request_id,
        "task": task,
        column: value,  # type: ignore[misc]  # the task's input column
        **extra_values,
        "sampling_params": params,
    }
    for moved in ("priority", "prompt_cache_key"):  # the scheduling priority, the routing key
        if moved in params:
            params = dict(params)
            request[moved] = params.pop(moved)
            request["sampling_params"] = params
    if model is not None:
        if not isinstance(model, str):
            return f"'model' must be a string (a LoRA adapter name), got {_short(model)}"
        request["model"] = model
    return request


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


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
    "check_messages",
    "check_text",
    "check_sampling_params",
    "build_request",
]
