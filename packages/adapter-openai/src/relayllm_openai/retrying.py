"""Which endpoint failures are retried, how long to wait, and what a failed row says.

The backoff numbers come from :mod:`relayllm.retry` (the project's one place for them); this
module adds what only an HTTP endpoint has: status codes and ``Retry-After``. The openai
client's own retries are switched off, so this is the only retry policy.
"""

from __future__ import annotations

import email.utils
import time
from typing import Any

import openai
from tenacity import RetryCallState, wait_exponential_jitter

from relayllm.adapters import INITIAL_BACKOFF_S, MAX_BACKOFF_S, RelayLLMError

#: Statuses worth another try besides 5xx: timeout, conflict, rate limit.
RETRYABLE_STATUS = frozenset({408, 409, 429})
#: The longest ``Retry-After`` obeyed; a longer one is cut to this (and the retry may fail again).
MAX_RETRY_AFTER_S = 120.0


class MalformedResponse(RelayLLMError):
    """The endpoint answered 2xx with a body that is not the JSON the API promises."""


def is_retryable(exc: BaseException) -> bool:
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429 and exc.code == "insufficient_quota":
            return False  # out of credit: waiting will not help
        return exc.status_code in RETRYABLE_STATUS or exc.status_code >= 500
    return isinstance(
        exc, (openai.APIConnectionError, openai.APIResponseValidationError, MalformedResponse)
    )


def retry_after_s(exc: BaseException | None) -> float | None:
    """The wait the endpoint asked for (``retry-after-ms`` or ``Retry-After``), if any."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None)
    if not headers:
        return None
    millis = headers.get("retry-after-ms")
    if millis:
        try:
            return max(0.0, float(millis) / 1000)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:  # an HTTP date
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class BackoffHonouringRetryAfter:
    """tenacity wait: exponential backoff with jitter, but never shorter than Retry-After."""

    def __init__(self) -> None:
        self._backoff = wait_exponential_jitter(initial=INITIAL_BACKOFF_S, max=MAX_BACKOFF_S)

    def __call__(self, state: RetryCallState) -> float:
        backoff = self._backoff(state)
        exc = state.outcome.exception() if state.outcome else None
        asked = retry_after_s(exc)
        if asked is None:
            return backoff
        return max(backoff, min(asked, MAX_RETRY_AFTER_S))


def describe_failure(exc: BaseException, attempts: int, timeout_s: float) -> str:
    """A row's ``error``: the endpoint's own message where it sent one."""
    if isinstance(exc, openai.APIStatusError):
        text = f"HTTP {exc.status_code} from the endpoint: {_endpoint_message(exc)}"
    elif isinstance(exc, openai.APITimeoutError):
        text = f"the endpoint did not answer within timeout_s={timeout_s:g}s"
    elif isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause else ""
        text = f"could not reach the endpoint{detail}"
    else:
        detail = str(exc).strip()
        text = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    if attempts > 1:
        text += f" (gave up after {attempts} attempts)"
    return text


def _endpoint_message(exc: openai.APIStatusError) -> str:
    body: Any = exc.body
    if isinstance(body, dict):
        message = body.get("message") or body.get("detail") or body.get("error")
        if message:
            return str(message)
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return exc.message


__all__ = [
    "MAX_RETRY_AFTER_S",
    "RETRYABLE_STATUS",
    "BackoffHonouringRetryAfter",
    "MalformedResponse",
    "describe_failure",
    "is_retryable",
    "retry_after_s",
]
