"""The gateway: a Serve application on the cluster's HTTP proxy (and, by default, on its own
HTTP server beside it: :mod:`~relayllm.batch.service.direct`) that answers OpenAI's
``/v1/files`` and ``/v1/batches`` for the projects of the API keys, and routes
``/v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` and ``/v1/models`` to the
deployment a body's ``model`` names, so one ``base_url`` serves online and batch traffic.

Routing only: what a client reads is :mod:`~relayllm.batch.service.objects`' (errors
through ``objects.http_error``), the state is the job store's and the file storage's, and the
online requests go through the deployments' own HTTP front code
(:class:`relayllm.serving.http_front.HttpFront`, with :mod:`relayllm.openai_body`'s one
translation), given a stand-in for its replica that calls the deployment through a handle.
SQLite and file calls run in threads, never on the event loop. Batches are run by the
runner (:mod:`~relayllm.batch.service.runner`), which the gateway starts (or finds running)
and wakes after a create or a cancel.

Loaded only in the gateway's replicas (it imports starlette and, for uploads,
python-multipart: ``pip install 'relayllm[http]'``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from relayllm.batch.service import objects
from relayllm.batch.service.errors import (
    InvalidRequestError,
    NotFoundError,
    TooLargeError,
)
from relayllm.batch.service.files import CHUNK, FileStorage
from relayllm.batch.service.ids import is_batch_id, is_file_id, new_file_id
from relayllm.batch.service.keys import KeyMap
from relayllm.batch.service.settings import MAX_EXPIRES_S, ServiceSettings
from relayllm.batch.service.store import SQLiteJobStore
from relayllm.batch.service.validate import check_endpoint

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

logger = logging.getLogger(__name__)

#: Online routes: served by a deployment's HTTP front code.
ONLINE = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings"}
#: Room for the multipart envelope around an upload's bytes.
_FORM_SLACK = 64 * 1024

Handler = Callable[..., Awaitable["Response"]]


class RemoteReplica:
    """What :class:`~relayllm.serving.http_front.HttpFront` reads of its replica, answered
    by a running deployment through its handle (the same methods the deployment's own front
    calls, so admission, priorities and counts are the same)."""

    def __init__(self, handle: Any, describe: dict[str, Any], info: dict[str, Any]) -> None:
        self.deployment = describe
        self.backend_name = str(info.get("backend") or describe.get("backend") or "unknown")
        self._info = info
        self._handle = handle

    def engine_info(self) -> dict[str, Any]:
        return self._info

    async def serve_http_row(self, row: dict[str, Any]) -> Any:
        return await self._handle.serve_http_row.remote(row)

    async def stream_http_row(self, row: dict[str, Any]) -> Any:
        async for part in self._handle.options(stream=True).stream_http_row.remote(row):
            yield part


class Gateway:
    """The gateway's Serve deployment (one or more replicas; the state is shared)."""

    def __init__(self, settings: ServiceSettings, keys: KeyMap) -> None:
        from relayllm.batch.service.runner import start_runner

        self.settings = settings
        self.keys = keys
        os.makedirs(settings.state_dir, exist_ok=True)
        self.store = SQLiteJobStore(settings.store_path)
        self.storage = FileStorage.from_uri(settings.files_location, settings.max_file_bytes)
        self.fronts: dict[str, Any] = {}
        self.runner = start_runner(settings)
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("POST", re.compile(r"/v1/files"), self.upload),
            ("GET", re.compile(r"/v1/files"), self.list_files),
            ("GET", re.compile(r"/v1/files/([^/]+)"), self.get_file),
            ("GET", re.compile(r"/v1/files/([^/]+)/content"), self.file_content),
            ("DELETE", re.compile(r"/v1/files/([^/]+)"), self.delete_file),
            ("POST", re.compile(r"/v1/batches"), self.create_batch),
            ("GET", re.compile(r"/v1/batches"), self.list_batches),
            ("GET", re.compile(r"/v1/batches/([^/]+)"), self.get_batch),
            ("POST", re.compile(r"/v1/batches/([^/]+)/cancel"), self.cancel_batch),
            ("GET", re.compile(r"/v1/models"), self.models),
        ]

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
        try:
            project = self.keys.project_for_header(request.headers.get("authorization"))
            path = _path(request)
            if path in ONLINE:
                return await self.online(request)
            for method, pattern, handler in self.routes:
                match = pattern.fullmatch(path)
                if match and request.method == method:
                    return await handler(request, project, *match.groups())
            if any(pattern.fullmatch(path) for _, pattern, _ in self.routes):
                raise _HttpStatus(405, f"{path} does not take {request.method}")
            raise _HttpStatus(404, f"no route {path!r}")
        except _HttpStatus as exc:
            return _json(objects.error_body(str(exc)), exc.status)
        except Exception as exc:
            status, body = objects.http_error(exc)
            if status == 500:
                logger.exception("the gateway failed on %s %s", request.method, request.url.path)
            return _json(body, status)

    # -- files -----------------------------------------------------------------------------

    async def upload(self, request: Request, project: str) -> Response:
        from starlette.requests import ClientDisconnect

        from relayllm.batch.service.uploads import FILE_PART, receive_upload

        limit = self.settings.max_file_bytes
        # The body is parsed as it arrives and the file written to storage a piece at a time
        # (uploads.py): the storage stops it where it crosses the limit. A Content-Length is
        # required, and one that declares more than the limit is refused before any is read.
        declared = request.headers.get("content-length")
        if not declared or not declared.isdigit():
            raise _HttpStatus(411, "an upload needs a Content-Length header")
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
            filename = received.filename or "upload.jsonl"
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
        return _json(objects.file_object(record))

    async def list_files(self, request: Request, project: str) -> Response:
        query = request.query_params
        page = await asyncio.to_thread(
            self.store.list_files,
            project,
            after=query.get("after"),
            limit=_int(query.get("limit"), 10000),
            order=query.get("order", "desc"),  # type: ignore[arg-type]
            purpose=query.get("purpose"),
        )
        return _json(objects.list_object(page, objects.file_object))

    async def get_file(self, request: Request, project: str, file_id: str) -> Response:
        _check_file_id(file_id)
        record = await asyncio.to_thread(self.store.get_file, project, file_id)
        return _json(objects.file_object(record))

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
        return _json(objects.file_deleted(file_id))

    # -- batches ---------------------------------------------------------------------------

    async def create_batch(self, request: Request, project: str) -> Response:
        body = await _json_body(request)
        endpoint = body.get("endpoint")
        check_endpoint(endpoint)
        input_file_id = body.get("input_file_id")
        _check_file_id(input_file_id, "input_file_id")
        window = body.get("completion_window", "24h")
        keep = self._expires_after(body.get("output_expires_after"), "output_expires_after")
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
        return _json(objects.batch_object(record))

    async def list_batches(self, request: Request, project: str) -> Response:
        query = request.query_params
        after = query.get("after")
        if after is not None:
            _check_batch_id(after)
        page = await asyncio.to_thread(
            self.store.list_batches, project, after=after, limit=_int(query.get("limit"), 20)
        )
        return _json(objects.list_object(page, objects.batch_object))

    async def get_batch(self, request: Request, project: str, batch_id: str) -> Response:
        _check_batch_id(batch_id)
        record = await asyncio.to_thread(self.store.get_batch, project, batch_id)
        return _json(objects.batch_object(record))

    async def cancel_batch(self, request: Request, project: str, batch_id: str) -> Response:
        _check_batch_id(batch_id)
        record = await asyncio.to_thread(self.store.cancel_batch, project, batch_id)
        self._wake_runner()
        return _json(objects.batch_object(record))

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
        from relayllm.batch.service.runner import find_runner

        try:  # by name: a gateway with other settings on the same state may have replaced it
            self.runner = find_runner(self.settings.runner_name) or self.runner
            self.runner.wake.remote()
        except Exception:  # the runner restarting: it looks for work when it starts anyway
            logger.warning("could not wake the batch runner", exc_info=True)

    # -- online traffic --------------------------------------------------------------------

    async def models(self, request: Request, project: str) -> Response:
        from relayllm.batch.service.runner import deployment_names

        data = []
        for name in await asyncio.to_thread(deployment_names):
            front = await self._front(name)
            data.extend(front.models_body()["data"])
        return _json({"object": "list", "data": data})

    async def online(self, request: Request) -> Response:
        from relayllm.batch.format import default_deployment, route_models
        from relayllm.batch.service.runner import deployment_names
        from relayllm.errors import ConfigError

        body = await _json_body(request)  # starlette keeps it: the front reads it again
        model = body.get("model")
        cached = self.fronts.get(model) if isinstance(model, str) else None
        if cached is not None:  # a deployment already answered here: no Serve status call
            answer: Response = await cached(request)
            return answer
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
        front = await self._front(name)
        response: Response = await front(request)
        return response

    async def _front(self, name: str) -> Any:
        """The HTTP front code of deployment ``name``, on a handle (made once per name)."""
        front = self.fronts.get(name)
        if front is None:
            from relayllm.deployments import handle_for
            from relayllm.serving.http_config import HttpConfig
            from relayllm.serving.http_front import HttpFront

            handle = await asyncio.to_thread(handle_for, name)
            describe = await handle.describe.remote()
            info = await handle.info.remote()
            replica: Any = RemoteReplica(handle, describe, info)
            # Here a deployment is known by its name (what routing matches and /v1/models
            # lists), not its own http.model_name; and the gateway's project keys replace
            # its http.api_key_env: the gateway checked the key before this.
            front = self.fronts[name] = HttpFront(replica, HttpConfig(), name)
        return front


