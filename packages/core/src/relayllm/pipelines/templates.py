"""``{column}`` templates: the names they read, and a row filled into one."""

from __future__ import annotations

import json
import string
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relayllm.pipelines.located import Loc
    from relayllm.pipelines.spec import StepSpec

_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    """The ``{column}`` names in ``template`` (``{{``/``}}`` are literal braces)."""
    return [name for _, name, _, _ in _FORMATTER.parse(template) if name is not None]


def render(template: str, row: dict[str, Any]) -> str:
    """Fill ``template`` from ``row``. A missing or empty column raises ``LookupError``."""
    out = []
    for literal, name, spec, conversion in _FORMATTER.parse(template):
        out.append(literal)
        if name is None:
            continue
        if name not in row:
            raise LookupError(f"the row has no column {name!r}")
        value = row[name]
        if value is None:
            raise LookupError(f"column {name!r} is empty")
        if isinstance(value, (dict, list)):
            value = json.dumps(value, ensure_ascii=False)
        value = _FORMATTER.convert_field(value, conversion) if conversion else value
        out.append(format(value, spec or ""))
    return "".join(out)


def step_templates(step: StepSpec, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if step.messages is not None:
        for k, message in enumerate(step.messages):
            yield (*loc, "messages", k, "content"), message.content
    from relayllm.pipelines.spec import STRING_TEMPLATES

    for key in STRING_TEMPLATES:
        value = getattr(step, key)
        if value is not None:
            yield (*loc, key), value
