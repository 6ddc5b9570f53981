"""The query parameters of the service's routes, read one way: each value checked for its type
and range before anything uses it, a bad one a 400 naming the parameter (OpenAI's ``param``),
so no value a client sends reaches SQLite or the arithmetic of a page unchecked.

Numbers are ASCII digits only (Python's ``int`` also takes ``"٣"``, ``"1_0"`` and ``" 3"``),
within the range the parameter has; times are Unix seconds from 0 to the end of year 9999.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from relayllm_service.errors import InvalidRequestError
from relayllm_service.store.records import check_text

if TYPE_CHECKING:
    from starlette.requests import Request

Query = Mapping[str, Sequence[str]]
#: The last second of year 9999: no Unix time a client means is later.
MAX_UNIX_S = 253_402_300_799
#: Values of one list parameter (each one a bound SQL value).
MAX_VALUES = 100
#: The purposes OpenAI's files have: a list asked for another is a 400, not an empty page.
FILE_PURPOSES = frozenset(
    {"assistants", "batch", "batch_output", "fine-tune", "vision", "user_data", "evals"}
)
#: Characters of one value (the longest id or name a route compares with is far shorter).
MAX_CHARS = 1024


def query_of(request: Request) -> dict[str, list[str]]:
    """The request's query, each parameter's values in order."""
    query: dict[str, list[str]] = {}
    for name, value in request.query_params.multi_items():
        query.setdefault(name, []).append(value)
    return query


def one(query: Query, name: str) -> str | None:
    """The parameter's value (the last, if sent again), checked as text."""
    values = query.get(name, ())
    if not values:
        return None
    value = values[-1]
    check_text(value, name)
    if len(value) > MAX_CHARS:
        raise InvalidRequestError(f"{name} is longer than {MAX_CHARS} characters", name)
    return value


def whole(query: Query, name: str, low: int, high: int, default: int | None = None) -> int | None:
    """A whole number from ``low`` to ``high`` (``default`` when absent)."""
    value = one(query, name)
    if value is None:
        return default
    if not (value.isascii() and value.isdigit() and len(value) <= len(str(high))):
        raise InvalidRequestError(
            f"{name} must be a whole number from {low} to {high}, got {value!r}", name
        )
    number = int(value)
    if not low <= number <= high:
        raise InvalidRequestError(f"{name} must be from {low} to {high}, got {number}", name)
    return number


def unix_time(query: Query, name: str) -> int | None:
    """Unix seconds (None when absent)."""
    return whole(query, name, 0, MAX_UNIX_S)


def choice(query: Query, name: str, allowed: Collection[str], default: str | None) -> str | None:
    """One of ``allowed`` (``default`` when absent)."""
    value = one(query, name)
    if value is None:
        return default
    if value not in allowed:
        raise InvalidRequestError(
            f"{name} must be one of {', '.join(sorted(allowed))}, got {value!r}", name
        )
    return value


def items(query: Query, name: str) -> list[str]:
    """A list parameter, sent repeated (``group_by=a&group_by=b``, the openai client's
    ``group_by[]=a``) or comma separated; at most :data:`MAX_VALUES` values."""
    values = [*query.get(name, ()), *query.get(f"{name}[]", ())]
    for value in values:
        check_text(value, name)
    found = [part.strip() for value in values for part in value.split(",") if part.strip()]
    if len(found) > MAX_VALUES:
        raise InvalidRequestError(f"{name} has more than {MAX_VALUES} values", name)
    if any(len(value) > MAX_CHARS for value in found):
        raise InvalidRequestError(f"a value of {name} is longer than {MAX_CHARS} characters", name)
    return found


__all__ = [
    "FILE_PURPOSES",
    "MAX_CHARS",
    "MAX_UNIX_S",
    "MAX_VALUES",
    "Query",
    "choice",
    "items",
    "one",
    "query_of",
    "unix_time",
    "whole",
]
