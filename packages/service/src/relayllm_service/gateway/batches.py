"""The Batches routes: ``/v1/batches`` (create from an uploaded file, the project's list),
``/v1/batches/{batch_id}`` and its ``/cancel``, for a project's key or the admin key (who
reads and cancels every project's and creates nothing). The runner does the work; a create or
a cancel wakes it.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from relayllm.http.app import json_body
from relayllm.http.errors import json_response
from relayllm_service.errors import NotFoundError
from relayllm_service.gateway import objects, params
from relayllm_service.gateway.files import Handler, check_file_id, creator, expires_after
from relayllm_service.ids import is_batch_id
from relayllm_service.runner.validate import check_endpoint
from relayllm_service.settings import ServiceSettings
from relayllm_service.store.admin import AdminStore
from relayllm_service.store.files import FileStorage
from relayllm_service.store.sql import SQLJobStore
from relayllm_service.tenancy.keys import ADMIN
from relayllm_service.tenancy.quotas import Quotas

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response


class BatchRoutes:
    """The Batches routes on the job store (the admin's view; quotas estimated on the store
    itself) and the file storage; ``wake`` tells the runner there is work."""

    def __init__(
        self,
        settings: ServiceSettings,
        store: AdminStore,
        jobs: SQLJobStore,
        storage: FileStorage,
        quotas: Quotas,
        wake: Callable[[], None],
    ) -> None:
        self.settings = settings
        self.store = store
        self.jobs = jobs
        self.storage = storage
        self.quotas = quotas
        self.wake = wake

    def table(self) -> list[tuple[str, str, Handler]]:
        return [
            ("/v1/batches", "POST", self.create_batch),
            ("/v1/batches", "GET", self.list_batches),
            ("/v1/batches/{batch_id}", "GET", self.get_batch),
            ("/v1/batches/{batch_id}/cancel", "POST", self.cancel_batch),
        ]

    async def create_batch(self, request: Request, project: str) -> Response:
        creator(project)
        body = await json_body(request)
        endpoint = body.get("endpoint")
        check_endpoint(endpoint)
        input_file_id = body.get("input_file_id")
        check_file_id(input_file_id, "input_file_id")
        window = body.get("completion_window", "24h")
        keep = expires_after(
            body.get("output_expires_after"), "output_expires_after", self.settings.min_expires_s
        )
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
        self.wake()
        return json_response(objects.batch_object(record))

    async def list_batches(self, request: Request, project: str) -> Response:
        query = params.query_of(request)
        after = params.one(query, "after")
        if after is not None:
            check_batch_id(after)
        limit = int(params.whole(query, "limit", 1, 100, 20) or 0)
        page = await asyncio.to_thread(self.store.list_batches, project, after=after, limit=limit)
        render = functools.partial(objects.batch_object, project=project == ADMIN)
        return json_response(objects.list_object(page, render))

    async def get_batch(self, request: Request, project: str, batch_id: str) -> Response:
        check_batch_id(batch_id)
        record = await asyncio.to_thread(self.store.get_batch, project, batch_id)
        return json_response(objects.batch_object(record, project=project == ADMIN))

    async def cancel_batch(self, request: Request, project: str, batch_id: str) -> Response:
        check_batch_id(batch_id)
        record = await asyncio.to_thread(self.store.cancel_batch, project, batch_id)
        self.wake()
        return json_response(objects.batch_object(record, project=project == ADMIN))


def check_batch_id(value: str) -> None:
    if not is_batch_id(value):
        raise NotFoundError(f"no batch {value!r}")


__all__ = ["BatchRoutes", "check_batch_id"]
