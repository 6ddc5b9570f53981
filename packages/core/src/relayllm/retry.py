"""Retries with exponential backoff and jitter: the one place that decides how long to wait."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from tenacity import AsyncRetrying, retry_if_exception, stop_after_attempt, wait_exponential_jitter

T = TypeVar("T")

INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0


async def call_with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    retryable: Callable[[BaseException], bool] = lambda exc: True,
    initial_s: float = INITIAL_BACKOFF_S,
    max_s: float = MAX_BACKOFF_S,
) -> T:
    """Run ``attempt`` until it succeeds or ``max_retries`` retries are spent; re-raise the
    last error."""
    async for try_ in AsyncRetrying(
        stop=stop_after_attempt(max_retries + 1),
        wait=wait_exponential_jitter(initial=initial_s, max=max_s),
        retry=retry_if_exception(retryable),
        reraise=True,
    ):
        with try_:
            return await attempt()
    raise AssertionError("unreachable: tenacity re-raises the last error")


__all__ = ["INITIAL_BACKOFF_S", "MAX_BACKOFF_S", "call_with_retries"]
