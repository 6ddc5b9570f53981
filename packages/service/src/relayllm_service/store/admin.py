"""The job store as the operator sees it: the admin key's project (:data:`keys.ADMIN`) names
every project, so the gateway's routes serve the operator CLI and the console with the same
calls they make for a project.

A lookup by id finds the project that owns the id and then asks as that project (the store's
own checks apply: an expired file is still no file); a list spans every project, newest
first, paged by the same cursor. The admin key creates nothing: an upload or a batch belongs
to a project, so those are refused at the gateway.
"""

from __future__ import annotations

from typing import Any, Literal

from relayllm_service.errors import InvalidRequestError, NotFoundError
from relayllm_service.store.records import BatchRecord, FileRecord, Page, check_limit
from relayllm_service.store.schema import FILE_COLUMNS, LIVE, batch_record, file_record, readable
from relayllm_service.store.sql import SQLJobStore
from relayllm_service.tenancy.keys import ADMIN


class AdminStore:
    """A job store seen with the project :data:`ADMIN` as every project: a wrapper around the
    store (:class:`SQLJobStore`), answering the project-scoped calls for ADMIN itself and
    handing every other call, and every other project's, to the store."""

    def __init__(self, store: SQLJobStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def __repr__(self) -> str:
        return f"AdminStore({self.store!r})"

    def owner(self, table: Literal["batches", "files"], item_id: str) -> str:
        """The project that owns a batch or file id (404 for an id no project has)."""
        with self.store.read() as db:
            row = db.execute(f"SELECT project FROM {table} WHERE id = ?", (item_id,)).fetchone()
        if row is None:
            kind = "batch" if table == "batches" else "file"
            raise NotFoundError(f"no {kind} {item_id!r}")
        return str(row["project"])

    def projects(self) -> list[str]:
        """Every project that has a batch or a live file, by name."""
        with self.store.read() as db:
            rows = db.execute(
                f"SELECT project FROM batches UNION SELECT project FROM files WHERE {LIVE}",
                (self.store.now(),),
            ).fetchall()
        return sorted(str(row["project"]) for row in rows)

    # -- the project-scoped calls, for ADMIN every project's --------------------------------

    def get_batch(self, project: str, batch_id: str) -> BatchRecord:
        return self.store.get_batch(self._as(project, "batches", batch_id), batch_id)

    def cancel_batch(self, project: str, batch_id: str) -> BatchRecord:
        return self.store.cancel_batch(self._as(project, "batches", batch_id), batch_id)

    def get_file(self, project: str, file_id: str) -> FileRecord:
        return self.store.get_file(self._as(project, "files", file_id), file_id)

    def delete_file(self, project: str, file_id: str) -> FileRecord:
        return self.store.delete_file(self._as(project, "files", file_id), file_id)

    def list_batches(
        self, project: str, *, after: str | None = None, limit: int = 20
    ) -> Page[BatchRecord]:
        if project != ADMIN:
            return self.store.list_batches(project, after=after, limit=limit)
        check_limit(limit, 100)
        with self.store.read() as db:
            before = self.store._batch_row(db, after, None)["seq"] if after is not None else 1 << 62
            rows = db.execute(
                "SELECT * FROM batches WHERE seq < ? ORDER BY seq DESC LIMIT ?",
                (before, limit + 1),
            ).fetchall()
        return Page(readable(rows[:limit], batch_record), len(rows) > limit)

    def list_files(
        self,
        project: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> Page[FileRecord]:
        if project != ADMIN:
            return self.store.list_files(
                project, after=after, limit=limit, order=order, purpose=purpose
            )
        check_limit(limit, 10000)
        if order not in ("asc", "desc"):
            raise InvalidRequestError(f"order must be 'asc' or 'desc', got {order!r}", "order")
        where: list[str] = [LIVE]
        args: list[object] = [self.store.now()]
        if purpose is not None:
            where.append("purpose = ?")
            args.append(purpose)
        with self.store.read() as db:
            if after is not None:
                row = db.execute("SELECT seq FROM files WHERE id = ?", (after,)).fetchone()
                if row is None:
                    raise NotFoundError(f"no file {after!r}")
                where.append("seq < ?" if order == "desc" else "seq > ?")
                args.append(row["seq"])
            rows = db.execute(
                f"SELECT {FILE_COLUMNS} FROM files WHERE {' AND '.join(where)} "
                f"ORDER BY seq {order.upper()} LIMIT ?",
                (*args, limit + 1),
            ).fetchall()
        return Page(readable(rows[:limit], file_record), len(rows) > limit)

    def _as(self, project: str, table: Literal["batches", "files"], item_id: str) -> str:
        return self.owner(table, item_id) if project == ADMIN else project


__all__ = ["AdminStore"]
