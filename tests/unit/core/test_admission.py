"""The admission controller's signals and its refill, on the real gate, on virtual time.

A batch job runs through :meth:`Admission.run` (its ticker is what moves the limit up) while
interactive requests are reported the way the HTTP front reports them (``begin``, ``token`` per
streamed part, ``end``). The engine is a coroutine that holds each admitted chunk for a moment:
the controller is under test, not an engine. Tests about cuts and raises let the job fill the
engine first (``Batch.full``): interactive traffic arriving at an engine full of batch rows is
what they exercise, and the restart after idle then leaves the limit where it was.

Time is virtual (:class:`VirtualTime`): the event loop and the controller read one clock that
moves only when every coroutine waits, straight to the next timer. A scenario's sequence of
events is then the same on every run, however loaded the machine, and takes no real time.
"""

from __future__ import annotations

import asyncio
import selectors
from types import SimpleNamespace

import pytest

from relayllm.serving import admission as admission_module
from relayllm.serving.admission import Admission
from relayllm.serving.admission_config import AdmissionConfig


class VirtualTime:
    """A clock for the controller (its ``time.monotonic``) and an event loop that runs on it."""

    #: A scenario still running after this much virtual time waits for something that never
    #: comes (the ticker alone would keep it going forever).
    LIMIT_S = 3600.0

    def __init__(self) -> None:
        self.start = self.now = 1000.0  # like a real monotonic clock: far from zero

    def monotonic(self) -> float:
        return self.now

    def _loop(self) -> asyncio.AbstractEventLoop:
        clock = self

        class Selector(selectors.DefaultSelector):
            def select(self, timeout=None):
                ready = super().select(0)  # the loop's own wake-ups (a socket pair)
                if ready or timeout == 0:
                    return ready
                if timeout is None:
                    raise AssertionError("the scenario waits for something no timer brings")
                clock.now += timeout  # nothing to do until the next timer: go there
                if clock.now - clock.start > clock.LIMIT_S:
                    raise AssertionError("the scenario did not end within an hour of virtual time")
                return []

        loop = asyncio.SelectorEventLoop(Selector())
        loop.time = self.monotonic  # call_later, sleep and timeouts on the same clock
        return loop

    def run(self, scenario):
        with asyncio.Runner(loop_factory=self._loop) as runner:
            return runner.run(scenario)


