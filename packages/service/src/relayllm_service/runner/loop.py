"""The runner: claims the store's unfinished batches and runs them on the shared deployments.

One runner per state directory, in a detached Ray actor on the head node, or on the nodes
``ServiceSettings.node_resources`` names (:func:`~relayllm_service.runner.actor.start_runner`;
the gateway starts it, or finds it running). Ray restarts the actor when its process dies or
its node is lost (``max_restarts=-1``), on any node it may run on: the new one claims every
unfinished batch again, and the claim numbers fence off anything the old one might still try
to write.

Each claimed batch runs in its own thread as a :class:`~relayllm_service.runner.job.BatchJob`
(the life cycle, the work files, exactly once across a kill). A claim has a lease
(``ServiceSettings.lease_s``): the runner marks its claims alive every poll, and another runner
takes a batch only once its holder has been silent that long.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import threading
import time
from typing import Any

from relayllm_service.errors import (
    ClaimHeldError,
    IllegalTransitionError,
    NotFoundError,
    StaleClaimError,
)
from relayllm_service.runner.job import BatchJob
from relayllm_service.runner.workfiles import delete_quietly
from relayllm_service.settings import ServiceSettings
from relayllm_service.store.files import FileStorage
from relayllm_service.store.location import open_store
from relayllm_service.tenancy.fair import FairShare
from relayllm_service.tenancy.projects import quotas_now
from relayllm_service.tenancy.quotas import weight_of
from relayllm_service.tenancy.usage import UsageLedger

logger = logging.getLogger(__name__)

#: A batch's ``errors`` entry when the runner failed it unexpectedly (details in its log).
RUNNER_ERROR: dict[str, Any] = {
    "code": "runner_error",
    "message": "The batch could not be run to its end because of a server error; lines "
    "finished before it, if any, are in its output and error files.",
    "param": None,
    "line": None,
}
#: A temporary ``.part-`` file in the storage not written to for this long is a killed
#: writer's (an upload's body arrives far faster): the runner deletes it.
PART_MAX_AGE_S = 3600.0
#: How often the runner sweeps the storage for such files (and once when it starts).
PART_SWEEP_S = 600.0


class BatchRunner:
    """The runner's loop: every ``poll_s`` (or when woken) it claims the unfinished batches
    it is not running yet, up to ``max_batches`` at once, each in its own thread."""

    def __init__(self, settings: ServiceSettings) -> None:
        self.settings = settings
        os.makedirs(settings.work_dir, exist_ok=True)
        self.store = open_store(settings.store_path)
        self.ledger = UsageLedger(settings.store_path, recording=settings.record_usage)
        self.storage = FileStorage.from_uri(settings.files_location, settings.max_file_bytes)
        self.name = _runner_identity()
        self.active: dict[str, threading.Thread] = {}
        self.jobs: dict[str, BatchJob] = {}  # the claims held, kept alive by _heartbeat
        self.turns: dict[str, int] = {}  # batch -> when it last got a slot (a tick)
        quotas = quotas_now(settings.quotas_file, settings.quotas)  # the file's, if it changes
        self.fair = FairShare(lambda project: weight_of(quotas(), project), settings.turn_lines)
        self._tick = 0
        #: A batch waits for a slot: turns are capped in lines and end at a block.
        self.contended = False
        self._wake = threading.Event()
        self._quiet_ray_data()
        self._thread = threading.Thread(target=self._loop, name="batch-runner", daemon=True)
        self._thread.start()

    @staticmethod
    def _quiet_ray_data() -> None:
        try:
            from ray.data import DataContext

            DataContext.get_current().enable_progress_bars = False
        except ImportError:  # a unit test without Ray
            pass

    def wake(self) -> None:
        """Look for work now (the gateway calls it after a create or a cancel)."""
        self._wake.set()

    def pid(self) -> int:
        return os.getpid()

    def settings_json(self) -> dict[str, Any]:
        """The settings this runner started with
        (:func:`~relayllm_service.runner.actor.start_runner` compares them)."""
        return runner_fields(self.settings)

    def _loop(self) -> None:
        swept = float("-inf")
        while True:  # until the actor is killed (stop_runner)
            try:
                if time.monotonic() - swept >= PART_SWEEP_S:
                    self._sweep()
                    swept = time.monotonic()
                self._heartbeat()
                self._start_due()
                self._remove_expired_files()
            except Exception:
                logger.exception("the batch runner could not read the job store")
            self._wake.wait(self.settings.poll_s)
            self._wake.clear()

    def _heartbeat(self) -> None:
        """Every claim held, marked alive (a block may take longer than the lease), and a
        cancelled batch's lines stopped at once (the gateway wakes us after a cancel)."""
        for job in list(self.jobs.values()):
            try:
                record = job.update()
                if record.status == "cancelling":
                    job.request_stop()
            except Exception:  # finished or taken meanwhile: its thread finds out
                logger.debug("batch %s: no heartbeat", job.batch_id, exc_info=True)

    def _sweep(self) -> None:
        """What killed writers left: the storage's old ``.part-`` files, and the work
        directories of batches that ended (a runner killed after publishing a batch and
        before deleting its work files). An unfinished batch's directory is its next
        claim's to clean."""
        removed = self.storage.remove_parts(older_than_s=PART_MAX_AGE_S)
        if removed:
            logger.info("removed %d unfinished file(s) killed writers left", len(removed))
        if not os.path.isdir(self.settings.work_dir):
            return
        unfinished = {record.id for record in self.store.unfinished()}
        for name in os.listdir(self.settings.work_dir):
            if name not in unfinished and name not in self.active:
                shutil.rmtree(os.path.join(self.settings.work_dir, name), ignore_errors=True)

    def _remove_expired_files(self) -> None:
        """Expired files' records, then their bytes (one runner per state does it)."""
        while expired := self.store.remove_expired_files():
            for file_id in expired:
                delete_quietly(self.storage, file_id)

    def _start_due(self) -> None:
        """Fill the free slots: each to the project of lowest pass (weighted fair share,
        :mod:`~relayllm_service.tenancy.fair`), within it round robin: the batches that never
        ran, oldest first, then those whose last turn is longest ago. While any batch is
        left waiting, a turn runs at most its project's weight x ``turn_lines`` lines, and
        one running ends at its next block once it has written as many or run ``turn_s``."""
        self.active = {b: t for b, t in self.active.items() if t.is_alive()}
        unfinished = self.store.unfinished()
        live = {r.id for r in unfinished}
        self.turns = {b: t for b, t in self.turns.items() if b in live}
        waiting = [r for r in unfinished if r.id not in self.active]
        self.fair.keep_only({r.project for r in unfinished})
        chosen: list[str] = []
        while waiting and len(self.active) + len(chosen) < self.settings.max_batches:
            batch = self.fair.pick(waiting, self.turns)  # projects by weight (fair.py)
            waiting.remove(batch)
            self.fair.granted(batch.project, batch.id)  # corrected when the turn ends
            self._tick += 1
            self.turns[batch.id] = self._tick
            chosen.append(batch.id)
        self.contended = bool(waiting)  # before the turns start: it caps their lines
        for batch_id in chosen:
            thread = threading.Thread(
                target=self._run, args=(batch_id,), name=f"batch-{batch_id}", daemon=True
            )
            self.active[batch_id] = thread
            thread.start()

    def _turn_over(self, seconds: float) -> bool:
        return self.contended and seconds >= self.settings.turn_s

    def _turn_lines(self, project: str) -> int | None:
        """The lines a turn of ``project`` may write while others wait (None: none wait)."""
        return self.fair.turn_lines(project) if self.contended else None

    def _run(self, batch_id: str) -> None:
        written: int | None = None  # None: the turn never ran
        try:
            written = self._turn(batch_id)
        finally:
            self.fair.ended(batch_id, written)  # the project's share, in lines (fair.py)
            self._wake.set()  # a slot is free

    def _turn(self, batch_id: str) -> int | None:
        """One turn of ``batch_id``: the lines it wrote (None: it did not run)."""
        job = self.jobs.get(batch_id)  # a batch back for another turn keeps its claim
        if job is None:
            try:
                claim = self.store.claim(batch_id, self.name, lease_s=self.settings.lease_s)
            except (IllegalTransitionError, NotFoundError):
                return None  # finished meanwhile
            except ClaimHeldError:
                logger.debug("batch %s: held by a live runner", batch_id)
                return None  # tried again at the next poll, once that runner's lease runs out
            job = BatchJob(
                self.settings,
                self.store,
                self.storage,
                batch_id,
                claim,
                turn_over=self._turn_over,
                turn_lines=self._turn_lines,
                ledger=self.ledger,
            )
            self.jobs[batch_id] = job
        ended = True
        try:
            ended = job.run()
        except StaleClaimError:
            logger.warning("batch %s: another runner claimed it; stopping", batch_id)
        except Exception as exc:
            logger.exception("batch %s failed in the runner", batch_id)
            self._fail(job, exc)
        finally:
            if ended:
                self.jobs.pop(batch_id, None)
        return job.written

    def _fail(self, job: BatchJob, exc: Exception) -> None:
        """An unexpected error: the batch ``failed`` with the lines it finished published
        (output and error files), a generic message in its ``errors`` (the details, server
        paths and internals, only in the log)."""
        del exc  # logged by the caller with its traceback; never shown to the client
        try:
            record = job.update()
            if record.status == "cancelling":
                job.finish(record, "cancelled")
            elif not record.terminal:
                try:
                    job.finish(record, "failed", errors=[RUNNER_ERROR])
                except StaleClaimError:
                    raise
                except Exception:
                    logger.exception("batch %s: could not publish its lines", job.batch_id)
                    job.update(status="failed", errors=[RUNNER_ERROR])
                    job._cleanup()
        except Exception:
            logger.exception("batch %s: could not record its failure", job.batch_id)


