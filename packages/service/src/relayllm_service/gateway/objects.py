"""Store rows as the JSON bodies OpenAI's API returns (a Batch, a File, a list page, a deleted
file, an error), so the gateway only routes: what a client reads is decided here, once, and
tested against the ``openai`` package's own types.

Nothing a client should not see leaves through these: a batch's claim number and runner stay
in the store (its project goes only to the admin key). Errors become answers in the HTTP
layer (:func:`relayllm.http.errors.refusal_of`), not here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from relayllm_service.store.records import BatchRecord, FileRecord, Page

T = TypeVar("T")


def batch_object(record: BatchRecord, *, project: bool = False) -> dict[str, Any]:
    """OpenAI's Batch object; ``project``: with its project (for the admin key, which sees
    every project's: an extra field the ``openai`` client keeps)."""
    counts = record.request_counts
    shown = {"project": record.project} if project else {}
    return {
        "id": record.id,
        "object": "batch",
        "endpoint": record.endpoint,
        "errors": None if record.errors is None else {"object": "list", "data": record.errors},
        "input_file_id": record.input_file_id,
        "completion_window": record.completion_window,
        "status": record.status,
        "output_file_id": record.output_file_id,
        "error_file_id": record.error_file_id,
        "created_at": record.created_at,
        "in_progress_at": record.in_progress_at,
        "expires_at": record.expires_at,
        "finalizing_at": record.finalizing_at,
        "completed_at": record.completed_at,
        "failed_at": record.failed_at,
        "expired_at": record.expired_at,
        "cancelling_at": record.cancelling_at,
        "cancelled_at": record.cancelled_at,
        "request_counts": {
            "total": counts.total,
            "completed": counts.completed,
            "failed": counts.failed,
        },
        "metadata": record.metadata,
        **shown,
    }


def file_object(record: FileRecord, *, project: bool = False) -> dict[str, Any]:
    """OpenAI's File object (``status`` is deprecated upstream; a stored file is always
    ``processed``); ``project``: with its project, as :func:`batch_object`."""
    shown = {"project": record.project} if project else {}
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "status_details": None,
        **shown,
    }


def file_deleted(file_id: str) -> dict[str, Any]:
    return {"id": file_id, "object": "file", "deleted": True}


def list_object(page: Page[T], render: Callable[[T], dict[str, Any]]) -> dict[str, Any]:
    """A cursor page as OpenAI lists (the ``openai`` client pages with the last item's id as
    ``after`` while ``has_more``)."""
    data = [render(item) for item in page.data]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": page.has_more,
    }


__all__ = [
    "batch_object",
    "file_deleted",
    "file_object",
    "list_object",
]
