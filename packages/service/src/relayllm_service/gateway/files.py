"""The Files routes: ``/v1/files`` (an upload streamed to the file storage as it arrives, the
project's list), ``/v1/files/{file_id}`` (get, delete) and its ``/content``, for a project's
key or the admin key (who reads and deletes every project's and uploads nothing).

The checks the Batches routes share are here too: a file id, an expiration policy, a creator.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from relayllm.http.errors import HttpError, json_response
from relayllm_service.errors import InvalidRequestError, NotFoundError, TooLargeError
from relayllm_service.gateway import objects, params
from relayllm_service.ids import is_file_id, new_file_id
from relayllm_service.settings import MAX_EXPIRES_S, ServiceSettings
from relayllm_service.store.admin import AdminStore
from relayllm_service.store.files import CHUNK, FileStorage
from relayllm_service.store.records import check_text
from relayllm_service.tenancy.keys import ADMIN

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

#: Room for the multipart envelope around an upload's bytes.
_FORM_SLACK = 64 * 1024

#: A route's handler: ``handler(request, project, **path parameters)``.
Handler = Callable[..., Awaitable["Response"]]


class FileRoutes:
    """The Files routes on the job store (the admin's view) and the file storage."""

    def __init__(self, settings: ServiceSettings, store: AdminStore, storage: FileStorage) -> None:
        self.settings = settings
        self.store = store
        self.storage = storage

    def table(self) -> list[tuple[str, str, Handler]]:
        return [
            ("/v1/files", "POST", self.upload),
            ("/v1/files", "GET", self.list_files),
            ("/v1/files/{file_id}", "GET", self.get_file),
            ("/v1/files/{file_id}", "DELETE", self.delete_file),
            ("/v1/files/{file_id}/content", "GET", self.file_content),
        ]

    async def upload(self, request: Request, project: str) -> Response:
        from starlette.requests import ClientDisconnect

        from relayllm_service.gateway.uploads import FILE_PART, receive_upload

        creator(project)
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
            expires_s = expires_after(
                {
                    key: form[f"expires_after[{key}]"]
                    for key in ("anchor", "seconds")
                    if f"expires_after[{key}]" in form
                }
                or None,
                "expires_after",
                self.settings.min_expires_s,
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
        check_file_id(file_id)
        record = await asyncio.to_thread(self.store.get_file, project, file_id)
        return json_response(objects.file_object(record, project=project == ADMIN))

    async def file_content(self, request: Request, project: str, file_id: str) -> Response:
        from starlette.responses import StreamingResponse

        check_file_id(file_id)
        await asyncio.to_thread(self.store.get_file, project, file_id)  # this project's?
        source = await asyncio.to_thread(self.storage.open, file_id)

        def chunks() -> Iterator[bytes]:  # starlette iterates it in a thread
            with source:
                while piece := source.read(CHUNK):
                    yield piece

        return StreamingResponse(chunks(), media_type="application/octet-stream")

    async def delete_file(self, request: Request, project: str, file_id: str) -> Response:
        check_file_id(file_id)
        await asyncio.to_thread(self.store.delete_file, project, file_id)
        try:  # the record first: a crash between leaves bytes, never a record without them
            await asyncio.to_thread(self.storage.delete, file_id)
        except NotFoundError:
            pass
        return json_response(objects.file_deleted(file_id))


def check_file_id(value: Any, param: str = "file_id") -> None:
    """A string that is no file id names no file (404, as OpenAI answers); another type is
    a bad parameter (400)."""
    if is_file_id(value):
        return
    if isinstance(value, str):
        raise NotFoundError(f"no file {value!r}")
    raise InvalidRequestError(f"{param} must be a file id", param)


def creator(project: str) -> None:
    """Uploads and batches belong to a project: the admin key creates nothing."""
    if project == ADMIN:
        raise HttpError(
            403, "the admin key reads, cancels and deletes; create with a project's key"
        )


def expires_after(value: Any, param: str, low: int) -> int | None:
    """OpenAI's expiration policy (``{"anchor": "created_at", "seconds": N}``, N from an
    hour to 30 days; the lower bound ``low`` a server setting) as seconds, or None."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("anchor") != "created_at":
        raise InvalidRequestError(
            f"{param} must be {{'anchor': 'created_at', 'seconds': N}}", param
        )
    high = MAX_EXPIRES_S
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


__all__ = ["FileRoutes", "Handler", "check_file_id", "creator", "expires_after"]
