"""The direct server: uvicorn serving an :class:`~relayllm.http.app.HttpApp` on the running
event loop (a Serve replica's), under a route prefix, beside Serve's proxy.

Why a second door: Serve (2.60) passes request and response bodies between its proxy and a
replica without flow control, so a large upload or download is held in memory as fast as the
faster side moves it. uvicorn stops reading a socket while a request's body waits to be read
and a streamed response waits while the client's socket is full, so a file of any size passes
here in the memory of a few pieces.

Light at import (uvicorn and starlette are imported when a server starts): :func:`base_url`
is the config models' too.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
from typing import Any

from relayllm.errors import RelayLLMError
from relayllm.http.errors import envelope, json_response

logger = logging.getLogger(__name__)

#: How long a fixed port may stay taken before the server gives up: the previous replica
#: (replaced or restarted) may still be closing it. Short, because Serve gives up on a
#: deployment after a few failed constructors, and the error names the port.
BIND_WAIT_S = 10.0


class ServerError(RelayLLMError):
    """The direct server could not listen or start (the message names the address)."""


def base_url(host: str, port: int, route_prefix: str) -> str:
    """The ``base_url`` an OpenAI client on the same node takes for a server bound to ``host``
    (any address: loopback) and ``port`` under ``route_prefix``."""
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}{route_prefix.rstrip('/')}/v1"


class DirectServer:
    """uvicorn serving ``app`` on ``host:port`` (0: a free port) under ``route_prefix``;
    ``hint`` ends the error of a port it cannot take (what to set instead)."""

    def __init__(
        self, app: Any, host: str, port: int, route_prefix: str = "/", hint: str = ""
    ) -> None:
        self.app = app
        self.host = host
        self.requested_port = port
        self.prefix = "" if route_prefix == "/" else route_prefix
        self.hint = hint
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
            self._mounted,
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
                raise ServerError(f"the HTTP server on {self.url} did not start")
            await asyncio.sleep(0.02)
        logger.info("serving on %s", self.url)

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
                raise ServerError(
                    f"the HTTP server cannot listen on {self.host}:{self.requested_port}: "
                    f"{exc.strerror or exc}" + (f" ({self.hint})" if self.hint else "")
                ) from None
            sock.listen(2048)
            sock.setblocking(False)
            return sock

    async def stop(self) -> None:
        """Stop accepting, let the requests in flight end (uvicorn's graceful timeout)."""
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait({self._task}, timeout=10)

    async def _mounted(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """``app`` under the prefix, given as ``root_path`` as Serve's proxy gives it."""
        if scope["type"] == "http" and self.prefix:
            path: str = scope["path"]
            if not (path == self.prefix or path.startswith(self.prefix + "/")):
                message = f"no route {path!r} (this server's paths start with {self.prefix})"
                response = json_response(envelope(message, code="not_found"), 404)
                await response(scope, receive, send)
                return
            scope = {**scope, "root_path": self.prefix}
        await self.app(scope, receive, send)


__all__ = ["BIND_WAIT_S", "DirectServer", "ServerError", "base_url"]
