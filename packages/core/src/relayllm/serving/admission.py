"""Admission of batch rows into a shared engine, so interactive latency stays within a target.

Interactive requests (the HTTP front) are measured while they run: their time to first token
(the whole answer's time when not streamed, an upper bound) and, when streamed, the time
between their tokens (time per output token, TPOT: it grows with every batch row that shares
the engine's steps). The controller keeps a limit on the batch rows inside the engine and
moves it by additive increase, multiplicative decrease (AIMD, as TCP's congestion window):

- a first token slower than ``target_ttft_s`` or a next token slower than ``target_tpot_s``
  cuts the limit (at most once per interval, so one burst is one cut). A request still waiting
  longer than its target counts as slow already, so a stalled request cuts before it answers;
- while interactive traffic is present, an interval with nothing slow and a token in time
  raises the limit by a step (additive: interactive requests probe how much batch work they
  tolerate; nothing is raised between requests, where nothing is measured), up to a ceiling:
  one step below the level the last cut came from, so each cut narrows the sawtooth instead
  of climbing back to the level that was too slow;
- once no interactive request has run for ``idle_s``, the limit goes back to the maximum at
  once (at that moment, not at the next interval), so batch work gets the whole engine during
  idle periods instead of climbing for many intervals. The default, 1 s, is longer than the
  pause between one program's requests and short enough that an idle period is mostly full:
  with 2 s, batch throughput in 10 s idle windows was 0.78x batch alone (docs/benchmarks.md);
- a batch job that starts while interactive traffic is present, on an engine holding no batch
  rows, restarts the limit at one step (TCP's restart after idle, RFC 5681 section 4.1: a
  sender idle for a while starts again with a small window). A job is told by the ``job`` its
  calls carry (the stage's run id); a call without one counts as a new job after the engine
  has held no batch rows for ``idle_s``. The maximum was right for batch work alone; left
  open, the job's first rows all enter at once, in one prefill every interactive request waits
  for. A running job is left as it is when interactive traffic comes: the rows it has in the
  engine are already there, and its next calls enter as its earlier ones finish. The versions
  that also restarted at a burst's first request, or raised the limit only while batch rows
  waited at the gate, are in docs/architecture.md.

Rows already in the engine stay there: a cut takes effect as they finish. Active only on
deployments with an HTTP front: batch-only deployments run unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relayllm.serving.admission_config import AdmissionConfig

#: Job ids a replica remembers: enough for the jobs that run on it at once.
KEPT_JOBS = 64


class Interactive:
    """One interactive request in flight as the controller sees it (:meth:`Admission.begin`)."""

    __slots__ = ("began", "last_token", "streamed")

    def __init__(self, began: float, streamed: bool) -> None:
        self.began = began
        self.last_token: float | None = None  # when its latest token came (None: none yet)
        self.streamed = streamed


class Admission:
    """The AIMD limit and the gate batch rows pass (one per replica, on its event loop)."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.limit = config.max_batch_rows
        self.in_engine = 0  # batch rows admitted and not finished
        self.cuts = 0
        self.cuts_by = {"ttft": 0, "tpot": 0}  # which signal made each cut
        self.raises = 0  # additive steps
        self.refills = 0  # returns to the maximum after idle_s without interactive traffic
        self.restarts = 0  # jobs that started beside interactive traffic at one step
        self.jobs = 0  # distinct job ids (the stages' run ids) whose calls came
        self.lowest = self.limit
        self.ceiling = self.limit  # raises stop here; a cut lowers it, a refill restores it
        self.last_ttft_s: float | None = None
        self.last_tpot_s: float | None = None
        self._last_move = 0.0
        self._last_slow = 0.0
        self._last_fast = 0.0  # when an interactive token last came within its target
        self._batch_left = float("-inf")  # when the engine last became empty of batch rows
        self._jobs: OrderedDict[str, None] = OrderedDict()  # the latest jobs seen (run ids)
        self._active: set[Interactive] = set()
        self._last_interactive = float("-inf")  # when an interactive request last began or ended
        self._changed: asyncio.Condition | None = None
        self._ticker: asyncio.Task[None] | None = None

    # -- the signals ---------------------------------------------------------------------------

    def begin(self, *, streamed: bool) -> Interactive:
        """An interactive request starts: batch work is no longer alone until it ends."""
        now = time.monotonic()
        request = Interactive(now, streamed)
        self._active.add(request)
        self._last_interactive = now
        return request

    def token(self, request: Interactive) -> None:
        """A streamed part reached ``request`` (one token in vLLM's delta outputs): its first
        is the time to first token, each later one a time per output token."""
        now = time.monotonic()
        if request.last_token is None:
            self.observe(now - request.began)
        else:
            self.observe_tpot(now - request.last_token)
        request.last_token = now

    def end(self, request: Interactive) -> None:
        """``request`` finished (answered, failed or cancelled)."""
        now = time.monotonic()
        self._active.discard(request)
        self._last_interactive = now
        if not request.streamed:  # the whole answer's time: TTFT's upper bound
            self.observe(now - request.began)
        if not self._active and self._ticker is not None:
            # The refill is due idle_s from now, if nothing begins before: on time, not at
            # the interval tick after it (ticks are up to interval_s late).
            asyncio.get_running_loop().call_later(self.config.idle_s + 0.01, self._refill_if_idle)

    def _seen(self, job: str) -> bool:
        """Whether ``job`` sent a call before (and remember it now)."""
        seen = job in self._jobs
        self.jobs += not seen
        self._jobs[job] = None
        self._jobs.move_to_end(job)
        while len(self._jobs) > KEPT_JOBS:
            self._jobs.popitem(last=False)
        return seen

    def _restart_if_job_starts(self, now: float, new_job: bool) -> None:
        """A job starting beside interactive traffic on an engine with no batch rows enters one
        step at a time, and grows as interactive tokens show it can. Without a job id, a new
        job is a call after ``idle_s`` with no batch rows: a running job's calls come closer
        (the engine empties between its waves of calls)."""
        if self.in_engine or (not new_job and now - self._batch_left < self.config.idle_s):
            return
        restart = max(self.config.min_batch_rows, self.config.increase_rows)
        if restart < self.limit:
            self.limit, self._last_move = restart, now
            self.restarts += 1
            self.lowest = min(self.lowest, restart)

    def _refill_if_idle(self) -> None:
        if self.idle():
            self.tick()

    def observe(self, ttft_s: float) -> None:
        """An interactive request's time to first token."""
        self.last_ttft_s = ttft_s
        self._judge("ttft", ttft_s, self.config.target_ttft_s)

    def observe_tpot(self, tpot_s: float) -> None:
        """The time between two tokens of an interactive stream."""
        self.last_tpot_s = tpot_s
        self._judge("tpot", tpot_s, self.config.target_tpot_s)

    def _judge(self, signal: str, seconds: float, target_s: float) -> None:
        if seconds > target_s:
            self._slow(signal)
        else:
            self._last_fast = time.monotonic()

    def _slow(self, signal: str) -> None:
        now = time.monotonic()
        self._last_slow = now
        if now - self._last_move < self.config.interval_s:
            return
        lowered = max(self.config.min_batch_rows, int(self.limit * self.config.decrease_factor))
        if lowered < self.limit:
            self.ceiling = max(lowered, self.limit - self.config.increase_rows)
            self.limit, self._last_move = lowered, now
            self.cuts += 1
            self.cuts_by[signal] += 1
            self.lowest = min(self.lowest, lowered)

    def _waiting_too_long(self, now: float) -> str | None:
        """The signal of a stream still waiting for its next token longer than its target:
        that token will be slow whenever it comes, so it counts as slow now."""
        for request in self._active:
            if not request.streamed:
                continue
            if request.last_token is None:
                if now - request.began > self.config.target_ttft_s:
                    return "ttft"
            elif now - request.last_token > self.config.target_tpot_s:
                return "tpot"
        return None

    def idle(self, now: float | None = None) -> bool:
        """No interactive request in flight, and none began or ended for ``idle_s``."""
        now = time.monotonic() if now is None else now
        return not self._active and now - self._last_interactive >= self.config.idle_s

    def tick(self) -> None:
        """Called every interval: back to the maximum when interactive traffic has gone; with
        interactive traffic, cut for a request waiting too long, else raise by a step if
        nothing was slow for a whole interval and a token came in time since the last move.
        Raising on evidence, not on silence: between two interactive requests nothing is
        measured, and rows admitted then are still in the engine when the next one comes."""
        now = time.monotonic()
        top = self.config.max_batch_rows
        if self.idle(now):
            self.ceiling = top
            if self.limit < top:
                self.limit, self._last_move = top, now
                self.refills += 1
                self._wake()
            return
        waiting = self._waiting_too_long(now)
        if waiting is not None:
            self._slow(waiting)
            return
        quiet = now - self._last_slow >= self.config.interval_s
        moved_long_ago = now - self._last_move >= self.config.interval_s
        in_time = self._last_fast > self._last_move
        if quiet and moved_long_ago and in_time and self.limit < self.ceiling:
            self.limit = min(self.ceiling, self.limit + self.config.increase_rows)
            self._last_move = now
            self.raises += 1
            self._wake()

    # -- the gate ------------------------------------------------------------------------------

    async def run(self, rows: list[Any], call: Any, job: str | None = None) -> list[Any]:
        """``call(chunk)`` over ``rows`` in chunks the limit admits, results in order; ``job``
        names the batch job the rows belong to (the stage's run id)."""
        self._start_ticker()
        new_job = job is not None and not self._seen(job)
        if self.idle():  # interactive traffic left before any ticker could refill the limit
            self.tick()
        else:
            self._restart_if_job_starts(time.monotonic(), new_job)
        tasks = []
        start = 0
        while start < len(rows):
            size = max(1, min(len(rows) - start, self.limit))
            await self._acquire(size)
            chunk = rows[start : start + size]
            start += size
            tasks.append(asyncio.ensure_future(self._run_chunk(chunk, size, call)))
        parts = await asyncio.gather(*tasks)
        return [result for part in parts for result in part]

    async def _run_chunk(self, chunk: list[Any], size: int, call: Any) -> list[Any]:
        try:
            return list(await call(chunk))
        finally:
            self.in_engine -= size
            if not self.in_engine:
                self._batch_left = time.monotonic()
            self._wake()

    async def _acquire(self, size: int) -> None:
        changed = self._condition()
        async with changed:
            # An empty engine takes any chunk: a limit below the chunk never blocks forever.
            await changed.wait_for(
                lambda: self.in_engine == 0 or self.in_engine + size <= self.limit
            )
            self.in_engine += size

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    def _wake(self) -> None:
        changed = self._changed
        if changed is None:
            return

        async def notify() -> None:
            async with changed:
                changed.notify_all()

        asyncio.ensure_future(notify())

    def _start_ticker(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.ensure_future(self._tick_forever())

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.interval_s)
            self.tick()

    def describe(self) -> dict[str, Any]:
        return {
            "limit": self.limit,
            "batch_rows_in_engine": self.in_engine,
            "lowest_limit": self.lowest,
            "ceiling": self.ceiling,
            "cuts": self.cuts,
            "cuts_by": dict(self.cuts_by),
            "raises": self.raises,
            "refills": self.refills,
            "restarts": self.restarts,
            "jobs": self.jobs,
            "last_ttft_s": self.last_ttft_s,
            "last_tpot_s": self.last_tpot_s,
            "interactive_in_flight": len(self._active),
            "idle": self.idle(),
            **self.config.model_dump(),
        }


__all__ = ["KEPT_JOBS", "Admission", "Interactive"]
