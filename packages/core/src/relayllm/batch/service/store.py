"""The durable job store: files' metadata and batches, each owned by a project, and the runners'
claims on batches.

One small interface (:class:`JobStore`) so a server database can replace SQLite later; one
implementation (:class:`SQLiteJobStore`), a file on the head node's local disk in WAL mode
(readers never wait for the writer; several processes share it). Every row belongs to a
project, and every lookup a client's request makes takes the project: another project's id
answers :class:`NotFoundError`, exactly as an id that does not exist.

Statuses follow OpenAI's life cycle (:data:`TRANSITIONS`); a change the cycle does not allow
raises, and each change stamps its ``*_at`` time. A runner **claims** a batch before it runs
it: :meth:`JobStore.claim` increments a number stored with the batch and returns it, and every
write the runner makes afterwards (status, counts, its output files) carries that number and is
refused with :class:`StaleClaimError`, nothing written, once a newer claim exists. A runner
that was presumed dead and comes back can therefore never overwrite the work of the one that
replaced it. Check and write happen in one ``BEGIN IMMEDIATE`` transaction, which holds
SQLite's write lock across processes.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

from relayllm.batch.service.errors import (
    ClaimHeldError,
    IllegalTransitionError,
    InvalidRequestError,
    NotFoundError,
    ServiceError,
    StaleClaimError,
)
from relayllm.batch.service.ids import is_file_id, new_batch_id, new_file_id
from relayllm.batch.service.sqlite_file import SQLiteFile

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
#: Where each status may go next (OpenAI's batch life cycle).
TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling", "expired"}),
    "in_progress": frozenset({"finalizing", "failed", "cancelling", "expired"}),
    "finalizing": frozenset({"completed", "failed"}),
    "cancelling": frozenset({"cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "expired": frozenset(),
    "cancelled": frozenset(),
}
TERMINAL = frozenset(s for s, after in TRANSITIONS.items() if not after)
#: The time a status change stamps.
STAMPS: dict[str, str] = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}
#: The completion windows a client may ask for, in seconds (OpenAI accepts only 24h). The
#: server may enforce a shorter one (``window_s``), for tests.
COMPLETION_WINDOWS = {"24h": 24 * 3600}
#: OpenAI's metadata limits: pairs, key length, value length.
METADATA_LIMITS = (16, 64, 512)
FILE_PURPOSES = frozenset({"batch", "batch_output"})

T = TypeVar("T")


@dataclass(frozen=True)
class FileRecord:
    id: str
    project: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchRecord:
    """A batch's row: OpenAI's Batch fields, its project, and the current runner claim."""

    id: str
    project: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: Status
    created_at: int
    expires_at: int
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    #: OpenAI's ``errors.data`` entries (``code``, ``message``, ``param``, ``line``).
    errors: list[dict[str, Any]] | None = None
    claim: int = 0  # the latest claim's number; 0: never claimed
    runner: str | None = None  # who holds it
    heartbeat_at: int | None = None  # the claim's holder's last write
    #: File ids a runner reserved for the batch's output and error files before it wrote
    #: their bytes (:meth:`SQLiteJobStore.reserve_files`): what a killed finish may have left.
    pending_files: tuple[str, ...] = ()
    #: Seconds its output and error files are kept after they are written (None: kept).
    output_expires_s: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, newest first unless asked otherwise; ``has_more``: a next page."""

    data: list[T]
    has_more: bool


