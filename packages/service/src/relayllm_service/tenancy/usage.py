"""The usage ledger: what each project used, per batch, deployment (model) and minute.

Every batch line in a batch's output file and every online request answered through the
gateway adds to one row of the ``usage`` table (project, batch id or ``""`` for online
traffic, model, the minute it was answered): requests, input tokens, cached input tokens
(where the engine reports ``prompt_tokens_details.cached_tokens``), output tokens and engine
seconds (the body's ``engine_s``: the row's share of its replica's busy time,
:data:`relayllm.rows.outputs.ENGINE_S`). The
table lives in the job store's database (SQLite's file or a PostgreSQL server: the store's
``--store``), beside the store's own tables, with its own schema version (:func:`migrate`), so
the ledger survives a restart and is shared by every gateway and runner of the state; each
charge is one write transaction of that database, the same as the store's.

**Charged once.** A batch's lines are charged from the runner's output work file, which only
grows by whole lines and is carried byte for byte to the next claim after a kill: the ledger
keeps, per batch, how many bytes of that file are charged (``usage_marks``), and
:meth:`UsageLedger.charge_lines` charges the lines past that mark and moves it in one
transaction, fenced by the runner's claim (a replaced runner charges nothing). A line
recomputed after a kill was never in the file, so it is charged when it is written, once;
the ledger then equals the sums over the batch's published output file exactly. The
Usage API (:mod:`relayllm_service.gateway.usage_api`) reads it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

from relayllm_service.errors import ServiceError, StaleClaimError
from relayllm_service.store.database import Connection, Database

logger = logging.getLogger(__name__)

#: The ledger's resolution: usage is kept per minute and summed into wider buckets on read.
MINUTE = 60

_SCHEMA_VERSION = 2
#: What each version of the ledger's tables adds to the one before (``schema_parts``
#: remembers each part's version: the store's own ``user_version`` is the store's).
_MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE usage (
    project TEXT NOT NULL,
    batch_id TEXT NOT NULL,
    model TEXT NOT NULL,
    minute INTEGER NOT NULL,
    requests INTEGER NOT NULL DEFAULT 0,
    input_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (project, batch_id, model, minute)
);
CREATE INDEX usage_by_minute ON usage (minute);
CREATE TABLE usage_marks (
    batch_id TEXT PRIMARY KEY,
    charged_bytes INTEGER NOT NULL,
    charged_lines INTEGER NOT NULL
)
""",
    2: "ALTER TABLE usage ADD COLUMN engine_s REAL NOT NULL DEFAULT 0",
}


def _same(statement: str) -> str:
    return statement


def migrate(
    db: Connection,
    part: str,
    version: int,
    steps: dict[int, str],
    ddl: Callable[[str], str] = _same,
) -> None:
    """Bring the tables of ``part`` to ``version`` (inside the caller's write transaction):
    each part of the state beside the store keeps its version in ``schema_parts``. ``ddl``:
    the database's words for each statement (:meth:`Database.ddl`; SQLite's as written)."""
    db.execute(
        ddl("CREATE TABLE IF NOT EXISTS schema_parts (part TEXT PRIMARY KEY, version INTEGER)")
    )
    row = db.execute("SELECT version FROM schema_parts WHERE part = ?", (part,)).fetchone()
    have = 0 if row is None else int(row[0])
    if have > version:
        raise ServiceError(
            f"the job store's {part} tables were written by a newer relayllm (version {have}, "
            f"this one knows {version}); upgrade relayllm"
        )
    for step in range(have + 1, version + 1):
        for statement in steps[step].split(";"):
            if statement.strip():
                db.execute(ddl(statement))
    db.execute(
        "INSERT INTO schema_parts (part, version) VALUES (?, ?) "
        "ON CONFLICT (part) DO UPDATE SET version = excluded.version",
        (part, version),
    )


@dataclass(frozen=True)
class Use:
    """One request's usage (or several requests' summed)."""

    requests: int = 1
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    engine_s: float = 0.0

    def __add__(self, other: Use) -> Use:
        return Use(
            self.requests + other.requests,
            self.input_tokens + other.input_tokens,
            self.cached_tokens + other.cached_tokens,
            self.output_tokens + other.output_tokens,
            self.engine_s + other.engine_s,
        )


