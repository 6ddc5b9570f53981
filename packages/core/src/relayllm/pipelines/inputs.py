"""The input: its files checked and peeked at before anything starts, then read as a Ray
Dataset."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from relayllm.errors import ConfigError
from relayllm.fit import TASK_NUM_CPUS
from relayllm.pipelines.located import not_utf8
from relayllm.pipelines.spec import EXTENSIONS

if TYPE_CHECKING:
    from ray.data import Dataset

    from relayllm.pipelines.pipeline import Pipeline


@dataclass(frozen=True)
class InputPlan:
    """The input as checked before a run: inline rows, or files with their format and their
    columns (None for remote files, checked when the dataset opens)."""

    override: str | None = None  # --input / input=: a path instead of the pipeline's input
    paths: list[str] | None = None  # None: the pipeline's inline rows
    format: str | None = None
    columns: list[str] | None = None


def check_input(pipeline: Pipeline, override: str | None = None) -> InputPlan:
    """Check the input once, before anything starts: the files exist and are readable, are
    UTF-8 where text, hold rows, and have the columns the templates read."""
    if pipeline.spec.input.rows is not None and not override:
        return InputPlan()  # checked when the file was loaded
    paths = pipeline.input_paths(override)
    fmt = pipeline.input_format(paths)
    columns = peek_columns(paths, fmt)
    if columns == []:
        empty = f"{', '.join(paths)} has no rows (an empty file?): nothing to run"
        if override:
            raise ConfigError(f"--input: {empty}")
        raise pipeline.error(("input", "path"), empty)
    if columns is not None:
        pipeline.check_columns(columns)
    return InputPlan(override, paths, fmt, columns)


def peek_columns(paths: list[str], fmt: str, sample: int = 100) -> list[str] | None:
    """The columns of local input files, read from their first rows (None for remote ones).
    A file that is not UTF-8 text fails here, naming it, before anything starts."""
    files = _local_files(paths, fmt)
    if files is None:
        return None
    if not files:
        return []
    try:
        return _columns_of_file(files[0], fmt, sample)
    except UnicodeDecodeError as exc:
        raise not_utf8(files[0], exc) from None


def _columns_of_file(first: str, fmt: str, sample: int) -> list[str]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return list(pq.read_schema(first).names)
    if fmt == "csv":
        import csv

        with open(first, newline="", encoding="utf-8") as handle:
            return next(csv.reader(handle), [])
    columns: dict[str, None] = {}
    with open(first, encoding="utf-8") as handle:
        if fmt == "json":
            rows = json.load(handle)
            rows = rows if isinstance(rows, list) else [rows]
            return columns_of_rows([r for r in rows[:sample] if isinstance(r, dict)])
        for n, line in enumerate(handle):
            if n >= sample:
                break
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{first}:{n + 1}: not valid JSON: {exc.msg}") from None
                if isinstance(row, dict):
                    columns.update(dict.fromkeys(row))
    return list(columns)


def count_rows(pipeline: Pipeline, plan: InputPlan, limit: int | None = None) -> int | None:
    """The number of input rows when it is cheap to know (inline rows, local JSON-lines and
    Parquet files), for the progress display's totals; None otherwise."""
    count: int | None = None
    if plan.paths is None:
        count = len(pipeline.spec.input.rows or [])
    elif plan.format in ("jsonl", "parquet"):
        files = _local_files(plan.paths, plan.format)
        if files is not None:
            count = 0
            for path in files:
                if plan.format == "parquet":
                    import pyarrow.parquet as pq

                    count += pq.read_metadata(path).num_rows
                else:
                    with open(path, "rb") as handle:
                        count += sum(1 for line in handle if line.strip())
    if limit is not None and count is not None:
        count = min(count, limit)
    return count


def _local_files(paths: list[str], fmt: str) -> list[str] | None:
    files: list[str] = []
    for path in paths:
        if "://" in path:
            return None
        if os.path.isdir(path):
            files += [
                os.path.join(path, n)
                for n in sorted(os.listdir(path))
                if EXTENSIONS.get(Path(n).suffix.lower()) == fmt
            ]
        else:
            files.append(path)
    return files


def open_dataset(
    pipeline: Pipeline,
    input_override: str | None = None,
    limit: int | None = None,
    *,
    plan: InputPlan | None = None,
) -> Dataset:
    """The input as a Ray Dataset; ``plan`` is :func:`check_input`'s (checked here without)."""
    import ray

    from relayllm.data_context import keep_input_order
    from relayllm.pipelines.transforms import in_blocks, input_block_rows

    plan = plan or check_input(pipeline, input_override)
    # Rows come out in input order. Set before the dataset exists: a dataset keeps the context
    # it was created with, and a read of small tasks otherwise finishes blocks out of order.
    keep_input_order()
    # Output is written block by block (transforms.input_block_rows): an input whose size is known
    # is split into blocks by its reader; any other is cut by a repartition.
    total = count_rows(pipeline, plan, None)
    # Rounded down: a block smaller than the stage's Ray Data batch would be bundled with its
    # neighbours into one task, and their rows would reach the output together.
    blocks = None if total is None else max(1, total // input_block_rows(pipeline, total))
    dataset: Dataset
    if plan.paths is None or plan.format is None:
        dataset = ray.data.from_items(pipeline.spec.input.rows or [], override_num_blocks=blocks)
    else:
        reader = {
            "jsonl": ray.data.read_json,
            "json": ray.data.read_json,
            "csv": ray.data.read_csv,
            "parquet": ray.data.read_parquet,
        }[plan.format]
        # A read asks one whole CPU by default: next to an engine replica and the stage
        # actors on a small machine it may never be scheduled (relayllm.fit).
        paths = plan.paths
        dataset = reader(
            paths if len(paths) > 1 else paths[0],
            num_cpus=TASK_NUM_CPUS,
            override_num_blocks=blocks,
        )
        if plan.columns is None:  # remote files: their columns are known now
            pipeline.check_columns(list(dataset.schema().names))
    if total is None:
        dataset = in_blocks(pipeline, dataset)
    if limit is not None:
        dataset = dataset.limit(limit)
    return dataset


def columns_of_rows(rows: list[dict[str, Any]]) -> list[str]:
    columns: dict[str, None] = {}
    for row in rows:
        columns.update(dict.fromkeys(row))
    return list(columns)
