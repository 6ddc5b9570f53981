"""The batch service's job store, the same tests on both stores (a real SQLite file and a
real PostgreSQL server's database, ``db_path``'s two params): OpenAI's status cycle, runner
claims that fence every write, projects that never see each other's rows, and OpenAI's list
cursors.

The fencing and isolation scenarios are functions run against the real store and, to show they
can fail, against a store with the one check removed."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading

import pytest

from relayllm_service.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    NotFoundError,
    ServiceError,
    StaleClaimError,
)
from relayllm_service.ids import is_batch_id, is_file_id
from relayllm_service.store.claims import ClaimedWrites
from relayllm_service.store.location import open_database, open_store
from relayllm_service.store.records import STAMPS, TRANSITIONS, RequestCounts
from relayllm_service.store.sql import SQLJobStore
from relayllm_service.store.sqlite import SQLiteJobStore

STATUSES = list(TRANSITIONS)


class Clock:
    """Time the test sets, so each stamp is known."""

    def __init__(self, now: float = 1_700_000_000) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def sqlite_path(tmp_path):
    return str(tmp_path / "jobs.sqlite")


@pytest.fixture(params=["sqlite", "postgresql"])
def db_path(request, sqlite_path):
    """Where the store is: an SQLite file, or a fresh database on the session's PostgreSQL."""
    if request.param == "sqlite":
        return sqlite_path
    return request.getfixturevalue("postgres_url")


def raw(location, sql, parameters=()):
    """``sql`` run on the store's database beside the store (its own connection, committed);
    the rows it returns."""
    if location.startswith("postgresql:"):
        import psycopg

        with psycopg.connect(location, autocommit=True) as db:
            cursor = db.execute(sql.replace("?", "%s"), parameters)
            return cursor.fetchall() if cursor.description else []
    db = sqlite3.connect(location, isolation_level=None)
    try:
        return db.execute(sql, parameters).fetchall()
    finally:
        db.close()


@pytest.fixture
def store(db_path, clock):
    s = open_store(db_path, clock=clock)
    yield s
    s.close()


def new_batch(store, project="alpha", **kwargs):
    source = store.add_file(project, filename="in.jsonl", purpose="batch", bytes=10)
    kwargs.setdefault("endpoint", "/v1/chat/completions")
    return store.create_batch(project, input_file_id=source.id, **kwargs)


#: A way to each status from validating (cancelling goes through the client's cancel).
PATHS = {
    "validating": [],
    "in_progress": ["in_progress"],
    "finalizing": ["in_progress", "finalizing"],
    "completed": ["in_progress", "finalizing", "completed"],
    "failed": ["failed"],
    "expired": ["in_progress", "expired"],
    "cancelling": ["cancel"],
    "cancelled": ["cancel", "cancelled"],
}


def reach(store, status):
    batch = new_batch(store)
    claim = store.claim(batch.id, "runner-a")
    for step in PATHS[status]:
        if step == "cancel":
            store.cancel_batch(batch.project, batch.id)
        else:
            store.update(batch.id, claim, status=step)
    assert store.get_batch(batch.project, batch.id).status == status
    return batch, claim


def test_a_batch_and_its_file_survive_reopening_the_store(db_path, clock):
    first = open_store(db_path, clock=clock)
    batch = new_batch(first, metadata={"team": "search"})
    first.close()
    again = open_store(db_path, clock=clock)
    try:
        found = again.get_batch("alpha", batch.id)
        assert found == batch
        assert (found.status, found.metadata, found.created_at) == (
            "validating",
            {"team": "search"},
            int(clock.now),
        )
        assert found.expires_at == found.created_at + 24 * 3600
        assert again.get_file("alpha", batch.input_file_id).purpose == "batch"
    finally:
        again.close()
    assert is_batch_id(batch.id) and is_file_id(batch.input_file_id)


