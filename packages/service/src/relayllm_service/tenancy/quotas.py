"""Quotas per project: what one project may hold of the service, so one key holder cannot fill
its disk or its queue for everyone.

Set beside the keys (``relayllm serve --quotas FILE.yaml``: ``ServiceSettings.quotas``), per
project name, ``"*"`` for every project not named:

- ``stored_bytes`` and ``files``: the project's live files (uploads and batches' output and
  error files), checked at each upload;
- ``batches``: its batches not finished yet, checked at each create;
- ``requests_per_minute``: its online requests through the gateway in each clock minute,
  every gateway's counted together; one over it answers 429 ``rate_limit_exceeded`` with
  ``Retry-After`` (the seconds to the next minute) and OpenAI's error body;
- ``enqueued_tokens``: per deployment (as a line's ``model`` names it), the estimated input
  tokens of its unfinished batches' lines, checked at each create: OpenAI's batch queue
  limit, refused with OpenAI's ``token_limit_exceeded`` code and message (429 with
  ``x-should-retry: false``, as the ``batches`` limit's: a client retrying at once would be
  refused again).

And ``weight`` (default 1): the project's share of the batch lines the runner's turns
write while batches of several projects wait (:mod:`~relayllm_service.tenancy.fair`).

Each check runs inside the store's write transaction that records the upload or the batch
(:attr:`SQLJobStore.admit`), and the online requests' count in a write transaction of its own,
on the store's database (SQLite's file or PostgreSQL), so gateways and runners sharing the
state see one count: two creates racing for the last room cannot both get it. A refused
request writes nothing (an upload's bytes are deleted), and other projects are not affected.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pydantic import ConfigDict, Field

from relayllm.configbase import ConfigModel
from relayllm.http.errors import HttpError
from relayllm_service.store.database import Connection, Database
from relayllm_service.store.files import FileStorage
from relayllm_service.store.records import TERMINAL, BatchRecord, FileRecord
from relayllm_service.store.sql import SQLJobStore
from relayllm_service.tenancy.tokens import estimate_tokens
from relayllm_service.tenancy.usage import migrate

#: The quota of every project not named.
EVERY = "*"

_SCHEMA_VERSION = 2
_MIGRATIONS = {
    1: "CREATE TABLE file_tokens (file_id TEXT NOT NULL, model TEXT NOT NULL, "
    "tokens INTEGER NOT NULL, PRIMARY KEY (file_id, model))",
    2: "CREATE TABLE online_requests (project TEXT NOT NULL, minute INTEGER NOT NULL, "
    "count INTEGER NOT NULL, PRIMARY KEY (project, minute))",
}


class Quota(ConfigModel):
    """One project's limits (None: no limit)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stored_bytes: int | None = Field(
        default=None, ge=0, description="Bytes of live files (uploads, batch outputs)."
    )
    files: int | None = Field(default=None, ge=0, description="Live files.")
    batches: int | None = Field(default=None, ge=0, description="Batches not finished yet.")
    enqueued_tokens: dict[str, int] = Field(
        default_factory=dict,
        description="Per deployment: estimated input tokens of the batches not finished yet.",
    )
    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        description="Online requests through the gateway per clock minute (UTC).",
    )
    weight: float = Field(
        default=1.0,
        gt=0,
        description="Share of the batch lines written while several projects' batches wait "
        "(fair.py).",
    )


#: A 429 no retry soon mends (the project's batches must finish first): the ``openai`` client
#: retries a 429 unless told not to.
PERMANENT = {"x-should-retry": "false"}


class QuotaError(HttpError):
    """A request over its project's quota (OpenAI's error body; nothing was written)."""


