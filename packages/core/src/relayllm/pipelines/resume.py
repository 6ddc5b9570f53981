"""Resuming a stopped or killed run: keep the rows already in its JSONL output, run the rest.

A run writes every finished block to the output and flushes it (``RowWriter``), so a killed
run leaves whole rows plus at most one line cut short. A resumed run (``resume=True``,
``relayllm run --resume``) trims that line, reads the ids of the rows there, skips those input
rows and appends the others.

One id policy (:class:`RowIds`): a row is identified by ``input.id_column`` when the pipeline
sets one; otherwise by a hash of its input columns' values (:func:`content_id`), read back from
the output, which then must keep every input column. Ids must be unique in the input: rows with
identical content share a content id, so only one of them would run.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayllm.errors import ConfigError

if TYPE_CHECKING:
    from ray.data import Dataset

    from relayllm.pipelines.inputs import InputPlan
    from relayllm.pipelines.outputs import OutputTarget
    from relayllm.pipelines.pipeline import Pipeline


def content_id(row: dict[str, Any]) -> str:
    """A stable id for a row: sha256 of its canonical JSON, 24 hex digits. A value JSON cannot
    hold is hashed as its text, as the output writes it, so the id survives the round trip."""
    text = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class RowIds:
    """How a row is known in the input and in the output: its ``id_column``, or without one
    the :func:`content_id` of its input ``columns``."""

    id_column: str | None
    columns: tuple[str, ...] = ()

    def needs(self) -> list[str]:
        """The columns an output row must hold to be identified."""
        return [self.id_column] if self.id_column else list(self.columns)

    def of(self, row: dict[str, Any]) -> Any:
        if self.id_column:
            return row[self.id_column]
        return content_id({c: row.get(c) for c in self.columns})


def row_ids(pipeline: Pipeline, plan: InputPlan) -> RowIds:
    """The pipeline's id policy, or a ConfigError that says what to set."""
    id_column = pipeline.spec.input.id_column
    if id_column:
        return RowIds(id_column)
    columns: list[str] | None = plan.columns
    if plan.paths is None:
        from relayllm.pipelines.inputs import columns_of_rows

        columns = columns_of_rows(pipeline.spec.input.rows or [])
    if columns is None:
        raise ConfigError(
            "--resume on remote input files needs input.id_column in the pipeline: the column "
            "that identifies a row in the input and in the output"
        )
    rewritten = sorted({s.output_column for s in pipeline.spec.steps} & set(columns))
    if rewritten:
        raise ConfigError(
            f"--resume without input.id_column identifies a row by its input columns, but a "
            f"step writes over {', '.join(rewritten)}: set input.id_column in the pipeline"
        )
    return RowIds(None, tuple(columns))


def prepare(
    pipeline: Pipeline, plan: InputPlan, target: OutputTarget | None, retry_errors: bool
) -> tuple[RowIds, set[Any]]:
    """Check that the output can be resumed and read the ids of the rows already there (with
    ``retry_errors``, rows recorded with an error are removed from it first)."""
    if target is None:
        raise ConfigError("--resume needs an output file (not stdout) to resume")
    if target.format != "jsonl":
        raise ConfigError(f"--resume appends to a .jsonl output; {target.path} is {target.format}")
    ids = row_ids(pipeline, plan)
    if target.columns:
        missing = [c for c in ids.needs() if c not in target.columns]
        if ids.id_column and missing:
            raise ConfigError(f"--resume needs the id column {ids.id_column!r} in output.columns")
        if missing:
            raise ConfigError(
                f"--resume without input.id_column needs every input column in output.columns "
                f"(missing: {', '.join(missing)}), or set input.id_column"
            )
        if retry_errors and "error" not in target.columns:
            raise ConfigError("--retry-errors needs the 'error' column in output.columns")
    done = jsonl_ids(target.path, ids)  # first: it also trims a line cut short by a kill
    if retry_errors:
        drop_error_rows(target.path)
        done = jsonl_ids(target.path, ids)
    return ids, done


def jsonl_ids(path: str | os.PathLike[str], ids: RowIds) -> set[Any]:
    """Ids of the rows of a JSONL output file that a killed run left behind. A last line cut
    short by the kill is removed from the file, so appending to it stays valid JSONL."""
    done: set[Any] = set()
    read_jsonl_ids(path, ids, done.add)
    return done


def read_jsonl_ids(path: str | os.PathLike[str], ids: RowIds, add: Callable[[Any], None]) -> None:
    """:func:`jsonl_ids`, each id given to ``add`` (one call a row) instead of kept in a set."""
    if not Path(path).exists():
        return
    with open(path, "r+b") as lines:
        whole = 0  # bytes of complete lines so far
        for number, line in enumerate(lines, 1):
            if not line.endswith(b"\n"):
                lines.truncate(whole)
                break
            whole += len(line)
            _add_id(add, line, ids, path, number)


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


def _add_id(add: Callable[[Any], None], line: bytes, ids: RowIds, path: Any, number: int) -> None:
    if not line.strip():
        return
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{path}, line {number}: not JSON ({exc.msg}), so the run cannot resume it"
        ) from None
    missing = [c for c in ids.needs() if not isinstance(row, dict) or c not in row]
    if missing:
        raise ConfigError(
            f"{path}, line {number}: no {missing[0]!r} column, so the run cannot resume it"
        )
    add(ids.of(row))


def skip_done(dataset: Dataset, ids: RowIds, done: set[Any]) -> Dataset:
    """``dataset`` without the rows whose id is in ``done``."""
    if not done:
        return dataset
    import pyarrow as pa
    import pyarrow.compute as pc

    from relayllm.fit import TASK_NUM_CPUS

    if ids.id_column:
        column = ids.id_column
        done_ids = pa.array(sorted(done, key=str))

        def missing(batch: pa.Table) -> pa.Table:
            return batch.filter(pc.invert(pc.is_in(batch[column], value_set=done_ids)))

    else:

        def missing(batch: pa.Table) -> pa.Table:
            rows = batch.select(list(ids.columns)).to_pylist()
            return batch.filter(pa.array([ids.of(row) not in done for row in rows]))

    return dataset.map_batches(
        missing, batch_format="pyarrow", zero_copy_batch=True, num_cpus=TASK_NUM_CPUS
    )


__all__ = [
    "RowIds",
    "content_id",
    "drop_error_rows",
    "jsonl_ids",
    "read_jsonl_ids",
    "prepare",
    "row_ids",
    "skip_done",
]
