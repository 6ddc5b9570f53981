"""The gateway: a Serve application on the cluster's HTTP proxy (and, by default, on its own
HTTP server beside it: :mod:`relayllm.http.server`) that answers OpenAI's
``/v1/files`` and ``/v1/batches`` for the projects of the API keys, and routes
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` to the
deployment a body's ``model`` names, so one ``base_url`` serves online and batch traffic;
every project's usage of both is read at ``/v1/organization/usage/completions`` (usage_api.py).

Routing only: each feature owns its routes (:mod:`~relayllm_service.gateway.files`,
:mod:`~relayllm_service.gateway.batches`, :mod:`~relayllm_service.gateway.online`,
:mod:`~relayllm_service.gateway.usage_api`, the console's); what a client reads is
:mod:`~relayllm_service.gateway.objects`' (errors through ``relayllm.http.errors``), the state is
the job store's and the file storage's, and the online requests go through the deployments'
own HTTP front code. Routes, keys, bodies and errors are
:mod:`relayllm.http`'s, as the front's are.
SQLite and file calls run in threads, never on the event loop. Batches are run by the
runner (:mod:`~relayllm_service.runner.loop`), which the gateway starts (or finds running)
and wakes after a create or a cancel.

Loaded only in the gateway's replicas (it imports starlette and, for uploads,
python-multipart, both this package's requirements).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from typing import TYPE_CHECKING, Any

from relayllm.http.app import Endpoint, HttpApp
from relayllm.http.errors import json_response
from relayllm_service.console.routes import Console
from relayllm_service.gateway import usage_api
from relayllm_service.gateway.batches import BatchRoutes
from relayllm_service.gateway.files import FileRoutes, Handler
from relayllm_service.gateway.online import ONLINE, OnlineRoutes
from relayllm_service.settings import ServiceSettings
from relayllm_service.store.admin import AdminStore
from relayllm_service.store.files import FileStorage
from relayllm_service.store.location import open_store
from relayllm_service.tenancy.projects import Keys, quotas_now
from relayllm_service.tenancy.quotas import Quotas
from relayllm_service.tenancy.signins import SignInLimit
from relayllm_service.tenancy.usage import UsageLedger

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)


class Gateway:
    """The gateway's Serve deployment (one or more replicas; the state is shared): a route
    set on :class:`relayllm.http.app.HttpApp`, every ``/v1`` route behind the project keys
    (the admin key's project is every one: :mod:`~relayllm_service.store.admin`; refused keys
    limited per address: :mod:`~relayllm_service.tenancy.signins`), and the console
    (:mod:`~relayllm_service.console.routes`), which signs in with a cookie."""

    def __init__(self, settings: ServiceSettings, keys: Keys) -> None:
        from relayllm_service.runner.actor import start_runner

        self.settings = settings
        self.keys = keys
        os.makedirs(settings.state_dir, exist_ok=True)
        self.jobs = open_store(settings.store_path)  # SQLite's file or PostgreSQL
        self.store = AdminStore(self.jobs)  # the admin key's project is every one
        self.ledger = UsageLedger(settings.store_path, recording=settings.record_usage)  # usage.py
        live = quotas_now(settings.quotas_file, settings.quotas)  # the file's as it changes
        self.quotas = Quotas.install(self.jobs, settings.quotas, live)  # checked as it writes
        self.storage = FileStorage.from_uri(settings.files_location, settings.max_file_bytes)
        self.online = OnlineRoutes()
        self.fronts = self.online.fronts  # the front code of each deployment, by name
        self.runner = start_runner(settings)
        self.signins = SignInLimit()  # refused keys per client address: 429 past a bound
        self.console = Console(self.store, keys, self.storage, self.ledger, self.signins)
        self.files = FileRoutes(settings, self.store, self.storage)
        self.batches = BatchRoutes(
            settings, self.store, self.jobs, self.storage, self.quotas, self._wake_runner
        )
        self.app = HttpApp(self._routes() + self.console.routes(), server="the batch service")

    def _routes(self) -> list[Any]:
        from starlette.routing import Route

        table: list[tuple[str, str, Handler]] = [
            *self.files.table(),
            *self.batches.table(),
            ("/v1/models", "GET", self.models),
            ("/v1/organization/usage/completions", "GET", self.usage),
        ]
        table += [
            (path, "POST", functools.partial(self._online, route)) for path, route in ONLINE.items()
        ]
        return [
            Route(path, self._keyed(handler), methods=[method]) for path, method, handler in table
        ]

    def _keyed(self, handler: Handler) -> Endpoint:
        """``handler(request, project, **path parameters)`` for the project of the key."""

        async def endpoint(request: Request) -> Response:
            project = self.signins.project_of(request, self.keys)
            return await handler(request, project, **request.path_params)

        return endpoint

    @property
    def url(self) -> str:
        """The base URL clients are told (the proxy's; :class:`GatewayReplica` has its own)."""
        return self.settings.url

    async def describe(self) -> dict[str, Any]:
        """What the gateway runs with (``relayllm status``, the reuse check): its settings,
        its keys' fingerprint (no key), its URLs and the batches not finished yet."""
        unfinished = await asyncio.to_thread(self.store.unfinished)
        return {
            "settings": self.settings.model_dump(mode="json"),
            "keys": self.keys.fingerprint,
            "url": self.url,
            "proxy_url": self.settings.url,
            "unfinished": len(unfinished),
        }

    async def __call__(self, request: Request) -> Response:
        return await self.app.respond(request)

    def _wake_runner(self) -> None:
        from relayllm_service.runner.actor import find_runner

        try:  # by name: a gateway with other settings on the same state may have replaced it
            self.runner = find_runner(self.settings.runner_name) or self.runner
            self.runner.wake.remote()
        except Exception:  # the runner restarting: it looks for work when it starts anyway
            logger.warning("could not wake the batch runner", exc_info=True)

    # -- online traffic --------------------------------------------------------------------

    async def models(self, request: Request, project: str) -> Response:
        return json_response(await self.online.models())

    async def _online(self, route: str, request: Request, project: str) -> Response:
        await asyncio.to_thread(self.quotas.admit_request, self.jobs.file, project)
        answer = await self.online.answer(route, request)
        return await usage_api.metered(answer, project, self.ledger)

    async def usage(self, request: Request, project: str) -> Response:
        return await usage_api.answer(self.ledger, request, project)


class GatewayReplica(Gateway):
    """The gateway as Serve runs it: also on its own HTTP server (``settings.direct_port``,
    :mod:`relayllm.http.server`), the URL it then gives clients, where files of
    any size pass in flat memory."""

    # Serve awaits an async constructor and destructor on the replica's event loop, where
    # the server must run (the same loop as the requests Serve's proxy sends).
    async def __init__(self, settings: ServiceSettings, keys: Keys) -> None:  # type: ignore[misc]
        from relayllm.http.server import DirectServer

        super().__init__(settings, keys)
        self.direct: DirectServer | None = None
        if settings.direct_port is not None:
            direct = DirectServer(
                self.app,
                settings.host,
                settings.direct_port,
                settings.route_prefix,
                hint="set direct_port / --direct-port to another port, 0 for any free one, or "
                "off to serve only through Serve's proxy",
            )
            await direct.start()
            self.direct = direct

    @property
    def url(self) -> str:
        return self.direct.url if self.direct is not None else self.settings.url

    async def __del__(self) -> None:
        direct = getattr(self, "direct", None)  # None if the constructor failed before it
        if direct is not None:
            await direct.stop()


__all__ = ["Gateway", "GatewayReplica"]
