"""Running an OpenAI Batch API file of any size: read from disk in blocks, never whole in the
driver (``relayllm batch``).

1. :func:`scan_batch_file` (driver, before anything runs): one pass over the file that keeps
   only what must be known up front -- each line's ``custom_id`` (duplicates reject the file),
   the ``model`` values (routing errors reject it), and per line one byte: which (model,
   task) it belongs to, or that it does not run (blank, already done on ``--resume``, or bad
   at a glance: not JSON, no ``custom_id``, another url). The file is cut into chunks of
   lines at byte offsets found on the way; a chunk is a byte range, its first line number
   and those bytes, so the driver holds about one byte per line.
2. :func:`run_scanned` runs each (deployment, task) group as one Ray Data job: a read task
   per chunk reads its byte range from disk and keeps its group's lines as rows of one
   canonical schema (``line`` int64, ``text`` the line's JSON as a string), so every block
   concatenates with every other whatever the bodies hold. The stage's ``preprocess`` parses
   the line inside the stage actor (:func:`relayllm.batch.format.parse_line`), its
   ``postprocess`` renders the output line there; the driver only writes the finished
   blocks' lines, in input order, and flushes each block.

A scoring line (``/v1/score``, ``/v1/rerank``) is one row per (query, document) pair: its read
task parses it and emits the pairs (all in one block), and the driver gathers them into the
line's response as they arrive.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

from relayllm.batch.format import (
    BadLine,
    BatchRequest,
    duplicate_ids_error,
    error_line,
    gathered,
    parse_envelope,
    parse_line,
    request_counts,
    response_line,
    route_models,
    served_model,
)
from relayllm.errors import ConfigError
from relayllm.rows import ERROR, INPUT_COLUMN, SAMPLING_PARAMS_COLUMN, Task

if TYPE_CHECKING:
    from ray.data import Dataset

#: A line's byte in a chunk when it does not run in any group.
SKIP = 255
#: Chunks are at most this many lines, and at most this share of the file (so a small file
#: still runs as several blocks, on several stage actors, and reaches the disk as it goes):
#: the same sizes as a pipeline's input blocks (relayllm.pipelines.transforms.block_rows).
MAX_CHUNK_LINES = 4096
CHUNKS_PER_FILE = 16


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

    ids: frozenset[str] = frozenset()  # custom_ids with a line in either file
    bad_lines: frozenset[int] = frozenset()  # error lines without a custom_id, by line number
    completed: int = 0
    failed: int = 0


def stage_batch(batch_size: int) -> int:
    """Rows of one Ray Data batch of the stage (``batch_size`` x the in-flight calls)."""
    from relayllm.processor import ProcessorConfig

    in_flight = ProcessorConfig.model_fields["max_in_flight_batches"].default
    return int(batch_size * in_flight)


def chunk_lines(total_lines: int, stage_batch: int) -> int:
    """Lines per chunk (a read task, and a block of the stage): 1/16 of the file, at most
    4,096, never less than one stage batch (a smaller block would be bundled with its
    neighbours into one stage task)."""
    return max(stage_batch, min(MAX_CHUNK_LINES, -(-total_lines // CHUNKS_PER_FILE)))


def count_lines(path: str) -> int:
    """Physical lines of a file (a last line without a newline counts), read in big pieces."""
    count, last = 0, b"\n"
    with open(path, "rb") as handle:
        while piece := handle.read(1 << 22):
            count += piece.count(b"\n")
            last = piece[-1:]
    return count + (last != b"\n")


def scan_batch_file(path: str, stage_batch: int = 256, done: Done | None = None) -> Scan:
    """One pass over the file in the driver; see the module's docstring. Duplicate
    ``custom_id``s (bad lines included) and a file with no request lines are ConfigErrors,
    raised before anything runs."""
    done = done or Done()
    scan = Scan(path)
    key_index: dict[tuple[str | None, Task], int] = {}
    seen: dict[str, int] = {}  # custom_id -> its first line
    duplicates: dict[str, list[int]] = {}
    try:
        per_chunk = chunk_lines(count_lines(path), stage_batch)
        with open(path, "rb") as handle:
            offset, chunk = 0, None
            for number, raw in enumerate(handle, start=1):
                if chunk is None or len(chunk.keys) == per_chunk:
                    chunk = Chunk(offset, offset, number)
                    scan.chunks.append(chunk)
                offset += len(raw)
                chunk.end = offset
                chunk.keys.append(_scan_line(raw, number, scan, key_index, seen, duplicates, done))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the batch file: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if duplicates:
        raise duplicate_ids_error(path, duplicates)
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
    seen: dict[str, int],
    duplicates: dict[str, list[int]],
    done: Done,
) -> int:
    """The line's byte in its chunk (see :class:`Chunk`), noting what the scan keeps."""
    if not raw.strip():
        return SKIP
    scan.lines += 1
    envelope = parse_envelope(raw.decode("utf-8"), number)
    custom_id = envelope.custom_id
    if custom_id is not None:
        first = seen.setdefault(custom_id, number)
        if first != number:
            duplicates.setdefault(custom_id, [first]).append(number)
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