def test_the_sqlite_store_runs_in_wal_mode_with_full_sync(sqlite_path):
    store = SQLiteJobStore(sqlite_path)
    try:
        assert raw(sqlite_path, "PRAGMA journal_mode") == [("wal",)]
        assert store.file._db.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    finally:
        store.close()


def set_schema_version(location, version):
    """The job store's schema version, written as each database keeps it."""
    if location.startswith("postgresql:"):
        raw(location, "UPDATE schema_parts SET version = ? WHERE part = 'jobs'", (version,))
    else:
        raw(location, f"PRAGMA user_version={version}")


def test_a_store_written_by_a_newer_schema_is_refused(db_path):
    open_store(db_path).close()
    set_schema_version(db_path, 99)
    with pytest.raises(ServiceError, match="newer relayllm"):
        open_store(db_path)


def test_the_happy_path_stamps_each_status(store, clock):
    batch = new_batch(store)
    claim = store.claim(batch.id, "runner-a")
    for status in ["in_progress", "finalizing", "completed"]:
        clock.now += 10
        record = store.update(batch.id, claim, status=status)
        assert record.status == status
        assert getattr(record, STAMPS[status]) == int(clock.now)
        assert record.heartbeat_at == int(clock.now), "a runner's write is its heartbeat"
    assert (record.in_progress_at, record.finalizing_at, record.completed_at) == (
        batch.created_at + 10,
        batch.created_at + 20,
        batch.created_at + 30,
    )
    assert record.terminal


@pytest.mark.parametrize("current", STATUSES)
def test_every_status_change_is_checked_against_the_cycle(db_path, clock, current):
    """From each status, each target: the allowed ones stamp their time, the others raise
    and leave the row as it was."""
    for target in STATUSES:
        if target == current:
            continue
        store = open_store(db_path, clock=clock)
        try:
            batch, claim = reach(store, current)
            before = store.get_batch("alpha", batch.id)
            if target in TRANSITIONS[current]:
                after = store.update(batch.id, claim, status=target)
                assert after.status == target and getattr(after, STAMPS[target]) is not None
            else:
                with pytest.raises(IllegalTransitionError):
                    store.update(batch.id, claim, status=target)
                assert store.get_batch("alpha", batch.id) == before
        finally:
            store.close()


def test_a_finished_batch_takes_no_more_writes(store):
    batch, claim = reach(store, "completed")
    with pytest.raises(IllegalTransitionError, match="completed"):
        store.update(batch.id, claim, request_counts=RequestCounts(3, 3, 0))
    with pytest.raises(IllegalTransitionError, match="nothing to run"):
        store.claim(batch.id, "runner-b")
    assert store.get_batch("alpha", batch.id).request_counts == RequestCounts()


