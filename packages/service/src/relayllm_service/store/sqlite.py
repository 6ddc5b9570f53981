"""The embedded job store: :class:`SQLiteJobStore`, one SQLite file on the head node's local
disk in WAL mode (readers never wait for the writer; several processes share it). The
store's calls are :class:`~relayllm_service.store.sql.SQLJobStore`'s."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from relayllm_service.store.protocol import JobStore
from relayllm_service.store.sql import SQLJobStore
from relayllm_service.store.sqlite_file import SQLiteFile


class SQLiteJobStore(SQLJobStore):
    """:class:`JobStore` in one SQLite file (WAL mode, synchronous=FULL: a committed write
    survives a process kill and a power cut). Safe to share between threads (one connection
    behind a lock) and between processes (SQLite's locks; a writer waits up to ``timeout_s``).
    """

    def __init__(
        self, path: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
    ) -> None:
        super().__init__(SQLiteFile(path, clock=clock, timeout_s=timeout_s))


if TYPE_CHECKING:
    _conforms: JobStore = SQLiteJobStore(":memory:")

__all__ = ["SQLiteJobStore"]