class GatewayReplica(Gateway):
    """The gateway as Serve runs it: also on its own HTTP server (``settings.direct_port``,
    :mod:`~relayllm.batch.service.direct`), the URL it then gives clients, where files of
    any size pass in flat memory."""

    # Serve awaits an async constructor and destructor on the replica's event loop, where
    # the server must run (the same loop as the requests Serve's proxy sends).
    async def __init__(self, settings: ServiceSettings, keys: KeyMap) -> None:  # type: ignore[misc]
        from relayllm.batch.service.direct import DirectServer

        super().__init__(settings, keys)
        self.direct: DirectServer | None = None
        if settings.direct_port is not None:
            direct = DirectServer(
                self.__call__, settings.host, settings.direct_port, settings.route_prefix
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


class _HttpStatus(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _path(request: Request) -> str:
    path = request.url.path
    root = request.scope.get("root_path") or ""
    if root and path.startswith(root):
        path = path[len(root) :]
    return path.rstrip("/") or "/"


def _check_file_id(value: Any, param: str = "file_id") -> None:
    """A string that is no file id names no file (404, as OpenAI answers); another type is
    a bad parameter (400)."""
    if is_file_id(value):
        return
    if isinstance(value, str):
        raise NotFoundError(f"no file {value!r}")
    raise InvalidRequestError(f"{param} must be a file id", param)


def _check_batch_id(value: str) -> None:
    if not is_batch_id(value):
        raise NotFoundError(f"no batch {value!r}")


def _int(value: str | None, default: int) -> int:
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError(f"{value!r} is not a number", "limit") from None


async def _json_body(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise InvalidRequestError("the body is not JSON") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("the body must be a JSON object")
    return body


def _json(body: Any, status: int = 200) -> Response:
    from starlette.responses import JSONResponse

    return JSONResponse(body, status_code=status)


__all__ = ["ONLINE", "Gateway", "GatewayReplica", "RemoteReplica"]