def test_cancel_moves_to_cancelling_once_and_refuses_a_finished_batch(store, clock):
    batch = new_batch(store)
    clock.now += 5
    cancelling = store.cancel_batch("alpha", batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at == int(clock.now)
    clock.now += 5
    assert store.cancel_batch("alpha", batch.id) == cancelling, "asking again changes nothing"
    done, _ = reach(store, "completed")
    with pytest.raises(IllegalTransitionError):
        store.cancel_batch("alpha", done.id)
    finishing, _ = reach(store, "finalizing")
    with pytest.raises(IllegalTransitionError, match="finalizing to cancelling"):
        store.cancel_batch("alpha", finishing.id)


def test_counts_files_and_errors_are_written_by_the_claim_holder(store):
    batch = new_batch(store)
    claim = store.claim(batch.id, "runner-a")
    out = store.add_batch_file(
        batch.id, claim, filename="out.jsonl", purpose="batch_output", bytes=5
    )
    assert out.project == "alpha", "a runner's file belongs to the batch's project"
    problems = [{"code": "invalid_json", "message": "m", "param": None, "line": 2}]
    record = store.update(
        batch.id,
        claim,
        request_counts=RequestCounts(10, 4, 1),
        output_file_id=out.id,
        errors=problems,
    )
    assert record.request_counts == RequestCounts(10, 4, 1)
    assert (record.output_file_id, record.errors) == (out.id, problems)
    with pytest.raises(ValueError, match="impossible"):
        store.update(batch.id, claim, request_counts=RequestCounts(3, 3, 1))
    assert store.get_batch("alpha", batch.id).request_counts == RequestCounts(10, 4, 1)


def test_completion_window_metadata_and_input_file_are_checked(store):
    source = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=1)
    create = store.create_batch
    with pytest.raises(InvalidRequestError, match="completion_window"):
        create("alpha", input_file_id=source.id, endpoint="/v1/completions", completion_window="1h")
    for bad in ({str(i): "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}, {"k": 1}):
        with pytest.raises(InvalidRequestError) as caught:
            create("alpha", input_file_id=source.id, endpoint="/v1/completions", metadata=bad)
        assert caught.value.param == "metadata"
    output = store.add_file("alpha", filename="o.jsonl", purpose="batch_output", bytes=1)
    with pytest.raises(InvalidRequestError, match="not 'batch'"):
        create("alpha", input_file_id=output.id, endpoint="/v1/completions")
    with pytest.raises(InvalidRequestError, match="purpose"):
        store.add_file("alpha", filename="x", purpose="fine-tune", bytes=1)
    with pytest.raises(InvalidRequestError, match="not a file id"):
        store.add_file("alpha", filename="x", purpose="batch", bytes=1, file_id="../x")
    chosen = store.add_file("alpha", filename="x", purpose="batch", bytes=1, file_id="file-abc")
    assert store.get_file("alpha", "file-abc") == chosen, "the id the storage wrote under"
    short = create("alpha", input_file_id=source.id, endpoint="/v1/completions", window_s=3)
    assert short.expires_at == short.created_at + 3, "the server's shorter window"
    assert short.completion_window == "24h"
    assert [b.id for b in store.list_batches("alpha").data] == [short.id], "refused ones left none"


# -- claims and fencing ---------------------------------------------------------------------


def fencing_scenario(make_store):
    """Two runners on one store file (two connections, as two processes have): the second
    claim fences the first runner out of every kind of write."""
    a, b = make_store(), make_store()
    try:
        batch = new_batch(a)
        first = a.claim(batch.id, "runner-a")
        a.update(batch.id, first, status="in_progress", request_counts=RequestCounts(5, 1, 0))
        second = b.claim(batch.id, "runner-b")
        assert second == first + 1
        before = b.get_batch("alpha", batch.id)
        assert before.runner == "runner-b"
        for write in (
            lambda: a.update(batch.id, first, request_counts=RequestCounts(5, 5, 0)),
            lambda: a.update(batch.id, first, status="finalizing"),
            lambda: a.update(batch.id, first),  # even a heartbeat
            lambda: a.add_batch_file(
                batch.id, first, filename="o", purpose="batch_output", bytes=1
            ),
        ):
            with pytest.raises(StaleClaimError, match="nothing was written"):
                write()
        after = b.get_batch("alpha", batch.id)
        assert after == before, "a refused write changed the batch"
        files = b.list_files("alpha").data
        assert [f.purpose for f in files] == ["batch"], "a stale runner left a file"
        done = b.update(
            batch.id, second, status="finalizing", request_counts=RequestCounts(5, 5, 0)
        )
        assert done.status == "finalizing"
    finally:
        a.close()
        b.close()


def test_a_newer_claim_fences_every_write_of_the_older_one(db_path):
    fencing_scenario(lambda: open_store(db_path))


class UnfencedWrites(ClaimedWrites):
    """The runners' writes with their claim check removed."""

    def _check_claim(self, row, claim):
        pass


def unfenced_store(path):
    store = open_store(path)
    store.runner = UnfencedWrites(store.file)  # the store's part for the runners' calls
    return store


def test_the_fencing_scenario_fails_on_a_store_without_the_check(db_path):
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        fencing_scenario(lambda: unfenced_store(db_path))


def test_a_claim_number_from_the_future_is_refused_too(store):
    batch = new_batch(store)
    claim = store.claim(batch.id, "runner-a")
    with pytest.raises(StaleClaimError):
        store.update(batch.id, claim + 1, status="in_progress")
    with pytest.raises(StaleClaimError):
        store.update(batch.id, 0, status="in_progress")  # never claimed with 0


def test_concurrent_claims_from_many_connections_get_distinct_numbers(db_path, store):
    batch = new_batch(store)
    got: list[int] = []
    lock = threading.Lock()

    def claim(i: int) -> None:
        own = open_store(db_path)
        try:
            for _ in range(5):
                number = own.claim(batch.id, f"runner-{i}")
                with lock:
                    got.append(number)
        finally:
            own.close()

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 31))
    assert store.get_batch("alpha", batch.id).claim == 30


