"""Files' metadata per project, as a client asks: an upload's record added, got, listed, deleted."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from relayllm_service.errors import InvalidRequestError
from relayllm_service.ids import is_file_id, new_file_id
from relayllm_service.store.database import Connection, Database
from relayllm_service.store.records import (
    FILE_PURPOSES,
    BatchRecord,
    FileRecord,
    Page,
    check_limit,
    check_text,
)
from relayllm_service.store.schema import FILE_COLUMNS, LIVE, file_record, insert_file, readable

#: The quotas' check of a record in the write transaction that writes it (quotas.py).
Admit = Callable[[Connection, FileRecord | BatchRecord], None]


class FileRecords:
    """The ``files`` table of a store's file, every lookup in the caller's project (``row``:
    the store's lookup of a live file's row in its project); ``admit`` gives the store's
    check of an upload, asked when one is written."""

    def __init__(
        self,
        file: Database,
        row: Callable[[Connection, str, str], Any],
        admit: Callable[[], Admit | None],
    ) -> None:
        self.file, self._row, self._admit = file, row, admit

    def add(
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
        answers 404 like a deleted file, and :meth:`ClaimedWrites.remove_expired_files` hands
        its id over for its bytes to be deleted."""
        if purpose not in FILE_PURPOSES:
            raise InvalidRequestError(
                f"purpose {purpose!r} is not supported; use one of {sorted(FILE_PURPOSES)}",
                "purpose",
            )
        check_text(filename, "filename")
        if file_id is not None and not is_file_id(file_id):
            raise InvalidRequestError(f"{file_id!r} is not a file id", "file_id")
        now = self.file.now()
        expires_at = None if expires_s is None else now + int(expires_s)
        record = FileRecord(
            file_id or new_file_id(), project, filename, purpose, int(bytes), now, expires_at
        )
        with self.file.write() as db:
            admit = self._admit()
            if admit is not None:
                admit(db, record)
            insert_file(db, record)
        return record

    def get(self, project: str, file_id: str) -> FileRecord:
        with self.file.read() as db:
            return file_record(self._row(db, project, file_id))

    def list(
        self,
        project: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> Page[FileRecord]:
        check_limit(limit, 10000)
        if order not in ("asc", "desc"):
            raise InvalidRequestError(f"order must be 'asc' or 'desc', got {order!r}", "order")
        where, args = ["project = ?", LIVE], [project, self.file.now()]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        with self.file.read() as db:
            if after is not None:
                where.append("seq < ?" if order == "desc" else "seq > ?")
                args.append(self._row(db, project, after)["seq"])
            rows = db.execute(
                f"SELECT {FILE_COLUMNS} FROM files WHERE {' AND '.join(where)} "
                f"ORDER BY seq {order.upper()} "
                f"LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return Page(readable(rows[:limit], file_record), len(rows) > limit)

    def delete(self, project: str, file_id: str) -> FileRecord:
        """The record, deleted; the caller deletes the bytes after (a crash between leaves
        bytes no record names, never a record whose bytes are gone)."""
        with self.file.write() as db:
            record = file_record(self._row(db, project, file_id))
            db.execute("DELETE FROM files WHERE id = ?", (file_id,))
        return record


__all__ = ["Admit", "FileRecords"]