def read_quotas(path: str | None, text: str | None = None) -> dict[str, Quota]:
    """The quotas of a YAML file: a mapping of project name (``"*"``: every other project)
    to its limits; None: no quotas. A bad file is a ConfigError naming it and the field.
    ``text``: the file's contents, already read."""
    if path is None:
        return {}
    import yaml

    from relayllm.errors import ConfigError

    try:
        if text is None:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        data = yaml.safe_load(text) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read the quotas file {path!r}: {exc}") from None
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError(
            f"the quotas file {path!r} must map project names to their limits, e.g. "
            f"'team-a: {{stored_bytes: 10000000000, batches: 4}}'"
        )
    try:
        return {str(project): Quota(**limits) for project, limits in data.items()}
    except ConfigError as exc:
        raise ConfigError(f"the quotas file {path!r}: {exc}") from None


def weight_of(quotas: dict[str, Quota], project: str) -> float:
    quota = quota_for(quotas, project)
    return 1.0 if quota is None else quota.weight


def quota_for(quotas: dict[str, Quota], project: str) -> Quota | None:
    return quotas.get(project) or quotas.get(EVERY)


class Quotas:
    """The checks :attr:`SQLJobStore.admit` runs, for ``quotas`` (project -> limits); the
    calls outside the store's own take its database (``store.file``)."""

    def __init__(
        self, quotas: dict[str, Quota], live: Callable[[], dict[str, Quota]] | None = None
    ) -> None:
        self._quotas, self._live = quotas, live

    @property
    def quotas(self) -> dict[str, Quota]:
        """The quotas now (``live``: the quotas file's, read again when it changes)."""
        return self._quotas if self._live is None else self._live()

    @classmethod
    def install(
        cls,
        store: SQLJobStore,
        quotas: dict[str, Quota],
        live: Callable[[], dict[str, Quota]] | None = None,
    ) -> Quotas:
        """The checks of ``quotas``, run by ``store`` from now on; with ``live``, of the quotas
        it returns at each check (the quotas file's as it changes: projects.quotas_now)."""
        checks = cls(quotas, live)
        checks.prepare(store.file)
        store.admit = checks
        return checks

    def estimate(
        self, store: SQLJobStore, storage: FileStorage, project: str, file_id: str
    ) -> None:
        """The token estimate of ``project``'s input file, made once (before a create, when
        the project has an ``enqueued_tokens`` quota; another project's file is not found)."""
        if not self.needs_tokens(project):
            return
        store.get_file(project, file_id)
        if self.has_tokens(store.file, file_id):
            return
        with storage.open(file_id) as source:
            self.record_tokens(store.file, file_id, estimate_tokens(source))

    def prepare(self, database: Database) -> None:
        """The quotas' tables (token estimates, online requests' counts) in the store's
        database, created or migrated (once per process)."""
        with database.write() as db:
            migrate(db, "quotas", _SCHEMA_VERSION, _MIGRATIONS, database.ddl)

    def needs_tokens(self, project: str) -> bool:
        quota = quota_for(self.quotas, project)
        return quota is not None and bool(quota.enqueued_tokens)

    def __call__(self, db: Connection, record: FileRecord | BatchRecord) -> None:
        quota = quota_for(self.quotas, record.project)
        if quota is None:
            return
        if isinstance(record, FileRecord):
            self._file(db, record, quota)
        else:
            self._batch(db, record, quota)

    def _file(self, db: Connection, record: FileRecord, quota: Quota) -> None:
        files, stored = db.execute(
            "SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM files WHERE project = ? "
            "AND (expires_at IS NULL OR expires_at > ?)",
            (record.project, record.created_at),
        ).fetchone()
        if quota.files is not None and files + 1 > quota.files:
            raise QuotaError(
                400,
                f"project {record.project!r} has {files} files, its limit; delete some first",
                code="file_limit_exceeded",
                param="file",
            )
        if quota.stored_bytes is not None and stored + record.bytes > quota.stored_bytes:
            raise QuotaError(
                400,
                f"this file's {record.bytes:,} bytes would take project {record.project!r}'s "
                f"stored files to {stored + record.bytes:,} bytes, over its limit of "
                f"{quota.stored_bytes:,}; delete some first",
                code="storage_limit_exceeded",
                param="file",
            )

    def _batch(self, db: Connection, record: BatchRecord, quota: Quota) -> None:
        marks = ", ".join("?" * len(TERMINAL))
        unfinished = f"b.project = ? AND b.status NOT IN ({marks})"
        args = (record.project, *sorted(TERMINAL))
        if quota.batches is not None:
            (running,) = db.execute(f"SELECT COUNT(*) FROM batches b WHERE {unfinished}", args)
            if running[0] + 1 > quota.batches:
                raise QuotaError(
                    429,
                    f"project {record.project!r} has {running[0]} batches not finished, its "
                    f"limit of {quota.batches}. Please try again once some in_progress "
                    f"batches have been completed.",
                    code="batch_limit_exceeded",
                    headers=PERMANENT,
                )
        if not quota.enqueued_tokens:
            return
        mine = dict(
            db.execute(
                "SELECT model, tokens FROM file_tokens WHERE file_id = ?", (record.input_file_id,)
            ).fetchall()
        )
        for model, limit in sorted(quota.enqueued_tokens.items()):
            if not mine.get(model):
                continue
            (queued,) = db.execute(
                "SELECT COALESCE(SUM(t.tokens), 0) FROM batches b JOIN file_tokens t "
                f"ON t.file_id = b.input_file_id WHERE {unfinished} AND t.model = ?",
                (*args, model),
            ).fetchone()
            if queued + mine[model] > limit:
                raise QuotaError(
                    429,
                    f"Enqueued token limit reached for {model} in project {record.project}. "
                    f"Limit: {limit:,} enqueued tokens. Please try again once some "
                    f"in_progress batches have been completed.",
                    code="token_limit_exceeded",
                    headers=PERMANENT,
                )

    def admit_request(self, database: Database, project: str, now: float | None = None) -> None:
        """Count an online request of ``project`` in this minute, or refuse it (429, nothing
        counted) when its ``requests_per_minute`` are used up."""
        quota = quota_for(self.quotas, project)
        if quota is None or quota.requests_per_minute is None:
            return
        moment = int(time.time() if now is None else now)
        minute, limit = moment - moment % 60, quota.requests_per_minute
        with database.write() as db:  # a refusal raises: rolled back, nothing counted
            row = db.execute(
                "SELECT count FROM online_requests WHERE project = ? AND minute = ?",
                (project, minute),
            ).fetchone()
            used = 0 if row is None else int(row[0])
            if used >= limit:
                wait = minute + 60 - moment
                raise QuotaError(
                    429,
                    f"Rate limit reached for project {project} on requests per min (RPM): "
                    f"Limit {limit}, Used {used}, Requested 1. Please try again in {wait}s.",
                    "requests",
                    "rate_limit_exceeded",
                    headers={"Retry-After": str(wait)},
                )
            db.execute(
                "INSERT INTO online_requests (project, minute, count) VALUES (?, ?, ?) "
                "ON CONFLICT (project, minute) DO UPDATE SET count = excluded.count",
                (project, minute, used + 1),
            )
            db.execute("DELETE FROM online_requests WHERE minute < ?", (minute - 60,))

    def record_tokens(self, database: Database, file_id: str, tokens: dict[str, int]) -> None:
        """A file's estimate, kept for the quota checks of every batch made of it."""
        with database.write() as db:
            db.executemany(
                "INSERT INTO file_tokens (file_id, model, tokens) VALUES (?, ?, ?) "
                "ON CONFLICT (file_id, model) DO UPDATE SET tokens = excluded.tokens",
                [(file_id, model, n) for model, n in (tokens or {"": 0}).items()],
            )

    def has_tokens(self, database: Database, file_id: str) -> bool:
        with database.read() as db:
            row = db.execute(
                "SELECT 1 FROM file_tokens WHERE file_id = ? LIMIT 1", (file_id,)
            ).fetchone()
        return row is not None


__all__ = [
    "EVERY",
    "Quota",
    "QuotaError",
    "Quotas",
    "quota_for",
    "read_quotas",
    "weight_of",
]