@pytest.fixture
def virtual(monkeypatch) -> VirtualTime:
    clock = VirtualTime()
    # The controller's clock only: asyncio and everything else keep the real one.
    monkeypatch.setattr(admission_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    return clock


class Batch:
    """A batch job that keeps the gate busy until stopped; records the chunks admitted."""

    def __init__(self, admission: Admission, rows: int = 100_000) -> None:
        self.admission = admission
        self.chunks: list[int] = []
        self.stopped = False
        self.task = asyncio.ensure_future(admission.run(list(range(rows)), self.engine))

    async def engine(self, chunk: list[int]) -> list[int]:
        self.chunks.append(len(chunk))
        if not self.stopped:
            await asyncio.sleep(0.02)
        return chunk

    async def full(self) -> None:
        """Until the batch rows in the engine reach the limit: a job under way. The caller's
        next synchronous step (``begin``) runs before the loop can move a chunk."""
        while self.admission.in_engine < self.admission.limit:
            await asyncio.sleep(0.001)

    async def stop(self) -> None:
        assert not self.task.done(), "the job ran out of rows before the scenario ended"
        self.stopped = True
        results = await self.task
        assert results == sorted(results)  # in order, none lost


async def stream(admission: Admission, tokens: int, gap_s: float) -> None:
    """One streamed interactive request: ``tokens`` parts, ``gap_s`` apart."""
    request = admission.begin(streamed=True)
    try:
        for _ in range(tokens):
            await asyncio.sleep(gap_s)
            admission.token(request)
    finally:
        admission.end(request)


def test_a_slow_time_per_output_token_cuts_the_batch_limit(virtual):
    config = AdmissionConfig(
        target_ttft_s=10.0,  # the first tokens are always in time: only TPOT can cut
        target_tpot_s=0.05,
        max_batch_rows=64,
        increase_rows=1,
        interval_s=0.05,
        idle_s=30.0,
    )

    observed = Admission(config)
    observed.observe_tpot(0.2)  # one slow gap between two tokens
    assert observed.limit == 32 and observed.cuts_by == {"ttft": 0, "tpot": 1}

    async def scenario() -> tuple[dict, dict, list[int]]:
        admission = Admission(config)
        batch = Batch(admission, rows=10_000)  # ends at a low limit: fewer rows
        await batch.full()
        await stream(admission, tokens=5, gap_s=0.01)  # fast tokens: nothing to cut
        fast = admission.describe()
        await stream(admission, tokens=6, gap_s=0.12)  # each token slower than the target
        slow = admission.describe()
        await batch.stop()
        return fast, slow, batch.chunks

    fast, slow, chunks = virtual.run(scenario())
    assert fast["cuts"] == 0 and fast["limit"] == 64, fast
    assert slow["cuts_by"]["tpot"] >= 2 and slow["cuts_by"]["ttft"] == 0, slow
    assert slow["lowest_limit"] <= 16 and slow["last_tpot_s"] > 0.05, slow
    assert min(chunks) <= 16  # the cut reached the engine: later chunks are smaller
    assert slow["target_tpot_s"] == 0.05 and "idle_s" in slow  # describe() shows the options


def test_a_stream_waiting_longer_than_its_target_cuts_before_it_answers(virtual):
    config = AdmissionConfig(target_ttft_s=0.1, max_batch_rows=64, interval_s=0.05, idle_s=30.0)

    async def scenario() -> dict:
        admission = Admission(config)
        batch = Batch(admission, rows=10_000)  # ends at a low limit: fewer rows
        request = admission.begin(streamed=True)
        await asyncio.sleep(0.5)  # no first token yet: the ticker sees it waiting
        during = admission.describe()
        admission.end(request)
        await batch.stop()
        return during

    during = virtual.run(scenario())
    assert during["cuts_by"]["ttft"] >= 2 and during["limit"] <= 16, during
    assert during["last_ttft_s"] is None and during["interactive_in_flight"] == 1


def test_the_limit_is_back_at_the_maximum_once_interactive_traffic_is_idle(virtual):
    config = AdmissionConfig(
        target_ttft_s=0.05,
        max_batch_rows=256,
        increase_rows=1,  # additive increase alone would need 255 intervals (~13 s)
        interval_s=0.05,
        idle_s=0.4,
    )

    async def scenario() -> tuple[dict, dict, float]:
        admission = Admission(config)
        batch = Batch(admission)
        await batch.full()
        for i in range(4):  # slow first tokens, one request after the other: cuts
            if i:
                await asyncio.sleep(0.06)
            await stream(admission, tokens=1, gap_s=0.1)
        ended = virtual.monotonic()  # the last interactive request ended just now
        cut = admission.describe()
        while admission.limit < config.max_batch_rows and virtual.monotonic() - ended < 5:
            await asyncio.sleep(0.01)
        refilled_after = virtual.monotonic() - ended
        after = admission.describe()
        await batch.stop()
        return cut, after, refilled_after

    cut, after, refilled_after = virtual.run(scenario())
    assert cut["limit"] <= 64 and cut["cuts"] >= 2, cut
    assert after["limit"] == 256 and after["refills"] == 1 and after["idle"], after
    # Not before idle_s (the user may come back), and at once after it (not 255 intervals):
    # the refill is due 10 ms after idle_s, seen at the next 10 ms poll.
    assert 0.4 <= refilled_after <= 0.42 + 1e-6, refilled_after
    assert after["raises"] < 40, after


def test_the_refill_comes_when_idle_s_ends_not_at_the_next_interval(virtual):
    # An interval far longer than idle_s: a refill left to the ticker would come up to 2 s late.
    config = AdmissionConfig(target_ttft_s=0.05, max_batch_rows=256, interval_s=2.0, idle_s=0.2)

    async def scenario() -> tuple[dict, float]:
        admission = Admission(config)
        batch = Batch(admission)
        await batch.full()  # and the ticker is running (asleep for interval_s)
        await stream(admission, tokens=1, gap_s=0.1)  # one slow first token: a cut
        ended = virtual.monotonic()
        cut = admission.describe()
        while admission.limit < config.max_batch_rows and virtual.monotonic() - ended < 5:
            await asyncio.sleep(0.01)
        refilled_after = virtual.monotonic() - ended
        await batch.stop()
        assert cut["limit"] == 128 and cut["cuts"] == 1, cut
        return admission.describe(), refilled_after

    after, refilled_after = virtual.run(scenario())
    assert after["refills"] == 1 and after["limit"] == 256, after
    # Due 10 ms after idle_s, seen at the next 10 ms poll; the next tick would come about
    # 1.8 s after the stream.
    assert 0.2 <= refilled_after <= 0.22 + 1e-6, refilled_after


def test_while_interactive_traffic_continues_the_limit_rises_additively_only(virtual):
    config = AdmissionConfig(
        target_ttft_s=0.15,
        target_tpot_s=1.0,
        max_batch_rows=1000,
        increase_rows=3,
        interval_s=0.05,
        idle_s=0.3,
    )

    async def scenario() -> tuple[dict, list[tuple[int, int]], dict]:
        admission = Admission(config)
        batch = Batch(admission)
        await batch.full()
        await stream(admission, tokens=1, gap_s=0.3)  # one slow first token: cuts
        start = admission.describe()
        seen = [(admission.limit, admission.raises)]
        # Then fast requests one after another for well over idle_s, each streaming for
        # longer than idle_s, with pauses shorter than idle_s between them: interactive
        # traffic is present throughout.
        until = virtual.monotonic() + 1.5
        while virtual.monotonic() < until:
            await stream(admission, tokens=40, gap_s=0.01)
            seen.append((admission.limit, admission.raises))
            await asyncio.sleep(0.1)
            seen.append((admission.limit, admission.raises))
        end = admission.describe()
        await batch.stop()
        return start, seen, end

    start, seen, end = virtual.run(scenario())
    assert start["cuts"] >= 1 and start["limit"] <= 500, start
    assert end["refills"] == 0, end
    assert end["raises"] >= 5 and end["limit"] < 1000, end  # it rose, and not to the top
    for limit, raises in seen:  # every step was one increase_rows
        assert limit == start["limit"] + 3 * (raises - start["raises"]), (limit, raises)


def test_between_interactive_requests_the_limit_does_not_rise_without_a_token_in_time(virtual):
    # Nothing is measured between two requests: raising then would fill the engine with rows
    # the next request finds there. The limit waits for a token in time (or for idle_s).
    config = AdmissionConfig(target_ttft_s=0.05, max_batch_rows=256, interval_s=0.05, idle_s=1.0)

    async def scenario() -> tuple[dict, dict, dict]:
        admission = Admission(config)
        batch = Batch(admission)
        await batch.full()
        await stream(admission, tokens=1, gap_s=0.15)  # a slow first token: cuts
        cut = admission.describe()
        await asyncio.sleep(0.6)  # the user thinks: no request, shorter than idle_s
        between = admission.describe()
        await stream(admission, tokens=20, gap_s=0.01)  # a request in time: evidence
        after = admission.describe()
        await batch.stop()
        return cut, between, after

    cut, between, after = virtual.run(scenario())
    assert cut["limit"] < 256 and cut["cuts"] >= 1, cut
    assert between["limit"] == cut["limit"] and between["raises"] == 0, between
    assert between["refills"] == 0 and not between["idle"], between
    assert after["raises"] >= 1 and after["limit"] > cut["limit"], after


def test_each_cut_lowers_the_ceiling_raises_stop_at(virtual):
    """A cut from L leaves a ceiling one step below L: raises stop there instead of climbing
    back to the level that was too slow, so the sawtooth narrows while the traffic lasts; a
    refill after idle_s restores the maximum."""
    config = AdmissionConfig(
        target_ttft_s=0.1, max_batch_rows=64, increase_rows=8, interval_s=0.02, idle_s=0.2
    )

    async def scenario() -> list[tuple[int, int, int]]:
        admission = Admission(config)
        batch = Batch(admission)
        await batch.full()
        request = admission.begin(streamed=True)
        admission.token(request)  # a first token at once: in time
        seen = []

        async def rise_while_fast() -> None:
            for _ in range(20):  # far more steps than the gap to the ceiling
                await asyncio.sleep(0.025)
                admission.token(request)  # the next token, 25 ms after the last: in time
                admission.tick()
            seen.append((admission.limit, admission.ceiling, admission.refills))

        async def cut() -> None:
            await asyncio.sleep(0.025)
            admission.observe_tpot(1.0)  # a slow token
            admission.token(request)
            seen.append((admission.limit, admission.ceiling, admission.refills))

        await cut()
        await rise_while_fast()
        await cut()
        await rise_while_fast()
        admission.end(request)
        await asyncio.sleep(0.25)
        admission.tick()
        seen.append((admission.limit, admission.ceiling, admission.refills))
        await batch.stop()
        return seen

    assert virtual.run(scenario()) == [
        (32, 56, 0),  # cut from 64; raises stop one step below it
        (56, 56, 0),  # up to the ceiling, not back to 64
        (28, 48, 0),
        (48, 48, 0),
        (64, 64, 1),  # idle_s without interactive traffic: the maximum again
    ]


def test_a_job_starting_beside_interactive_traffic_enters_a_step_at_a_time(virtual):
    """A batch job that starts while interactive requests run must not put its first rows into
    the engine all at once (the limit was at the maximum from the idle period before): one
    prefill of them all is a step every interactive request waits for. On an engine that held
    no batch rows for idle_s, the job restarts the limit at one step."""
    config = AdmissionConfig(
        target_ttft_s=1.0, max_batch_rows=256, increase_rows=8, interval_s=0.05, idle_s=0.5
    )

    async def scenario() -> tuple[dict, list[int], dict]:
        admission = Admission(config)
        user = asyncio.ensure_future(stream(admission, tokens=60, gap_s=0.01))  # in time
        await asyncio.sleep(0.05)
        before = admission.describe()
        batch = Batch(admission)  # the job starts under interactive traffic
        await asyncio.sleep(0.01)
        restarted = admission.describe()
        await user
        await batch.stop()
        return before, restarted, batch.chunks, admission.describe()

    before, restarted, chunks, after = virtual.run(scenario())
    assert before["limit"] == 256 and before["restarts"] == 0, before
    assert restarted["restarts"] == 1 and restarted["lowest_limit"] == 8, restarted
    assert chunks[0] == 8, chunks[:5]  # not 256: the job entered one step at a time
    assert after["raises"] >= 3 and max(chunks) > 8, after  # and grew while tokens were fast


def test_interactive_traffic_leaves_a_running_job_its_rows(virtual):
    """A running job's calls come one after another with short gaps (a call ends, the stage
    sends the next): an interactive request that begins in such a gap must not restart the
    limit. The job's rows were in the engine a moment ago; held back through a burst, it would
    enter the idle period after it as one slow wave."""
    config = AdmissionConfig(
        target_ttft_s=1.0, max_batch_rows=64, increase_rows=8, interval_s=0.05, idle_s=0.5
    )
    calls: list[list[int]] = []

    async def engine(chunk: list[int]) -> list[int]:
        calls[-1].append(len(chunk))
        await asyncio.sleep(0.02)
        return chunk

    async def scenario() -> dict:
        admission = Admission(config)

        async def job() -> None:
            for _ in range(12):  # 16-row calls, 0.05 s apart
                calls.append([])
                await admission.run(list(range(16)), engine, job="running")
                await asyncio.sleep(0.05)

        running = asyncio.ensure_future(job())
        await asyncio.sleep(0.1)
        while admission.in_engine:  # begin in a gap between two calls
            await asyncio.sleep(0.001)
        await stream(admission, tokens=20, gap_s=0.01)
        await running
        return admission.describe()

    after = virtual.run(scenario())
    assert after["restarts"] == 0 and after["limit"] == 64, after
    assert all(call == [16] for call in calls), calls  # every call entered whole


def test_a_job_starting_right_after_another_enters_a_step_at_a_time(virtual):
    """A job that starts less than idle_s after the one before it ended finds an engine that
    emptied a moment ago, as a running job's next call does: only the job id its calls carry
    (the stage's run id) tells the two apart. Beside interactive traffic it restarts the limit
    at one step as well; the job before, alone, ran at the maximum."""
    config = AdmissionConfig(
        target_ttft_s=1.0, max_batch_rows=256, increase_rows=8, interval_s=0.05, idle_s=0.5
    )
    chunks: dict[str, list[int]] = {"first": [], "second": []}

    async def scenario() -> dict:
        admission = Admission(config)

        def engine(job: str):
            async def run(chunk: list[int]) -> list[int]:
                chunks[job].append(len(chunk))
                await asyncio.sleep(0.02)
                return chunk

            return run

        await admission.run(list(range(64)), engine("first"), job="first")  # alone
        user = asyncio.ensure_future(stream(admission, tokens=30, gap_s=0.01))
        await asyncio.sleep(0.02)  # well within idle_s of the first job's end
        assert await admission.run(list(range(64)), engine("second"), job="second") == list(
            range(64)
        )
        await user
        return admission.describe()

    after = virtual.run(scenario())
    assert chunks["first"] == [64], chunks
    assert chunks["second"][0] == 8 and after["restarts"] == 1, (chunks, after)


def test_a_job_that_starts_after_interactive_traffic_has_gone_gets_the_maximum_at_once(virtual):
    # A replica with no batch work yet has no ticker to refill the limit when interactive
    # traffic ends: a job that comes after idle_s must not start at the cut limit.
    config = AdmissionConfig(
        target_ttft_s=0.05, max_batch_rows=256, increase_rows=8, interval_s=0.5, idle_s=0.1
    )

    async def scenario() -> list[int]:
        admission = Admission(config)
        await stream(admission, tokens=1, gap_s=0.1)  # a slow first token: a cut
        assert admission.limit == 128 and admission.cuts == 1
        await asyncio.sleep(0.15)  # idle_s passes with no request
        batch = Batch(admission)
        await asyncio.sleep(0.05)  # well before the ticker's first interval
        await batch.stop()
        return batch.chunks

    assert virtual.run(scenario())[0] == 256
