"""The replica's parts, each on its own, without Ray: the row cache (a retried call computed
once, a cancelled caller's work finished for its retry, a failed call remembered nowhere),
health and retirement (a hung engine fails the waiting calls; a busy one is not hung), and the
replica's info() keys that tests and ``relayllm status`` read."""

from __future__ import annotations

import asyncio

import pytest

from relayllm.errors import CallFailedError, EngineFailedError
from relayllm.serving.health import EngineWatch
from relayllm.serving.replica import Replica
from relayllm.serving.rowcache import RowCache
from relayllm.testing.echo import EchoEngine
from relayllm.testing.echo_options import EchoOptions

pytestmark = pytest.mark.usefixtures("echo_backend")


def _rows(*ids: str) -> list[dict]:
    return [{"task": "completion", "prompt": i, "request_id": i} for i in ids]


class Counting:
    """A compute function that counts the rows it computes and can be held or fail."""

    def __init__(self) -> None:
        self.computed: list[str] = []
        self.release = asyncio.Event()
        self.release.set()
        self.fail: BaseException | None = None

    async def __call__(self, fresh: list[dict]) -> list[dict]:
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        self.computed += [r["request_id"] for r in fresh]
        return [{"generated_text": r["prompt"]} for r in fresh]


def test_a_retried_call_is_computed_once():
    async def scenario():
        cache, compute = RowCache(), Counting()
        first = await cache.run(_rows("a", "b"), compute)
        again = await cache.run(_rows("b", "a", "c"), compute)
        assert [r["generated_text"] for r in again] == ["b", "a", "c"]
        assert first == again[1::-1] and compute.computed == ["a", "b", "c"]

    asyncio.run(scenario())


def test_a_retry_joins_the_work_its_cancelled_first_try_started():
    async def scenario():
        cache, compute = RowCache(), Counting()
        compute.release.clear()
        first = asyncio.create_task(cache.run(_rows("a", "b"), compute))
        await asyncio.sleep(0.01)
        first.cancel()  # the caller timed out; the computation goes on
        retry = asyncio.create_task(cache.run(_rows("a", "b"), compute))
        await asyncio.sleep(0.01)
        compute.release.set()
        assert [r["generated_text"] for r in await retry] == ["a", "b"]
        assert compute.computed == ["a", "b"]

    asyncio.run(scenario())


def test_rows_a_cancelled_caller_left_are_still_counted_as_computing_until_they_end():
    async def scenario():
        cache, compute = RowCache(), Counting()
        compute.release.clear()
        caller = asyncio.create_task(cache.run(_rows("a", "b", "c"), compute))
        await asyncio.sleep(0.01)
        caller.cancel()  # the batch was cancelled: its caller is gone, the rows are not
        await asyncio.sleep(0.01)
        assert cache.computing == 3
        compute.release.set()
        while cache.computing:
            await asyncio.sleep(0.01)
        assert compute.computed == ["a", "b", "c"]
        compute.fail = EngineFailedError("dead")
        with pytest.raises(EngineFailedError):
            await cache.run(_rows("d"), compute)
        assert cache.computing == 0

    asyncio.run(scenario())


@pytest.mark.parametrize("error", [EngineFailedError("dead"), CallFailedError("again")])
def test_a_failed_call_is_remembered_nowhere_and_computed_again(error):
    async def scenario():
        cache, compute = RowCache(), Counting()
        compute.fail = error
        with pytest.raises(type(error)):
            await cache.run(_rows("a"), compute)
        compute.fail = None
        assert (await cache.run(_rows("a"), compute))[0]["generated_text"] == "a"
        assert compute.computed == ["a"]

    asyncio.run(scenario())


def test_the_cache_forgets_the_oldest_rows_past_its_size():
    async def scenario():
        cache, compute = RowCache(size=2), Counting()
        await cache.run(_rows("a", "b", "c"), compute)
        await cache.run(_rows("a"), compute)  # forgotten: computed again
        assert compute.computed == ["a", "b", "c", "a"] and len(cache) == 2

    asyncio.run(scenario())


