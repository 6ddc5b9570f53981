"""The job store on a PostgreSQL server, for gateways and runners on hosts that share no
disk: :class:`PostgresJobStore`, the calls of :class:`~relayllm_service.store.sql.SQLJobStore`
on :class:`~relayllm_service.store.postgres_file.PostgresFile`."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from relayllm_service.store.postgres_file import PostgresFile
from relayllm_service.store.protocol import JobStore
from relayllm_service.store.sql import SQLJobStore


class PostgresJobStore(SQLJobStore):
    """:class:`JobStore` in a PostgreSQL database (``url``; its tables created or migrated
    when opened, once however many processes open it at once)."""

    def __init__(
        self, url: str, *, clock: Callable[[], float] = time.time, timeout_s: float = 30.0
    ) -> None:
        super().__init__(PostgresFile(url, clock=clock, timeout_s=timeout_s))


if TYPE_CHECKING:
    _conforms: JobStore = PostgresJobStore("postgresql://")

__all__ = ["PostgresJobStore"]
