"""Failed sign-ins limited per client address, so keys cannot be guessed at the speed of the
network: a key refused (an API request's header, the console's form or header) counts a
failure for the address it came from, and an address with :data:`MAX_FAILURES` failures in
the last :data:`WINDOW_S` seconds gets 429 with ``Retry-After`` for every keyed request, a
good key's included (else the answer would tell a right guess from a wrong one), until its
oldest failure is that old. A missing key is no guess and counts nothing.

Counted in the gateway replica's memory: each replica (and each gateway) limits on its own,
and a restart forgets; the bound is per address and replica, which is what a guesser meets.
The address is the one the ASGI server gives (Serve's proxy passes the client's on); behind
another proxy every client may share one address, which then shares one limit.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from relayllm.http.auth import KeyProvider
from relayllm.http.errors import HttpError
from relayllm_service.errors import UnauthorizedError

if TYPE_CHECKING:
    from starlette.requests import Request

#: Failures an address may have in :data:`WINDOW_S` before it is refused.
MAX_FAILURES = 10
WINDOW_S = 60.0
#: Addresses remembered at most (the least recently failing forgotten first): a flood of
#: addresses cannot grow the replica's memory without bound.
MAX_ADDRESSES = 10_000


class TooManySignInsError(HttpError):
    """429 with ``Retry-After``: too many refused keys from this address (OpenAI's body)."""


class SignInLimit:
    """Failed sign-ins per address (see the module)."""

    def __init__(
        self,
        max_failures: int = MAX_FAILURES,
        window_s: float = WINDOW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_failures, self.window_s, self.clock = max_failures, window_s, clock
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.get(address)
        if times is None:
            return deque()
        while times and times[0] <= now - self.window_s:
            times.popleft()
        if not times:
            del self._failures[address]
        return times

    def check(self, address: str) -> None:
        """Refuse (429) an address with too many recent failures."""
        now = self.clock()
        times = self._recent(address, now)
        if len(times) >= self.max_failures:
            wait = max(1, math.ceil(times[0] + self.window_s - now))
            raise TooManySignInsError(
                429,
                f"Too many requests with an invalid API key from this address. Please try "
                f"again in {wait}s.",
                "requests",
                "rate_limit_exceeded",
                headers={"Retry-After": str(wait)},
            )

    def failed(self, address: str) -> None:
        now = self.clock()
        times = self._recent(address, now)
        times.append(now)
        self._failures[address] = times
        self._failures.move_to_end(address)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)

    def project_for(self, address: str, key: str | None, keys: KeyProvider) -> str | None:
        """The project of a key given in a form (None: no key), the limit applied."""
        if not key:
            return None
        self.check(address)
        try:
            return keys.project_for_header(f"Bearer {key}")
        except UnauthorizedError:
            self.failed(address)
            raise

    def project_of(self, request: Request, keys: KeyProvider) -> str:
        """The project of the request's ``Authorization`` header, the limit applied."""
        header = request.headers.get("authorization")
        address = client_address(request)
        if header and header.strip():
            self.check(address)
        try:
            return keys.project_for_header(header)
        except UnauthorizedError:
            if header and header.strip():
                self.failed(address)
            raise


def client_address(request: Request) -> str:
    return request.client.host if request.client is not None else "unknown"


__all__ = [
    "MAX_ADDRESSES",
    "MAX_FAILURES",
    "WINDOW_S",
    "SignInLimit",
    "TooManySignInsError",
    "client_address",
]
