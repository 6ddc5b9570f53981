"""Where a pipeline run writes rows: one file (jsonl, json, csv, parquet) or stdout."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from relayllm.errors import ConfigError
from relayllm.pipelines.spec import EXTENSIONS

if TYPE_CHECKING:
    from relayllm.pipelines.pipeline import Pipeline


@dataclass(frozen=True)
class OutputTarget:
    """An output file: its path (relative to the current directory), format and the columns
    it keeps (None: all)."""

    path: str
    format: str
    columns: list[str] | None = None


def output_target(pipeline: Pipeline, output: str | None) -> OutputTarget | None:
    """Where rows go: ``output`` (a path; ``-``: stdout), else the pipeline's ``output:``
    block; None means stdout."""
    spec = pipeline.spec.output
    if output == "-" or (output is None and spec is None):
        return None
    # Relative to the current directory, like --output (input paths are relative to the
    # pipeline file: they are its data; outputs belong to whoever runs it).
    if output:
        path, fmt = output, output_format(output, None)
    else:
        assert spec is not None  # checked above
        path, fmt = spec.path, output_format(spec.path, spec.format)
    return OutputTarget(path, fmt, spec.columns if spec else None)


def open_writer(target: OutputTarget, append: bool = False) -> RowWriter:
    """The target's writer, created now so an unwritable path fails before any engine
    starts; ``append`` (jsonl) keeps what a stopped run wrote there."""
    try:
        return RowWriter(target.path, target.format, target.columns, append=append)
    except OSError as exc:
        raise ConfigError(f"cannot write the output {target.path}: {exc.strerror or exc}") from None


def output_format(path: str, fmt: str | None) -> str:
    if fmt:
        return fmt
    found = EXTENSIONS.get(Path(path).suffix.lower())
    if not found:
        raise ConfigError(
            f"cannot tell the output format of {path!r}; use .jsonl, .json, .csv or .parquet"
        )
    return found


class RowWriter:
    """Writes blocks of rows to one file, as they arrive (jsonl, json, csv or parquet)."""

    def __init__(
        self, path: str, fmt: str, columns: list[str] | None = None, append: bool = False
    ) -> None:
        """``append`` (jsonl only: the callers check) adds to an existing file, for --resume."""
        self.path, self.fmt, self.columns = path, fmt, columns
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        mode = "a" if append else "w"
        # Held open across blocks and closed by close(): the run owns the writer's lifetime.
        self._file: IO[str] | None = (
            None if fmt == "parquet" else open(path, mode, encoding="utf-8", newline="")  # noqa: SIM115
        )
        self._parquet: Any = None  # a pyarrow.parquet.ParquetWriter, made by the first block
        self._csv: Any = None  # a csv.DictWriter, made by the first block
        self._count = 0
        if fmt == "json":
            self._text().write("[")

    def __call__(self, rows: list[dict[str, Any]]) -> None:
        if self.columns:
            rows = [{c: row.get(c) for c in self.columns} for row in rows]
        if self.fmt == "parquet":
            self._write_parquet(rows)
        elif self.fmt == "csv":
            self._write_csv(rows)
        else:
            for row in rows:
                text = json.dumps(row, ensure_ascii=False, default=str)
                if self.fmt == "json":
                    text = ("\n" if self._count == 0 else ",\n") + text
                else:
                    text += "\n"
                self._text().write(text)
                self._count += 1
            # Each block reaches the disk as it finishes: a killed run keeps what it did.
            self._text().flush()

    def _text(self) -> IO[str]:
        assert self._file is not None, "text formats hold a file open"
        return self._file

    def _write_csv(self, rows: list[dict[str, Any]]) -> None:
        import csv

        if not rows:
            return
        if self._csv is None:
            fields = list(rows[0])
            self._csv = csv.DictWriter(self._text(), fieldnames=fields, extrasaction="ignore")
            self._csv.writeheader()
        for row in rows:
            self._csv.writerow(
                {
                    k: json.dumps(v, ensure_ascii=False) if isinstance(v, (dict, list)) else v
                    for k, v in row.items()
                }
            )

    def _write_parquet(self, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not rows:
            return
        table = pa.Table.from_pylist(rows)
        if self._parquet is None:
            # A column that is all null in the first block ('error' usually) is text later.
            self._schema = pa.schema(
                [f.with_type(pa.string()) if pa.types.is_null(f.type) else f for f in table.schema]
            )
            table = table.cast(self._schema)
            self._parquet = pq.ParquetWriter(self.path, table.schema)
        else:  # later blocks may type a column differently (e.g. all nulls): use the first's
            table = table.select(self._schema.names).cast(self._schema)
        self._parquet.write_table(table)

    def close(self) -> None:
        if self._parquet is not None:
            self._parquet.close()
        if self._file is not None:
            if self.fmt == "json":
                self._file.write("\n]\n")
            self._file.close()


def stdout_sink(rows: list[dict[str, Any]]) -> None:
    for row in rows:
        sys.stdout.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()
