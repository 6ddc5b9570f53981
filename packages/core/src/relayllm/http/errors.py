"""OpenAI's error envelope: every refusal of both servers is an :class:`HttpError` when it is
answered -- raised as one, or a :class:`Refusal` (an error of the code below, which says its
own status) made one by :func:`refusal_of` -- and leaves as ``{"error": {"message", "type",
"param", "code"}}``, the body the ``openai`` client raises its status errors from. Anything
else is a 500 whose text stays in the server's log."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from relayllm.errors import RelayLLMError

if TYPE_CHECKING:
    from starlette.responses import Response

logger = logging.getLogger(__name__)


class HttpError(RelayLLMError):
    """An answer other than 200, with OpenAI's error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
        *,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code
        self.param = param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return envelope(self.message, self.kind, self.param, self.code)


class Refusal(RelayLLMError):
    """An error a server answers as a refusal: its class says the status and OpenAI's code,
    its message is safe to show a client, and ``param`` (if set) names the field."""

    status: ClassVar[int] = 400
    code: ClassVar[str | None] = None
    param: str | None = None

    def http_error(self) -> HttpError:
        return HttpError(self.status, str(self), code=self.code, param=self.param)


class UnauthorizedError(Refusal):
    """No API key, or one no project has (HTTP 401, ``invalid_api_key``). Never carries the
    key."""

    status = 401
    code = "invalid_api_key"


def refusal_of(exc: BaseException) -> HttpError | None:
    """The answer ``exc`` is as a refusal; None for an error nothing expected (a 500)."""
    if isinstance(exc, HttpError):
        return exc
    if isinstance(exc, Refusal):
        return exc.http_error()
    return None


def envelope(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: Any = None
) -> dict[str, Any]:
    """OpenAI's error envelope (the ``openai`` client raises its status error with
    ``message``)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    """``body`` as JSON. A string in it that cannot be encoded as UTF-8 (a lone surrogate:
    every door refuses one, but a record an older version stored may hold it) is sent as
    U+FFFD and logged, never a failed answer."""
    import json

    from starlette.responses import JSONResponse

    try:
        return JSONResponse(body, status_code=status, headers=headers)
    except UnicodeEncodeError:
        logger.warning("an answer held text that is not UTF-8; sent with U+FFFD in its place")
        text = json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        mended = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return JSONResponse(json.loads(mended), status_code=status, headers=headers)


#: The 4xx statuses that may mend by themselves (a timeout, a conflict): left unmarked.
TRANSIENT = frozenset({408, 409})


def refusal_headers(status: int, headers: dict[str, str] | None = None) -> dict[str, str]:
    """The headers of a refusal: a 4xx that retrying cannot mend says so
    (``x-should-retry: false``, which the ``openai`` client obeys before it retries a 429),
    unless it says when to come back (``Retry-After``: a 429 that time mends) or says
    otherwise itself."""
    headers = dict(headers or {})
    named = {name.lower() for name in headers}
    marked = named & {"retry-after", "x-should-retry"}
    if 400 <= status < 500 and status not in TRANSIENT and not marked:
        headers["x-should-retry"] = "false"
    return headers


def error_response(exc: HttpError) -> Response:
    return json_response(exc.body(), exc.status, refusal_headers(exc.status, exc.headers))


__all__ = [
    "HttpError",
    "Refusal",
    "UnauthorizedError",
    "envelope",
    "error_response",
    "refusal_headers",
    "json_response",
    "refusal_of",
]
