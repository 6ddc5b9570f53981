"""The Ray Data stage: turns a block of rows into batched calls on a named deployment.

One Ray Data batch arrives (``batch_size`` times the calls a stage actor or task keeps in
flight, ``processor.stage_workers``), is split into calls of ``batch_size`` rows, and on an
actor those calls share its ``max_in_flight_batches`` slots with the calls of other batches
Ray Data runs concurrently on it (a task works on one batch at a time). Input columns pass
through as Arrow columns, untouched; only the output columns are built in Python.

A processor's ``preprocess`` and ``postprocess`` run here, in the stage actor, on the rows of
the batch it holds: as separate Ray Data ``map`` operators they cost a task and an Arrow
round trip of every column per row function, which made the README's pattern 0.6x a
hand-written client (docs/benchmarks.md, "The path users write").

How the calls travel (gRPC, or actor calls) is relayllm.stage.transport; the stage as Ray
Data tasks (one stage kept per run in each worker process) is relayllm.stage.tasks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import pyarrow as pa

from relayllm.config import ProcessorConfig, RowFn
from relayllm.errors import RowError, describe_exception
from relayllm.retry import call_with_retries
from relayllm.rows import (
    ERROR,
    EXTRA_INPUT_COLUMNS,
    INPUT_COLUMN,
    Request,
    Result,
    build_request,
    error_result,
    features_of,
    request_text,
    unsupported_features,
)
from relayllm.stage import affinity
from relayllm.stage.columns import Inputs, column, postprocessed, read_inputs, with_outputs
from relayllm.stage.images import prepare_pending
from relayllm.stage.transport import HandlesKey, Transport


class ServeStage:
    """``map_batches`` UDF (an actor): looks the deployment up by name once, then batches."""

    def __init__(
        self,
        config: ProcessorConfig,
        processor_id: str,
        preprocess: RowFn | None = None,
        postprocess: RowFn | None = None,
        *,
        run_id: str | None = None,
        deployment_seen: bool = False,
        handles_key: HandlesKey | None = None,
    ) -> None:
        from relayllm.deployments import handle_for
        from relayllm.errors import DeploymentNotFoundError

        self.config = config
        self._preprocess = preprocess
        self._postprocess = postprocess
        self._gone = False  # the deployment was shut down: fail fast instead of retrying
        self._features: Any = None
        self._check_pending = False  # the check below is still to do (no replica answered)
        try:
            handle_for(config.deployment)  # unknown name -> an error that lists the running ones
            # A task the deployment's options do not serve fails here, not on every row.
            # So does a feature (logprobs, tools...) its sampling_params ask the backend can't do.
            self._features = self._check_served()
        except DeploymentNotFoundError:
            if not deployment_seen:
                raise
            # It ran when the job was planned and was shut down since. A stage built now (a
            # task in a new worker process) fails its rows as the stages already running do,
            # and the job goes on instead of ending at this task.
            self._gone = True
        # Serve's gRPC transport first unless the config says actor calls. In a task the
        # process's handles are shared under ``handles_key`` (relayllm.stage.tasks).
        self.transport = Transport(
            config.deployment, grpc=config.transport == "grpc", run_id=run_id, key=handles_key
        )
        self._id_prefix = f"{processor_id}-{uuid.uuid4().hex[:8]}-"
        self._ids = itertools.count()
        self._slots = asyncio.Semaphore(config.max_in_flight_batches)
        self._input_column = INPUT_COLUMN[config.task]
        self._extra_columns = EXTRA_INPUT_COLUMNS.get(config.task, ())

    def _check_served(self) -> Any:
        """:func:`check_task_served` for this stage; when no replica answers in time (one is
        starting, or replacing a dead engine) the check waits for the next batch instead of
        failing the stage: a dead engine is a failed call to retry, not a failed job."""
        from relayllm.deployments import check_task_served

        try:
            found = check_task_served(
                self.config.deployment,
                self.config.task,
                features=features_of(self.config.sampling_params),
            )
        except TimeoutError:
            self._check_pending = True
            return None
        self._check_pending = False
        return found

    async def __call__(self, batch: pa.Table) -> pa.Table:
        if self._check_pending and not self._gone:
            # In a thread: the check waits on the replica, this event loop runs the calls.
            self._features = await asyncio.to_thread(self._check_served)
        inputs = read_inputs(batch, self._preprocess, self._input_column, self._extra_columns)
        ids = [f"{self._id_prefix}{next(self._ids)}" for _ in range(batch.num_rows)]
        results: list[Result] = [{}] * batch.num_rows
        pending = await prepare_pending(
            self._requests(inputs, ids, results),
            results,
            self.config.local_image_files,
            self.config.remote_image_hosts,
        )
        await self._answer(pending, results, inputs.rows, batch)
        if self.config.on_error == "raise":
            row_ids = None
            if self.config.id_column and inputs.rows is not None:
                row_ids = [row.get(self.config.id_column) for row in inputs.rows]
            elif self.config.id_column:
                row_ids = column(batch, self.config.id_column, batch.num_rows)
            self._raise_first_error(results, ids, inputs.values, row_ids)
        if self._postprocess is not None:
            rows = inputs.rows if inputs.rows is not None else batch.to_pylist()
            return postprocessed(rows, results, ids, self.config.task, self._postprocess)
        if inputs.rows is not None:
            batch = pa.Table.from_pylist(inputs.rows)
        return with_outputs(batch, results, ids, self.config.task)

    def _requests(
        self, inputs: Inputs, ids: list[str], results: list[Result]
    ) -> list[tuple[int, Request]]:
        """The rows' requests to send, by row index; a row that cannot be sent gets its error
        in ``results`` instead."""
        pending: list[tuple[int, Request]] = []
        for i, request_id in enumerate(ids):
            row_params = inputs.sampling_params[i]
            request = build_request(
                self.config.task,
                inputs.values[i],
                self.config.sampling_params,
                row_params,
                inputs.models[i],
                request_id,
                {c: extra[i] for c, extra in inputs.extras.items()},
            )
            if isinstance(request, str):
                results[i] = error_result(request)
            elif (
                self._features is not None
                and row_params is not None
                and (
                    problem := unsupported_features(
                        self._features[0],
                        features_of(request["sampling_params"]),
                        self._features[1],
                    )
                )
            ):
                results[i] = error_result(problem)  # a row's own params: that row fails
            else:
                request.setdefault("priority", self.config.priority)  # batch, unless said
                pending.append((i, request))
        return pending

    async def _answer(
        self,
        pending: list[tuple[int, Request]],
        results: list[Result],
        rows: list[dict[str, Any]] | None,
        batch: pa.Table,
    ) -> None:
        """Send the requests in calls (grouped by prefix affinity) and put each answer in
        ``results`` at its row's index."""
        if self.config.order_by_prefix:
            # Lexicographic order puts rows that share a prefix next to each other, however
            # long the prefix; results go back by row index, so the output order is unchanged.
            pending.sort(key=lambda item: request_text(item[1], roles=True))
        router = self.transport.router
        if router is None and pending and not self._gone:  # the replicas it knows
            router = await self.transport.ready_router()
        lineage = affinity.lineage(self.config, rows, batch)
        keyed = affinity.keyed_calls(pending, lineage, self.config, router)
        calls = [call for _, call in keyed]
        answers = await asyncio.gather(*(self._send([r for _, r in c], k) for k, c in keyed))
        for call, answer in zip(calls, answers, strict=True):
            for (i, _), result in zip(call, answer, strict=True):
                results[i] = result

    async def _send(self, requests: list[Request], key: str | None = None) -> list[Result]:
        async with self._slots:
            try:
                if self._gone:
                    raise _Gone()
                return await call_with_retries(
                    lambda: self._call(requests, key),
                    max_retries=self.config.max_retries,
                    retryable=lambda exc: not self._deployment_gone(),
                )
            except _Gone:
                error = f"deployment {self.config.deployment!r} is no longer running (shut down?)"
                return [error_result(error) for _ in requests]
            except Exception as exc:  # transport failure after every retry: rows fail, not vanish
                if self._deployment_gone():
                    error = (
                        f"deployment {self.config.deployment!r} is no longer running (shut down?)"
                    )
                else:
                    error = (
                        f"deployment {self.config.deployment!r} failed after "
                        f"{self.config.max_retries + 1} attempts: {describe_exception(exc)}"
                    )
                return [error_result(error) for _ in requests]

    def _deployment_gone(self) -> bool:
        """Asked only after a failure: is the app still there? (A restarting replica is.)"""
        if not self._gone:
            from ray import serve

            from relayllm.deployments import app_name

            try:
                self._gone = app_name(self.config.deployment) not in serve.status().applications
            except Exception:  # the controller itself is unreachable: keep retrying
                return False
            if self._gone:
                self.transport.forget()  # a redeploy gets a fresh handle
        return self._gone

    async def _call(self, requests: list[Request], key: str | None = None) -> list[Result]:
        while True:
            sent = time.monotonic()
            try:
                return await asyncio.wait_for(
                    self.transport.call(requests, key), self.config.timeout_s
                )
            except TimeoutError:
                if await self._held_by_pause(time.monotonic() - sent):
                    continue  # the rows waited for a resume: not an attempt, send them again
                raise TimeoutError(
                    f"no answer within timeout_s={self.config.timeout_s:g}s "
                    f"for {len(requests)} rows"
                ) from None

    async def _held_by_pause(self, waited_s: float) -> bool:
        """Whether the deployment was paused in the last ``waited_s`` s (relayllm.control): its
        rows wait in the replica, so a pause longer than ``timeout_s`` must not spend the
        call's retries; the re-sent call joins the replica's computation of the same ids.
        Durations, no clocks compared: the state actor's since its change, this worker's."""
        from relayllm.serving.control_state import state_actor

        try:
            actor = await asyncio.to_thread(state_actor, self.config.deployment, create=False)
            if actor is None:
                return False
            state, changed_ago_s = await actor.since_change.remote()
        except Exception:  # no state to read: an ordinary timeout
            return False
        return state.get("paused") is not None or changed_ago_s <= waited_s

    def _raise_first_error(
        self, results: list[Result], ids: list[str], values: list[Any], row_ids: list[Any] | None
    ) -> None:
        for i, result in enumerate(results):
            if result.get(ERROR):
                preview = repr(values[i])
                preview = preview if len(preview) <= 120 else preview[:117] + "..."
                which = f"{self.config.id_column}={row_ids[i]!r}, " if row_ids else ""
                raise RowError(
                    f"row {i} of its batch ({which}request_id {ids[i]}, "
                    f"{self._input_column}={preview}) failed on deployment "
                    f"{self.config.deployment!r}: {result.get(ERROR)}"
                )


class _Gone(Exception):
    """The deployment was shut down while this stage used it."""


#: Ray Data operator names of the stage, as an actor class and as a task function.
STAGE_OPERATOR_NAMES = ("ServeStage", "serve_stage")


__all__ = ["STAGE_OPERATOR_NAMES", "ServeStage"]
