"""The strict base of every public config model, and how a validation error reads.

:class:`ConfigModel` is the base of every config a user builds in Python (processors,
deployments, the HTTP front, admission, the batch service's settings): an unknown key or a bad
value raises :class:`~relayllm.ConfigError` naming the field, with the closest known name for a
misspelled key. ``model_validate`` keeps pydantic's error, whose field paths the pipeline loader
maps to lines of the file (:func:`flat_errors`).

In the foundation (pydantic and :mod:`relayllm.errors` only), so the serving layer's configs
share it with the driver's.
"""

from __future__ import annotations

import difflib
import typing
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from relayllm.errors import ConfigError


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``known``, or an empty string."""
    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_key_hint(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """`` (did you mean 'x'?)`` for the unknown key at ``loc`` (a pydantic error's path from
    ``model``), or an empty string. Parts of the path that name no field (list indexes,
    pydantic's union labels) are stepped over."""
    models = [model]
    for part in loc[:-1]:
        fields = {n: f for m in models for n, f in m.model_fields.items()}
        if isinstance(part, str) and part in fields:
            models = _models_in(fields[part].annotation) or models
    known = {name for m in models for name in m.model_fields}
    return did_you_mean(str(loc[-1]), known) if known else ""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X | None``, ``list[X]``, unions of models)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def error_message(model: type[BaseModel], error: Any) -> str:
    """One pydantic error as the configs word it: the unknown key with its closest known
    name, a missing key, or pydantic's own message."""
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key" + unknown_key_hint(model, tuple(error["loc"]))
    if kind == "missing":
        return "required key is missing"
    return str(error["msg"]).removeprefix("Value error, ")


class InvalidConfigError(ConfigError):
    """A config model failed validation. ``errors``: pydantic's errors, without the input
    values (one may be a secret), for callers that point at the field themselves."""

    def __init__(self, message: str, errors: list[Any] | None = None) -> None:
        super().__init__(message)  # one argument: the error pickles and unpickles as it is
        self.errors = errors or []


def flat_errors(exc: ValidationError) -> list[Any]:
    """``exc.errors()`` without input values, with the errors of a nested config model in
    place of the :class:`InvalidConfigError` it raised (pydantic builds a nested model through
    its ``__init__``), each at its full path."""
    out: list[Any] = []
    for error in exc.errors(include_url=False, include_input=False):
        raised = (error.get("ctx") or {}).get("error")
        if isinstance(raised, InvalidConfigError):
            out += [{**e, "loc": (*error["loc"], *e["loc"])} for e in raised.errors]
        else:
            out.append(error)
    return out


def config_error(model: type[BaseModel], exc: ValidationError) -> InvalidConfigError:
    """``exc`` (the validation of ``model``) as one error naming each field. Raise it ``from
    None``: the ValidationError as its cause would print the values."""
    errors = flat_errors(exc)
    problems = [
        f"{'.'.join(str(p) for p in e['loc']) or '(the config)'}: {error_message(model, e)}"
        for e in errors
    ]
    return InvalidConfigError(f"invalid {model.__name__}: " + "; ".join(problems), errors)


def undescribed_fields(model: type[BaseModel]) -> list[str]:
    """``Model.field`` for every field of ``model`` and of the models it holds that has no
    description: a config's fields are documented where they are declared."""
    found: list[str] = []
    seen: set[type[BaseModel]] = set()
    todo = [model]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        for name, field in current.model_fields.items():
            if not field.description:
                found.append(f"{current.__name__}.{name}")
            todo.extend(_models_in(field.annotation))
    return sorted(found)


class ConfigModel(BaseModel):
    """Strict keys; building one with a bad key or value raises :class:`ConfigError`."""

    model_config = ConfigDict(extra="forbid")

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise config_error(type(self), exc) from None


__all__ = [
    "ConfigModel",
    "InvalidConfigError",
    "config_error",
    "did_you_mean",
    "error_message",
    "flat_errors",
    "undescribed_fields",
    "unknown_key_hint",
]
