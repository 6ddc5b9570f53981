"""Invalid backend options as an error that names each field and the reason, never a value.

Pydantic's own message repeats every bad input (``input_value=...``), and an option's value may
be a secret: a key pasted into the wrong field, a token in a header. Every backend's options go
through :func:`parse_options` (``Backend.parse_options`` calls it), so no adapter can leak one
in a message, a log line or a traceback.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from relayllm.configbase import did_you_mean
from relayllm.errors import ConfigError

#: Where in the options a problem is: field names and list positions, outermost first.
Location = tuple[str | int, ...]
M = TypeVar("M", bound=BaseModel)


class OptionsError(ConfigError):
    """A backend's options failed validation. ``problems`` holds ``(location, reason)`` per
    field, for callers that point at the field themselves (the pipeline loader)."""

    def __init__(
        self, message: str, problems: Sequence[tuple[Location, str]] = (), backend: str = ""
    ) -> None:
        super().__init__(message)  # one argument: the error pickles and unpickles as it is
        self.problems = list(problems)
        self.backend = backend


def option_problems(exc: ValidationError, fields: Iterable[str] = ()) -> list[tuple[Location, str]]:
    """``(location, reason)`` for each error of ``exc``, without the input values; an unknown
    key gets the closest of ``fields`` as a suggestion."""
    known = list(fields)
    problems: list[tuple[Location, str]] = []
    for error in exc.errors(include_url=False, include_input=False, include_context=False):
        loc: Location = tuple(error["loc"])
        kind = error["type"]
        if kind == "extra_forbidden":
            last = str(loc[-1]) if loc else ""
            reason = f"unknown key{did_you_mean(last, known) if len(loc) == 1 else ''}"
        elif kind == "missing":
            reason = "required key is missing"
        else:
            reason = error["msg"].removeprefix("Value error, ")
        problems.append((loc, reason))
    return problems


def options_error(backend: str, exc: ValidationError, fields: Iterable[str] = ()) -> OptionsError:
    """The :class:`OptionsError` for ``exc``: ``invalid options for backend 'x': field: reason;
    ...``. Raise it ``from None``: the ValidationError as its cause would print the values."""
    problems = option_problems(exc, fields)
    text = "; ".join(f"{'.'.join(map(str, loc)) or 'options'}: {why}" for loc, why in problems)
    return OptionsError(f"invalid options for backend {backend!r}: {text}", problems, backend)


def parse_options(backend: str, model: type[M], options: Mapping[str, Any] | BaseModel) -> M:
    """``model`` validated from ``options``; an :class:`OptionsError` naming the fields, and
    none of the values, otherwise."""
    try:
        return model.model_validate(options)
    except ValidationError as exc:
        raise options_error(backend, exc, model.model_fields) from None


__all__ = ["Location", "OptionsError", "option_problems", "options_error", "parse_options"]
