"""The endpoint's rate gate: a concurrency cap, a request pace and a token bucket.

An instance lives in each Serve replica of the deployment, so every processor that sends rows
to the deployment passes through the same gate: the limits are global, not per processor or
per stage actor. With N replicas, each replica takes 1/N of every budget (it cannot see the
others), so the deployment as a whole stays within the configured numbers.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiolimiter import AsyncLimiter


def class_budgets(options: Any, interactive_share: float) -> tuple[dict[str, Any], ...]:
    """The :class:`RateGate` arguments of the batch and of the interactive class: the options'
    budgets split by ``interactive_share`` (0: one budget, all batch; then only one)."""

    def part(share: float) -> dict[str, Any]:
        def scaled(value: int | None) -> int | None:
            return max(1, int(value * share)) if value else None

        return {
            "max_concurrency": max(1, int(options.max_concurrency * share)),
            "requests_per_minute": scaled(options.requests_per_minute),
            "tokens_per_minute": scaled(options.tokens_per_minute),
        }

    if not interactive_share:
        return (part(1.0),)
    return part(1.0 - interactive_share), part(interactive_share)


class RateGate:
    """The gate every request to the endpoint passes, retries included. (Not the replica's
    latency controller, ``relayllm.serving.admission``, nor Serve's ``max_ongoing_requests``:
    this one keeps within the provider's rate limits.)"""

    def __init__(
        self,
        *,
        max_concurrency: int,
        requests_per_minute: int | None,
        tokens_per_minute: int | None,
        replicas: int = 1,
    ) -> None:
        self.replicas = replicas
        self.max_concurrency = max(1, max_concurrency // replicas)
        self.requests_per_minute = requests_per_minute / replicas if requests_per_minute else None
        self.tokens_per_minute = tokens_per_minute / replicas if tokens_per_minute else None
        self._slots = asyncio.Semaphore(self.max_concurrency)
        # Requests: a leaky bucket that holds ONE request and drains at rpm/60 per second, so
        # requests are spaced evenly and no window of any length -- 60 s included, and the
        # shorter windows some providers really enforce -- admits more than its share.
        self._requests = (
            AsyncLimiter(1, 60.0 / self.requests_per_minute) if self.requests_per_minute else None
        )
        # Tokens: a bucket holding one minute's budget, refilled continuously -- the way
        # providers meter tokens. A request is charged before it is sent (its estimate).
        self._tokens = (
            AsyncLimiter(self.tokens_per_minute, 60.0) if self.tokens_per_minute else None
        )
        self._resume_at = 0.0
        self._debts: set[asyncio.Task[None]] = set()

    @asynccontextmanager
    async def slot(self, tokens: int) -> AsyncIterator[None]:
        """Hold one concurrency slot, after the pause (if any), the request pace and the token
        budget allow one more request of ``tokens`` estimated tokens."""
        async with self._slots:
            await self._wait_out_pause()
            if self._requests is not None:
                await self._requests.acquire()
            if self._tokens is not None:
                # A request bigger than the whole bucket waits for a full bucket instead of
                # never fitting.
                await self._tokens.acquire(min(tokens, self._tokens.max_rate))
            yield

    def settle(self, estimated: int, actual: int | None) -> None:
        """Charge the tokens the estimate missed (e.g. no max_tokens was set), in the
        background: the row that used them is done, later requests wait for them."""
        if self._tokens is None or actual is None or actual <= estimated:
            return
        extra = min(actual - estimated, self._tokens.max_rate)
        task = asyncio.get_running_loop().create_task(self._tokens.acquire(extra))
        self._debts.add(task)
        task.add_done_callback(self._debts.discard)

    def pause(self, seconds: float) -> None:
        """Stop admitting requests for ``seconds``: the endpoint said it is over its limit
        (429 with Retry-After), so every request of this replica waits, not just the one
        that was refused."""
        loop = asyncio.get_running_loop()
        self._resume_at = max(self._resume_at, loop.time() + seconds)

    async def _wait_out_pause(self) -> None:
        loop = asyncio.get_running_loop()
        while (left := self._resume_at - loop.time()) > 0:
            await asyncio.sleep(left)

    def describe(self) -> dict[str, Any]:
        """This replica's share of the budgets."""
        return {
            "replicas_sharing_budget": self.replicas,
            "max_concurrency": self.max_concurrency,
            "requests_per_minute": self.requests_per_minute,
            "tokens_per_minute": self.tokens_per_minute,
        }


__all__ = ["RateGate", "class_budgets"]