def _runner_identity() -> str:
    """Who holds a claim: the runner's Ray actor id, which a restarted actor keeps, so the
    runner Ray restarts after a crash takes its own batches back at once instead of waiting
    out the lease (the dead process cannot write; a stale one is fenced by the claim
    numbers all the same). Outside an actor: host and pid."""
    try:
        import ray

        if ray.is_initialized():
            actor = ray.get_runtime_context().get_actor_id()
            if actor:
                return f"{socket.gethostname()}:{actor}"
    except ImportError:
        pass
    return f"{socket.gethostname()}:{os.getpid()}"


#: Settings only the gateway reads (its address, and what it applies when a file is uploaded
#: or a batch created): a gateway that differs only in these shares the state's runner.
GATEWAY_ONLY = frozenset(
    {
        "name",
        "host",
        "port",
        "direct_port",
        "route_prefix",
        "window_s",
        "output_expires_s",
        "min_expires_s",
    }
)


def runner_fields(settings: ServiceSettings) -> dict[str, Any]:
    """The settings a runner works by: a gateway with other values for these needs a new
    runner (the gateway-only fields, :data:`GATEWAY_ONLY`, do not count)."""
    return settings.model_dump(mode="json", exclude=set(GATEWAY_ONLY))


__all__ = [
    "BatchRunner",
    "runner_fields",
]
