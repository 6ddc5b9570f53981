"""One claim on one batch, run to its end (:class:`BatchJob`); the runner
(:mod:`~relayllm_service.runner.loop`) starts one per batch it claims.

A batch, once claimed: ``validating`` -> its input copied to the work directory and checked
(:mod:`relayllm_service.runner.validate`; a problem fails it with OpenAI's ``errors``) ->
``in_progress``: its lines through :func:`relayllm.batch.ray_job.run_scanned` (the path
``relayllm batch`` takes: processors at batch priority on the deployments named by ``model``,
but with no image read from the workers' files: :func:`processor_fields`), each finished block
appended to the claim's own work files and the counts written after it -> ``finalizing`` ->
the output and error files stored, the batch ``completed``. Between blocks a ``cancelling``
batch stops (``cancelled``, its finished lines kept) and an expired one stops too, its
unfinished lines written to the error file as ``batch_expired``.

**Exactly once.** The work files of claim N are ``out.N.jsonl`` / ``err.N.jsonl``. A new claim
starts from a copy of the newest earlier claim's files (a line cut short by a kill trimmed) and
skips their ``custom_id`` s (``relayllm batch --resume``'s :func:`~relayllm.batch.scan.read_done`);
an older runner that is somehow still alive writes only to its own files, which nothing reads
again, and its store writes are refused. Recomputed after a crash: the blocks in flight.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from typing import Any

from relayllm.batch.format import default_deployment
from relayllm_service.errors import IllegalTransitionError
from relayllm_service.ids import new_file_id
from relayllm_service.runner.validate import Limits, validate_input
from relayllm_service.runner.workfiles import (
    carry_over,
    delete_quietly,
    expire_rest,
    fetch_input,
    written_lines,
)
from relayllm_service.settings import ServiceSettings
from relayllm_service.store.files import FileStorage
from relayllm_service.store.records import BatchRecord, RequestCounts, Status
from relayllm_service.store.sql import SQLJobStore
from relayllm_service.tenancy.fair import hold_back
from relayllm_service.tenancy.usage import UsageLedger

logger = logging.getLogger(__name__)


class _TurnOver(Exception):
    """Raised when the batch has had its turn (its lines or its time) and another waits."""


class _Stop(Exception):
    """Raised between blocks to stop a batch's run: ``cancelled`` or ``expired``."""

    def __init__(self, status: Status) -> None:
        super().__init__(status)
        self.status: Status = status


def deployment_names() -> list[str]:
    """The relayllm deployments running now (Serve's view; no connect: we run in the cluster)."""
    from relayllm.deployments import running_names

    return running_names()


