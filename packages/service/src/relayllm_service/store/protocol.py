"""What the gateway and the runners need of a job store (:class:`JobStore`): one small
interface, so a server database can replace SQLite later without either of them changing.
:class:`~relayllm_service.store.sqlite.SQLiteJobStore` is the one implementation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol

from relayllm_service.store.records import BatchRecord, FileRecord, Page, RequestCounts, Status


class JobStore(Protocol):
    """What the gateway and the runners need of a store. Project-scoped calls answer
    :class:`NotFoundError` for another project's ids; runner calls (``claim``, ``update``,
    ``add_batch_file``) are fenced by the claim number."""

    # files (the bytes live in files.FileStorage)
    def add_file(
        self,
        project: str,
        *,
        filename: str,
        purpose: str,
        bytes: int,
        file_id: str | None = None,
        expires_s: int | None = None,
    ) -> FileRecord: ...
    def get_file(self, project: str, file_id: str) -> FileRecord: ...
    def list_files(
        self,
        project: str,
        *,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        purpose: str | None = None,
    ) -> Page[FileRecord]: ...
    def delete_file(self, project: str, file_id: str) -> FileRecord: ...

    # batches, as a client asks
    def create_batch(
        self,
        project: str,
        *,
        input_file_id: str,
        endpoint: str,
        completion_window: str = "24h",
        metadata: Mapping[str, str] | None = None,
        window_s: int | None = None,
        output_expires_s: int | None = None,
    ) -> BatchRecord: ...
    def get_batch(self, project: str, batch_id: str) -> BatchRecord: ...
    def list_batches(
        self, project: str, *, after: str | None = None, limit: int = 20
    ) -> Page[BatchRecord]: ...
    def cancel_batch(self, project: str, batch_id: str) -> BatchRecord: ...

    # batches, as a runner works on them
    def unfinished(self) -> list[BatchRecord]: ...
    def claim(self, batch_id: str, runner: str, lease_s: float | None = None) -> int: ...
    def update(
        self,
        batch_id: str,
        claim: int,
        *,
        status: Status | None = None,
        request_counts: RequestCounts | None = None,
        output_file_id: str | None = None,
        error_file_id: str | None = None,
        errors: list[dict[str, Any]] | None = None,
    ) -> BatchRecord: ...
    def add_batch_file(
        self,
        batch_id: str,
        claim: int,
        *,
        filename: str,
        purpose: str,
        bytes: int,
        file_id: str | None = None,
    ) -> FileRecord: ...
    def reserve_files(self, batch_id: str, claim: int, file_ids: list[str]) -> tuple[str, ...]: ...
    def remove_expired_files(self, limit: int = 1000) -> list[str]: ...
    def finish_batch(
        self,
        batch_id: str,
        claim: int,
        *,
        status: Status,
        request_counts: RequestCounts,
        files: Mapping[str, tuple[str, int]],
        errors: list[dict[str, Any]] | None = None,
    ) -> BatchRecord: ...

    def close(self) -> None: ...


__all__ = ["JobStore"]