def test_a_claim_taken_by_another_process_fences_this_one(db_path, store):
    """The claim check holds across processes (the database's lock, not this process's)."""
    batch = new_batch(store)
    mine = store.claim(batch.id, "runner-here")
    code = (
        "import sys\n"
        "from relayllm_service.store.location import open_store\n"
        "s = open_store(sys.argv[1]); print(s.claim(sys.argv[2], 'runner-there')); s.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, db_path, batch.id],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert int(done.stdout) == mine + 1
    with pytest.raises(StaleClaimError, match="runner-there"):
        store.update(batch.id, mine, status="in_progress")
    assert store.get_batch("alpha", batch.id).status == "validating"


def test_unfinished_batches_are_listed_oldest_first_across_projects(store):
    first = new_batch(store, "alpha")
    finished, _ = reach(store, "failed")
    second = new_batch(store, "beta")
    cancelling, _ = reach(store, "cancelling")
    assert [b.id for b in store.unfinished()] == [first.id, second.id, cancelling.id]
    assert finished.id not in {b.id for b in store.unfinished()}


# -- projects -------------------------------------------------------------------------------


def isolation_scenario(store):
    """What project beta can do with project alpha's ids: exactly what it can do with ids that
    do not exist (the same error, the same words), and alpha's rows stay as they were."""
    batch = new_batch(store, "alpha")
    source = batch.input_file_id
    alpha_before = (store.get_batch("alpha", batch.id), store.get_file("alpha", source))
    unknown_batch, unknown_file = "batch_" + "0" * 32, "file-" + "0" * 24
    attempts = {
        "get_batch": lambda b, f: store.get_batch("beta", b),
        "cancel_batch": lambda b, f: store.cancel_batch("beta", b),
        "list_batches after": lambda b, f: store.list_batches("beta", after=b),
        "get_file": lambda b, f: store.get_file("beta", f),
        "delete_file": lambda b, f: store.delete_file("beta", f),
        "list_files after": lambda b, f: store.list_files("beta", after=f),
        "create_batch": lambda b, f: store.create_batch(
            "beta", input_file_id=f, endpoint="/v1/completions"
        ),
    }
    for name, attempt in attempts.items():
        with pytest.raises(NotFoundError) as theirs:
            attempt(batch.id, source)
        with pytest.raises(NotFoundError) as nobodys:
            attempt(unknown_batch, unknown_file)
        words = str(theirs.value).replace(batch.id, "ID").replace(source, "ID")
        assert words == str(nobodys.value).replace(unknown_batch, "ID").replace(
            unknown_file, "ID"
        ), name
    assert store.list_batches("beta").data == [] and store.list_files("beta").data == []
    assert (store.get_batch("alpha", batch.id), store.get_file("alpha", source)) == alpha_before
    # a runner's write may not attach another project's file to a batch
    theirs = new_batch(store, "beta")
    claim = store.claim(theirs.id, "runner")
    with pytest.raises(NotFoundError):
        store.update(theirs.id, claim, output_file_id=source)
    assert store.get_batch("beta", theirs.id).output_file_id is None


def test_a_project_never_sees_another_projects_files_or_batches(store):
    isolation_scenario(store)


class LeakyStore(SQLJobStore):
    """The store with the project left out of its batch and file lookups."""

    def _batch_row(self, db, batch_id, project):
        return super()._batch_row(db, batch_id, None)

    def _file_row(self, db, project, file_id):
        row = db.execute(
            "SELECT seq, id, project, filename, purpose, bytes, created_at, expires_at "
            "FROM files WHERE id = ?",
            (file_id,),
        ).fetchone()
        if row is None:
            raise NotFoundError(f"no file {file_id!r}")
        return row


def test_the_isolation_scenario_fails_on_a_store_that_ignores_projects(db_path):
    leaky = LeakyStore(open_database(db_path))
    try:
        with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
            isolation_scenario(leaky)
    finally:
        leaky.close()


# -- lists ----------------------------------------------------------------------------------


def test_batches_list_newest_first_with_openai_cursors(store):
    made = [new_batch(store).id for _ in range(5)]
    new_batch(store, "beta")  # another project's batch is never on alpha's pages
    newest_first = made[::-1]
    page = store.list_batches("alpha", limit=2)
    assert [b.id for b in page.data] == newest_first[:2] and page.has_more
    page = store.list_batches("alpha", after=page.data[-1].id, limit=2)
    assert [b.id for b in page.data] == newest_first[2:4] and page.has_more
    page = store.list_batches("alpha", after=page.data[-1].id, limit=2)
    assert [b.id for b in page.data] == newest_first[4:] and not page.has_more
    full = store.list_batches("alpha", limit=5)
    assert [b.id for b in full.data] == newest_first and not full.has_more
    assert store.list_batches("alpha", after=made[0]).data == []
    assert [b.id for b in store.list_batches("alpha").data] == newest_first  # default 20
    for bad in (0, 101, -1, True, "5"):
        with pytest.raises(InvalidRequestError):
            store.list_batches("alpha", limit=bad)


def test_files_list_in_either_order_by_purpose_with_cursors(store):
    made = [
        store.add_file(
            "alpha", filename=f"f{i}", purpose="batch" if i % 2 else "batch_output", bytes=i
        ).id
        for i in range(6)
    ]
    assert [f.id for f in store.list_files("alpha").data] == made[::-1]
    asc = store.list_files("alpha", order="asc", limit=4)
    assert [f.id for f in asc.data] == made[:4] and asc.has_more
    rest = store.list_files("alpha", order="asc", after=made[3])
    assert [f.id for f in rest.data] == made[4:] and not rest.has_more
    assert [f.id for f in store.list_files("alpha", purpose="batch").data] == made[5::-2]
    with pytest.raises(InvalidRequestError):
        store.list_files("alpha", order="sideways")


def test_deleting_a_file_removes_only_that_projects_record(store):
    kept = store.add_file("alpha", filename="a", purpose="batch", bytes=1)
    gone = store.add_file("alpha", filename="b", purpose="batch", bytes=2)
    assert store.delete_file("alpha", gone.id) == gone
    with pytest.raises(NotFoundError):
        store.get_file("alpha", gone.id)
    with pytest.raises(NotFoundError):
        store.delete_file("alpha", gone.id)
    assert [f.id for f in store.list_files("alpha").data] == [kept.id]


def test_metadata_and_errors_are_stored_as_json(store, db_path):
    batch = new_batch(store, metadata={"a": "1"})
    (stored,) = raw(db_path, "SELECT metadata FROM batches WHERE id = ?", (batch.id,))
    assert json.loads(stored[0]) == {"a": "1"}


def test_a_live_holders_claim_is_not_taken_until_its_lease_runs_out(store, clock):
    from relayllm_service.errors import ClaimHeldError

    batch = new_batch(store)
    first = store.claim(batch.id, "runner-a", lease_s=10)
    clock.now += 5
    with pytest.raises(ClaimHeldError):
        store.claim(batch.id, "runner-b", lease_s=10)
    clock.now += 4
    store.update(batch.id, first)  # runner-a's heartbeat
    clock.now += 9
    with pytest.raises(ClaimHeldError):
        store.claim(batch.id, "runner-b", lease_s=10)
    assert store.update(batch.id, first).status == "validating"  # still runner-a's
    again = store.claim(batch.id, "runner-a", lease_s=10)  # its own claim: taken again
    clock.now += 10  # no heartbeat for a lease: runner-a is presumed dead
    taken = store.claim(batch.id, "runner-b", lease_s=10)
    assert taken > again > first
    with pytest.raises(StaleClaimError):
        store.update(batch.id, again)


def test_an_expired_file_is_no_file_and_its_record_is_handed_over_for_deletion(store, clock):
    kept = store.add_file("alpha", filename="k.jsonl", purpose="batch", bytes=1)
    brief = store.add_file("alpha", filename="b.jsonl", purpose="batch", bytes=1, expires_s=60)
    assert brief.expires_at == brief.created_at + 60
    assert store.get_file("alpha", brief.id) == brief
    assert store.remove_expired_files() == []
    clock.now += 60
    with pytest.raises(NotFoundError):
        store.get_file("alpha", brief.id)
    assert [f.id for f in store.list_files("alpha").data] == [kept.id]
    with pytest.raises(NotFoundError):  # no batch from an expired input
        store.create_batch("alpha", input_file_id=brief.id, endpoint="/v1/chat/completions")
    assert store.remove_expired_files() == [brief.id]
    assert store.remove_expired_files() == []
    assert store.get_file("alpha", kept.id) == kept


def test_a_batchs_output_files_expire_as_it_asked(store, clock):
    source = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=1)
    batch = store.create_batch(
        "alpha",
        input_file_id=source.id,
        endpoint="/v1/chat/completions",
        output_expires_s=3600,
    )
    claim = store.claim(batch.id, "me")
    store.update(batch.id, claim, status="in_progress")
    store.update(batch.id, claim, status="finalizing")
    assert store.reserve_files(batch.id, claim, ["file-out1"]) == ()
    clock.now += 10
    done = store.finish_batch(
        batch.id,
        claim,
        status="completed",
        request_counts=RequestCounts(1, 1, 0),
        files={"output": ("file-out1", 5)},
    )
    output = store.get_file("alpha", done.output_file_id)
    assert output.expires_at == output.created_at + 3600 == clock.now + 3600
    assert done.pending_files == () and done.output_expires_s == 3600


