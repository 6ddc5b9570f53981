"""The job store's tables in SQLite: their schema, the migrations that bring a store an older
relayllm wrote up to date, and the row-level steps every store call is made of (a row found
by id within its project, a file's row inserted, a batch's changes applied with the life
cycle checked). Each step runs inside the caller's transaction (``SQLiteFile.write`` or
``read``), so a call made of several stays all or nothing."""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from relayllm import bounded_json
from relayllm_service.errors import (
    IllegalTransitionError,
    NotFoundError,
    ServiceError,
)
from relayllm_service.store.database import Connection, Database
from relayllm_service.store.records import (
    STAMPS,
    TERMINAL,
    TRANSITIONS,
    BatchRecord,
    FileRecord,
    RequestCounts,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

SCHEMA_VERSION = 3
#: Schema 1; :data:`MIGRATIONS` bring a store to :data:`SCHEMA_VERSION`.
SCHEMA = """
CREATE TABLE files (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    project TEXT NOT NULL,
    filename TEXT NOT NULL,
    purpose TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    expires_at INTEGER
);
CREATE INDEX files_by_project ON files (project, seq);
CREATE TABLE batches (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    project TEXT NOT NULL,
    endpoint TEXT NOT NULL,
    input_file_id TEXT NOT NULL,
    completion_window TEXT NOT NULL,
    status TEXT NOT NULL,
    output_file_id TEXT,
    error_file_id TEXT,
    created_at INTEGER NOT NULL,
    in_progress_at INTEGER,
    expires_at INTEGER NOT NULL,
    finalizing_at INTEGER,
    completed_at INTEGER,
    failed_at INTEGER,
    expired_at INTEGER,
    cancelling_at INTEGER,
    cancelled_at INTEGER,
    total INTEGER NOT NULL DEFAULT 0,
    completed INTEGER NOT NULL DEFAULT 0,
    failed INTEGER NOT NULL DEFAULT 0,
    metadata TEXT,
    errors TEXT,
    claim INTEGER NOT NULL DEFAULT 0,
    runner TEXT,
    heartbeat_at INTEGER
);
CREATE INDEX batches_by_project ON batches (project, seq);
CREATE INDEX batches_by_status ON batches (status);
"""
#: What each schema version adds to the one before (a store written by an older relayllm
#: is brought up to date when opened).
MIGRATIONS: dict[int, str] = {
    2: "ALTER TABLE batches ADD COLUMN pending_files TEXT",
    3: "ALTER TABLE batches ADD COLUMN output_expires_s INTEGER; "
    "CREATE INDEX files_by_expiry ON files (expires_at)",
}
#: A file that has expired (``?``: now) is no file: every lookup and list leaves it out.
LIVE = "(expires_at IS NULL OR expires_at > ?)"
FILE_COLUMNS = "id, project, filename, purpose, bytes, created_at, expires_at"


def migrate(db: Connection, database: Database) -> None:
    """The tables created, or brought to :data:`SCHEMA_VERSION` (in the caller's write
    transaction: a store opened by two processes at once is migrated once); ``database``
    says where the version is kept and how each statement reads in its dialect."""
    path = database.path
    version = database.schema_version(db)
    if version > SCHEMA_VERSION:
        raise ServiceError(
            f"the job store {path!r} was written by a newer relayllm (schema "
            f"{version}, this one knows {SCHEMA_VERSION}); upgrade relayllm"
        )
    if version == 0:
        for statement in SCHEMA.split(";"):
            if statement.strip():
                db.execute(database.ddl(statement))
        version = 1
    for step in range(version + 1, SCHEMA_VERSION + 1):
        for statement in MIGRATIONS[step].split(";"):
            db.execute(database.ddl(statement))
    database.set_schema_version(db, SCHEMA_VERSION)


def file_row(db: Connection, project: str, file_id: str, now: int) -> Any:
    """A live file's row, only if ``project`` owns it (else :class:`NotFoundError`)."""
    row = db.execute(
        f"SELECT seq, {FILE_COLUMNS} FROM files WHERE id = ? AND project = ? AND {LIVE}",
        (file_id, project, now),
    ).fetchone()
    if row is None:
        raise NotFoundError(f"no file {file_id!r}")
    return row


def insert_file(db: Connection, record: FileRecord) -> None:
    db.execute(
        f"INSERT INTO files ({FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            record.id,
            record.project,
            record.filename,
            record.purpose,
            record.bytes,
            record.created_at,
            record.expires_at,
        ),
    )


