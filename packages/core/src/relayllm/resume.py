"""Resumable output: results are written as they finish; a job run again on the same output
directory processes only the rows missing from it.

Each finished block becomes one file ``part-<uuid>.jsonl`` in the output directory, written
under a temporary name and renamed when complete, so a killed job leaves only whole files (plus
``*.tmp`` leftovers that the next run deletes). A row is identified by ``id_column`` or, without
one, by a hash of its content (``ROW_ID_COLUMN``): the same input row gets the same id on every
run. Ids must be unique in the input; rows with identical content share a content id.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayllm.errors import ConfigError

if TYPE_CHECKING:
    from ray.data import Dataset

ROW_ID_COLUMN = "row_id"
PART_GLOB = "part-*.jsonl"


@dataclass(frozen=True)
class ResumeReport:
    already_done: int  # rows found in the output directory before this run
    written: int  # rows this run wrote
    output_dir: Path


def content_id(row: dict[str, Any]) -> str:
    """A stable id for a row: sha256 of its canonical JSON, 24 hex digits."""
    text = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def completed_ids(output_dir: str | os.PathLike[str], id_column: str) -> set[Any]:
    """Ids of the rows already in the output directory's complete part files."""
    done: set[Any] = set()
    for path in sorted(Path(output_dir).glob(PART_GLOB)):
        with path.open("rb") as lines:
            for number, line in enumerate(lines, 1):
                _add_id(done, line, id_column, path, number)
    return done


def jsonl_ids(path: str | os.PathLike[str], id_column: str) -> set[Any]:
    """Ids of the rows of a JSONL output file that a killed run left behind. A last line cut
    short by the kill is removed from the file, so appending to it stays valid JSONL."""
    done: set[Any] = set()
    if not Path(path).exists():
        return done
    with open(path, "r+b") as lines:
        whole = 0  # bytes of complete lines so far
        for number, line in enumerate(lines, 1):
            if not line.endswith(b"\n"):
                lines.truncate(whole)
                break
            whole += len(line)
            _add_id(done, line, id_column, path, number)
    return done


def drop_error_rows(path: str | os.PathLike[str], error_column: str = "error") -> int:
    """Remove the rows recorded with an error from a JSONL output (rewritten atomically), so a
    resumed run does them again; returns how many were removed."""
    source = Path(path)
    if not source.exists():
        return 0
    dropped = 0
    temp = source.with_name(source.name + ".tmp")
    with source.open("rb") as lines, temp.open("wb") as kept:
        for line in lines:
            try:
                row = json.loads(line) if line.strip() else None
            except json.JSONDecodeError:
                row = None  # not ours to judge: jsonl_ids reports it
            if isinstance(row, dict) and row.get(error_column):
                dropped += 1
                continue
            kept.write(line)
        kept.flush()
        os.fsync(kept.fileno())
    os.replace(temp, source)
    return dropped


def _add_id(done: set[Any], line: bytes, id_column: str, path: Any, number: int) -> None:
    if not line.strip():
        return
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}, line {number}: not JSON ({exc.msg}), so the run cannot resume it"
        ) from None
    if not isinstance(row, dict) or id_column not in row:
        raise ConfigError(
            f"{path}, line {number}: no {id_column!r} column, so the run cannot resume it"
        )
    done.add(row[id_column])


def skip_done(dataset: Dataset, id_column: str, done: set[Any]) -> Dataset:
    """``dataset`` without the rows whose ``id_column`` is in ``done``."""
    if not done:
        return dataset
    import pyarrow as pa
    import pyarrow.compute as pc

    done_ids = pa.array(sorted(done, key=str))

    def missing(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.invert(pc.is_in(batch[id_column], value_set=done_ids)))

    from relayllm.resources import TASK_NUM_CPUS

    return dataset.map_batches(
        missing, batch_format="pyarrow", zero_copy_batch=True, num_cpus=TASK_NUM_CPUS
    )


def read_output(output_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every row of a (finished or partial) output directory."""
    rows = []
    for path in sorted(Path(output_dir).glob(PART_GLOB)):
        with path.open(encoding="utf-8") as lines:
            rows.extend(json.loads(line) for line in lines)
    return rows


def run_resumable(
    dataset: Dataset,
    transform: Callable[[Dataset], Dataset],
    output_dir: str | os.PathLike[str],
    id_column: str | None = None,
) -> ResumeReport:
    """Run ``transform`` (e.g. one or more processors) on the rows of ``dataset`` that are not
    yet in ``output_dir`` and append their results there, one file per finished block."""
    from ray.data import ActorPoolStrategy

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for leftover in out.glob("*.tmp"):
        leftover.unlink()
    if id_column is None:
        id_column = ROW_ID_COLUMN
        dataset = dataset.map(lambda row: {**row, ROW_ID_COLUMN: content_id(row)})
    done = completed_ids(out, id_column)
    dataset = skip_done(dataset, id_column, done)
    # The writer is a long-lived actor, not a task per block: results are on disk moments
    # after the stage yields them, so a crash loses little more than the calls in flight.
    # (With write_datasink's tasks, the stage ran far ahead of the writes.)
    counts = transform(dataset).map_batches(
        PartWriter,
        fn_constructor_kwargs={"directory": str(out)},
        batch_size=None,
        batch_format="pyarrow",
        compute=ActorPoolStrategy(size=1),
        num_cpus=0.1,
    )
    written = sum(int(b["written"].sum()) for b in counts.iter_batches(batch_format="numpy"))
    return ResumeReport(already_done=len(done), written=written, output_dir=out)


class PartWriter:
    """Writes each block it receives to its own JSONL file, atomically (temp file, fsync,
    rename), and passes on only the row count."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def __call__(self, block: Any) -> dict[str, list[int]]:
        rows = block.to_pylist()
        if rows:
            self.write(rows)
        return {"written": [len(rows)]}

    def write(self, rows: list[dict[str, Any]]) -> None:
        final = Path(self.directory) / f"part-{uuid.uuid4().hex}.jsonl"
        temp = final.with_suffix(".tmp")
        with temp.open("w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row, default=_jsonable, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(temp, final)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):  # numpy arrays and scalars
        return value.tolist()
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


__all__ = [
    "ROW_ID_COLUMN",
    "PartWriter",
    "ResumeReport",
    "completed_ids",
    "content_id",
    "drop_error_rows",
    "jsonl_ids",
    "read_output",
    "run_resumable",
    "skip_done",
]