class BatchJob:
    """One claim on one batch, run to its end (or until the claim is lost)."""

    def __init__(
        self,
        settings: ServiceSettings,
        store: SQLJobStore,
        storage: FileStorage,
        batch_id: str,
        claim: int,
        deployments: Callable[[], list[str]] = deployment_names,
        turn_over: Callable[[float], bool] | None = None,
        turn_lines: Callable[[str], int | None] | None = None,
        ledger: UsageLedger | None = None,
    ) -> None:
        self.settings, self.store, self.storage = settings, store, storage
        self.ledger = ledger  # the lines written are charged to the project (usage.py)
        self.batch_id, self.claim = batch_id, claim
        self.deployments = deployments
        #: Asked after each block with the seconds this turn has written blocks for (from
        #: its first block): True ends the turn.
        self.turn_over = turn_over
        #: Asked with the project when a turn starts and after each block: the lines a turn
        #: may write (None: no limit, no other batch waits).
        self.turn_lines = turn_lines
        #: Lines the last :meth:`run` wrote (the runner charges them to the project's share).
        self.written = 0
        self.dir = os.path.join(settings.work_dir, batch_id)
        self.input = os.path.join(self.dir, "input.jsonl")
        self.output = os.path.join(self.dir, f"out.{claim}.jsonl")
        self.errors = os.path.join(self.dir, f"err.{claim}.jsonl")
        #: While this file exists (on this node) or this signal is raised (in the cluster:
        #: stage workers on other nodes) the stage workers send none of the batch's lines.
        self.stop_flag = os.path.join(self.dir, f"stop.{claim}")
        self.stop_key = f"{batch_id}.{claim}"

    def update(self, **changes: Any) -> BatchRecord:
        return self.store.update(self.batch_id, self.claim, **changes)

    def expired(self, record: BatchRecord) -> bool:
        return time.time() >= record.expires_at

    def request_stop(self) -> None:
        """Stop sending lines now (a cancel): the calls in flight finish, the block's other
        lines are not sent, and ``on_block`` ends the run as cancelled."""
        from relayllm.batch.stop import raise_stop

        if os.path.isdir(self.dir):
            with open(self.stop_flag, "w"):
                pass
        raise_stop(self.stop_key)

    # -- the life cycle --------------------------------------------------------------------

    def run(self) -> bool:
        """The batch to its end, or to the end of its turn (returns False: the claim and the
        work files are kept for the next turn); a status change refused because the batch
        moved on meanwhile (a cancel arriving after the last block's check) ends it as it is
        now: cancelled."""
        self.written = 0
        try:
            self._steps()
        except _TurnOver:
            logger.info("batch %s: its turn is over, another batch waits", self.batch_id)
            return False
        except IllegalTransitionError:
            record = self.update()  # re-read
            if record.status == "cancelling":
                logger.info("batch %s: cancelled while it ran", self.batch_id)
                self.finish(record, "cancelled")
            elif not record.terminal:
                raise
        return True

    def _steps(self) -> None:
        record = self.update()  # the batch as it is now (and: our claim is current)
        os.makedirs(self.dir, exist_ok=True)
        self._carry_over()
        if record.status == "cancelling":
            return self.finish(record, "cancelled")
        if self.expired(record) and record.status in ("validating", "in_progress"):
            return self.finish(record, "expired")
        if record.status == "validating":
            record = self.validate(record)
            if record.status != "in_progress":
                return
        if record.status == "in_progress":
            try:
                self.run_lines(record)
            except _Stop as stop:
                return self.finish(self.update(), stop.status)
            record = self.update(status="finalizing")
        if record.status == "finalizing":
            self.finish(record, "completed")

    def validate(self, record: BatchRecord) -> BatchRecord:
        self._fetch_input(record)
        limits = Limits(max_lines=self.settings.max_lines, max_bytes=self.settings.max_file_bytes)
        with open(self.input, "rb") as source:
            # No routing check: a line whose model names no deployment fails alone, when
            # the lines run (OpenAI's per-request model_not_found), not the whole batch.
            found = validate_input(source, record.endpoint, limits)
        if not found.ok:
            errors = found.errors()
            assert errors is not None
            failed = self.update(status="failed", errors=errors["data"])  # fenced, then
            self._cleanup()  # the files: a stale claim never gets here to delete the current one's
            return failed
        return self.update(status="in_progress", request_counts=RequestCounts(found.lines, 0, 0))

    def run_lines(self, record: BatchRecord) -> None:
        """The lines not in the work files yet, through the batch-file run; raises
        :class:`_Stop` between blocks for a cancel or the window's end."""
        from relayllm.batch.ray_job import run_scanned
        from relayllm.batch.scan import read_done, scan_batch_file
        from relayllm.batch.stop import StopCheck
        from relayllm.blocks import stage_batch

        self._fetch_input(record)
        done = read_done(self.output, self.errors, False)
        # No second duplicate check: a batch reaches in_progress only through validate(),
        # which failed it on any repeated custom_id of this same input file.
        scan = scan_batch_file(
            self.input, stage_batch(self.settings.batch_size), done, check_ids=False
        )
        names = self.deployments()
        default = default_deployment(names)
        total = scan.lines
        self.update(request_counts=RequestCounts(total, done.completed, done.failed))

        # A turn while others wait runs its project's lines (fair.py): the rest held back,
        # left undone for the next turn. Its turn_s counts from its first block: starting
        # the batch's Ray Data job (again each turn: seconds cold) is not engine time.
        limit = self.turn_lines(record.project) if self.turn_lines is not None else None
        held = hold_back(scan, limit) if limit is not None else 0
        to_write = scan.to_run + len(scan.bad)
        began: float | None = None
        before = done.completed + done.failed

        def on_block(completed: int, failed: int) -> None:
            nonlocal began
            if began is None:
                began = time.monotonic()
            self.written = completed + failed - before
            self.charge()
            now = self.update(request_counts=RequestCounts(total, completed, failed))
            if now.status == "cancelling":
                raise _Stop("cancelled")
            if self.expired(now):
                raise _Stop("expired")
            if self.written >= to_write:
                return  # the turn's last block: it ends anyway
            if self.turn_over is not None and self.turn_over(time.monotonic() - began):
                raise _TurnOver()
            limit = self.turn_lines(record.project) if self.turn_lines is not None else None
            if limit is not None and self.written >= limit:  # a turn begun alone
                raise _TurnOver()

        fields = processor_fields(self.settings)
        with (
            open(self.output, "a", encoding="utf-8") as out,
            open(self.errors, "a", encoding="utf-8") as err,
        ):
            # The window's end by this runner's clock alone: the stage workers, on any node,
            # see the stop signal and never compare their clocks with the batch's expires_at.
            window = threading.Timer(max(record.expires_at - time.time(), 0.0), self.request_stop)
            window.daemon = True
            window.start()
            try:
                stop = StopCheck(self.stop_flag, None, self.stop_key)
                work = (scan, names, default, out, err, fields, done, on_block, stop)
                run_scanned(*work, strict_routing=False)
            finally:
                window.cancel()
        if held:
            raise _TurnOver()  # its lines written, the batch's others for the next turns

    def finish(
        self, record: BatchRecord, status: Status, errors: list[dict[str, Any]] | None = None
    ) -> None:
        """Store the work files as the batch's output and error files and end it in
        ``status`` (an expired batch's unfinished lines written to the error file first;
        a ``failed`` one keeps the lines it finished, with ``errors``).

        Idempotent across a kill at any point: the file ids are reserved in the store before
        their bytes are written, and the files' records, the ids in the batch and its status
        are written in one transaction (:meth:`SQLJobStore.finish_batch`). A runner killed
        before that transaction published nothing; the next claim deletes the reserved
        bytes, publishes its own (the same lines: the work files are kept until the batch
        ends) and ends the batch once."""
        if status == "expired":
            self._fetch_input(record)
            expire_rest(self.input, self.output, self.errors)
        self.charge()  # before the files are published: a kill after it charges no line twice
        work = {"output": self.output, "error": self.errors}
        lines = {kind: written_lines(path) for kind, path in work.items()}
        ids = {kind: new_file_id() for kind, count in lines.items() if count}
        for leftover in self.store.reserve_files(self.batch_id, self.claim, list(ids.values())):
            delete_quietly(self.storage, leftover)  # a killed finish's unpublished bytes,
            self.storage.remove_parts(leftover)  # whole or cut short mid-put
        files: dict[str, tuple[str, int]] = {}
        try:
            for kind, file_id in ids.items():
                with open(work[kind], "rb") as source:
                    files[kind] = (file_id, self.storage.put(file_id, source, max_bytes=1 << 62))
            self.store.finish_batch(
                self.batch_id,
                self.claim,
                status=status,
                request_counts=RequestCounts(
                    max(record.request_counts.total, lines["output"] + lines["error"]),
                    lines["output"],
                    lines["error"],
                ),
                files=files,
                errors=errors,
            )
        except BaseException:
            for file_id in ids.values():  # ours, never published: no orphan bytes
                delete_quietly(self.storage, file_id)
            raise
        self._cleanup()

    def charge(self) -> None:
        if self.ledger is not None:
            self.ledger.charge_lines(self.batch_id, self.claim, self.output)

    # -- files -----------------------------------------------------------------------------

    def _carry_over(self) -> None:
        carry_over(self.dir, self.claim, self.output, self.errors)

    def _fetch_input(self, record: BatchRecord) -> None:
        fetch_input(self.storage, record.input_file_id, self.input, self.claim)

    def _cleanup(self) -> None:
        from relayllm.batch.stop import clear_stop

        shutil.rmtree(self.dir, ignore_errors=True)
        try:
            clear_stop(self.stop_key)
        except Exception:  # a signal left behind is a few bytes in the GCS, no more
            logger.debug("batch %s: the stop signal stays", self.batch_id, exc_info=True)


def processor_fields(settings: ServiceSettings) -> dict[str, Any]:
    """The processor settings a batch's lines run with. The lines come from anyone holding a
    project key: their images may not be files of the cluster's workers, nor http(s)
    addresses the workers would fetch (inside the cluster's network too) unless the service
    allows their hosts (``image_hosts``)."""
    hosts = settings.image_hosts
    return {
        "batch_size": settings.batch_size,
        "concurrency": settings.concurrency,
        "local_image_files": False,
        "remote_image_hosts": None if "*" in hosts else list(hosts),
    }


__all__ = [
    "BatchJob",
    "deployment_names",
    "processor_fields",
]
