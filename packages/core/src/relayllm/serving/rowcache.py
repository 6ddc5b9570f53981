"""Idempotency by request id: a retried call is computed once.

The stage retries a call that timed out on its side with the same request ids. Each row of a
call is answered from memory (finished), joins the computation already running for it (the
first try's), or is computed fresh -- in a task of its own, so a caller that gives up and
cancels does not cancel the work its retry will pick up. Bookkeeping is per call, not per row:
this is the hot path.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from relayllm.errors import EngineFailedError
from relayllm.rows import Request, Result

#: How many finished results a replica remembers, so a batch retried after a caller-side
#: timeout is answered from memory instead of being generated (and counted) twice.
RESULT_CACHE_SIZE = 8192

#: Computes the fresh rows of a call: one result per request, in order. Raising
#: :class:`EngineFailedError` fails the call (nothing remembered); the caller retries.
Compute = Callable[[list[Request]], Awaitable[list[Result]]]


class RowCache:
    """The rows a replica finished (bounded) and the ones it is computing, by request id."""

    def __init__(self, size: int = RESULT_CACHE_SIZE) -> None:
        self.size = size
        self._inflight: dict[str, tuple[asyncio.Future[list[Result]], int]] = {}
        self._finished: OrderedDict[str, Result] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        #: Rows being computed now, including those whose every caller has left: their work
        #: goes on (a retry picks it up) and ends in the engine's row counts.
        self.computing = 0

    def __len__(self) -> int:
        return len(self._finished)

    async def run(self, requests: list[Request], compute: Compute) -> list[Result]:
        """The results of ``requests``, computing (with ``compute``) only the rows neither
        finished nor in flight."""
        loop = asyncio.get_running_loop()
        sources: list[tuple[asyncio.Future[list[Result]] | None, int | Result]] = []
        fresh: list[Request] = []
        batch_future: asyncio.Future[list[Result]] = loop.create_future()
        for request in requests:
            rid = request.get("request_id")
            if rid is not None and rid in self._finished:
                sources.append((None, self._finished[rid]))
            elif rid is not None and rid in self._inflight:
                sources.append(self._inflight[rid])
            else:
                source = (batch_future, len(fresh))
                if rid is not None:
                    self._inflight[rid] = source
                sources.append(source)
                fresh.append(request)
        if fresh:
            self.computing += len(fresh)
            task = loop.create_task(self._compute(fresh, batch_future, compute))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            batch_future.set_result([])
        answers: dict[int, list[Result]] = {}
        out: list[Result] = []
        for future, item in sources:
            if future is None:
                out.append(item)  # type: ignore[arg-type]
                continue
            key = id(future)
            if key not in answers:
                answers[key] = await asyncio.shield(future)
            out.append(answers[key][item])  # type: ignore[index]
        return out

    def fail_inflight(self, reason: str) -> None:
        """Fail every call waiting on a computation (the engine is gone): their answers, to
        retry elsewhere, leave now instead of when the process ends."""
        for future, _ in list(self._inflight.values()):
            if not future.done():
                future.set_exception(EngineFailedError(reason))
        self._inflight.clear()

    async def _compute(
        self, fresh: list[Request], future: asyncio.Future[list[Result]], compute: Compute
    ) -> None:
        try:
            results = await compute(fresh)
        except BaseException as exc:  # the call fails, not its rows: nothing is remembered
            for request in fresh:
                self._inflight.pop(request.get("request_id") or "", None)
            if not future.done():
                future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        finally:
            self.computing -= len(fresh)
        for request, result in zip(fresh, results, strict=True):
            rid = request.get("request_id")
            if rid is not None:
                self._inflight.pop(rid, None)
                self._finished[rid] = result
        while len(self._finished) > self.size:
            self._finished.popitem(last=False)
        if not future.done():
            future.set_result(results)


__all__ = ["RESULT_CACHE_SIZE", "Compute", "RowCache"]
