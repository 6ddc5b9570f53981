"""A row's request: its parts checked (messages, text, sampling params: each problem the row's
own error, naming the field) and built from the row's columns (build_request)."""

from __future__ import annotations

from typing import Any

from relayllm.rows.inputs import (
    EXTRA_INPUT_COLUMNS,
    INPUT_COLUMN,
    POOLING_TASKS,
    STRUCTURED_FORMS,
    Request,
    Task,
)

_ROLES = {"system", "user", "assistant", "tool", "developer"}


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


__all__ = ["build_request", "check_messages", "check_sampling_params", "check_text"]
