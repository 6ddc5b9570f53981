"""OpenAI's error envelope: every refusal of both servers is an :class:`HttpError` (or an error
a route set maps to one) and leaves as ``{"error": {"message", "type", "param", "code"}}``,
the body the ``openai`` client raises its status errors from."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relayllm.errors import RelayLLMError

if TYPE_CHECKING:
    from starlette.responses import Response


class HttpError(Exception):
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


class UnauthorizedError(RelayLLMError):
    """No API key, or one no project has (HTTP 401, ``invalid_api_key``). Never carries the
    key."""


def envelope(
    message: str, type: str = "invalid_request_error", param: str | None = None, code: Any = None
) -> dict[str, Any]:
    """OpenAI's error envelope (the ``openai`` client raises its status error with
    ``message``)."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def unauthorized(exc: UnauthorizedError) -> HttpError:
    return HttpError(401, str(exc), code="invalid_api_key")


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status, headers=headers)


def error_response(exc: HttpError) -> Response:
    return json_response(exc.body(), exc.status, exc.headers)


__all__ = [
    "HttpError",
    "UnauthorizedError",
    "envelope",
    "error_response",
    "json_response",
    "unauthorized",
]