def use_of(usage: Any) -> Use:
    """A response body's ``usage`` as a :class:`Use` (chat and completions' ``prompt_tokens``,
    the Responses API's ``input_tokens``; embeddings have no output tokens)."""
    if not isinstance(usage, dict):
        return Use()
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return Use(
        1,
        _count(usage.get("prompt_tokens", usage.get("input_tokens"))),
        _count(details.get("cached_tokens") if isinstance(details, dict) else None),
        _count(usage.get("completion_tokens", usage.get("output_tokens"))),
    )


def body_use(body: dict[str, Any]) -> Use:
    """A response body's usage and its engine time (relayllm's ``engine_s``, beside
    ``usage``)."""
    engine = body.get("engine_s")
    seconds = float(engine) if isinstance(engine, int | float) and engine > 0 else 0.0
    return replace(use_of(body.get("usage")), engine_s=seconds)


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def line_use(text: str, now: int) -> tuple[str, int, Use] | None:
    """An output line's (model, the minute it was answered, usage); None for a line that
    is not a response (an error file's line has nothing to charge)."""
    try:
        line = json.loads(text)
        body = line["response"]["body"]
    except (ValueError, KeyError, TypeError):
        return None
    if not isinstance(body, dict):
        return None
    created = body.get("created", body.get("created_at"))
    at = created if isinstance(created, int) and not isinstance(created, bool) else now
    return str(body.get("model") or "unknown"), at - at % MINUTE, body_use(body)


