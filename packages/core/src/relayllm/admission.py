"""Admission of batch rows into a shared engine, so interactive latency stays within a target.

Interactive requests (the HTTP front) are measured: their time to first token (the whole
answer's time when not streamed, an upper bound). The controller keeps a limit on the batch
rows inside the engine and moves it by additive increase, multiplicative decrease (AIMD, as
TCP's congestion window): a request slower than the target cuts the limit (at most once per
interval, so one burst is one cut); an interval with no slow request raises it by a step, so
batch work refills the engine when interactive traffic leaves. Active only on deployments
with an HTTP front: batch-only deployments run unchanged.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, model_validator


class AdmissionConfig(BaseModel):
    """The targets and limits of the admission controller (``DeploymentConfig.admission``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target_ttft_s: float = Field(
        default=0.5, gt=0, description="Interactive time to first token to stay within."
    )
    min_batch_rows: PositiveInt = Field(
        default=1, description="Batch rows always admitted: batch work never stops entirely."
    )
    max_batch_rows: PositiveInt = Field(
        default=256, description="Batch rows in the engine at most (and when nothing is slow)."
    )
    increase_rows: PositiveInt = Field(
        default=8, description="Rows added to the limit per interval with no slow request."
    )
    decrease_factor: float = Field(
        default=0.5, gt=0, lt=1, description="The limit is multiplied by this on a slow request."
    )
    interval_s: float = Field(default=0.5, gt=0, description="How often the limit may move.")

    @model_validator(mode="after")
    def _ordered(self) -> AdmissionConfig:
        if self.min_batch_rows > self.max_batch_rows:
            raise ValueError("min_batch_rows must not exceed max_batch_rows")
        return self


class Admission:
    """The AIMD limit and the gate batch rows pass (one per replica, on its event loop)."""

    def __init__(self, config: AdmissionConfig) -> None:
        self.config = config
        self.limit = config.max_batch_rows
        self.in_engine = 0  # batch rows admitted and not finished
        self.cuts = 0
        self.raises = 0
        self.lowest = self.limit
        self.last_ttft_s: float | None = None
        self._last_move = 0.0
        self._last_slow = 0.0
        self._changed: asyncio.Condition | None = None
        self._ticker: asyncio.Task[None] | None = None

    # -- the signal ----------------------------------------------------------------------------

    def observe(self, ttft_s: float) -> None:
        """An interactive request's time to first token."""
        self.last_ttft_s = ttft_s
        if ttft_s <= self.config.target_ttft_s:
            return
        now = time.monotonic()
        self._last_slow = now
        if now - self._last_move < self.config.interval_s:
            return
        lowered = max(self.config.min_batch_rows, int(self.limit * self.config.decrease_factor))
        if lowered < self.limit:
            self.limit, self._last_move = lowered, now
            self.cuts += 1
            self.lowest = min(self.lowest, lowered)

    def tick(self) -> None:
        """Called every interval: raise the limit if nothing was slow for a whole interval."""
        now = time.monotonic()
        quiet = now - self._last_slow >= self.config.interval_s
        moved_long_ago = now - self._last_move >= self.config.interval_s
        if quiet and moved_long_ago and self.limit < self.config.max_batch_rows:
            self.limit = min(self.config.max_batch_rows, self.limit + self.config.increase_rows)
            self._last_move = now
            self.raises += 1
            self._wake()

    # -- the gate ------------------------------------------------------------------------------

    async def run(self, rows: list[Any], call: Any) -> list[Any]:
        """``call(chunk)`` over ``rows`` in chunks the limit admits, results in order."""
        self._start_ticker()
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
            "cuts": self.cuts,
            "raises": self.raises,
            "last_ttft_s": self.last_ttft_s,
            **self.config.model_dump(),
        }


__all__ = ["Admission", "AdmissionConfig"]
