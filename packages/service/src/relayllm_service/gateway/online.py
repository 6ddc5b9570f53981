"""The gateway's online routes: ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/embeddings`` answered by the deployment a body's ``model`` names, with that deployment's
own HTTP front code (:class:`relayllm.serving.http_front.HttpFront`, with
:mod:`relayllm.openai_body`'s one translation) hosted by :class:`DeploymentOverHandle`, which
calls the deployment through its Serve handle; and ``/v1/models``, every deployment's. So a
request answers the same through the gateway as through the deployment's own front."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from relayllm.http.app import json_body
from relayllm.rows import Request as Row
from relayllm.rows import Result
from relayllm.serving.http_front import ROUTES, HttpFront
from relayllm_service.errors import NotFoundError

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: Online routes: path -> what a deployment's HTTP front answers there.
ONLINE = {path: route for path, (_, route) in ROUTES.items() if route != "models"}


class DeploymentOverHandle:
    """A running deployment as :class:`~relayllm.serving.http_front.HttpFront` reads its
    host (:class:`relayllm.http.host.FrontHost`), answered through its Serve handle: the
    same methods the deployment's own front calls, so admission, priorities, counts and the
    pause gate are the replica's own."""

    def __init__(self, handle: Any, describe: dict[str, Any], info: dict[str, Any]) -> None:
        self.deployment = describe
        self.backend_name = str(info.get("backend") or describe.get("backend") or "unknown")
        self._info = info
        self._handle = handle

    def engine_info(self) -> dict[str, Any]:
        return self._info

    async def serve_http_row(self, request: Row) -> Result:
        result: Result = await self._handle.serve_http_row.remote(request)
        return result

    async def serve_http_rows(self, requests: list[Row]) -> list[Result]:
        results: list[Result] = await self._handle.serve_http_rows.remote(requests)
        return results

    async def stream_http_row(self, request: Row) -> AsyncIterator[Result]:
        async for part in self._handle.options(stream=True).stream_http_row.remote(request):
            yield part


class OnlineRoutes:
    """The front code of each deployment the gateway has answered for, by name (made once
    per name: the next request skips Serve's status call)."""

    def __init__(self) -> None:
        self.fronts: dict[str, HttpFront] = {}

    async def models(self) -> dict[str, Any]:
        """``/v1/models``: every deployment, by the name routing matches."""
        from relayllm_service.runner.job import deployment_names

        data = []
        for name in await asyncio.to_thread(deployment_names):
            front = await self.front(name)
            data.extend(front.models_body()["data"])
        return {"object": "list", "data": data}

    async def answer(self, route: str, request: Request) -> Response:
        """A chat, completion or embeddings request, answered by the front code of the
        deployment its ``model`` names (the key was checked here: the front asks no other)."""
        from relayllm.batch.format import default_deployment, route_models
        from relayllm.errors import ConfigError
        from relayllm_service.runner.job import deployment_names

        body = await json_body(request)  # the Request keeps it: the front reads it again
        model = body.get("model")
        cached = self.fronts.get(model) if isinstance(model, str) else None
        if cached is not None:  # a deployment already answered here: no Serve status call
            return await cached.answer(route, request)
        names = await asyncio.to_thread(deployment_names)
        try:
            name = route_models(
                {model if isinstance(model, str) else None: 1},
                names,
                default_deployment(names),
            )[model if isinstance(model, str) else None]
        except ConfigError:
            raise NotFoundError(
                f"model {model!r} names no deployment here (deployments: "
                f"{', '.join(names) or 'none'})"
            ) from None
        front = await self.front(name)
        return await front.answer(route, request)

    async def front(self, name: str) -> HttpFront:
        """The HTTP front code of deployment ``name``, on a handle (made once per name)."""
        front = self.fronts.get(name)
        if front is None:
            from relayllm.deployments import handle_for
            from relayllm.serving.http_config import HttpConfig

            handle = await asyncio.to_thread(handle_for, name)
            describe = await handle.describe.remote()
            info = await handle.info.remote()
            # Here a deployment is known by its name (what routing matches and /v1/models
            # lists), not its own http.model_name; and the gateway's project keys replace
            # its http.api_key_env: the gateway checked the key before this.
            host = DeploymentOverHandle(handle, describe, info)
            front = self.fronts[name] = HttpFront(host, HttpConfig(), name)
        return front


__all__ = ["ONLINE", "DeploymentOverHandle", "OnlineRoutes"]
