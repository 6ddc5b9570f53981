"""The driver's one pass over an OpenAI Batch API file, before anything runs
(:func:`scan_batch_file`), and what a stopped run already wrote (:func:`read_done`).

The scan keeps only what must be known up front -- each line's ``custom_id`` as a fixed-size
digest (duplicates reject the file: :mod:`relayllm.batch.custom_ids`), the ``model`` values
(routing errors reject it), and per line one byte: which (model, task) it belongs to, or that
it does not run (blank, already done on ``--resume``, or bad at a glance: not JSON, no
``custom_id``, another url). The file is cut into chunks of lines at byte offsets found on the
way; a chunk is a byte range, its first line number and those bytes, so the driver holds about
21 bytes per line whatever the ids hold (the duplicate check's digest and line number, and the
line's byte), and on ``--resume`` 16 bytes per id already written (:func:`read_done`).
:mod:`relayllm.batch.run` runs them.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from relayllm.batch.custom_ids import IdLines, IdSet, digest, ids_on_lines
from relayllm.batch.format import BadLine, duplicate_ids_error, parse_envelope
from relayllm.blocks import block_rows
from relayllm.errors import ConfigError
from relayllm.rows import Task

#: A line's byte in a chunk when it does not run in any group.
SKIP = 255


@dataclass
class Chunk:
    start: int  # byte offset of its first line
    end: int  # byte offset after its last line
    first_line: int  # 1-based number of its first line
    keys: bytearray = field(default_factory=bytearray)  # one per line: a key index, or SKIP


@dataclass
class Scan:
    """What :func:`scan_batch_file` found: the work to do and what is known to fail."""

    path: str
    lines: int = 0  # request lines (blank ones not counted)
    keys: list[tuple[str | None, Task]] = field(default_factory=list)  # (model, task)
    key_lines: list[int] = field(default_factory=list)  # lines per key (to run)
    first_line: dict[str | None, int] = field(default_factory=dict)  # model -> first line
    chunks: list[Chunk] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)  # bad at a glance, to write
    already: int = 0  # lines skipped because a resumed run's files hold them

    @property
    def to_run(self) -> int:
        return sum(self.key_lines)


@dataclass(frozen=True)
class Done:
    """What a stopped run left in its output and error files (``--resume``)."""

    #: custom_ids with a line in either file, as digests (``custom_id in ids``)
    ids: IdSet = field(default_factory=IdSet)
    bad_lines: frozenset[int] = frozenset()  # error lines without a custom_id, by line number
    completed: int = 0
    failed: int = 0


def count_lines(path: str) -> int:
    """Physical lines of a file (a last line without a newline counts), read in big pieces."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while piece := handle.read(1 << 22):
            count += piece.count(b"\n")
            last = piece[-1:]
    return count + (last != b"\n")


def scan_batch_file(
    path: str, stage_batch: int = 256, done: Done | None = None, *, check_ids: bool = True
) -> Scan:
    """One pass over the file in the driver; see the module's docstring. Duplicate
    ``custom_id``s (bad lines included) and a file with no request lines are ConfigErrors,
    raised before anything runs. ``check_ids=False`` leaves the duplicate check out, for a
    caller that has already checked this file (the batch service's runner validates it)."""
    done = done or Done()
    scan = Scan(path)
    key_index: dict[tuple[str | None, Task], int] = {}
    seen = IdLines() if check_ids else None
    try:
        per_chunk = block_rows(count_lines(path), stage_batch)  # chunks are blocks
        with open(path, "rb") as handle:
            offset, chunk = 0, None
            for number, raw in enumerate(handle, start=1):
                if chunk is None or len(chunk.keys) == per_chunk:
                    chunk = Chunk(offset, offset, number)
                    scan.chunks.append(chunk)
                offset += len(raw)
                chunk.end = offset
                chunk.keys.append(_scan_line(raw, number, scan, key_index, seen, done))
        if seen is not None:
            _check_repeats(path, seen)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the batch file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not scan.lines:
        raise ConfigError(f"{path}: the batch file has no request lines")
    # A chunk with nothing to run costs a read task for nothing (most of a resumed file).
    scan.chunks = [c for c in scan.chunks if c.keys.count(SKIP) != len(c.keys)]
    return scan


