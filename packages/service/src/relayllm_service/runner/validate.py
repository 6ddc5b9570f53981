"""A batch's input file checked before anything runs (the ``validating`` status): one streamed
pass, each line's envelope parsed by :func:`relayllm.batch.format.parse_envelope` (the same
parser ``relayllm batch`` and the runner use), and the problems as OpenAI's ``errors`` entries
(``code``, ``message``, ``param``, ``line``). Any problem fails the batch, as OpenAI's
validation does.

What fails a batch here: a line that is not JSON or not a request (no ``custom_id``, another
``method``, no ``body`` object, ``stream``), an unsupported ``url``, a line whose ``url`` is not
the batch's endpoint, a repeated ``custom_id``, a file with no request lines, more lines or
bytes than the server's :class:`Limits`, and (when the deployments are given) ``model`` values
that route to none. A body's contents (messages, sampling parameters) are checked where the
line runs, as ``relayllm batch`` does: a bad body is that line's entry in the error file, not
the batch's failure; so is a body nested too deep to parse (its envelope read from the line's
top level) or holding text that cannot be encoded as UTF-8.

The codes are ``relayllm batch``'s error-file codes (``invalid_json``, ``missing_custom_id``,
``unsupported_url``, ``invalid_request``) and, for what only a whole file shows,
``mismatched_endpoint``, ``duplicate_custom_id``, ``empty_file``, ``too_many_lines``,
``file_too_large``, ``line_too_large``, ``model_not_found`` and ``too_many_errors``.

Memory: a fixed size per line for the ``custom_id`` duplicate check (a digest and the line's
number, :mod:`relayllm.batch.custom_ids`, as the driver's scan holds them) and one line at a
time; no line is read past the file's byte limit, nor held past the line's
(``max_line_bytes``: the rest of a longer line is read a piece at a time and dropped).
Repeated ids are found at the end of the pass and merged into the problems in line order (a
line's repeat before its other problem), so the list is the file's first problems, as a check
line by line would give. Their messages name the id when ``source`` can seek (the lines
reported are read again); otherwise only the lines.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from relayllm.batch.custom_ids import IdLines, ids_on_lines
from relayllm.batch.format import URL_TASKS, BadLine, parse_envelope, route_models
from relayllm.errors import ConfigError
from relayllm.rows import Task
from relayllm_service.errors import InvalidRequestError
from relayllm_service.store.files import CHUNK, DEFAULT_MAX_BYTES

#: The default limit on one line: room for a request with several large base64 images.
DEFAULT_MAX_LINE_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """The server's limits on one batch's input file."""

    max_lines: int = 1_000_000
    max_bytes: int = DEFAULT_MAX_BYTES
    #: One line's bytes (its newline included): a longer line fails the batch, read no
    #: further than this (a line is held whole only where it runs, after validation).
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    #: Problems listed in the batch's ``errors``; validation stops at the first one past it.
    max_errors: int = 100


@dataclass
class Validation:
    """What one pass found: ``lines`` (request lines: the batch's ``request_counts.total``),
    the first line of each ``model`` value (for routing), and the problems."""

    lines: int = 0
    first_line: dict[str | None, int] = field(default_factory=dict)
    problems: list[dict[str, Any]] = field(default_factory=list)
    #: More problems exist than ``problems`` lists (validation stopped early).
    truncated: bool = False

    @property
    def ok(self) -> bool:
        return not self.problems

    def errors(self) -> dict[str, Any] | None:
        """The batch's ``errors`` field: None when valid, else OpenAI's list object."""
        if self.ok:
            return None
        data = list(self.problems)
        if self.truncated:
            last = data[-1].get("line")
            data.append(
                _problem(
                    "too_many_errors",
                    f"validation stopped after {len(self.problems)} problems (line {last}); "
                    f"fix these and upload the file again",
                )
            )
        return {"object": "list", "data": data}


def check_endpoint(endpoint: object) -> Task:
    """The task of a batch's ``endpoint``, or the 400 a client gets for another one."""
    task = URL_TASKS.get(endpoint) if isinstance(endpoint, str) else None
    if task is None:
        raise InvalidRequestError(
            f"endpoint {endpoint!r} is not supported; use one of {', '.join(URL_TASKS)}",
            "endpoint",
        )
    return task


def validate_input(
    source: BinaryIO,
    endpoint: str,
    limits: Limits | None = None,
    *,
    deployments: list[str] | None = None,
    default: str | None = None,
) -> Validation:
    """Check the input file read from ``source`` for a batch on ``endpoint``; with
    ``deployments`` (and the ``default`` one), also that every ``model`` routes to one."""
    check_endpoint(endpoint)
    limits = limits or Limits()
    found = Validation()
    seen = IdLines()
    start = _position(source)  # where to read the repeated lines' ids again
    read = number = 0

    def problem(code: str, message: str, param: str | None = None, line: int | None = None) -> bool:
        """Record one; True when validation must stop (the list is full)."""
        if len(found.problems) == limits.max_errors:
            found.truncated = True
            return True
        found.problems.append(_problem(code, message, param, line))
        return False

    def too_large(number: int) -> None:
        problem(
            "file_too_large",
            f"the file is larger than the limit of {limits.max_bytes:,} bytes "
            f"(reached on line {number})",
            None,
            number,
        )

    while raw := source.readline(min(limits.max_bytes - read, limits.max_line_bytes) + 1):
        read += len(raw)
        number += 1
        if read > limits.max_bytes:
            too_large(number)
            break
        if len(raw) > limits.max_line_bytes:
            found.lines += 1
            read = _skip_line(source, raw, read, limits.max_bytes)
            if read > limits.max_bytes:
                too_large(number)
                break
            if problem(
                "line_too_large",
                f"line {number}: the line is larger than the limit of "
                f"{limits.max_line_bytes:,} bytes",
                None,
                number,
            ):
                break
            continue
        if not raw.strip():
            continue
        found.lines += 1
        if found.lines > limits.max_lines:
            problem(
                "too_many_lines",
                f"the file has more than {limits.max_lines:,} request lines",
                None,
                number,
            )
            break
        if _check_line(raw, number, endpoint, found, seen, problem):
            break
    _add_repeats(found, seen, source, start, limits.max_errors)
    if found.lines == 0 and not found.problems:
        problem("empty_file", "the file has no request lines")
    if found.ok and deployments is not None:
        try:
            route_models(found.first_line, deployments, default)
        except ConfigError as exc:
            problem("model_not_found", str(exc), "body.model")
    return found


def _skip_line(source: BinaryIO, raw: bytes, read: int, max_bytes: int) -> int:
    """Read past the rest of a line over the limit a piece at a time (never held whole);
    returns the bytes read in all, stopping once they pass ``max_bytes``."""
    while not raw.endswith(b"\n") and read <= max_bytes:
        raw = source.readline(min(CHUNK, max_bytes - read + 1))
        if not raw:
            break
        read += len(raw)
    return read


def _check_line(
    raw: bytes,
    number: int,
    endpoint: str,
    found: Validation,
    seen: IdLines,
    problem: Callable[..., bool],
) -> bool:
    """One request line's problems; True when validation must stop."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return problem(
            "invalid_json", f"line {number}: not UTF-8 text ({exc.reason})", None, number
        )
    envelope = parse_envelope(text, number)
    custom_id = envelope.custom_id
    if custom_id is not None:
        seen.add(custom_id, number)  # repeats: at the end of the pass (_add_repeats)
    if isinstance(envelope, BadLine):
        return problem(envelope.code, envelope.message, envelope.param, number)
    if envelope.url != endpoint:
        return problem(
            "mismatched_endpoint",
            f"line {number}: 'url' {envelope.url!r} is not the batch's endpoint {endpoint!r}; "
            f"a batch's lines all go to its endpoint",
            "url",
            number,
        )
    found.first_line.setdefault(envelope.model, number)
    return False


def _position(source: BinaryIO) -> int | None:
    """Where ``source`` stands, if it can go back there."""
    try:
        return source.tell() if source.seekable() else None
    except (OSError, ValueError):
        return None


def _add_repeats(
    found: Validation, seen: IdLines, source: BinaryIO, start: int | None, max_errors: int
) -> None:
    """The repeated custom_ids of the lines read, merged into ``found.problems`` in line order
    (the list cut at ``max_errors``, as it would have been line by line)."""
    lines, firsts = seen.repeats()
    if not len(lines):
        return
    cut = max_errors + 1  # more cannot be listed
    pairs = list(zip(lines[:cut].tolist(), firsts[:cut].tolist(), strict=True))
    ids: dict[int, str] = {}
    if start is not None:
        try:
            source.seek(start)
            ids = ids_on_lines(iter(source.readline, b""), {line for line, _ in pairs})
        except (OSError, ValueError):
            ids = {}
    repeats = [
        _problem(
            "duplicate_custom_id",
            f"line {line}: custom_id {ids[line]!r} repeats line {first}; each must be unique"
            if line in ids
            else f"line {line}: its custom_id repeats line {first}; each must be unique",
            "custom_id",
            line,
        )
        for line, first in pairs
    ]
    merged = sorted(
        [*repeats, *found.problems],  # sorted() is stable: a line's repeat comes first
        key=lambda p: p["line"] if p["line"] is not None else float("inf"),
    )
    if len(merged) > max_errors:
        found.truncated = True
    found.problems = merged[:max_errors]


def _problem(
    code: str, message: str, param: str | None = None, line: int | None = None
) -> dict[str, Any]:
    return {"code": code, "message": message, "param": param, "line": line}


__all__ = ["DEFAULT_MAX_LINE_BYTES", "Limits", "Validation", "check_endpoint", "validate_input"]
