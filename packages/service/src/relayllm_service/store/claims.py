"""A runner's side of the job store: its claims on batches and every write it makes under
one.

A runner **claims** a batch before it runs it: :meth:`ClaimedWrites.claim` increments a
number stored with the batch and returns it, and every write the runner makes afterwards
(status, counts, its output files) carries that number and is refused with
:class:`StaleClaimError`, nothing written, once a newer claim exists. A runner that was
presumed dead and comes back can therefore never overwrite the work of the one that replaced
it. Check and write happen in one ``BEGIN IMMEDIATE`` transaction, which holds SQLite's write
lock across processes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from relayllm_service.errors import (
    ClaimHeldError,
    IllegalTransitionError,
    InvalidRequestError,
    StaleClaimError,
)
from relayllm_service.ids import is_file_id, new_file_id
from relayllm_service.store.database import Connection, Database
from relayllm_service.store.records import (
    FILE_PURPOSES,
    TERMINAL,
    BatchRecord,
    FileRecord,
    RequestCounts,
    Status,
    check_counts,
)
from relayllm_service.store.schema import (
    apply_changes,
    batch_record,
    batch_row,
    file_row,
    insert_file,
    pending_files,
    readable,
)


class ClaimedWrites:
    """The runner calls of :class:`~relayllm_service.store.sqlite.SQLiteJobStore`, each
    fenced by the claim number, on the store's file (whose tables the store creates)."""

    def __init__(self, file: Database) -> None:
        self.file = file

    def _batch_row(self, db: Connection, batch_id: str, project: str | None) -> Any:
        """A batch's row, only if ``project`` owns it (None: any project's, as runners ask)."""
        return batch_row(db, batch_id, project)

    def _file_row(self, db: Connection, project: str, file_id: str) -> Any:
        """A live file's row, only if ``project`` owns it."""
        return file_row(db, project, file_id, self.file.now())

    def unfinished(self) -> list[BatchRecord]:
        """Every batch not in a final status, oldest first: what runners must (re)claim after
        a restart."""
        marks = ", ".join("?" * len(TERMINAL))
        with self.file.read() as db:
            rows = db.execute(
                f"SELECT * FROM batches WHERE status NOT IN ({marks}) ORDER BY seq",
                tuple(sorted(TERMINAL)),
            ).fetchall()
        return readable(rows, batch_record)

    def claim(self, batch_id: str, runner: str, lease_s: float | None = None) -> int:
        """A new claim on the batch for ``runner``: the returned number fences every later
        write, and every write made with an older number is refused from now on. With
        ``lease_s``, refused (:class:`ClaimHeldError`) while another runner holds the batch
        and wrote (``heartbeat_at``) less than ``lease_s`` ago: two live runners never take
        a batch from each other; a dead one's batches are taken once its lease ran out."""
        with self.file.write() as db:
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
                and self.file.now() - int(beat) < lease_s
            ):
                raise ClaimHeldError(
                    f"batch {batch_id!r} is held by {row['runner']!r}, alive "
                    f"{self.file.now() - int(beat)}s ago"
                )
            number = int(row["claim"]) + 1
            db.execute(
                "UPDATE batches SET claim = ?, runner = ?, heartbeat_at = ? WHERE id = ?",
                (number, runner, self.file.now(), batch_id),
            )
        return number

    def _check_claim(self, row: Any, claim: int) -> None:
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
            changes["request_counts"] = check_counts(request_counts)
        if errors is not None:
            changes["errors"] = json.dumps(errors)
        with self.file.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            for column, file_id in (
                ("output_file_id", output_file_id),
                ("error_file_id", error_file_id),
            ):
                if file_id is not None:
                    self._file_row(db, row["project"], file_id)  # the batch's project's file
                    changes[column] = file_id
            apply_changes(db, row, changes, self.file.now())
            db.execute(
                "UPDATE batches SET heartbeat_at = ? WHERE id = ? AND claim = ?",
                (self.file.now(), batch_id, claim),
            )
            return batch_record(self._batch_row(db, batch_id, None))

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
        with self.file.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            record = FileRecord(
                file_id or new_file_id(),
                row["project"],
                filename,
                purpose,
                int(bytes),
                self.file.now(),
            )
            insert_file(db, record)
        return record

    def reserve_files(self, batch_id: str, claim: int, file_ids: list[str]) -> tuple[str, ...]:
        """Record the ids a runner is about to write the batch's output and error bytes
        under (fenced like :meth:`update`), before it writes them; returns the ids an earlier
        claim reserved and never published (a finish killed between its bytes and
        :meth:`finish_batch`), whose bytes the caller deletes."""
        for file_id in file_ids:
            if not is_file_id(file_id):
                raise InvalidRequestError(f"{file_id!r} is not a file id", "file_id")
        with self.file.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            if row["status"] in TERMINAL:
                raise IllegalTransitionError(
                    f"batch {batch_id!r} is {row['status']}; it cannot change any more"
                )
            earlier = pending_files(row)
            db.execute(
                "UPDATE batches SET pending_files = ?, heartbeat_at = ? WHERE id = ?",
                (json.dumps(file_ids), self.file.now(), batch_id),
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
        with self.file.write() as db:
            row = self._batch_row(db, batch_id, None)
            self._check_claim(row, claim)
            reserved = pending_files(row)
            changes: dict[str, Any] = {
                "status": status,
                "request_counts": check_counts(request_counts),
                "pending_files": None,
            }
            if errors is not None:
                changes["errors"] = json.dumps(errors)
            for kind, (file_id, size) in files.items():
                if file_id not in reserved:
                    raise ValueError(f"file {file_id!r} was not reserved for batch {batch_id!r}")
                keep = row["output_expires_s"]
                insert_file(
                    db,
                    FileRecord(
                        file_id,
                        row["project"],
                        f"{batch_id}_{kind}.jsonl",
                        "batch_output",
                        int(size),
                        self.file.now(),
                        None if keep is None else self.file.now() + int(keep),
                    ),
                )
                changes[f"{kind}_file_id"] = file_id
            apply_changes(db, row, changes, self.file.now())
            db.execute(
                "UPDATE batches SET heartbeat_at = ? WHERE id = ?", (self.file.now(), batch_id)
            )
            return batch_record(self._batch_row(db, batch_id, None))

    def remove_expired_files(self, limit: int = 1000) -> list[str]:
        """The records of up to ``limit`` expired files, deleted; returns their ids, whose
        bytes the caller deletes (the record first, as :meth:`delete_file`). A batch that
        names an expired output file keeps naming it; the file answers 404, as OpenAI's."""
        with self.file.write() as db:
            ids = [
                r["id"]
                for r in db.execute(
                    "SELECT id FROM files WHERE expires_at IS NOT NULL AND expires_at <= ? "
                    "ORDER BY expires_at LIMIT ?",
                    (self.file.now(), limit),
                ).fetchall()
            ]
            db.executemany("DELETE FROM files WHERE id = ?", [(i,) for i in ids])
        return ids


__all__ = ["ClaimedWrites"]
