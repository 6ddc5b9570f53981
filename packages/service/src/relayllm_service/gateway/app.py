"""The gateway: a Serve application on the cluster's HTTP proxy (and, by default, on its own
HTTP server beside it: :mod:`relayllm.http.server`) that answers OpenAI's
``/v1/files`` and ``/v1/batches`` for the projects of the API keys, and routes
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` to the
deployment a body's ``model`` names, so one ``base_url`` serves online and batch traffic;
every project's usage of both is read at ``/v1/organization/usage/completions`` (usage_api.py).

Routing only: what a client reads is :mod:`~relayllm_service.gateway.objects`' (errors
through ``objects.http_error``), the state is the job store's and the file storage's, and the
online requests go through the deployments' own HTTP front code
(:mod:`~relayllm_service.gateway.online`). Routes, keys, bodies and errors are
:mod:`relayllm.http`'s, as the front's are.
SQLite and file calls run in threads, never on the event loop. Batches are run by the
runner (:mod:`~relayllm_service.runner.loop`), which the gateway starts (or finds running)
and wakes after a create or a cancel.

Loaded only in the gateway's replicas (it imports starlette and, for uploads,
python-multipart: ``pip install 'relayllm[http]'``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from relayllm.http.app import Endpoint, HttpApp, json_body
from relayllm.http.errors import HttpError, json_response
from relayllm_service.console.routes import Console
from relayllm_service.errors import InvalidRequestError, NotFoundError, TooLargeError
from relayllm_service.gateway import objects, params, usage_api
from relayllm_service.gateway.online import ONLINE, OnlineRoutes
from relayllm_service.ids import is_batch_id, is_file_id, new_file_id
from relayllm_service.runner.validate import check_endpoint
from relayllm_service.settings import MAX_EXPIRES_S, ServiceSettings
from relayllm_service.store.admin import AdminStore
from relayllm_service.store.files import CHUNK, FileStorage
from relayllm_service.store.records import check_text
from relayllm_service.store.sqlite import SQLiteJobStore
from relayllm_service.tenancy.keys import ADMIN
from relayllm_service.tenancy.projects import Keys, quotas_now
from relayllm_service.tenancy.quotas import Quotas
from relayllm_service.tenancy.signins import SignInLimit
from relayllm_service.tenancy.usage import UsageLedger

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

#: Room for the multipart envelope around an upload's bytes.
_FORM_SLACK = 64 * 1024

Handler = Callable[..., Awaitable["Response"]]


class Gateway:
    """The gateway's Serve deployment (one or more replicas; the state is shared): a route
    set on :class:`relayllm.http.app.HttpApp`, every ``/v1`` route behind the project keys
    (the admin key's project is every one: :mod:`~relayllm_service.store.admin`; refused keys
    limited per address: :mod:`~relayllm_service.tenancy.signins`), and the console
    (:mod:`~relayllm_service.console.routes`), which signs in with a cookie."""

    def __init__(self, settings: ServiceSettings, keys: Keys) -> None:
        from relayllm_service.runner.loop import start_runner

        self.settings = settings
        self.keys = keys
        os.makedirs(settings.state_dir, exist_ok=True)
        self.jobs = SQLiteJobStore(settings.store_path)
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
        self.app = HttpApp(self._routes() + self.console.routes(), errors=objects.http_error)

    def _routes(self) -> list[Any]:
        from starlette.routing import Route

        table: list[tuple[str, str, Handler]] = [
            ("/v1/files", "POST", self.upload),
            ("/v1/files", "GET", self.list_files),
            ("/v1/files/{file_id}", "GET", self.get_file),
            ("/v1/files/{file_id}", "DELETE", self.delete_file),
            ("/v1/files/{file_id}/content", "GET", self.file_content),
            ("/v1/batches", "POST", self.create_batch),
            ("/v1/batches", "GET", self.list_batches),
            ("/v1/batches/{batch_id}", "GET", self.get_batch),
            ("/v1/batches/{batch_id}/cancel", "POST", self.cancel_batch),
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

    # -- files -----------------------------------------------------------------------------

    async def upload(self, request: Request, project: str) -> Response:
        from starlette.requests import ClientDisconnect

        from relayllm_service.gateway.uploads import FILE_PART, receive_upload

        _creator(project)
        limit = self.settings.max_file_bytes
        # The body is parsed as it arrives and the file written to storage a piece at a time
        # (uploads.py): the storage stops it where it crosses the limit. A Content-Length is
        # required, and one that declares more than the limit is refused before any is read.
        declared = request.headers.get("content-length")
        if not declared or not declared.isdigit():
            raise HttpError(411, "an upload needs a Content-Length header")
        if int(declared) > limit + _FORM_SLACK:
            raise TooLargeError(f"the file is larger than the limit of {limit:,} bytes", "file")
        file_id = new_file_id()
        try:
            received = await receive_upload(
                request.headers.get("content-type"), request.stream(), self.storage, file_id
            )
        except ClientDisconnect:
            raise InvalidRequestError("the client went away before the upload ended") from None
        try:
            form = received.fields
            purpose = form.get("purpose")
            if purpose != "batch":
                raise InvalidRequestError(
                    f"purpose {purpose!r} is not supported here; upload with purpose='batch'",
                    "purpose",
                )
            if received.filename is None:
                raise InvalidRequestError("no file part in the form", FILE_PART)
            filename = check_text(received.filename or "upload.jsonl", FILE_PART)
            expires_s = self._expires_after(
                {
                    key: form[f"expires_after[{key}]"]
                    for key in ("anchor", "seconds")
                    if f"expires_after[{key}]" in form
                }
                or None,
                "expires_after",
            )
            size = await asyncio.to_thread(received.commit)
        except BaseException:
            await asyncio.to_thread(received.discard)
            raise
        try:
            record = await asyncio.to_thread(
                self.store.add_file,
                project,
                filename=filename,
                purpose="batch",
                bytes=size,
                file_id=file_id,
                expires_s=expires_s,
            )
        except BaseException:
            await asyncio.to_thread(self.storage.delete, file_id)
            raise
        return json_response(objects.file_object(record))

    async def list_files(self, request: Request, project: str) -> Response:
        query = params.query_of(request)
        page = await asyncio.to_thread(
            self.store.list_files,
            project,
            after=params.one(query, "after"),
            limit=int(params.whole(query, "limit", 1, 10000, 10000) or 0),
            order=params.choice(query, "order", ("asc", "desc"), "desc"),  # type: ignore[arg-type]
            purpose=params.choice(query, "purpose", params.FILE_PURPOSES, None),
        )
        render = functools.partial(objects.file_object, project=project == ADMIN)
        return json_response(objects.list_object(page, render))

    async def get_file(self, request: Request, project: str, file_id: str) -> Response:
        _check_file_id(file_id)
        record = await asyncio.to_thread(self.store.get_file, project, file_id)
        return json_response(objects.file_object(record, project=project == ADMIN))

    async def file_content(self, request: Request, project: str, file_id: str) -> Response:
        from starlette.responses import StreamingResponse

        _check_file_id(file_id)
        await asyncio.to_thread(self.store.get_file, project, file_id)  # this project's?
        source = await asyncio.to_thread(self.storage.open, file_id)

        def chunks() -> Iterator[bytes]:  # starlette iterates it in a thread
            with source:
                while piece := source.read(CHUNK):
                    yield piece

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def delete_file(self, request: Request, project: str, file_id: str) -> Response:
        _check_file_id(file_id)
        await asyncio.to_thread(self.store.delete_file, project, file_id)
        try:  # the record first: a crash between leaves bytes, never a record without them
            await asyncio.to_thread(self.storage.delete, file_id)
        except NotFoundError:
            pass
        return json_response(objects.file_deleted(file_id))

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, request: Request, project: str) -> Response:
        _creator(project)
        body = await json_body(request)
        endpoint = body.get("endpoint")
        check_endpoint(endpoint)
        input_file_id = body.get("input_file_id")
        _check_file_id(input_file_id, "input_file_id")
        window = body.get("completion_window", "24h")
        keep = self._expires_after(body.get("output_expires_after"), "output_expires_after")
        args = (self.jobs, self.storage, project, str(input_file_id))
        await asyncio.to_thread(self.quotas.estimate, *args)  # its tokens, if a quota asks
        record = await asyncio.to_thread(
            self.store.create_batch,
            project,
            input_file_id=str(input_file_id),
            endpoint=str(endpoint),
            completion_window=str(window),
            metadata=body.get("metadata"),
            window_s=self.settings.window_s,
            output_expires_s=self.settings.output_expires_s if keep is None else keep,
        )
        self._wake_runner()
        return json_response(objects.batch_object(record))

    async def list_batches(self, request: Request, project: str) -> Response:
        query = params.query_of(request)
        after = params.one(query, "after")
        if after is not None:
            _check_batch_id(after)
        limit = int(params.whole(query, "limit", 1, 100, 20) or 0)
        page = await asyncio.to_thread(self.store.list_batches, project, after=after, limit=limit)
        render = functools.partial(objects.batch_object, project=project == ADMIN)
        return json_response(objects.list_object(page, render))

    async def get_batch(self, request: Request, project: str, batch_id: str) -> Response:
        _check_batch_id(batch_id)
        record = await asyncio.to_thread(self.store.get_batch, project, batch_id)
        return json_response(objects.batch_object(record, project=project == ADMIN))

    async def cancel_batch(self, request: Request, project: str, batch_id: str) -> Response:
        _check_batch_id(batch_id)
        record = await asyncio.to_thread(self.store.cancel_batch, project, batch_id)
        self._wake_runner()
        return json_response(objects.batch_object(record, project=project == ADMIN))

    def _expires_after(self, value: Any, param: str) -> int | None:
        """OpenAI's expiration policy (``{"anchor": "created_at", "seconds": N}``, N from an
        hour to 30 days; the lower bound a server setting) as seconds, or None."""
        if value is None:
            return None
        if not isinstance(value, dict) or value.get("anchor") != "created_at":
            raise InvalidRequestError(
                f"{param} must be {{'anchor': 'created_at', 'seconds': N}}", param
            )
        low, high = self.settings.min_expires_s, MAX_EXPIRES_S
        raw: Any = value.get("seconds")
        try:
            seconds = int(raw)  # a form field arrives as text
        except (TypeError, ValueError):
            seconds = -1
        if isinstance(raw, bool) or (isinstance(raw, float) and not raw.is_integer()):
            seconds = -1
        if not low <= seconds <= high:
            raise InvalidRequestError(
                f"{param}.seconds must be a whole number from {low} to {high}", param
            )
        return seconds

    def _wake_runner(self) -> None:
        from relayllm_service.runner.loop import find_runner

        try:  # by name: a gateway with other settings on the same state may have replaced it
            self.runner = find_runner(self.settings.runner_name) or self.runner
            self.runner.wake.remote()
        except Exception:  # the runner restarting: it looks for work when it starts anyway
            logger.warning("could not wake the batch runner", exc_info=True)

    # -- online traffic --------------------------------------------------------------------

    async def models(self, request: Request, project: str) -> Response:
        return json_response(await self.online.models())

    async def _online(self, route: str, request: Request, project: str) -> Response:
        await asyncio.to_thread(self.quotas.admit_request, self.settings.store_path, project)
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


def _check_file_id(value: Any, param: str = "file_id") -> None:
    """A string that is no file id names no file (404, as OpenAI answers); another type is
    a bad parameter (400)."""
    if is_file_id(value):
        return
    if isinstance(value, str):
        raise NotFoundError(f"no file {value!r}")
    raise InvalidRequestError(f"{param} must be a file id", param)


def _creator(project: str) -> None:
    if project == ADMIN:
        raise HttpError(
            403, "the admin key reads, cancels and deletes; create with a project's key"
        )


def _check_batch_id(value: str) -> None:
    if not is_batch_id(value):
        raise NotFoundError(f"no batch {value!r}")


__all__ = ["ONLINE", "Gateway", "GatewayReplica"]
