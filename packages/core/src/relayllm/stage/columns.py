"""A Ray Data batch as the stage reads and writes it: the inputs of its rows (through the
processor's ``preprocess``, or straight from the Arrow columns) and its output columns
(through ``postprocess``, or set on the Arrow table, the input columns passing untouched)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from relayllm.config import RowFn
from relayllm.rows import (
    MODEL_COLUMN,
    REQUEST_ID,
    SAMPLING_PARAMS_COLUMN,
    Result,
    Task,
    output_fields,
)


@dataclass
class Inputs:
    """What the stage reads of each row of a batch, column by column."""

    #: The rows after ``preprocess`` (None without one: the batch's columns are read).
    rows: list[dict[str, Any]] | None
    values: list[Any]
    extras: dict[str, list[Any]]
    sampling_params: list[Any]
    models: list[Any]


def read_inputs(
    batch: pa.Table, preprocess: RowFn | None, input_column: str, extra_columns: Sequence[str]
) -> Inputs:
    if preprocess is not None:
        rows = [preprocess(row) for row in batch.to_pylist()]
        return Inputs(
            rows,
            [row.get(input_column) for row in rows],
            {c: [row.get(c) for row in rows] for c in extra_columns},
            [row.get(SAMPLING_PARAMS_COLUMN) for row in rows],
            [row.get(MODEL_COLUMN) for row in rows],
        )
    n = batch.num_rows
    return Inputs(
        None,
        column(batch, input_column, n),
        {c: column(batch, c, n) for c in extra_columns},
        column(batch, SAMPLING_PARAMS_COLUMN, n),
        column(batch, MODEL_COLUMN, n),
    )


def column(batch: pa.Table, name: str, n: int) -> list[Any]:
    if name not in batch.column_names:
        return [None] * n
    return batch.column(name).to_pylist()


def postprocessed(
    rows: list[dict[str, Any]], results: list[Result], ids: list[str], task: Task, fn: RowFn
) -> pa.Table:
    """Each row with the task's output fields set, through the user's ``postprocess``."""
    fields = [field.name for field in output_fields(task)]
    out = []
    for row, result, request_id in zip(rows, results, ids, strict=True):
        for name in fields:
            row[name] = request_id if name == REQUEST_ID else result.get(name)
        out.append(fn(row))
    return pa.Table.from_pylist(out)


def with_outputs(batch: pa.Table, results: list[Result], ids: list[str], task: Task) -> pa.Table:
    """The batch with the task's output columns (rows.OUTPUT_SCHEMA) set or replaced."""
    for field in output_fields(task):
        values = ids if field.name == REQUEST_ID else [r.get(field.name) for r in results]
        array = pa.array(values, field.arrow_type())
        index = batch.schema.get_field_index(field.name)
        if index >= 0:
            batch = batch.set_column(index, field.name, array)
        else:
            batch = batch.append_column(field.name, array)
    return batch


__all__ = ["Inputs", "column", "postprocessed", "read_inputs", "with_outputs"]