def test_finish_batch_records_only_reserved_files_and_is_fenced(store):
    source = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=1)
    batch = store.create_batch("alpha", input_file_id=source.id, endpoint="/v1/chat/completions")
    old = store.claim(batch.id, "old")
    store.update(batch.id, old, status="in_progress")
    assert store.reserve_files(batch.id, old, ["file-a1"]) == ()
    new = store.claim(batch.id, "new")
    with pytest.raises(StaleClaimError):
        store.finish_batch(
            batch.id,
            old,
            status="cancelled",
            request_counts=RequestCounts(1, 1, 0),
            files={"output": ("file-a1", 1)},
        )
    assert store.reserve_files(batch.id, new, ["file-b1"]) == ("file-a1",)  # to delete
    with pytest.raises(ValueError, match="not reserved"):
        store.finish_batch(
            batch.id,
            new,
            status="expired",
            request_counts=RequestCounts(1, 1, 0),
            files={"output": ("file-a1", 1)},
        )
    assert [f.purpose for f in store.list_files("alpha").data] == ["batch"]  # nothing half


def test_a_schema_1_store_is_migrated_when_opened(db_path):
    from relayllm_service.store import schema

    database = open_database(db_path)
    with database.write() as db:  # schema 1 as an older relayllm wrote it, no more
        for statement in schema.SCHEMA.split(";"):
            if statement.strip():
                db.execute(database.ddl(statement))
        database.set_schema_version(db, 1)
    database.close()
    opened = open_store(db_path)
    source = opened.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=1)
    batch = opened.create_batch(
        "alpha", input_file_id=source.id, endpoint="/v1/chat/completions", output_expires_s=7
    )
    assert batch.output_expires_s == 7 and batch.pending_files == ()
    opened.close()


