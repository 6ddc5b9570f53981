"""The Ray Data stage: turns a block of rows into batched calls on a named deployment.

One Ray Data batch arrives (``batch_size * max_in_flight_batches`` rows), is split into calls
of ``batch_size`` rows, and those calls share the actor's ``max_in_flight_batches`` slots with
the calls of other batches Ray Data runs concurrently on this actor. Input columns pass
through as Arrow columns, untouched; only the output columns are built in Python.

Transport: the cost of moving rows is per call, not per row (docs/benchmarks.md has the
profile), so the stage calls its deployment the cheapest way Serve offers -- a router on the
stage's own event loop and Serve's gRPC transport to the replica, which cut the CPU time of a
call on both sides (about a quarter in the stage, half in the replica). That transport caps a message at 4 MiB and needs the replica's port to be
reachable; on any gRPC-level error the stage switches to Serve's ordinary actor-call transport
for good and re-sends the call there (not counted as a retry). ``RELAYLLM_SERVE_TRANSPORT=actor``
uses the actor transport from the start.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from relayllm.engine import _describe
from relayllm.errors import RowError
from relayllm.retry import call_with_retries
from relayllm.rows import (
    ERROR,
    INPUT_COLUMN,
    MODEL_COLUMN,
    REQUEST_ID,
    SAMPLING_PARAMS_COLUMN,
    Request,
    Result,
    Task,
    build_request,
    error_result,
    features_of,
    output_fields,
    request_text,
    unsupported_features,
)

if TYPE_CHECKING:
    from relayllm.processor import ProcessorConfig

logger = logging.getLogger(__name__)

TRANSPORT_ENV = "RELAYLLM_SERVE_TRANSPORT"


class ServeStage:
    """``map_batches`` UDF (an actor): looks the deployment up by name once, then batches."""

    #: Try Serve's gRPC transport first (see the module docstring).
    grpc_transport: bool = os.environ.get(TRANSPORT_ENV, "grpc").lower() != "actor"

    def __init__(self, config: ProcessorConfig, processor_id: str) -> None:
        from relayllm.deployments import check_task_served, handle_for

        self.config = config
        handle_for(config.deployment)  # unknown name -> an error that lists the running ones
        # A task the deployment's options do not serve fails here, not on every row.
        # So does a feature (logprobs, tools...) its sampling_params ask the backend can't do.
        self._features = check_task_served(
            config.deployment, config.task, features=features_of(config.sampling_params)
        )
        self._fast: Any = None  # process_batch over gRPC, bound to this actor's event loop
        self._safe: Any = None  # process_batch over actor calls: no size limit
        self._use_fast = self.grpc_transport
        self._id_prefix = f"{processor_id}-{uuid.uuid4().hex[:8]}-"
        self._ids = itertools.count()
        self._slots = asyncio.Semaphore(config.max_in_flight_batches)
        self._input_column = INPUT_COLUMN[config.task]
        self._gone = False  # the deployment was shut down: fail fast instead of retrying

    async def __call__(self, batch: pa.Table) -> pa.Table:
        n = batch.num_rows
        values = _column(batch, self._input_column, n)
        row_params = _column(batch, SAMPLING_PARAMS_COLUMN, n)
        models = _column(batch, MODEL_COLUMN, n)
        ids = [f"{self._id_prefix}{next(self._ids)}" for _ in range(n)]
        results: list[Result] = [{}] * n
        pending: list[tuple[int, Request]] = []
        for i in range(n):
            request = build_request(
                self.config.task,
                values[i],
                self.config.sampling_params,
                row_params[i],
                models[i],
                ids[i],
            )
            if isinstance(request, str):
                results[i] = error_result(request)
            elif (
                self._features is not None
                and row_params[i] is not None
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
                pending.append((i, request))

        if self.config.order_by_prefix:
            # Lexicographic order puts rows that share a prefix next to each other, however
            # long the prefix; results go back by row index, so the output order is unchanged.
            pending.sort(key=lambda item: request_text(item[1], roles=True))
        size = self.config.batch_size
        calls = [pending[k : k + size] for k in range(0, len(pending), size)]
        answers = await asyncio.gather(*(self._send([r for _, r in call]) for call in calls))
        for call, answer in zip(calls, answers):
            for (i, _), result in zip(call, answer):
                results[i] = result

        if self.config.on_error == "raise":
            row_ids = _column(batch, self.config.id_column, n) if self.config.id_column else None
            self._raise_first_error(results, ids, values, row_ids)
        return _with_outputs(batch, results, ids, self.config.task)

    async def _send(self, requests: list[Request]) -> list[Result]:
        async with self._slots:
            try:
                if self._gone:
                    raise _Gone()
                return await call_with_retries(
                    lambda: self._call(requests),
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
                        f"{self.config.max_retries + 1} attempts: {_describe(exc)}"
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
        return self._gone

    async def _call(self, requests: list[Request]) -> list[Result]:
        try:
            return await asyncio.wait_for(self._round_trip(requests), self.config.timeout_s)
        except TimeoutError:
            raise TimeoutError(
                f"no answer within timeout_s={self.config.timeout_s:g}s for {len(requests)} rows"
            ) from None

    async def _round_trip(self, requests: list[Request]) -> list[Result]:
        if self._safe is None:
            self._bind_handles()
        if self._use_fast:
            try:
                return await _answer(self._fast.remote(requests))
            except Exception as exc:
                if not _is_grpc_error(exc):
                    raise
                # Too large for gRPC's 4 MiB, or the replica's port is unreachable. A replica
                # that already computed the batch answers the re-sent call from its cache.
                self._use_fast = False
                logger.warning(
                    "gRPC transport to deployment %r failed (%s); using actor calls from now on",
                    self.config.deployment,
                    _describe(exc),
                )
        return await _answer(self._safe.remote(requests))

    def _bind_handles(self) -> None:
        """A handle of our own (not Serve's per-process cached one) whose router runs on the
        event loop Ray Data calls us on: no hop to Serve's router thread and back per call."""
        from ray.serve.handle import DeploymentHandle

        from relayllm.deployments import app_name

        handle = DeploymentHandle(self.config.deployment, app_name(self.config.deployment))
        handle._init(_run_router_in_separate_loop=False)  # private in Ray 2.60 (pinned 2.60.*)
        self._safe = handle.process_batch
        self._fast = handle.options(_by_reference=False).process_batch

    def _raise_first_error(
        self, results: list[Result], ids: list[str], values: list[Any], row_ids: list[Any] | None
    ) -> None:
        for i, result in enumerate(results):
            if result.get(ERROR):
                preview = repr(values[i])
                preview = preview if len(preview) <= 120 else preview[:117] + "..."
                which = f"{self.config.id_column}={row_ids[i]!r}, " if row_ids else ""
                raise RowError(
                    f"row {i} of its batch ({which}request_id {ids[i]}, {self._input_column}={preview}) "
                    f"failed on deployment {self.config.deployment!r}: {result[ERROR]}"
                )


class _Gone(Exception):
    """The deployment was shut down while this stage used it."""


async def _answer(response: Any) -> Any:
    try:
        return await response
    except asyncio.CancelledError:  # our timeout: let Serve drop the request too
        response.cancel()
        raise


def _is_grpc_error(exc: BaseException) -> bool:
    """A failure of the gRPC transport itself (``grpc.aio.AioRpcError``), not of the call."""
    import grpc  # a dependency of Ray Serve, already loaded by the handle

    return isinstance(exc, grpc.RpcError)


def _column(batch: pa.Table, name: str, n: int) -> list[Any]:
    if name not in batch.column_names:
        return [None] * n
    return batch.column(name).to_pylist()


def _with_outputs(batch: pa.Table, results: list[Result], ids: list[str], task: Task) -> pa.Table:
    """The batch with the task's output columns (rows.OUTPUT_SCHEMA) set or replaced."""
    for field in output_fields(task):
        values = ids if field.name == REQUEST_ID else [r.get(field.name) for r in results]
        array = pa.array(values, field.arrow_type())
        index = batch.schema.get_field_index(field.name)
        if index >= 0:
            batch = batch.set_column(index, field.name, array)
        else:
            batch = batch.append_column(field.name, array)
    return batch


__all__ = ["ServeStage"]
