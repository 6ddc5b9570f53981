"""Health and retirement: an engine that dies or hangs gets its replica replaced, with no row
lost.

Serve marks a replica whose health check fails unhealthy only after three checks in a row, but
a replica whose process ended at once. So when the engine as a whole fails -- a call raises
:class:`~relayllm.EngineFailedError`, or a health probe does not answer in time while no row
finishes -- the replica fails every call from then on (the stage retries them on the
replacement, same request ids), stops its engine and ends its process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from relayllm.errors import EngineFailedError

logger = logging.getLogger(__name__)

#: Seconds a replica whose engine failed waits (for the failed calls' answers to leave) before
#: it ends its process, so Serve replaces it at once instead of after three failed checks.
RETIRE_DELAY_S = 0.5
#: Seconds the engine may take to stop before the replica ends anyway.
STOP_ENGINE_TIMEOUT_S = 15.0


class EngineWatch:
    """Whether the engine failed (and why), when it last answered, and the loop it serves on.

    ``probe`` asks the engine whether it serves (raises if not); ``on_failure`` fails the calls
    waiting on it; ``stop`` stops its processes (from a thread); ``retire`` says whether this
    process may end (False outside a Serve replica: a test calling the class)."""

    def __init__(
        self,
        name: str,
        probe: Callable[[], Awaitable[object]],
        on_failure: Callable[[str], None],
        stop: Callable[[], None],
        *,
        retire_when_hung: bool = True,
        retire: bool = True,
    ) -> None:
        self.name = name
        self.failure: str | None = None  # why the engine as a whole failed (then: retiring)
        self.last_answer = time.monotonic()  # when the engine last finished a row
        self.busy_since = self.last_answer  # when the replica last went from idle to busy
        # The event loop the calls run on. Serve runs the health check on another loop; an
        # engine's client (vLLM's) answers only on the loop it serves from, so the probe is
        # sent there.
        self.serving_loop: asyncio.AbstractEventLoop | None = None
        self._probe = probe
        self._on_failure = on_failure
        self._stop = stop
        self.retire_when_hung = retire_when_hung
        self._retire = retire
        self._tasks: set[asyncio.Task[None]] = set()

    def answered(self) -> None:
        self.last_answer = time.monotonic()

    def check_serving(self) -> None:
        """Refuse new work on a replica on its way out (the caller retries elsewhere)."""
        if self.failure:
            raise EngineFailedError(self.failure)

    def seconds_without_answer(self, busy: bool) -> float:
        """How long calls have waited with no row answered (0 when idle): a stall when long."""
        if not busy:
            return 0.0
        return round(time.monotonic() - max(self.last_answer, self.busy_since), 1)

    async def check(self, bound_s: float) -> None:
        """Serve's periodic health check: probe the engine on its serving loop within
        ``bound_s``; a dead or hung engine retires the replica."""
        self.check_serving()
        asked = time.monotonic()
        loop = self.serving_loop
        probe: Any = self._probe()
        if loop is not None and loop is not asyncio.get_running_loop():
            probe = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(probe, loop))
        try:
            await asyncio.wait_for(probe, bound_s)
        except TimeoutError:
            if self.last_answer >= asked:  # slow to answer but still finishing rows: busy
                logger.warning(
                    "health check: the engine took over %gs to answer but is finishing rows "
                    "(busy, not hung)",
                    bound_s,
                )
                return
            if not self.retire_when_hung:
                raise TimeoutError(
                    f"the engine did not answer a health check within {bound_s:g}s"
                ) from None
            self.failed(f"the engine did not answer a health check within {bound_s:g}s (hung)")
            raise EngineFailedError(self.failure) from None
        except EngineFailedError as exc:  # other errors count as Serve counts them (3 in a row)
            self.failed(str(exc))
            raise

    def failed(self, reason: str) -> None:
        """The engine as a whole is gone: fail every call from now on and retire the replica
        (rows answered before the failure are not redone)."""
        if self.failure:
            return
        self.failure = reason
        logger.error("engine failed in %s: %s; retiring this replica", self.name, reason)
        # Calls waiting on a hung engine would wait until the process ends: fail them now.
        # Their futures belong to the loop the calls run on; a health check runs on another.
        loop = self.serving_loop
        if loop is not None and loop is not asyncio.get_running_loop():
            loop.call_soon_threadsafe(self._on_failure, reason)
        else:
            self._on_failure(reason)
        if not self._retire:
            return
        task = asyncio.get_running_loop().create_task(self._retire_process())
        self._tasks.add(task)

    async def _retire_process(self) -> None:
        await asyncio.sleep(RETIRE_DELAY_S)
        try:
            await asyncio.wait_for(asyncio.to_thread(self._stop), STOP_ENGINE_TIMEOUT_S)
        except Exception:  # the process ends anyway; its children go with it
            logger.exception("stopping the engine of %s failed", self.name)
        os._exit(1)


__all__ = ["RETIRE_DELAY_S", "STOP_ENGINE_TIMEOUT_S", "EngineWatch"]