def read_done(output_file: str, errors_file: str, retry_errors: bool) -> Done:
    """The custom_ids a stopped run already wrote (a last line cut short by a kill is trimmed,
    as ``relayllm run --resume`` does); with ``retry_errors`` the errors file is emptied, so
    its lines run again."""
    from relayllm.pipelines.resume import RowIds, jsonl_ids

    ids = RowIds("custom_id")
    completed = jsonl_ids(output_file, ids)
    if retry_errors:
        if os.path.exists(errors_file):
            open(errors_file, "w").close()
        failed: set[Any] = set()
    else:
        failed = jsonl_ids(errors_file, ids)
    bad_lines = frozenset(_lines_without_id(errors_file)) if failed else frozenset()
    return Done(
        frozenset(i for i in completed | failed if i is not None),
        bad_lines,
        len(completed),
        _count_lines(errors_file) if failed else 0,
    )


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


def groups_of(
    scan: Scan, deployments: list[str], default: str | None
) -> dict[tuple[str, Task], list[int]]:
    """The (deployment, task) groups to run, in the file's order, each with its key indexes."""
    to = route_models(scan.first_line, deployments, default)
    groups: dict[tuple[str, Task], list[int]] = {}
    for index, (model, task) in enumerate(scan.keys):
        groups.setdefault((to[model], task), []).append(index)
    return groups


def run_scanned(
    scan: Scan,
    deployments: list[str],
    default: str | None,
    output: IO[str],
    errors: IO[str],
    processor_fields: dict[str, Any] | None = None,
    done: Done | None = None,
) -> dict[str, int]:
    """Run the scanned file's groups one after another; write each line to ``output`` or
    ``errors`` as its block arrives; return OpenAI's ``request_counts`` for the whole file
    (a resumed run's earlier lines included)."""
    from relayllm.data_context import keep_input_order

    done = done or Done()
    keep_input_order()  # before any dataset exists: each keeps the context it was made with
    completed, failed = done.completed, done.failed
    for line in scan.bad:
        errors.write(
            json.dumps(error_line(line.line, line.custom_id, line.code, line.message)) + "\n"
        )
        failed += 1
    errors.flush()
    for (deployment, task), keys in groups_of(scan, deployments, default).items():
        dataset = group_dataset(scan, keys, deployment, task, processor_fields or {})
        keep_input_order(dataset.context)
        write = _ScoreWriter(deployment, served_model(deployment)) if task == "score" else None
        for batch in dataset.iter_batches(batch_format="pyarrow", batch_size=None):
            if write is not None:
                ok, bad = write(batch.to_pylist(), output, errors)  # type: ignore[union-attr]
            else:
                ok, bad = _write_block(batch, output, errors)
            completed, failed = completed + ok, failed + bad
            output.flush()  # each block reaches the disk as it finishes: a kill keeps it
            errors.flush()
    return request_counts(scan.lines, completed, failed)


