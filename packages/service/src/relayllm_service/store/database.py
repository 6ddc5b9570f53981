"""What the store's parts need of a database: a transaction's connection (:class:`Connection`)
and the two kinds of transaction (:class:`Database`). SQLite's file (``sqlite_file``) and a
PostgreSQL database (``postgres_file``) each give both; the tables, the claims, the files'
records and the batches are written once, in plain SQL both accept (``?`` placeholders; rows
read by column name or position)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol


class Cursor(Protocol):
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    """One transaction's connection; a row reads as ``row["column"]`` and ``row[0]``."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...
    def executemany(self, sql: str, parameters: Iterable[Any], /) -> Any: ...


class Database(Protocol):
    """A store's database: where it is (``path``, safe to show), its clock, its
    transactions and what its schema's migration needs (``schema_version``, ``ddl``)."""

    path: str

    def now(self) -> int: ...
    def write(self) -> AbstractContextManager[Connection]: ...
    def read(self) -> AbstractContextManager[Connection]: ...
    def close(self) -> None: ...
    def schema_version(self, db: Connection) -> int: ...
    def set_schema_version(self, db: Connection, version: int) -> None: ...
    def ddl(self, statement: str) -> str: ...


__all__ = ["Connection", "Cursor", "Database"]
