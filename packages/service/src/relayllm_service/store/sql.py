"""The durable job store, in plain SQL that SQLite and PostgreSQL both run: files' metadata and
batches, each owned by a project, and the runners' claims on batches.

One small interface (:class:`~relayllm_service.store.protocol.JobStore`); one implementation
(:class:`SQLJobStore`) on a :class:`~relayllm_service.store.database.Database`: SQLite's file
(``sqlite``, the embedded default) or a PostgreSQL server (``postgres``), which differ only in
their connection, transactions and locks. Every row belongs to a project, and every lookup a
client's request makes takes the project: another project's id answers
:class:`NotFoundError`, exactly as an id that does not exist.

Statuses follow OpenAI's life cycle (:data:`TRANSITIONS`); a change the cycle does not allow
raises, and each change stamps its ``*_at`` time. A runner's writes are fenced by its claim
(:mod:`~relayllm_service.store.claims`). Parts: the records (``records``), the interface
(``protocol``), the tables and their migrations (``schema``), a runner's claimed writes
(``claims``), files' metadata (``file_records``) and, here, batches as a client's request
asks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Literal, cast

from relayllm_service.errors import InvalidRequestError
from relayllm_service.ids import new_batch_id
from relayllm_service.store.claims import ClaimedWrites
from relayllm_service.store.database import Connection, Database
from relayllm_service.store.file_records import Admit, FileRecords
from relayllm_service.store.protocol import JobStore
from relayllm_service.store.records import (
    COMPLETION_WINDOWS,
    BatchRecord,
    FileRecord,
    Page,
    RequestCounts,
    Status,
    check_limit,
    check_metadata,
)
from relayllm_service.store.schema import (
    apply_changes,
    batch_record,
    batch_row,
    file_record,
    file_row,
    migrate,
    readable,
)


class SQLJobStore:
    """:class:`JobStore` on one database (``file``), whose tables it creates or migrates.
    Made of parts: the database (:class:`Database`), the runners' fenced writes
    (:class:`ClaimedWrites`, on the same database), files' metadata (:class:`FileRecords`)
    and, here, batches as a client's request asks.
    """

    #: Asked in the write transaction of an upload's or a new batch's record before it is
    #: written (quotas.py); what it raises refuses the request, nothing written.
    admit: Admit | None = None

    def __init__(self, file: Database) -> None:
        self.file = file
        try:
            with self.file.write() as db:
                migrate(db, self.file)
        except BaseException:
            self.file.close()
            raise
        self.runner = ClaimedWrites(self.file)
        self.files = FileRecords(self.file, self._file_row, lambda: self.admit)

    @property
    def path(self) -> str:
        return self.file.path

    def close(self) -> None:
        self.file.close()

    def now(self) -> int:
        return self.file.now()

    def read(self) -> AbstractContextManager[Connection]:
        """A read transaction on the store's database."""
        return self.file.read()

    def write(self) -> AbstractContextManager[Connection]:
        """A write transaction on the store's database (one writer at a time)."""
        return self.file.write()

    def _batch_row(self, db: Connection, batch_id: str, project: str | None) -> Any:
        """A batch's row, only if ``project`` owns it (None: any project's)."""
        return batch_row(db, batch_id, project)

    def _file_row(self, db: Connection, project: str, file_id: str) -> Any:
        """A live file's row, only if ``project`` owns it."""
        return file_row(db, project, file_id, self.now())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.path!r})"

    # -- the runners' calls, each fenced by its claim (claims.py) ---------------------------

    def unfinished(self) -> list[BatchRecord]:
        return self.runner.unfinished()

    def claim(self, batch_id: str, runner: str, lease_s: float | None = None) -> int:
        return self.runner.claim(batch_id, runner, lease_s)

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
        return self.runner.update(
            batch_id,
            claim,
            status=status,
            request_counts=request_counts,
            output_file_id=output_file_id,
            error_file_id=error_file_id,
            errors=errors,
        )

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
        return self.runner.add_batch_file(
            batch_id, claim, filename=filename, purpose=purpose, bytes=bytes, file_id=file_id
        )

    def reserve_files(self, batch_id: str, claim: int, file_ids: list[str]) -> tuple[str, ...]:
        return self.runner.reserve_files(batch_id, claim, file_ids)

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
        return self.runner.finish_batch(
            batch_id,
            claim,
            status=status,
            request_counts=request_counts,
            files=files,
            errors=errors,
        )

    def remove_expired_files(self, limit: int = 1000) -> list[str]:
        return self.runner.remove_expired_files(limit)

    # -- files' metadata, as a client asks (file_records.py) -------------------------------

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
        return self.files.add(
            project,
            filename=filename,
            purpose=purpose,
            bytes=bytes,
            file_id=file_id,
            expires_s=expires_s,
        )

    def get_file(self, project: str, file_id: str) -> FileRecord:
        return self.files.get(project, file_id)

    def list_files(
        self,
        project: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> Page[FileRecord]:
        return self.files.list(project, after=after, limit=limit, order=order, purpose=purpose)

    def delete_file(self, project: str, file_id: str) -> FileRecord:
        return self.files.delete(project, file_id)

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
        meta = check_metadata(metadata)
        now = self.now()
        with self.write() as db:
            source = file_record(self._file_row(db, project, input_file_id))
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

    def get_batch(self, project: str, batch_id: str) -> BatchRecord:
        with self.read() as db:
            return batch_record(self._batch_row(db, batch_id, project))

    def list_batches(
        self, project: str, *, after: str | None = None, limit: int = 20
    ) -> Page[BatchRecord]:
        """Newest first, as OpenAI lists; ``after``: the last id of the previous page."""
        check_limit(limit, 100)
        with self.read() as db:
            before = self._batch_row(db, after, project)["seq"] if after is not None else 1 << 62
            rows = db.execute(
                "SELECT * FROM batches WHERE project = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (project, before, limit + 1),
            ).fetchall()
        return Page(readable(rows[:limit], batch_record), len(rows) > limit)

    def cancel_batch(self, project: str, batch_id: str) -> BatchRecord:
        """``cancelling`` (the runner moves it to ``cancelled`` once its lines in flight are
        written); asking again while it cancels, or once cancelled, answers the batch as is."""
        with self.write() as db:
            row = self._batch_row(db, batch_id, project)
            if row["status"] in ("cancelling", "cancelled"):
                return batch_record(row)
            apply_changes(db, row, {"status": "cancelling"}, self.now())
            return batch_record(self._batch_row(db, batch_id, project))


if TYPE_CHECKING:  # mypy checks that the implementation has the interface's every method
    _conforms: JobStore = SQLJobStore(cast(Database, None))

__all__ = ["SQLJobStore"]