class JobStore(Protocol):
    """What the gateway and the runners need of a store. Project-scoped calls answer
    :class:`NotFoundError` for another project's ids; runner calls (``claim``, ``update``,
    ``add_batch_file``) are fenced by the claim number."""

    # files (the bytes live in files.FileStorage)
    def add_file(
        self,
        project: str,
        *,
        filename: str,
        purpose: str,
        bytes: int,
        file_id: str | None = None,
        expires_s: int | None = None,
    ) -> FileRecord: ...
    def get_file(self, project: str, file_id: str) -> FileRecord: ...
    def list_files(
        self,
        project: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> Page[FileRecord]: ...
    def delete_file(self, project: str, file_id: str) -> FileRecord: ...

    # batches, as a client asks
    def create_batch(
        self,
        project: str,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
        window_s: int | None = None,
        output_expires_s: int | None = None,
    ) -> BatchRecord: ...
    def get_batch(self, project: str, batch_id: str) -> BatchRecord: ...
    def list_batches(
        self, project: str, *, after: str | None = None, limit: int = 20
    ) -> Page[BatchRecord]: ...
    def cancel_batch(self, project: str, batch_id: str) -> BatchRecord: ...

    # batches, as a runner works on them
    def unfinished(self) -> list[BatchRecord]: ...
    def claim(self, batch_id: str, runner: str, lease_s: float | None = None) -> int: ...
    def update(
        self,
        batch_id: str,
        claim: int,
        *,
        status: Status | None = None,
        request_counts: RequestCounts | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> BatchRecord: ...
    def add_batch_file(
        self,
        batch_id: str,
        claim: int,
        *,
        filename: str,
        purpose: str,
        bytes: int,
        file_id: str | None = None,
    ) -> FileRecord: ...
    def reserve_files(self, batch_id: str, claim: int, file_ids: list[str]) -> tuple[str, ...]: ...
    def remove_expired_files(self, limit: int = 1000) -> list[str]: ...
    def finish_batch(
        self,
        batch_id: str,
        claim: int,
        *,
        status: Status,
        request_counts: RequestCounts,
        files: Mapping[str, tuple[str, int]],
        errors: list[dict[str, Any]] | None = None,
    ) -> BatchRecord: ...

    def close(self) -> None: ...


_SCHEMA_VERSION = 3
#: Schema 1; :data:`_MIGRATIONS` bring a store to :data:`_SCHEMA_VERSION`.
_SCHEMA = """
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
_MIGRATIONS: dict[int, str] = {
    2: "ALTER TABLE batches ADD COLUMN pending_files TEXT",
    3: "ALTER TABLE batches ADD COLUMN output_expires_s INTEGER; "
    "CREATE INDEX files_by_expiry ON files (expires_at)",
}
#: A file that has expired (``?``: now) is no file: every lookup and list leaves it out.
_LIVE = "(expires_at IS NULL OR expires_at > ?)"
_FILE_COLUMNS = "id, project, filename, purpose, bytes, created_at, expires_at"


class SQLiteJobStore(SQLiteFile):
    """:class:`JobStore` in one SQLite file (WAL mode, synchronous=FULL: a committed write
    survives a process kill and a power cut). Safe to share between threads (one connection
    behind a lock) and between processes (SQLite's locks; a writer waits up to ``timeout_s``).
    """

    #: Asked in the write transaction of an upload's or a new batch's record before it is
    #: written (quotas.py); what it raises refuses the request, nothing written.
    admit: Callable[[sqlite3.Connection, FileRecord | BatchRecord], None] | None = None

    def __init__(
        self, path: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
    ) -> None:
        super().__init__(path, clock=clock, timeout_s=timeout_s)
        try:
            self._migrate()
        except BaseException:
            self._db.close()
            raise

    def _migrate(self) -> None:
        with self.write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > _SCHEMA_VERSION:
                raise ServiceError(
                    f"the job store {self.path!r} was written by a newer relayllm (schema "
                    f"{version}, this one knows {_SCHEMA_VERSION}); upgrade relayllm"
                )
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                version = 1
            for step in range(version + 1, _SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step].split(";"):
                    db.execute(statement)
            db.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")

    def __repr__(self) -> str:
        return f"SQLiteJobStore({self.path!r})"

    # -- files -------------------------------------------------------------------------

    def add_file(
        self,
        project: str,
        *,
        filename: str,
        purpose: str,
        bytes: int,
        file_id: str | None = None,
        expires_s: int | None = None,
    ) -> FileRecord:
        """A file's record; with ``expires_s`` it expires that many seconds after its
        creation (OpenAI's ``expires_after`` anchored at ``created_at``): from then on it
        answers 404 like a deleted file, and :meth:`remove_expired_files` hands its id over
        for its bytes to be deleted."""
        if purpose not in FILE_PURPOSES:
            raise InvalidRequestError(
                f"purpose {purpose!r} is not supported; use one of {sorted(FILE_PURPOSES)}",
                "purpose",
            )
        if file_id is not None and not is_file_id(file_id):
            raise InvalidRequestError(f"{file_id!r} is not a file id", "file_id")
        now = self.now()
        expires_at = None if expires_s is None else now + int(expires_s)
        record = FileRecord(
            file_id or new_file_id(), project, filename, purpose, int(bytes), now, expires_at
        )
        with self.write() as db:
            if self.admit is not None:
                self.admit(db, record)
            self._insert_file(db, record)
        return record

    def _insert_file(self, db: sqlite3.Connection, record: FileRecord) -> None:
        db.execute(
            f"INSERT INTO files ({_FILE_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?)",
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

    def _file_row(self, db: sqlite3.Connection, project: str, file_id: str) -> sqlite3.Row:
        row = db.execute(
            f"SELECT seq, {_FILE_COLUMNS} FROM files WHERE id = ? AND project = ? AND {_LIVE}",
            (file_id, project, self.now()),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no file {file_id!r}")
        return row

    def get_file(self, project: str, file_id: str) -> FileRecord:
        with self.read() as db:
            return _file(self._file_row(db, project, file_id))

    def list_files(
        self,
        project: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> Page[FileRecord]:
        _check_limit(limit, 10000)
        if order not in ("asc", "desc"):
            raise InvalidRequestError(f"order must be 'asc' or 'desc', got {order!r}", "order")
        where, args = ["project = ?", _LIVE], [project, self.now()]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        with self.read() as db:
            if after is not None:
                where.append("seq < ?" if order == "desc" else "seq > ?")
                args.append(self._file_row(db, project, after)["seq"])
            rows = db.execute(
                f"SELECT {_FILE_COLUMNS} FROM files WHERE {' AND '.join(where)} "
                f"ORDER BY seq {order.upper()} "
                f"LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return Page([_file(r) for r in rows[:limit]], len(rows) > limit)

    def delete_file(self, project: str, file_id: str) -> FileRecord:
        """The record, deleted; the caller deletes the bytes after (a crash between leaves
        bytes no record names, never a record whose bytes are gone)."""
        with self.write() as db:
            record = _file(self._file_row(db, project, file_id))
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return record

    # -- batches, as a client asks -------------------------------------------------------

    def create_batch(
        self,
        project: str,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
        window_s: int | None = None,
        output_expires_s: int | None = None,
    ) -> BatchRecord:
        """A batch in ``validating``, expiring ``window_s`` (default: the completion window)
        after its creation. The input file must be this project's, uploaded for ``batch``.
        ``output_expires_s``: its output and error files expire that long after they are
        written (OpenAI's ``output_expires_after``); None: kept until deleted."""
        window = COMPLETION_WINDOWS.get(completion_window)
        if window is None:
            raise InvalidRequestError(
                f"completion_window {completion_window!r} is not supported; use "
                f"{' or '.join(map(repr, COMPLETION_WINDOWS))}",
                "completion_window",
            )
        meta = _check_metadata(metadata)
        now = self.now()
        with self.write() as db:
            source = _file(self._file_row(db, project, input_file_id))
            if source.purpose != "batch":
                raise InvalidRequestError(
                    f"file {input_file_id!r} was uploaded for {source.purpose!r}, not 'batch'",
                    "input_file_id",
                )
            record = BatchRecord(
                id=new_batch_id(),
                project=project,
                endpoint=endpoint,
                input_file_id=input_file_id,
                completion_window=completion_window,
                status="validating",
                created_at=now,
                expires_at=now + (window if window_s is None else int(window_s)),
                metadata=meta,
                output_expires_s=output_expires_s,
            )
            if self.admit is not None:
                self.admit(db, record)
            db.execute(
                "INSERT INTO batches (id, project, endpoint, input_file_id, completion_window, "
                "status, created_at, expires_at, metadata, output_expires_s) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    record.id,
                    project,
                    endpoint,
                    input_file_id,
                    completion_window,
                    record.status,
                    now,
                    record.expires_at,
                    None if meta is None else json.dumps(meta),
                    output_expires_s,
                ),
            )
        return record

    def _batch_row(self, db: sqlite3.Connection, batch_id: str, project: str | None) -> sqlite3.Row:
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

    def get_batch(self, project: str, batch_id: str) -> BatchRecord:
        with self.read() as db:
            return _batch(self._batch_row(db, batch_id, project))

    def list_batches(
        self, project: str, *, after: str | None = None, limit: int = 20
    ) -> Page[BatchRecord]:
        """Newest first, as OpenAI lists; ``after``: the last id of the previous page."""
        _check_limit(limit, 100)
        with self.read() as db:
            before = self._batch_row(db, after, project)["seq"] if after is not None else 1 << 62
            rows = db.execute(
                "SELECT * FROM batches WHERE project = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (project, before, limit + 1),
            ).fetchall()
        return Page([_batch(r) for r in rows[:limit]], len(rows) > limit)

    def cancel_batch(self, project: str, batch_id: str) -> BatchRecord:
        """``cancelling`` (the runner moves it to ``cancelled`` once its lines in flight are
        written); asking again while it cancels, or once cancelled, answers the batch as is."""
        with self.write() as db:
            row = self._batch_row(db, batch_id, project)
            if row["status"] in ("cancelling", "cancelled"):
                return _batch(row)
            self._apply(db, row, {"status": "cancelling"})
            return _batch(self._batch_row(db, batch_id, project))

    # -- batches, as a runner works on them ---------------------------------------------

    def unfinished(self) -> list[BatchRecord]:
        """Every batch not in a final status, oldest first: what runners must (re)claim after
        a restart."""
        marks = ", ".join("?" * len(TERMINAL))
        with self.read() as db:
            rows = db.execute(
                f"SELECT * FROM batches WHERE status NOT IN ({marks}) ORDER BY seq",
                tuple(sorted(TERMINAL)),
            ).fetchall()
        return [_batch(r) for r in rows]

    def claim(self, batch_id: str, runner: str, lease_s: float | None = None) -> int:
        """A new claim on the batch for ``runner``: the returned number fences every later
        write, and every write made with an older number is refused from now on. With
        ``lease_s``, refused (:class:`ClaimHeldError`) while another runner holds the batch
        and wrote (``heartbeat_at``) less than ``lease_s`` ago: two live runners never take
        a batch from each other; a dead one's batches are taken once its lease ran out."""
        with self.write() as db:
            row = self._batch_row(db, batch_id, None)
            if row["status"] in TERMINAL:
                raise IllegalTransitionError(
                    f"batch {batch_id!r} is {row['status']}; there is nothing to run"
                )
            beat = row["heartbeat_at"]
            if (
                lease_s is not None
                and row["runner"] is not None
                and row["runner"] != runner
                and beat is not None
                and self.now() - int(beat) < lease_s
            ):
                raise ClaimHeldError(
                    f"batch {batch_id!r} is held by {row['runner']!r}, alive "
                    f"{self.now() - int(beat)}s ago"
                )
            number = int(row["claim"]) + 1
            db.execute(
                "UPDATE batches SET claim = ?, runner = ?, heartbeat_at = ? WHERE id = ?",
                (number, runner, self.now(), batch_id),
            )
        return number

    def _check_claim(self, row: sqlite3.Row, claim: int) -> None:
        if int(row["claim"]) != claim:
            raise StaleClaimError(
                f"claim {claim} on batch {row['id']!r} is not the current one "
                f"({row['claim']}, held by {row['runner']!r}); nothing was written"
            )

    def update(
        self,
        batch_id: str,
        claim: int,
        *,
        status: Status | None = None,
        request_counts: RequestCounts | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> BatchRecord:
        """A runner's write, all or nothing: refused (:class:`StaleClaimError`) unless
        ``claim`` is the batch's current claim, and (:class:`IllegalTransitionError`) for a
        status change the life cycle does not allow or any write to a finished batch. A call
        with nothing to change records that the runner is alive (``heartbeat_at``)."""
        changes: dict[str, Any] = {}
        if status is not None:
            changes["status"] = status
        if request_counts is not None:
            changes["request_counts"] = _check_counts(request_counts)
        if errors is not None:
            changes["errors"] = json.dumps(errors)
        with self.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            for column, file_id in (
                ("output_file_id", output_file_id),
                ("error_file_id", error_file_id),
            ):
                if file_id is not None:
                    self._file_row(db, row["project"], file_id)  # the batch's project's file
                    changes[column] = file_id
            self._apply(db, row, changes)
            db.execute(
                "UPDATE batches SET heartbeat_at = ? WHERE id = ? AND claim = ?",
                (self.now(), batch_id, claim),
            )
            return _batch(self._batch_row(db, batch_id, None))

    def add_batch_file(
        self,
        batch_id: str,
        claim: int,
        *,
        filename: str,
        purpose: str,
        bytes: int,
        file_id: str | None = None,
    ) -> FileRecord:
        """A file a runner produced (output, errors), in the batch's project; refused like
        :meth:`update` for a stale claim, so a replaced runner leaves no file behind.
        ``file_id``: the id its bytes were already stored under (bytes first, then the
        record: a crash between leaves orphan bytes, never a record without them)."""
        if purpose not in FILE_PURPOSES:
            raise InvalidRequestError(f"purpose {purpose!r} is not supported", "purpose")
        if file_id is not None and not is_file_id(file_id):
            raise InvalidRequestError(f"{file_id!r} is not a file id", "file_id")
        with self.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            record = FileRecord(
                file_id or new_file_id(), row["project"], filename, purpose, int(bytes), self.now()
            )
            self._insert_file(db, record)
        return record

    def reserve_files(self, batch_id: str, claim: int, file_ids: list[str]) -> tuple[str, ...]:
        """Record the ids a runner is about to write the batch's output and error bytes
        under (fenced like :meth:`update`), before it writes them; returns the ids an earlier
        claim reserved and never published (a finish killed between its bytes and
        :meth:`finish_batch`), whose bytes the caller deletes."""
        for file_id in file_ids:
            if not is_file_id(file_id):
                raise InvalidRequestError(f"{file_id!r} is not a file id", "file_id")
        with self.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            if row["status"] in TERMINAL:
                raise IllegalTransitionError(
                    f"batch {batch_id!r} is {row['status']}; it cannot change any more"
                )
            earlier = _pending(row)
            db.execute(
                "UPDATE batches SET pending_files = ?, heartbeat_at = ? WHERE id = ?",
                (json.dumps(file_ids), self.now(), batch_id),
            )
        return tuple(f for f in earlier if f not in file_ids)

    def finish_batch(
        self,
        batch_id: str,
        claim: int,
        *,
        status: Status,
        request_counts: RequestCounts,
        files: Mapping[str, tuple[str, int]],
        errors: list[dict[str, Any]] | None = None,
    ) -> BatchRecord:
        """A batch's end in one transaction: its output and error files recorded (``files``:
        ``"output"`` / ``"error"`` -> (a reserved file id whose bytes are stored, size)), its
        final status, counts and ``errors``. All or nothing, fenced by the claim: a runner
        killed before this published nothing (its reserved ids say which bytes to delete),
        and one killed after it has nothing left to do, so no file is published twice."""
        unknown = sorted(set(files) - {"output", "error"})
        if unknown:
            raise ValueError(f"files are 'output' and 'error', got {unknown}")
        with self.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            reserved = _pending(row)
            changes: dict[str, Any] = {
                "status": status,
                "request_counts": _check_counts(request_counts),
                "pending_files": None,
            }
            if errors is not None:
                changes["errors"] = json.dumps(errors)
            for kind, (file_id, size) in files.items():
                if file_id not in reserved:
                    raise ValueError(f"file {file_id!r} was not reserved for batch {batch_id!r}")
                keep = row["output_expires_s"]
                self._insert_file(
                    db,
                    FileRecord(
                        file_id,
                        row["project"],
                        f"{batch_id}_{kind}.jsonl",
                        "batch_output",
                        int(size),
                        self.now(),
                        None if keep is None else self.now() + int(keep),
                    ),
                )
                changes[f"{kind}_file_id"] = file_id
            self._apply(db, row, changes)
            db.execute("UPDATE batches SET heartbeat_at = ? WHERE id = ?", (self.now(), batch_id))
            return _batch(self._batch_row(db, batch_id, None))

    def remove_expired_files(self, limit: int = 1000) -> list[str]:
        """The records of up to ``limit`` expired files, deleted; returns their ids, whose
        bytes the caller deletes (the record first, as :meth:`delete_file`). A batch that
        names an expired output file keeps naming it; the file answers 404, as OpenAI's."""
        with self.write() as db:
            ids = [
                r["id"]
                for r in db.execute(
                    "SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? "
                    "ORDER BY expires_at LIMIT ?",
                    (self.now(), limit),
                ).fetchall()
            ]
            db.executemany("DELETE FROM files WHERE id = ?", [(i,) for i in ids])
        return ids

    def _apply(self, db: sqlite3.Connection, row: sqlite3.Row, changes: dict[str, Any]) -> None:
        """Write ``changes`` to the batch in ``row`` (inside the caller's transaction),
        checking the status change and stamping its time."""
        current = row["status"]
        new = changes.pop("status", current)
        if current in TERMINAL and (changes or new != current):
            raise IllegalTransitionError(
                f"batch {row['id']!r} is {current}; it cannot change any more"
            )
        columns: dict[str, Any] = {}
        if new != current:
            if new not in TRANSITIONS[current]:
                allowed = ", ".join(sorted(TRANSITIONS[current])) or "nothing"
                raise IllegalTransitionError(
                    f"batch {row['id']!r} cannot go from {current} to {new} (from {current}: "
                    f"{allowed})"
                )
            columns["status"] = new
            columns[STAMPS[new]] = self.now()
        counts = changes.pop("request_counts", None)
        if counts is not None:
            columns.update(total=counts.total, completed=counts.completed, failed=counts.failed)
        columns.update(changes)
        if columns:
            assignments = ", ".join(f"{name} = ?" for name in columns)
            db.execute(
                f"UPDATE batches SET {assignments} WHERE id = ?", (*columns.values(), row["id"])
            )


def _file(row: sqlite3.Row) -> FileRecord:
    return FileRecord(*(row[name] for name in _FILE_COLUMNS.split(", ")))


_BATCH_FIELDS = (
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


def _pending(row: sqlite3.Row) -> tuple[str, ...]:
    text = row["pending_files"]
    return tuple(json.loads(text)) if text else ()


def _batch(row: sqlite3.Row) -> BatchRecord:
    return BatchRecord(
        **{name: row[name] for name in _BATCH_FIELDS},
        pending_files=_pending(row),
        request_counts=RequestCounts(row["total"], row["completed"], row["failed"]),
        metadata=None if row["metadata"] is None else json.loads(row["metadata"]),
        errors=None if row["errors"] is None else json.loads(row["errors"]),
    )


def _check_limit(limit: int, most: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise InvalidRequestError(f"limit must be between 1 and {most}, got {limit!r}", "limit")


def _check_counts(counts: RequestCounts) -> RequestCounts:
    values = (counts.total, counts.completed, counts.failed)
    if any(v < 0 for v in values) or counts.completed + counts.failed > counts.total:
        raise ValueError(f"impossible request counts {counts}")
    return counts


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    """OpenAI's rules: up to 16 pairs of strings, keys up to 64 characters, values up to 512."""
    if metadata is None:
        return None
    pairs, key_len, value_len = METADATA_LIMITS
    if not isinstance(metadata, Mapping) or len(metadata) > pairs:
        raise InvalidRequestError(
            f"metadata must be an object of at most {pairs} pairs", "metadata"
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidRequestError("metadata keys and values must be strings", "metadata")
        if len(key) > key_len or len(value) > value_len:
            raise InvalidRequestError(
                f"metadata keys are at most {key_len} characters and values {value_len}",
                "metadata",
            )
    return dict(metadata)


if TYPE_CHECKING:  # mypy checks that the implementation has the interface's every method
    _conforms: JobStore = SQLiteJobStore(":memory:")

__all__ = [
    "COMPLETION_WINDOWS",
    "STAMPS",
    "TERMINAL",
    "TRANSITIONS",
    "BatchRecord",
    "FileRecord",
    "JobStore",
    "Page",
    "RequestCounts",
    "SQLiteJobStore",
    "Status",
]
