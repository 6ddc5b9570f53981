"""The job store on a PostgreSQL server (psycopg 3, the service's ``postgresql`` extra): one
connection shared by a process's threads under a lock, and the same two kinds of transaction
SQLite's file gives (``sqlite_file``), so the store's SQL runs unchanged on either.

A write transaction first takes one advisory lock (per database): writers go one at a time,
as SQLite's ``BEGIN IMMEDIATE`` makes them, so what a write reads (a claim number, a status, a
quota's count) cannot change before it writes, on any host. Reads run in a REPEATABLE READ
snapshot and never wait for a writer."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from relayllm_service.errors import ServiceError
from relayllm_service.store.database import Connection, Cursor

#: The advisory lock every write transaction holds (a constant of this program: "rllm").
WRITE_LOCK = 0x726C6C6D
SCHEMES = ("postgresql", "postgres")
INSTALL = "pip install 'relayllm-service[postgresql]'"


def is_postgres_url(value: str) -> bool:
    return urlsplit(value).scheme in SCHEMES


def redact(url: str) -> str:
    """``url`` with its password (if any) shown as ``***``: what logs, errors and reprs say."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def check_url(url: str) -> None:
    """A ValueError (its text without the password) unless ``url`` is a connection URL libpq
    reads, with psycopg installed to read it: checked before anything starts."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:
        raise ValueError(f"a PostgreSQL store needs psycopg: {INSTALL}") from None
    try:
        conninfo_to_dict(url)
    except Exception as error:
        raise ValueError(
            f"not a PostgreSQL connection URL ({_scrub(str(error), url).strip()}); e.g. "
            f"postgresql://user:password@host:5432/database"
        ) from None


def _scrub(text: str, url: str) -> str:
    password = urlsplit(url).password
    return text.replace(password, "***") if password else text


class Row(tuple[Any, ...]):
    """A row read by position (``row[0]``) or by column name (``row["id"]``), like
    ``sqlite3.Row``."""

    names: dict[str, int]

    def __new__(cls, names: dict[str, int], values: Sequence[Any]) -> Row:
        row = super().__new__(cls, values)
        row.names = names
        return row

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, str):
            return super().__getitem__(self.names[key])
        return super().__getitem__(key)


def _rows(cursor: Any) -> Callable[[Sequence[Any]], Row]:
    names = {d.name: i for i, d in enumerate(cursor.description or ())}
    return lambda values: Row(names, values)


class _Transaction:
    """The connection as the store's SQL sees it: ``?`` placeholders, as SQLite takes them."""

    def __init__(self, db: Any) -> None:
        self._db = db

    @staticmethod
    def _sql(sql: str) -> str:
        return sql.replace("%", "%%").replace("?", "%s")

    def execute(self, sql: str, parameters: Any = (), /) -> Cursor:
        cursor: Cursor = self._db.execute(self._sql(sql), tuple(parameters))
        return cursor

    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any:
        with self._db.cursor() as cursor:
            cursor.executemany(self._sql(sql), [tuple(p) for p in parameters])


def _schema_parts(db: Connection) -> None:
    db.execute("CREATE TABLE IF NOT EXISTS schema_parts (part TEXT PRIMARY KEY, version BIGINT)")


class PostgresFile:
    """A connection to the job store's database at ``url`` (``postgresql://user:password@host
    :port/db`` or with ``?host=/socket/dir``). ``path`` is the URL without its password.
    A writer waits up to ``timeout_s`` for the write lock, then fails saying so."""

    def __init__(
        self, url: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
    ) -> None:
        try:
            import psycopg
        except ImportError:
            raise ServiceError(
                f"the job store {redact(url)!r} is a PostgreSQL database, and psycopg is not "
                f"installed: {INSTALL}"
            ) from None
        self._psycopg = psycopg
        self._url = url
        self.path = redact(url)
        self._clock = clock
        self._timeout_ms = int(timeout_s * 1000)
        self._lock = threading.Lock()
        self._db = self._connect()

    def _connect(self) -> Any:
        try:
            return self._psycopg.connect(
                self._url,
                autocommit=True,
                row_factory=_rows,
                connect_timeout=max(1, self._timeout_ms // 1000),
                options=f"-c lock_timeout={self._timeout_ms}",
            )
        except self._psycopg.Error as error:
            raise ServiceError(
                f"cannot connect to the job store {self.path!r}: {_scrub(str(error), self._url)}"
            ) from None

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def now(self) -> int:
        return int(self._clock())

    def _live(self) -> Any:
        """The connection; a new one if the last was lost (a server restarted, a network
        that failed): its transaction was rolled back, so nothing half-written stays."""
        if self._db.closed or self._db.broken:
            self._db = self._connect()
        return self._db

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """One write transaction holding the write lock from its start (see the module)."""
        with self._lock:
            db = self._live()
            with db.transaction():
                db.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                yield _Transaction(db)

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """One read transaction: a consistent snapshot for reads of several statements."""
        with self._lock:
            db = self._live()
            with db.transaction():
                db.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                yield _Transaction(db)

    def schema_version(self, db: Connection) -> int:
        """The ``jobs`` part's version in ``schema_parts`` (the table the usage ledger's and
        the quotas' parts keep theirs in, in SQLite's file)."""
        _schema_parts(db)
        row = db.execute("SELECT version FROM schema_parts WHERE part = 'jobs'").fetchone()
        return 0 if row is None else int(row[0])

    def set_schema_version(self, db: Connection, version: int) -> None:
        _schema_parts(db)
        db.execute(
            "INSERT INTO schema_parts (part, version) VALUES ('jobs', ?) "
            "ON CONFLICT (part) DO UPDATE SET version = excluded.version",
            (version,),
        )

    def ddl(self, statement: str) -> str:
        """The schema's SQLite statement in PostgreSQL's words: 64-bit integers (times,
        sizes, counts) and sequences for the ``seq`` columns."""
        statement = statement.replace("INTEGER PRIMARY KEY AUTOINCREMENT", "BIGSERIAL PRIMARY KEY")
        statement = re.sub(r"\bINTEGER\b", "BIGINT", statement)
        return re.sub(r"\bREAL\b", "DOUBLE PRECISION", statement)

    def __repr__(self) -> str:
        return f"PostgresFile({self.path!r})"


__all__ = ["PostgresFile", "check_url", "is_postgres_url", "redact"]
