"""The job store's records: a file's and a batch's row as the gateway and the runners see
them, OpenAI's batch life cycle (which status may follow which, and the time each stamps), and
the checks a client's values pass before any store writes them. Plain data, no SQL, so the
store's interface (:mod:`~relayllm_service.store.protocol`) and any implementation
share them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from relayllm.bounded_json import encodes
from relayllm_service.errors import InvalidRequestError

Status = Literal[
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
]
#: Where each status may go next (OpenAI's batch life cycle).
TRANSITIONS: dict[str, frozenset[str]] = {
    "validating": frozenset({"in_progress", "failed", "cancelling", "expired"}),
    "in_progress": frozenset({"finalizing", "failed", "cancelling", "expired"}),
    "finalizing": frozenset({"completed", "failed"}),
    "cancelling": frozenset({"cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "expired": frozenset(),
    "cancelled": frozenset(),
}
TERMINAL = frozenset(s for s, after in TRANSITIONS.items() if not after)
#: The time a status change stamps.
STAMPS: dict[str, str] = {
    "in_progress": "in_progress_at",
    "finalizing": "finalizing_at",
    "completed": "completed_at",
    "failed": "failed_at",
    "expired": "expired_at",
    "cancelling": "cancelling_at",
    "cancelled": "cancelled_at",
}
#: The completion windows a client may ask for, in seconds (OpenAI accepts only 24h). The
#: server may enforce a shorter one (``window_s``), for tests.
COMPLETION_WINDOWS = {"24h": 24 * 3600}
#: OpenAI's metadata limits: pairs, key length, value length.
METADATA_LIMITS = (16, 64, 512)
FILE_PURPOSES = frozenset({"batch", "batch_output"})

T = TypeVar("T")


@dataclass(frozen=True)
class FileRecord:
    id: str
    project: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None = None


@dataclass(frozen=True)
class RequestCounts:
    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True)
class BatchRecord:
    """A batch's row: OpenAI's Batch fields, its project, and the current runner claim."""

    id: str
    project: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: Status
    created_at: int
    expires_at: int
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    #: OpenAI's ``errors.data`` entries (``code``, ``message``, ``param``, ``line``).
    errors: list[dict[str, Any]] | None = None
    claim: int = 0  # the latest claim's number; 0: never claimed
    runner: str | None = None  # who holds it
    heartbeat_at: int | None = None  # the claim's holder's last write
    #: File ids a runner reserved for the batch's output and error files before it wrote
    #: their bytes (:meth:`SQLiteJobStore.reserve_files`): what a killed finish may have left.
    pending_files: tuple[str, ...] = ()
    #: Seconds its output and error files are kept after they are written (None: kept).
    output_expires_s: int | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list, newest first unless asked otherwise; ``has_more``: a next page."""

    data: list[T]
    has_more: bool


def check_limit(limit: int, most: int) -> None:
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= most:
        raise InvalidRequestError(f"limit must be between 1 and {most}, got {limit!r}", "limit")


def check_counts(counts: RequestCounts) -> RequestCounts:
    values = (counts.total, counts.completed, counts.failed)
    if any(v < 0 for v in values) or counts.completed + counts.failed > counts.total:
        raise ValueError(f"impossible request counts {counts}")
    return counts


def check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    """OpenAI's rules: up to 16 pairs of strings, keys up to 64 characters, values up to 512."""
    if metadata is None:
        return None
    pairs, key_len, value_len = METADATA_LIMITS
    if not isinstance(metadata, Mapping) or len(metadata) > pairs:
        raise InvalidRequestError(
            f"metadata must be an object of at most {pairs} pairs", "metadata"
        )
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise InvalidRequestError("metadata keys and values must be strings", "metadata")
        if not (encodes(key) and encodes(value)):
            raise InvalidRequestError(
                "metadata keys and values must be text that can be encoded as UTF-8 (no lone "
                "surrogate)",
                "metadata",
            )
        if len(key) > key_len or len(value) > value_len:
            raise InvalidRequestError(
                f"metadata keys are at most {key_len} characters and values {value_len}",
                "metadata",
            )
    return dict(metadata)


def check_text(value: str, param: str) -> str:
    """A client's text the store keeps (a filename), refused if it cannot be encoded as
    UTF-8: stored, it would break every answer that shows it."""
    if not encodes(value):
        raise InvalidRequestError(
            f"{param} must be text that can be encoded as UTF-8 (no lone surrogate)", param
        )
    return value


__all__ = [
    "COMPLETION_WINDOWS",
    "FILE_PURPOSES",
    "METADATA_LIMITS",
    "STAMPS",
    "TERMINAL",
    "TRANSITIONS",
    "BatchRecord",
    "FileRecord",
    "Page",
    "RequestCounts",
    "Status",
    "check_counts",
    "check_limit",
    "check_text",
    "check_metadata",
]
