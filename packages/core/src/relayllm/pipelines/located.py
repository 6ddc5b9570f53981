"""Pipeline files read with the line of every key, so an error names the file, the line and
the field (:class:`PipelineError`)."""

from __future__ import annotations

from typing import Any

import yaml

from relayllm.errors import ConfigError

Loc = tuple[str | int, ...]


class PipelineError(ConfigError):
    """A pipeline file is invalid. ``problems`` holds (line, field, message) triples."""

    def __init__(self, source: str, problems: list[tuple[int | None, str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = []
        for line, where, message in problems:
            place = f"{source}:{line}" if line else source
            lines.append(f"{place}: {where}: {message}" if where else f"{place}: {message}")
        super().__init__("\n".join(lines))


def format_loc(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class Located:
    """The parsed YAML plus the line of every key and item, to point errors at them."""

    def __init__(self, source: str, data: Any, lines: dict[Loc, int]) -> None:
        self.source, self.data, self.lines = source, data, lines

    def line(self, loc: Loc) -> int | None:
        for end in range(len(loc), -1, -1):  # the deepest part of loc the file has
            if loc[:end] in self.lines:
                return self.lines[loc[:end]]
        return None

    def error(self, problems: list[tuple[Loc, str]]) -> PipelineError:
        return PipelineError(
            self.source, [(self.line(loc), format_loc(loc), m) for loc, m in problems]
        )


def parse_yaml(text: str, source: str) -> Located:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        raise PipelineError(
            source, [(line, "", f"not valid YAML: {getattr(exc, 'problem', exc)}")]
        ) from None
    finally:
        loader.dispose()
    lines: dict[Loc, int] = {}
    problems: list[tuple[int | None, str, str]] = []

    def walk(node: yaml.Node, loc: Loc) -> None:
        lines.setdefault(loc, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, value in node.value:
                name = key.value if isinstance(key, yaml.ScalarNode) else str(key.value)
                if name in seen:  # PyYAML silently keeps the last one
                    problems.append(
                        (key.start_mark.line + 1, format_loc((*loc, name)), "duplicate key")
                    )
                seen.add(name)
                lines[(*loc, name)] = key.start_mark.line + 1
                walk(value, (*loc, name))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                walk(item, (*loc, i))

    if node is not None:
        walk(node, ())
    if problems:
        raise PipelineError(source, problems)
    return Located(source, data, lines)


def not_utf8(path: str, exc: UnicodeDecodeError) -> ConfigError:
    """The error for a file that is not UTF-8 text: the file, the first bad line, what to do."""
    where = path
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    raw.decode("utf-8")
                except UnicodeDecodeError as bad:
                    where, exc = f"{path}:{number}", bad
                    break
    except OSError:
        pass
    byte = exc.object[exc.start]
    return ConfigError(
        f"{where}: not UTF-8 text ({exc.reason}: byte {byte:#04x}); save the file "
        f"as UTF-8 (e.g. `iconv -f LATIN1 -t UTF-8 FILE`)"
    )