# -- the quotas and the usage ledger, on the store's database ------------------------------


def test_the_quotas_refuse_past_each_limit_and_count_online_requests_across_gateways(
    db_path, store, clock
):
    """Files, batches, enqueued tokens and online requests per minute, checked in the
    store's write transactions; a second gateway's store on the same database sees the same
    counts, and a refused request counts nothing."""
    from relayllm_service.tenancy.quotas import Quota, QuotaError, Quotas

    limits = {"alpha": Quota(files=3, batches=1, requests_per_minute=2)}
    limits["beta"] = Quota(enqueued_tokens={"echo": 100})
    quotas = Quotas.install(store, limits)
    first = new_batch(store)  # two files: its input and this one
    store.add_file("alpha", filename="b.jsonl", purpose="batch", bytes=1)
    with pytest.raises(QuotaError) as refused:
        new_batch(store)  # its input is the third file; the batch, the second unfinished
    assert refused.value.code == "batch_limit_exceeded"
    with pytest.raises(QuotaError) as refused:
        store.add_file("alpha", filename="d.jsonl", purpose="batch", bytes=1)
    assert refused.value.code == "file_limit_exceeded"
    assert store.get_batch("alpha", first.id).status == "validating"

    for tokens in (60, 50):
        source = store.add_file("beta", filename="t.jsonl", purpose="batch", bytes=1)
        assert not quotas.has_tokens(store.file, source.id)
        quotas.record_tokens(store.file, source.id, {"echo": tokens})
        quotas.record_tokens(store.file, source.id, {"echo": tokens})  # again: the same
        assert quotas.has_tokens(store.file, source.id)
        if tokens == 60:
            store.create_batch("beta", input_file_id=source.id, endpoint="/v1/chat/completions")
    with pytest.raises(QuotaError) as refused:  # 60 queued + 50 > 100
        store.create_batch("beta", input_file_id=source.id, endpoint="/v1/chat/completions")
    assert refused.value.code == "token_limit_exceeded"

    other = open_store(db_path, clock=clock)  # a second gateway on the same database
    try:
        again = Quotas.install(other, limits)
        minute = 1_700_000_040
        quotas.admit_request(store.file, "alpha", minute + 1)
        again.admit_request(other.file, "alpha", minute + 2)
        for moment in (minute + 30, minute + 59):
            with pytest.raises(QuotaError) as refused:
                (quotas if moment % 2 else again).admit_request(other.file, "alpha", moment)
            assert refused.value.headers == {"Retry-After": str(minute + 60 - moment)}
        counted = raw(db_path, "SELECT count FROM online_requests WHERE project = 'alpha'")
        assert [int(c) for (c,) in counted] == [2]  # the refused ones counted nothing
        again.admit_request(other.file, "alpha", minute + 60)  # the next minute
    finally:
        other.close()