class UsageLedger:
    """The ledger in the job store's database at ``location`` (an SQLite file's path or a
    ``postgresql://`` URL, as the store's; its own connection, whose write transactions go
    one at a time with the store's, in any process). ``recording=False``
    (``ServiceSettings.record_usage``, a service that does no accounting): nothing is
    recorded or charged, and what was recorded before is read as ever."""

    def __init__(
        self,
        location: str,
        *,
        clock: Callable[[], float] = time.time,
        timeout_s: float = 30.0,
        recording: bool = True,
    ) -> None:
        from relayllm_service.store.location import open_database

        self.database: Database = open_database(location, clock=clock, timeout_s=timeout_s)
        self.path = self.database.path
        self.recording = recording
        try:
            with self.write() as db:
                migrate(db, "usage", _SCHEMA_VERSION, _MIGRATIONS, self.database.ddl)
        except BaseException:
            self.database.close()
            raise

    def __repr__(self) -> str:
        return f"UsageLedger({self.path!r})"

    def now(self) -> int:
        return self.database.now()

    def close(self) -> None:
        self.database.close()

    @contextmanager
    def write(self) -> Iterator[Connection]:
        """A write transaction on the ledger's database (one writer at a time)."""
        with self.database.write() as db:
            yield db

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction on the ledger's database (a snapshot)."""
        with self.database.read() as db:
            yield db

    # -- recording -------------------------------------------------------------------------

    def record(self, project: str, model: str, use: Use, *, at: int | None = None) -> None:
        """An online request's usage (``at``: when it was answered; default now)."""
        if not self.recording:
            return
        minute = self.now() if at is None else int(at)
        with self.write() as db:
            _add(db, project, "", model, minute - minute % MINUTE, use)

    def charge_lines(self, batch_id: str, claim: int, path: str) -> int:
        """Charge the batch's output lines in ``path`` past the bytes charged so far, and move
        the mark past them, in one transaction; returns the lines charged. Refused
        (:class:`StaleClaimError`, nothing charged) unless ``claim`` is the batch's current
        claim. A line cut short at the file's end waits for its newline (a kill's trimmed
        tail never is one). Not recording: nothing read, nothing charged, the mark left
        where it is."""
        if not self.recording:
            return 0
        with self.write() as db:
            row = db.execute(
                "SELECT project, claim FROM batches WHERE id = ?", (batch_id,)
            ).fetchone()
            if row is None or int(row["claim"]) != claim:
                raise StaleClaimError(
                    f"claim {claim} on batch {batch_id!r} is not the current one; nothing "
                    f"was charged"
                )
            mark = db.execute(
                "SELECT charged_bytes, charged_lines FROM usage_marks WHERE batch_id = ?",
                (batch_id,),
            ).fetchone()
            start, lines = (0, 0) if mark is None else (int(mark[0]), int(mark[1]))
            size = os.path.getsize(path) if os.path.exists(path) else 0
            if size < start:  # the work file is not the one charged from: never charge twice
                logger.warning("batch %s: its output work file is shorter than charged", batch_id)
                return 0
            with open(path, "rb") as source:
                source.seek(start)
                chunk = source.read(size - start)
            whole = chunk[: chunk.rfind(b"\n") + 1]
            sums: dict[tuple[str, int], Use] = {}
            now, charged = self.now(), 0
            for raw in whole.splitlines():
                found = line_use(raw.decode("utf-8", "replace"), now) if raw.strip() else None
                if found is not None:
                    key = found[:2]
                    sums[key] = sums[key] + found[2] if key in sums else found[2]
                    charged += 1
            for (model, minute), use in sums.items():
                _add(db, str(row["project"]), batch_id, model, minute, use)
            db.execute(
                "INSERT INTO usage_marks (batch_id, charged_bytes, charged_lines) "
                "VALUES (?, ?, ?) ON CONFLICT (batch_id) DO UPDATE SET "
                "charged_bytes = excluded.charged_bytes, charged_lines = excluded.charged_lines",
                (batch_id, start + len(whole), lines + charged),
            )
        return charged

    # -- reading ---------------------------------------------------------------------------

    def rows(
        self,
        start: int,
        end: int,
        *,
        projects: list[str] | None = None,
        models: list[str] | None = None,
        batch: bool | None = None,
    ) -> list[Any]:
        """The ledger's minute rows in ``[start, end)``, filtered (``batch``: True batch lines
        only, False online requests only)."""
        where: list[str] = ["minute >= ?", "minute < ?"]
        args: list[object] = [start, end]
        for column, values in (("project", projects), ("model", models)):
            if values:
                where.append(f"{column} IN ({', '.join('?' * len(values))})")
                args.extend(values)
        if batch is not None:
            where.append("batch_id != ''" if batch else "batch_id = ''")
        with self.read() as db:
            return db.execute(
                f"SELECT * FROM usage WHERE {' AND '.join(where)} ORDER BY minute", args
            ).fetchall()

    def batch_totals(self, batch_id: str) -> dict[str, Use]:
        """A batch's usage per model, summed over its minutes."""
        with self.read() as db:
            found = db.execute(
                "SELECT model, SUM(requests), SUM(input_tokens), SUM(cached_tokens), "
                "SUM(output_tokens), SUM(engine_s) FROM usage WHERE batch_id = ? "
                "GROUP BY model ORDER BY model",
                (batch_id,),
            ).fetchall()
        return {
            str(r[0]): Use(int(r[1]), int(r[2]), int(r[3]), int(r[4]), float(r[5])) for r in found
        }


def _add(db: Connection, project: str, batch_id: str, model: str, minute: int, use: Use):
    # The columns named by their table: PostgreSQL finds a bare one ambiguous with excluded's.
    db.execute(
        "INSERT INTO usage (project, batch_id, model, minute, requests, input_tokens, "
        "cached_tokens, output_tokens, engine_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
        "ON CONFLICT (project, batch_id, model, minute) DO UPDATE SET "
        "requests = usage.requests + excluded.requests, "
        "input_tokens = usage.input_tokens + excluded.input_tokens, "
        "cached_tokens = usage.cached_tokens + excluded.cached_tokens, "
        "output_tokens = usage.output_tokens + excluded.output_tokens, "
        "engine_s = usage.engine_s + excluded.engine_s",
        (
            project,
            batch_id,
            model,
            minute,
            use.requests,
            use.input_tokens,
            use.cached_tokens,
            use.output_tokens,
            use.engine_s,
        ),
    )


__all__ = ["MINUTE", "UsageLedger", "Use", "body_use", "line_use", "migrate", "use_of"]
