"""``{column}`` templates: the names they read, and a row filled into one."""

from __future__ import annotations

import functools
import json
import os
import string
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relayllm.pipelines.located import Loc
    from relayllm.pipelines.spec import ContentPart, StepSpec

_FORMATTER = string.Formatter()


def template_fields(template: str) -> list[str]:
    """The ``{column}`` names in ``template`` (``{{``/``}}`` are literal braces)."""
    return [name for _, name, _, _ in _FORMATTER.parse(template) if name is not None]


@functools.lru_cache(maxsize=256)
def _parsed(template: str) -> tuple[tuple[str, str | None, str | None, str | None], ...]:
    # Parsed once per template, not once per row (a step renders it for every row).
    return tuple(_FORMATTER.parse(template))


def render(template: str, row: dict[str, Any]) -> str:
    """Fill ``template`` from ``row``. A missing or empty column raises ``LookupError``."""
    out = []
    for literal, name, spec, conversion in _parsed(template):
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


def render_content(
    content: str | list[ContentPart], row: dict[str, Any], base_dir: Path | None = None
) -> str | list[dict[str, Any]]:
    """A message's content filled from ``row``: a string, or OpenAI's content parts (text and
    ``image_url``), whose image URL, when it is a relative local path, is read from
    ``base_dir`` (the pipeline file's folder, as ``input.path``)."""
    if isinstance(content, str):
        return render(content, row)
    parts: list[dict[str, Any]] = []
    for part in content:
        if part.type == "text":
            parts.append({"type": "text", "text": render(part.text, row)})
            continue
        spec = part.image_url.model_dump(exclude_none=True)
        spec["url"] = _local_to_base(render(part.image_url.url, row), base_dir)
        parts.append({"type": "image_url", "image_url": spec})
    return parts


def _local_to_base(url: str, base_dir: Path | None) -> str:
    """A relative path (no scheme, not absolute) under ``base_dir``; anything else as it is."""
    if base_dir is None or not url or urllib.parse.urlsplit(url).scheme or os.path.isabs(url):
        return url
    return str(base_dir / url)


def step_templates(step: StepSpec, loc: Loc) -> Iterator[tuple[Loc, str]]:
    if step.messages is not None:
        for k, message in enumerate(step.messages):
            where = (*loc, "messages", k, "content")
            if isinstance(message.content, str):
                yield where, message.content
                continue
            for j, part in enumerate(message.content):
                if part.type == "text":
                    yield (*where, j, "text"), part.text
                else:
                    yield (*where, j, "image_url", "url"), part.image_url.url
    from relayllm.pipelines.spec import STRING_TEMPLATES

    for key in STRING_TEMPLATES:
        value = getattr(step, key)
        if value is not None:
            yield (*loc, key), value