def batch_row(db: Connection, batch_id: str, project: str | None) -> Any:
    """A batch's row; with ``project``, only if that project owns it (runners, which
    serve every project, pass None)."""
    if project is None:
        row = db.execute("SELECT * FROM batches WHERE id = ?", (batch_id,)).fetchone()
    else:
        row = db.execute(
            "SELECT * FROM batches WHERE id = ? AND project = ?", (batch_id, project)
        ).fetchone()
    if row is None:
        raise NotFoundError(f"no batch {batch_id!r}")
    return row


def apply_changes(db: Connection, row: Any, changes: dict[str, Any], now: int) -> None:
    """Write ``changes`` to the batch in ``row`` (inside the caller's transaction),
    checking the status change and stamping its time."""
    current = row["status"]
    new = changes.pop("status", current)
    if current in TERMINAL and (changes or new != current):
        raise IllegalTransitionError(f"batch {row['id']!r} is {current}; it cannot change any more")
    columns: dict[str, Any] = {}
    if new != current:
        if new not in TRANSITIONS[current]:
            allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing"
            raise IllegalTransitionError(
                f"batch {row['id']!r} cannot go from {current} to {new} (from {current}: {allowed})"
            )
        columns["status"] = new
        columns[STAMPS[new]] = now
    counts = changes.pop("request_counts", None)
    if counts is not None:
        columns.update(total=counts.total, completed=counts.completed, failed=counts.failed)
    columns.update(changes)
    if columns:
        assignments = ", ".join(f"{name} = ?" for name in columns)
        db.execute(f"UPDATE batches SET {assignments} WHERE id = ?", (*columns.values(), row["id"]))


def file_record(row: Any) -> FileRecord:
    record = FileRecord(*(row[name] for name in FILE_COLUMNS.split(", ")))
    filename = _renderable(record.filename, record.id, "filename")
    if filename is record.filename:
        return record
    return dataclasses.replace(record, filename=filename)


def readable(rows: Iterable[Any], record: Callable[[Any], T]) -> list[T]:
    """The records of ``rows``; a row that cannot be read as one is left out and logged (by
    id), so one damaged row never breaks a list of many (another project's, the admin's)."""
    records = []
    for row in rows:
        try:
            records.append(record(row))
        except Exception:
            logger.exception("the job store's row %r cannot be read; left out of a list", row["id"])
    return records


def _renderable(value: Any, item_id: str, field: str) -> Any:
    """``value`` with every string that cannot be encoded as UTF-8 (a lone surrogate, from a
    store an older relayllm wrote) made encodable (U+FFFD in its place), logged; ``value``
    itself when it has none."""
    if bounded_json.unencodable_path(value) is None:
        return value
    logger.warning("%s of %r holds text that is not UTF-8; shown with U+FFFD", field, item_id)

    def mend(item: Any) -> Any:
        if isinstance(item, str):
            return item.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        if isinstance(item, dict):
            return {mend(k): mend(v) for k, v in item.items()}
        if isinstance(item, list):
            return [mend(v) for v in item]
        return item

    return mend(value)


def _stored_json(row: Any, column: str) -> Any:
    text = row[column]
    return None if text is None else _renderable(json.loads(text), row["id"], column)


BATCH_FIELDS = (
    "id",
    "project",
    "endpoint",
    "input_file_id",
    "completion_window",
    "status",
    "created_at",
    "expires_at",
    "output_file_id",
    "error_file_id",
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
    "claim",
    "runner",
    "heartbeat_at",
    "output_expires_s",
)


def pending_files(row: Any) -> tuple[str, ...]:
    text = row["pending_files"]
    return tuple(json.loads(text)) if text else ()


def batch_record(row: Any) -> BatchRecord:
    return BatchRecord(
        **{name: row[name] for name in BATCH_FIELDS},
        pending_files=pending_files(row),
        request_counts=RequestCounts(row["total"], row["completed"], row["failed"]),
        metadata=_stored_json(row, "metadata"),
        errors=_stored_json(row, "errors"),
    )


__all__ = [
    "BATCH_FIELDS",
    "FILE_COLUMNS",
    "LIVE",
    "MIGRATIONS",
    "SCHEMA",
    "SCHEMA_VERSION",
    "apply_changes",
    "batch_record",
    "batch_row",
    "file_record",
    "file_row",
    "insert_file",
    "migrate",
    "pending_files",
    "readable",
]
