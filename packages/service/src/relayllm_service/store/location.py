"""Where the job store is: a ``postgresql://`` URL names a PostgreSQL database, anything else
an SQLite file's path (the embedded default)."""

from __future__ import annotations

import time
from collections.abc import Callable

from relayllm_service.store.database import Database
from relayllm_service.store.postgres_file import is_postgres_url
from relayllm_service.store.sql import SQLJobStore


def open_database(
    location: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
) -> Database:
    """The database at ``location``, its tables not yet created (the store does that)."""
    if is_postgres_url(location):
        from relayllm_service.store.postgres_file import PostgresFile

        return PostgresFile(location, clock=clock, timeout_s=timeout_s)
    from relayllm_service.store.sqlite_file import SQLiteFile

    return SQLiteFile(location, clock=clock, timeout_s=timeout_s)


def open_store(
    location: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
) -> SQLJobStore:
    """The job store at ``location``, its tables created or migrated."""
    return SQLJobStore(open_database(location, clock=clock, timeout_s=timeout_s))


__all__ = ["open_database", "open_store"]