def test_an_engine_failure_fails_the_calls_waiting_on_it():
    async def scenario():
        cache, compute = RowCache(), Counting()
        compute.release.clear()
        watch = EngineWatch(
            "unit", compute.release.wait, cache.fail_inflight, lambda: None, retire=False
        )
        waiting = asyncio.create_task(cache.run(_rows("a"), compute))
        await asyncio.sleep(0.01)
        watch.failed("the engine died")
        with pytest.raises(EngineFailedError, match="the engine died"):
            await waiting
        with pytest.raises(EngineFailedError):
            watch.check_serving()  # no new work on a replica on its way out

    asyncio.run(scenario())


def test_a_hung_engine_is_found_by_the_health_check_and_a_busy_one_is_not():
    async def scenario():
        failures: list[str] = []
        hang = asyncio.Event()
        watch = EngineWatch("unit", hang.wait, failures.append, lambda: None, retire=False)
        with pytest.raises(EngineFailedError, match="hung"):
            await watch.check(0.05)
        assert failures and "hung" in failures[0]

        busy = EngineWatch("unit", hang.wait, failures.append, lambda: None, retire=False)

        async def answering() -> None:
            await asyncio.sleep(0.02)
            busy.answered()  # a row finished while the probe waited

        asyncio.get_running_loop().create_task(answering())
        await busy.check(0.05)  # slow to answer, but finishing rows: not hung
        assert busy.failure is None

    asyncio.run(scenario())


def test_a_slow_remote_engine_is_not_retired():
    async def scenario():
        failures: list[str] = []
        never = asyncio.Event()
        watch = EngineWatch(
            "unit", never.wait, failures.append, lambda: None, retire_when_hung=False, retire=False
        )
        with pytest.raises(TimeoutError):
            await watch.check(0.05)
        assert watch.failure is None and not failures

    asyncio.run(scenario())


def test_info_keeps_the_keys_status_and_tests_read():
    async def scenario():
        replica = Replica(EchoEngine, EchoOptions(), {"name": "unit"})
        await replica.process_batch(_rows("a", "b"))
        info = await replica.info()
        for key in ("backend", "deployment", "replica_id", "node_id", "pid", "calls", "rows"):
            assert key in info, key
        for key in (
            "ongoing",
            "peak_ongoing",
            "computing_rows",
            "seconds_without_answer",
            "paused",
        ):
            assert key in info, key
        for key in ("weight_version", "weight_updates", "model", "rows_by_class", "metrics"):
            assert key in info, key
        assert (info["backend"], info["calls"], info["rows"], info["model"]) == (
            "echo",
            1,
            2,
            "echo-echo",
        )
        health = await replica.health()
        assert health["ok"] is True and health["backend"] == "echo"

    asyncio.run(scenario())


def test_an_engine_that_dies_fails_the_call_not_its_rows():
    async def scenario():
        replica = Replica(EchoEngine, EchoOptions(engine_dies_after_rows=2), {"name": "unit"})
        await replica.process_batch(_rows("a", "b"))
        with pytest.raises(EngineFailedError, match="died"):
            await replica.process_batch(_rows("c"))
        assert replica.watch.failure and replica.rows == 2
        with pytest.raises(EngineFailedError):  # taken out of service: the caller retries
            await replica.process_batch(_rows("d"))

    asyncio.run(scenario())


def test_a_call_failure_is_retried_by_the_caller_and_the_replica_serves_on():
    async def scenario():
        replica = Replica(EchoEngine, EchoOptions(fail_calls=1), {"name": "unit"})
        with pytest.raises(CallFailedError, match="injected failure of call 1"):
            await replica.process_batch(_rows("a"))
        assert replica.watch.failure is None
        assert (await replica.process_batch(_rows("a")))[0]["generated_text"] == "a"
        assert (replica.calls, replica.rows) == (2, 1)

    asyncio.run(scenario())