def group_dataset(
    scan: Scan, keys: list[int], deployment: str, task: Task, fields: dict[str, Any]
) -> Dataset:
    """One group's lines as a lazy dataset: read from disk chunk by chunk, through the stage."""
    import ray

    from relayllm.processor import ProcessorConfig, build_processor
    from relayllm.resources import TASK_NUM_CPUS

    wanted = bytes(keys)
    chunks = [
        {"start": c.start, "end": c.end, "first_line": c.first_line, "keys": bytes(c.keys)}
        for c in scan.chunks
        if any(k in c.keys for k in wanted)
    ]
    items = ray.data.from_items(chunks, override_num_blocks=max(len(chunks), 1))
    reader = _ReadChunk(scan.path, wanted, task)
    # Ray Data names the operator (and its progress bar) after the function.
    reader.__name__ = f"read[{os.path.basename(scan.path)}]"  # type: ignore[attr-defined]
    lines = items.map_batches(
        reader,
        batch_size=1,  # a chunk per call: one block of its lines
        batch_format="pyarrow",
        num_cpus=TASK_NUM_CPUS,  # a whole CPU each could starve next to an engine replica
        # One read task at a time: a chunk takes milliseconds to read, and at 0.1 CPU each
        # Ray would start a worker process per concurrent task (a second of imports each):
        # unbounded, the reads cost more CPU than the stage (benchmarks/batch_file.py).
        concurrency=1,
    )
    # No more stage actors than blocks: an actor with no block to work on idles.
    fields = {**fields, "concurrency": min(fields.get("concurrency", 1), max(len(chunks), 1))}
    config = ProcessorConfig(deployment=deployment, task=task, **fields)
    if task == "score":  # the read task built the pair rows; the driver gathers them
        return build_processor(config)(lines)
    served = served_model(deployment)
    return build_processor(config, _Parse(task), _Respond(deployment, served))(lines)


class _ReadChunk:
    """Read task: a chunk's byte range from disk, its group's lines as rows."""

    def __init__(self, path: str, keys: bytes, task: Task) -> None:
        self.path, self.keys, self.task = path, set(keys), task

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        (chunk,) = batch.to_pylist()
        with open(self.path, "rb") as handle:
            handle.seek(chunk["start"])
            data = handle.read(chunk["end"] - chunk["start"])
        lines, texts = [], []
        # Split as the scan's binary line iteration did: on b"\n" only.
        for i, (key, raw) in enumerate(zip(chunk["keys"], data.split(b"\n"), strict=False)):
            if key in self.keys:
                lines.append(chunk["first_line"] + i)
                texts.append(raw.decode("utf-8"))
        if self.task == "score":
            return pa.Table.from_pylist(
                [
                    row
                    for line, text in zip(lines, texts, strict=True)
                    for row in _pairs(line, text)
                ],
                schema=_score_schema(),
            )
        return pa.table({"line": pa.array(lines, pa.int64()), "text": pa.array(texts, pa.string())})


def _pairs(line: int, text: str) -> list[dict[str, Any]]:
    """A scoring line's rows: one per (query, document) pair; a bad line is one row that
    carries its error line (no query, so the stage sends nothing for it)."""
    request = parse_line(text, line)
    if isinstance(request, BadLine):
        message = error_line(request.line, request.custom_id, request.code, request.message)
        return [{"line": line, "pair": 0, "pairs": 1, "bad": json.dumps(message)}]
    return [
        {
            "line": line,
            "custom_id": request.custom_id,
            "pair": i,
            "pairs": len(request.pairs),
            "query": q,
            "document": d,
            "rerank": request.rerank,
            "top_n": request.top_n,
        }
        for i, (q, d) in enumerate(request.pairs)
    ]


def _score_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("line", pa.int64()),
            ("custom_id", pa.string()),
            ("pair", pa.int64()),
            ("pairs", pa.int64()),
            ("query", pa.string()),
            ("document", pa.string()),
            ("rerank", pa.bool_()),
            ("top_n", pa.int64()),
            ("bad", pa.string()),
        ]
    )


