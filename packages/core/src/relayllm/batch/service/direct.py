"""The gateway's own HTTP server, in its replica on the head node, beside Serve's proxy: the
same routes (the gateway's ``__call__``) under the same path prefix, served by uvicorn on the
replica's event loop.

Why a second door: Serve (2.60) passes request and response bodies between its proxy and a
replica without flow control, so a large upload or download is held in memory as fast as the
faster side moves it. uvicorn stops reading a socket while a request's body waits to be read
and a streamed response waits while the client's socket is full, so a file of any size passes
here in the memory of a few pieces.

Loaded only in the gateway's replicas (uvicorn and starlette come with ``ray[serve]``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from relayllm.batch.service.errors import ServiceError
from relayllm.batch.service.settings import base_url

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

#: How long a fixed port may stay taken before the server gives up: the gateway's previous
#: replica (replaced or restarted) may still be closing it. Short, because Serve gives up
#: on a deployment after a few failed constructors, and the error names the port.
BIND_WAIT_S = 10.0


class DirectServer:
    """uvicorn serving ``handler`` on ``host:port`` (0: a free port) under ``route_prefix``."""

    def __init__(
        self,
        handler: Callable[[Request], Awaitable[Response]],
        host: str,
        port: int,
        route_prefix: str = "/",
    ) -> None:
        self.handler = handler
        self.host = host
        self.requested_port = port
        self.prefix = "" if route_prefix == "/" else route_prefix
        self.port: int | None = None
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (``base_url``)."""
        return base_url(self.host, self.port or self.requested_port, self.prefix or "/")

    async def start(self) -> None:
        """Bind (waiting up to ``BIND_WAIT_S`` for a fixed port another process still holds)
        and serve on the running event loop; returns once the server accepts connections."""
        import uvicorn

        sock = await self._bind()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            lifespan="off",
            proxy_headers=False,
            log_config=None,
            access_log=False,
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        self._server = uvicorn.Server(config)
        self._task = asyncio.get_running_loop().create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():  # uvicorn failed to start: its error, or a plain one
                self._task.result()
                raise ServiceError(f"the gateway's own HTTP server on {self.url} did not start")
            await asyncio.sleep(0.02)
        logger.info("the gateway also serves on %s", self.url)

    async def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        loop = asyncio.get_running_loop()
        deadline = loop.time() + BIND_WAIT_S
        while True:
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.host, self.requested_port))
            except OSError as exc:
                sock.close()
                busy = exc.errno == errno.EADDRINUSE and self.requested_port != 0
                if busy and loop.time() < deadline:
                    await asyncio.sleep(0.5)
                    continue
                raise ServiceError(
                    f"the gateway's own HTTP server cannot listen on "
                    f"{self.host}:{self.requested_port}: {exc.strerror or exc} (set "
                    "direct_port / --direct-port to another port, 0 for any free one, or "
                    "off to serve only through Serve's proxy)"
                ) from None
            sock.listen(2048)
            sock.setblocking(False)
            return sock

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight end (uvicorn's graceful timeout)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait({self._task}, timeout=10)

    async def app(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """The ASGI application: the gateway's handler, as behind Serve's proxy (which gives
        the route prefix as ``root_path``)."""
        from starlette.requests import Request
        from starlette.responses import JSONResponse

        from relayllm.batch.service.objects import error_body

        if scope["type"] != "http":  # no websockets here; lifespan is off
            return
        path: str = scope["path"]
        if self.prefix and not (path == self.prefix or path.startswith(self.prefix + "/")):
            message = f"no route {path!r} (this server's paths start with {self.prefix})"
            await JSONResponse(error_body(message), status_code=404)(scope, receive, send)
            return
        scope = {**scope, "root_path": self.prefix}
        response = await self.handler(Request(scope, receive))
        await response(scope, receive, send)


__all__ = ["BIND_WAIT_S", "DirectServer"]
