"""The job store's SQLite file: one connection in WAL mode, shared by a process's threads under
a lock, and the two kinds of transaction the store and the usage ledger run in it. Both open
the same file, each with its own connection; WAL and SQLite's write lock keep them safe beside
each other, in any process."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from relayllm_service.errors import ServiceError
from relayllm_service.store.database import Connection

logger = logging.getLogger(__name__)


def stored_text(data: bytes) -> str:
    """A stored text column as a string: text that is not UTF-8 (written by another program,
    or an older relayllm) is read with U+FFFD where it cannot be decoded, so one such row
    never stops a read of many."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("the job store holds text that is not UTF-8; read with U+FFFD in it")
        return data.decode("utf-8", "replace")


class SQLiteFile:
    """A connection to the job store's file. Subclasses migrate their tables after this
    constructor, closing the connection if that fails."""

    def __init__(
        self, path: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
    ) -> None:
        self.path = str(path)
        self._clock = clock
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.path, timeout=timeout_s, isolation_level=None, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        self._db.text_factory = stored_text
        try:
            mode = self._db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode != "wal":
                raise ServiceError(
                    f"the job store {self.path!r} cannot use SQLite's WAL mode (got {mode!r}); "
                    f"put it on a local disk (network filesystems do not support it)"
                )
            self._db.execute("PRAGMA synchronous=FULL")
        except BaseException:
            self._db.close()
            raise

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def now(self) -> int:
        return int(self._clock())

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction holding SQLite's write lock from its start, so what it reads
        (a claim number, a status, a quota's count) cannot change before it writes, in any
        process."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    self._db.execute("ROLLBACK")
                raise

    def schema_version(self, db: Connection) -> int:
        return int(db.execute("PRAGMA user_version").fetchone()[0])

    def set_schema_version(self, db: Connection, version: int) -> None:
        db.execute(f"PRAGMA user_version={int(version)}")

    def ddl(self, statement: str) -> str:
        """The schema's statements are SQLite's own."""
        return statement

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction: a consistent snapshot for reads of several statements."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                yield self._db
            finally:
                self._db.execute("COMMIT")


__all__ = ["SQLiteFile", "stored_text"]