class _Parse:
    """``preprocess`` in the stage actor: a line's JSON into the task's input columns; a bad
    line keeps its error line and no input (the stage sends nothing for it). The checks the
    stage makes on every row anyway are not made twice (``parse_line(check=False)``)."""

    def __init__(self, task: Task) -> None:
        self.column = INPUT_COLUMN[task]

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        line = row["line"]
        request = parse_line(row["text"], line, check=False)
        if isinstance(request, BadLine):
            bad = error_line(request.line, request.custom_id, request.code, request.message)
            return {"line": line, "bad": bad, self.column: None}
        return {
            "line": line,
            "text": row["text"],
            "request": request,
            self.column: request.value,
            SAMPLING_PARAMS_COLUMN: request.sampling_params or None,
        }


#: One encoder for every line (json.dumps with options builds one per call).
_encode = json.JSONEncoder(ensure_ascii=False).encode


class _Respond:
    """``postprocess`` in the stage actor: the row's output line (``ok``) or error line."""

    def __init__(self, deployment: str, served: str) -> None:
        self.deployment, self.served = deployment, served

    def __call__(self, row: dict[str, Any]) -> dict[str, Any]:
        bad = row.get("bad")
        request: BatchRequest | None = row.get("request")
        if bad is None and request is not None and row.get(ERROR):
            # Parsed unchecked: a line the full checks refuse is a bad request, not the
            # deployment's failure (the same error line as before anything ran).
            checked = parse_line(row["text"], request.line)
            if isinstance(checked, BadLine):
                bad = error_line(checked.line, checked.custom_id, checked.code, checked.message)
            else:
                bad = error_line(
                    request.line,
                    request.custom_id,
                    "engine_error",
                    f"deployment {self.deployment!r}: {row[ERROR]}",
                )
        if bad is not None:
            return {"ok": False, "text": _encode(bad)}
        assert request is not None
        return {"ok": True, "text": _encode(response_line(request, row, self.served))}


def _write_block(batch: Any, output: IO[str], errors: IO[str]) -> tuple[int, int]:
    """A finished block's lines to their files: column work, no per-row Python but the join."""
    import pyarrow.compute as pc

    ok = batch.column("ok")
    good = pc.filter(batch.column("text"), ok).to_pylist()
    bad = pc.filter(batch.column("text"), pc.invert(ok)).to_pylist()
    if good:
        output.write("\n".join(good) + "\n")
    if bad:
        errors.write("\n".join(bad) + "\n")
    return len(good), len(bad)


class _ScoreWriter:
    """Gathers a scoring line's pair rows (they arrive in one block, in order) into its
    response; a pair that failed sends the whole line to the errors file."""

    def __init__(self, deployment: str, served: str) -> None:
        self.deployment, self.served = deployment, served
        self.pending: dict[int, list[dict[str, Any]]] = {}

    def __call__(
        self, rows: list[dict[str, Any]], output: IO[str], errors: IO[str]
    ) -> tuple[int, int]:
        ok = bad = 0
        for row in rows:
            if row.get("bad"):
                errors.write(row["bad"] + "\n")
                bad += 1
                continue
            pairs = self.pending.setdefault(row["line"], [])
            pairs.append(row)
            if len(pairs) < row["pairs"]:
                continue
            pairs = sorted(self.pending.pop(row["line"]), key=lambda r: r["pair"])
            first = pairs[0]
            request = BatchRequest(
                first["line"],
                first["custom_id"],
                "score",
                None,
                {},
                None,
                [(r["query"], r["document"]) for r in pairs],
                bool(first["rerank"]),
                first["top_n"] or 0,
            )
            result = gathered(pairs)
            if result.get(ERROR):
                line = error_line(
                    request.line,
                    request.custom_id,
                    "engine_error",
                    f"deployment {self.deployment!r}: {result[ERROR]}",
                )
                errors.write(json.dumps(line, ensure_ascii=False) + "\n")
                bad += 1
            else:
                line = response_line(request, result, self.served)
                output.write(json.dumps(line, ensure_ascii=False) + "\n")
                ok += 1
        return ok, bad


__all__ = [
    "Chunk",
    "Done",
    "Scan",
    "chunk_lines",
    "groups_of",
    "read_done",
    "run_scanned",
    "scan_batch_file",
    "stage_batch",
]
