"""Routes declared with Starlette's ``Router``, answered the way both of relayllm's doors need
them: a request in, a response out. Serve hands a replica's ``__call__`` a ``Request`` and
sends the ``Response`` it returns; the direct server (:mod:`~relayllm.http.server`) calls the
same :meth:`HttpApp.respond` from its ASGI entry. One dispatch, so a route answers the same
through Serve's proxy and the direct server, and a body a route set has read once (the
gateway reads ``model`` before it hands a request to a deployment's front) stays with the
``Request``.

What every route set shares is here: root-path handling (the path under the route prefix,
a trailing ``/`` ignored), 404 and 405 in OpenAI's envelope, the JSON-body reader, and how an
exception becomes an answer: a refusal (:func:`~relayllm.http.errors.refusal_of`) in OpenAI's
envelope, anything else a 500 whose text stays in the server's log.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from relayllm import bounded_json
from relayllm.http.errors import (
    HttpError,
    envelope,
    error_response,
    json_response,
    refusal_headers,
    refusal_of,
)

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

logger = logging.getLogger(__name__)

Endpoint = Callable[["Request"], Awaitable["Response"]]


class HttpApp:
    """One route set, answered request by request. ``server`` names the server in the answer
    to an error nothing expected (its text may hold a server path or a payload, so the
    client gets a generic message and the log the rest)."""

    def __init__(self, routes: Sequence[Route], server: str = "the server") -> None:
        from starlette.routing import Router

        self.router = Router(routes=list(routes), redirect_slashes=False)
        self.failed = envelope(f"{server} failed; see its log", "server_error")

    @property
    def paths(self) -> list[str]:
        return list(dict.fromkeys(route.path for route in self._routes()))

    def _routes(self) -> list[Route]:
        return list(self.router.routes)  # type: ignore[arg-type]

    async def respond(self, request: Request) -> Response:
        """The answer of the route ``request`` names, or OpenAI's error body."""
        try:
            endpoint = self._match(request)
            return await endpoint(request)
        except Exception as exc:
            refusal = refusal_of(exc)
            if refusal is not None:
                return error_response(refusal)
            logger.exception("%s %s failed", request.method, route_path(request))
            return json_response(self.failed, 500, refusal_headers(500))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI entry (the direct server's): the same answers as :meth:`respond`."""
        from starlette.requests import Request

        if scope["type"] != "http":  # no websockets here; lifespan is off
            return
        response = await self.respond(Request(scope, receive))
        await response(scope, receive, send)

    def _match(self, request: Request) -> Endpoint:
        """Starlette's own matching of the path under the root path; the path parameters go
        to ``request.path_params``."""
        from starlette.routing import Match

        path = route_path(request)
        probe = {**request.scope, "path": path, "root_path": ""}
        allowed: list[str] = []
        for route in self._routes():
            match, child = route.matches(probe)
            if match is Match.FULL:
                request.scope.update(child)
                endpoint: Endpoint = route.endpoint
                return endpoint
            if match is Match.PARTIAL:
                allowed.extend(sorted(route.methods or ()))
        if allowed:
            methods = ", ".join(m for m in dict.fromkeys(allowed) if m != "HEAD")
            raise HttpError(
                405, f"{path} takes {methods}", headers={"Allow": ", ".join(dict.fromkeys(allowed))}
            )
        known = ", ".join(self.paths)
        raise HttpError(404, f"no route {path!r}; this server has {known}", code="not_found")


def route_path(request: Request) -> str:
    """The request's path under its root path (Serve's proxy and the direct server give the
    route prefix as ``root_path``), without a trailing ``/``."""
    path: str = request.scope["path"]
    root: str = request.scope.get("root_path") or ""
    if root and (path == root or path.startswith(root + "/")):
        path = path[len(root) :]
    return path.rstrip("/") or "/"


async def json_body(
    request: Request, *, empty: bool = False, what: str = "a JSON object"
) -> dict[str, Any]:
    """The body as a JSON object (``empty``: no body at all is ``{}``); a 400 otherwise: not
    UTF-8 JSON, nested too deep, or with a string that cannot be encoded as UTF-8
    (:mod:`relayllm.bounded_json`, the parser of every door; ``param`` names the field)."""
    raw = await request.body()
    if empty and not raw.strip():
        return {}
    try:
        body = bounded_json.loads(raw)
    except bounded_json.UnencodableTextError as exc:
        raise HttpError(400, exc.message, param=exc.param) from None
    except bounded_json.NotJsonError as exc:
        raise HttpError(400, f"the body is not JSON: {exc.reason}") from None
    except bounded_json.JsonTextError as exc:  # too deep
        raise HttpError(400, f"the body is {exc.message}") from None
    if not isinstance(body, dict):
        raise HttpError(400, f"the body must be {what}")
    return body


__all__ = ["Endpoint", "HttpApp", "json_body", "route_path"]