def _scan_line(
    raw: bytes,
    number: int,
    scan: Scan,
    key_index: dict[tuple[str | None, Task], int],
    seen: IdLines | None,
    done: Done,
) -> int:
    """The line's byte in its chunk (see :class:`Chunk`), noting what the scan keeps."""
    if not raw.strip():
        return SKIP
    scan.lines += 1
    envelope = parse_envelope(raw.decode("utf-8"), number)
    custom_id = envelope.custom_id
    if custom_id is not None and seen is not None:
        seen.add(custom_id, number)
    if custom_id in done.ids or (custom_id is None and number in done.bad_lines):
        scan.already += 1
        return SKIP
    if isinstance(envelope, BadLine):
        scan.bad.append(envelope)
        return SKIP
    key = (envelope.model, envelope.task)
    index = key_index.get(key)
    if index is None:
        if len(scan.keys) == SKIP:
            raise ConfigError(
                f"{scan.path}: more than {SKIP} different (model, url) pairs; split the file"
            )
        index = key_index[key] = len(scan.keys)
        scan.keys.append(key)
        scan.key_lines.append(0)
        scan.first_line.setdefault(envelope.model, number)
    scan.key_lines[index] += 1
    return index


def _check_repeats(path: str, seen: IdLines, shown: int = 10) -> None:
    """The ConfigError naming the repeated custom_ids, if any: the ids of the first ``shown``
    (in the order their first repeat comes in the file) read again from the file, with
    all their lines."""
    lines, firsts = seen.repeats()
    if not len(lines):
        return
    import numpy as np

    unique, at = np.unique(firsts, return_index=True)  # each id's first line, first repeat
    groups: list[int] = unique[np.argsort(at)][:shown].tolist()  # by their first repeat
    picked = np.isin(firsts, groups)
    members: dict[int, list[int]] = {first: [first] for first in groups}
    for line, first in zip(lines[picked].tolist(), firsts[picked].tolist(), strict=True):
        members[first].append(line)
    with open(path, "rb") as handle:
        ids = ids_on_lines(handle, set(groups))
    duplicates = {ids.get(first, f"<line {first}>"): members[first] for first in groups}
    raise duplicate_ids_error(path, duplicates, len(unique))


def read_done(output_file: str, errors_file: str, retry_errors: bool) -> Done:
    """The custom_ids a stopped run already wrote (a last line cut short by a kill is trimmed,
    as ``relayllm run --resume`` does); with ``retry_errors`` the errors file is emptied, so
    its lines run again."""
    from relayllm.pipelines.resume import RowIds, read_jsonl_ids

    ids = RowIds("custom_id")
    completed, failed = _Written(), _Written()
    read_jsonl_ids(output_file, ids, completed.add)
    if retry_errors:
        if os.path.exists(errors_file):
            open(errors_file, "w").close()
    else:
        read_jsonl_ids(errors_file, ids, failed.add)
    bad_lines = frozenset(_lines_without_id(errors_file)) if failed.rows else frozenset()
    return Done(
        IdSet(completed.digests + failed.digests),
        bad_lines,
        len(IdSet(completed.digests)) + len(completed.others),  # distinct ids, as a set counts
        _count_lines(errors_file) if failed.rows else 0,
    )


class _Written:
    """The ids of one work file's rows: the custom_id strings as digests (16 bytes each), any
    other value (None: a line without one) as itself."""

    def __init__(self) -> None:
        self.digests = bytearray()
        self.others: set[Any] = set()
        self.rows = 0

    def add(self, value: Any) -> None:
        self.rows += 1
        if isinstance(value, str):
            self.digests += digest(value)
        else:
            self.others.add(value)


def _lines_without_id(path: str) -> list[int]:
    """Line numbers of the error lines that have no custom_id (not JSON, no custom_id...)."""
    found = []
    with open(path, "rb") as lines:
        for text in lines:
            row = json.loads(text) if text.strip() else None
            if isinstance(row, dict) and row.get("custom_id") is None:
                found.append((row.get("error") or {}).get("line"))
    return [n for n in found if isinstance(n, int)]


def _count_lines(path: str) -> int:
    with open(path, "rb") as lines:
        return sum(1 for text in lines if text.strip())


__all__ = [
    "SKIP",
    "Chunk",
    "Done",
    "Scan",
    "count_lines",
    "read_done",
    "scan_batch_file",
]
