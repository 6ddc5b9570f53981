"""The sampling-parameter policy every adapter shares, and ``response_format`` parsed once.

- :func:`check_sampling_support`: the one policy for a sampling parameter a backend does not
  support -- that row fails with an error naming the backend and the parameter (and the closest
  supported name), identical on every adapter. Never silently dropped, never sent on to fail the
  engine call of the whole batch.
- :func:`parse_response_format`: OpenAI's ``response_format`` as one :class:`StructuredOutput`
  that each adapter turns into its engine's constraint.
- :func:`did_you_mean`: the suggestion for a misspelled name (options, engine kwargs, params).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from relayllm.configbase import did_you_mean
from relayllm.errors import RelayLLMError


class UnsupportedParameter(RelayLLMError, ValueError):
    """A row's sampling parameter the backend does not support: that row's error."""


def check_sampling_support(
    backend: str, params: Mapping[str, Any], supported: Iterable[str]
) -> None:
    """Raise :class:`UnsupportedParameter` for the first key of ``params`` not in ``supported``.

    The message is the same on every adapter: ``sampling_params.<key> is not supported by the
    '<backend>' backend (did you mean ...?); supported: ...``."""
    known = set(supported)
    for key, value in params.items():
        if value is None or key in known:
            continue
        listed = ", ".join(sorted(known)) or "none"
        raise UnsupportedParameter(
            f"sampling_params.{key} is not supported by the {backend!r} backend"
            f"{did_you_mean(key, known)}; supported: {listed}"
        )


@dataclass(frozen=True)
class StructuredOutput:
    """What ``response_format`` asks for: any JSON object, or one matching ``schema``."""

    kind: Literal["json_object", "json_schema"]
    schema: dict[str, Any] | None = None

    def schema_or_object(self) -> dict[str, Any]:
        """The JSON schema to enforce (``{"type": "object"}`` for ``json_object``)."""
        return self.schema if self.schema is not None else {"type": "object"}


def parse_response_format(value: Any) -> StructuredOutput | None:
    """OpenAI ``response_format`` -> :class:`StructuredOutput` (None for plain text).
    Raises ``ValueError`` naming the field at fault."""
    where = "sampling_params.response_format"
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} must be an object, got {value!r}")
    kind = value.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return StructuredOutput("json_object")
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, Mapping) else None
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}.json_schema.schema is not JSON: {exc}") from None
        if not isinstance(schema, Mapping):
            raise ValueError(
                f"{where} of type 'json_schema' needs json_schema.schema (a JSON schema object), "
                f"got {spec!r}"
            )
        return StructuredOutput("json_schema", dict(schema))
    raise ValueError(f"{where}.type must be 'text', 'json_object' or 'json_schema', got {kind!r}")


__all__ = [
    "StructuredOutput",
    "UnsupportedParameter",
    "check_sampling_support",
    "parse_response_format",
]