def test_two_gateways_racing_for_the_last_batch_get_one(db_path, clock):
    """Each gateway counts and writes in one write transaction, holding it while it checks
    (slowed here), so of two creates on two connections at once exactly one is admitted."""
    import time

    from relayllm_service.tenancy.quotas import Quota, QuotaError, Quotas

    stores = [open_store(db_path, clock=clock) for _ in range(2)]
    sources = [s.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=1) for s in stores]
    outcomes: list[str] = []
    start = threading.Barrier(2, timeout=30)
    for store in stores:
        checks = Quotas.install(store, {"alpha": Quota(batches=1)})

        def slow(db, record, checks=checks):
            checks(db, record)
            time.sleep(0.3)  # what the other gateway would count, if it could, is read

        store.admit = slow

    def create(store, source):
        start.wait()
        try:
            store.create_batch("alpha", input_file_id=source.id, endpoint="/v1/chat/completions")
            outcomes.append("created")
        except QuotaError as refused:
            outcomes.append(str(refused.code))

    pairs = zip(stores, sources, strict=True)
    threads = [threading.Thread(target=create, args=pair, daemon=True) for pair in pairs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    for s in stores:
        s.close()
    assert sorted(outcomes) == ["batch_limit_exceeded", "created"]
    assert raw(db_path, "SELECT COUNT(*) FROM batches")[0][0] == 1


def output_line(i, model="echo", created=1_700_000_040):
    body = {
        "model": model,
        "created": created,
        "usage": {"prompt_tokens": 10 + i, "completion_tokens": i},
        "engine_s": 0.5,
    }
    return json.dumps({"custom_id": f"r{i}", "response": {"status_code": 200, "body": body}})


def test_the_usage_ledger_charges_each_line_once_fenced_by_the_claim(db_path, store, tmp_path):
    from relayllm_service.tenancy.usage import UsageLedger, Use

    ledger = UsageLedger(db_path)
    try:
        batch = new_batch(store)
        claim = store.claim(batch.id, "runner-a")
        work = tmp_path / "out.jsonl"
        work.write_text(output_line(1) + "\n" + output_line(2, model="big") + "\n" + "{cut")
        assert ledger.charge_lines(batch.id, claim, str(work)) == 2
        assert ledger.charge_lines(batch.id, claim, str(work)) == 0  # charged once
        newer = store.claim(batch.id, "runner-b")
        with pytest.raises(StaleClaimError):
            ledger.charge_lines(batch.id, claim, str(work))
        work.write_text(work.read_text()[: -len("{cut")] + output_line(3) + "\n")
        assert ledger.charge_lines(batch.id, newer, str(work)) == 1
        assert ledger.charge_lines(batch.id, newer, str(work)) == 0  # the mark moved again
        assert ledger.batch_totals(batch.id) == {
            "big": Use(1, 12, 0, 2, 0.5),
            "echo": Use(2, 11 + 13, 0, 1 + 3, 1.0),
        }
        ledger.record("alpha", "echo", Use(1, 7, 2, 3), at=1_700_000_041)
        (online,) = ledger.rows(1_700_000_040, 1_700_000_100, batch=False)
        assert (online["batch_id"], online["requests"], online["cached_tokens"]) == ("", 1, 2)
        assert len(ledger.rows(1_700_000_040, 1_700_000_100, batch=True)) == 2
    finally:
        ledger.close()


def test_the_ledgers_and_quotas_tables_migrate_once_and_refuse_a_newer_schema(db_path, store):
    from relayllm_service.tenancy.quotas import Quotas
    from relayllm_service.tenancy.usage import UsageLedger

    Quotas.install(store, {})
    Quotas.install(store, {})  # twice: migrated once
    for _ in range(2):
        UsageLedger(db_path).close()
    parts = raw(db_path, "SELECT part, version FROM schema_parts WHERE part != 'jobs'")
    assert sorted((p, int(v)) for p, v in parts) == [("quotas", 2), ("usage", 2)]
    raw(db_path, "UPDATE schema_parts SET version = 99 WHERE part = 'usage'")
    with pytest.raises(ServiceError, match="newer relayllm"):
        UsageLedger(db_path)
