"""The replica: the Serve deployment the core builds around an adapter's engine.

The stage calls three methods on it: ``process_batch(requests, job=...)`` (one call, many rows,
one result per row in order, errors as values; ``job`` names the processor run the rows belong
to), ``health()`` and ``info()``. The driver's control plane calls ``control_refusals``,
``control_sync``, ``weights_prepare`` and ``control``; the HTTP front calls ``serve_http_row`` and
``stream_http_row``. The replica is composed of parts, each its own module: the row cache
(:mod:`.rowcache`: a retried call computed once), the control follower (:mod:`.follower`: the
pause gate, adapters, weights, the control-state actor), health and retirement
(:mod:`.health`), admission (:mod:`.admission`) and metrics (:mod:`.metrics`). The adapter's
part is an :class:`~relayllm.serving.engine.Engine`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from relayllm.errors import (
    CallFailedError,
    DeploymentPausedError,
    EngineFailedError,
    describe_exception,
)
from relayllm.rows import ENGINE_S, WEIGHT_VERSION, Request, Result, error_result
from relayllm.serving.admission import Admission
from relayllm.serving.admission_config import AdmissionConfig
from relayllm.serving.engine import Engine, EngineContext
from relayllm.serving.follower import ControlFollower
from relayllm.serving.health import EngineWatch
from relayllm.serving.identity import node_id, node_ip, replica_id
from relayllm.serving.metrics import ReplicaMetrics, split_by_tokens
from relayllm.serving.rowcache import RowCache

if TYPE_CHECKING:
    from pydantic import BaseModel
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response

logger = logging.getLogger(__name__)


class Replica:
    """One Serve replica of a deployment: the core's bookkeeping around one engine."""

    def __init__(
        self, engine_class: type[Engine], options: BaseModel, deployment: dict[str, Any]
    ) -> None:
        self._setup(options, deployment, engine_class.backend_name)
        self._engine: Engine = engine_class(options, self.context)
        self._assemble()
        self._engine.start()  # on the loop the calls run on (Serve runs constructors there)
        self._follow_control()

    def _setup(self, options: BaseModel, deployment: dict[str, Any], backend: str) -> None:
        #: The backend's ``Options`` instance, validated before deploy (typed attributes).
        self.options = options
        self.deployment = deployment
        self.backend_name = backend
        self.calls = 0  # process_batch calls served by this replica
        self.rows = 0  # rows this replica computed (cache hits excluded)
        self.ongoing = 0  # process_batch calls in progress now...
        self.peak_ongoing = 0  # ...and the most ever at once (checks the admission limit)
        self.http_rows = 0  # rows that came through the HTTP front (interactive traffic)
        #: Rows and tokens by traffic class (counted here, for every backend) and the engine's
        #: figures (fed by the engine): exported through Ray's metrics, summarised in info().
        self.metrics = ReplicaMetrics(self._name(), backend, replica_id())
        self.context = EngineContext(deployment, self.metrics)
        self.cache = RowCache()
        self.http_front: Any = None
        # Batch rows pass the admission gate only where interactive traffic can arrive: the
        # batch-only path stays as it was.
        self.admission: Admission | None = None
        if deployment.get("http") is not None:  # built at start: a bad key setup fails deploy
            from relayllm.serving.http_config import HttpConfig
            from relayllm.serving.http_front import HttpFront

            config = HttpConfig.model_validate(deployment["http"])
            self.http_front = HttpFront(self, config, self._name())
            admission = AdmissionConfig.model_validate(deployment.get("admission") or {})
            self.admission = Admission(admission)

    def _assemble(self) -> None:
        """The parts that act on the engine (built once :attr:`engine` exists)."""
        engine = self._engine
        self.follower = ControlFollower(
            engine,
            self.backend_name,
            self._name(),
            self.context.adapters,
            retire=lambda reason: self.engine_failed(reason),
        )
        self.watch = EngineWatch(
            type(engine).__name__,
            engine.health,
            self.cache.fail_inflight,
            engine.stop,
            retire_when_hung=engine.retire_when_hung,
            retire=replica_id() is not None,  # not inside Serve: a test calling the class
        )
        self.context.answered = self.watch.answered

    @property
    def engine(self) -> Any:
        """The adapter's :class:`~relayllm.serving.engine.Engine` this replica runs."""
        return self._engine

    # -- what the stage calls ----------------------------------------------------------------

    async def process_batch(self, requests: list[Request], job: str | None = None) -> list[Result]:
        watch = self.watch
        watch.check_serving()  # a replica on its way out takes no new work: the caller retries
        watch.serving_loop = asyncio.get_running_loop()
        self.calls += 1
        if not self.ongoing:
            watch.busy_since = time.monotonic()
        self.ongoing += 1
        self.peak_ongoing = max(self.peak_ongoing, self.ongoing)
        try:
            if job is None:
                return await self.cache.run(requests, self._compute)
            return await self.cache.run(requests, lambda fresh: self._compute(fresh, job))
        finally:
            self.ongoing -= 1

    async def _compute(self, fresh: list[Request], job: str | None = None) -> list[Result]:
        try:
            if self.admission is not None:
                results = await self.admission.run(fresh, self._engine_batch, job=job)
            else:
                results = await self._engine_batch(fresh)
            if len(results) != len(fresh):
                raise RuntimeError(
                    f"{type(self._engine).__name__}.run_batch returned {len(results)} results "
                    f"for {len(fresh)} requests"
                )
        except EngineFailedError as exc:  # the call fails, not its rows: nothing is cached
            self.engine_failed(str(exc))
            raise
        except CallFailedError:  # the call fails and is retried; the replica serves on
            raise
        except Exception as exc:
            logger.exception("batch failed in %s", type(self._engine).__name__)
            results = [error_result(describe_exception(exc)) for _ in fresh]
        self.rows += len(fresh)
        self.metrics.count("batch", results)
        self.watch.answered()
        return results

    async def _engine_batch(self, requests: list[Request]) -> list[Result]:
        """``run_batch`` behind the pause gate; each result stamped with the weight version
        its rows ran on and its engine time (the call's share, split by tokens)."""
        async with self.follower.admitted(len(requests)) as version:
            with self.metrics.engine_busy() as share:
                results = await self._engine.run_batch(requests)
        for result, seconds in zip(results, split_by_tokens(share.seconds, results), strict=True):
            if isinstance(result, dict):
                result[WEIGHT_VERSION] = version
                result[ENGINE_S] = seconds
        return results

    async def health(self) -> dict[str, Any]:
        facts = await self._engine.health()
        return {
            "ok": True,
            "backend": self.backend_name,
            "deployment": self.deployment.get("name"),
            "replica_id": replica_id(),  # which replica answered: Serve may have replaced one
            **(facts or {}),
        }

    async def info(self) -> dict[str, Any]:
        follower = self.follower
        return {
            "backend": self.backend_name,
            "deployment": self.deployment.get("name"),
            "replica_id": replica_id(),
            "node_id": node_id(),
            "node_ip": node_ip(),
            "pid": os.getpid(),
            "calls": self.calls,
            "rows": self.rows,
            "ongoing": self.ongoing,
            "peak_ongoing": self.peak_ongoing,
            # Rows still being computed, those of callers that gave up (cancelled) included.
            "computing_rows": self.cache.computing,
            # How long calls have been waiting with no row answered: a stall when long
            # (``relayllm status`` shows it); 0 when idle.
            "seconds_without_answer": self.watch.seconds_without_answer(bool(self.ongoing)),
            "tasks": self.deployment.get("tasks"),
            "paused": follower.paused,
            "weight_version": follower.weight_version,
            "weight_updates": follower.weight_updates,
            **self.engine_info(),
            "rows_by_class": {"batch": self.rows, "interactive": self.http_rows},
            # Tokens by class and the engine's figures (TTFT, queue, KV cache, prefix hits).
            "metrics": self.metrics.summary(),
            **({"http": self._http_info()} if self.http_front is not None else {}),
            **({"admission": self.admission.describe()} if self.admission is not None else {}),
        }

    def engine_info(self) -> dict[str, Any]:
        """The engine's own facts (model, version, device, its processes)."""
        return dict(self._engine.info())

    async def describe(self) -> dict[str, Any]:
        """The DeploymentConfig this replica was started with (used to detect conflicts)."""
        return self.deployment

    async def check_health(self) -> None:
        """Serve's periodic health check: a dead or hung engine gets the replica replaced."""
        if not self._engine.probed_by_serve:
            return
        bound = float(self.deployment.get("health_check_timeout_s") or 30.0) / 2
        await self.watch.check(bound)

    def stop_engine(self) -> None:
        """Stop the engine (what a retiring replica does; the conformance kit's engine-down
        check calls it through a handle, then expects health() to fail)."""
        self._engine.stop()

    def engine_failed(self, reason: str) -> None:
        """The engine as a whole is gone: fail every call from now on and retire the replica
        (:class:`~relayllm.serving.health.EngineWatch`)."""
        self.watch.failed(reason)

    # -- what relayllm.control calls on every replica -----------------------------------------

    async def control_refusals(self) -> dict[str, Any]:
        """The backend and the control calls this replica refuses, with why (asked before a
        call changes anything on any replica)."""
        return {"backend": self.backend_name, "refused": self.follower.refusals()}

    async def control_sync(self, version: int) -> dict[str, Any]:
        """Apply the deployment's control state up to at least ``version`` (written by the
        driver before it calls every replica), then say where this replica stands."""
        self.watch.serving_loop = asyncio.get_running_loop()
        await self.follower.sync(version)
        return {
            "replica_id": replica_id(),
            "paused": self.follower.paused,
            "version": self.follower.version,
        }

    async def weights_prepare(self, state_version: int, update: dict[str, str]) -> dict[str, Any]:
        """The prepare step of a weight-update transaction on this replica (the driver's
        :meth:`~relayllm.serving.controller.Controller.update_weights`): held, drained,
        loaded, and held until the outcome. Answers this replica's state, never raises."""
        self.watch.serving_loop = asyncio.get_running_loop()
        answer = await self.follower.prepare_weights(state_version, update)
        return {"replica_id": replica_id(), **answer}

    async def control(self, call: str, *args: Any) -> Any:
        """A control call on this replica (:data:`~relayllm.serving.engine.CAPABILITIES`)."""
        self.watch.serving_loop = asyncio.get_running_loop()
        return await self.follower.call(call, *args)

    @property
    def paused(self) -> str | None:
        return self.follower.paused

    @property
    def updating_weights(self) -> bool:
        return self.follower.updating_weights

    @property
    def weight_version(self) -> str | None:
        return self.follower.weight_version

    @property
    def runtime_adapters(self) -> dict[str, str]:
        """The LoRA adapters loaded at runtime, name -> path."""
        return dict(self.follower.adapters)

    def _follow_control(self) -> None:
        """Inside a Serve replica, follow the deployment's control state."""
        if replica_id() is None:  # a test calling the class: no deployment to follow
            return
        try:
            asyncio.get_running_loop()  # Serve runs the constructor on the user loop
        except RuntimeError:
            return
        self.follower.follow()

    def _name(self) -> str:
        return str(self.deployment.get("name"))

    # -- what the HTTP front calls (interactive traffic, one row per request) ------------------

    async def __call__(self, request: HttpRequest) -> Response:
        """Serve's HTTP ingress: requests to the deployment's route prefix arrive here."""
        if self.http_front is None:  # no route is published without an http section
            from starlette.responses import PlainTextResponse

            return PlainTextResponse("this deployment has no HTTP front", status_code=404)
        response: Response = await self.http_front(request)
        return response

    async def serve_http_row(self, request: Request) -> Result:
        (result,) = await self.serve_http_rows([request])
        return result

    async def serve_http_rows(self, requests: list[Request]) -> list[Result]:
        """The rows of one HTTP request (an embeddings request's inputs) in one engine call:
        one call for all, not a call (and through the gateway a handle call) per input."""
        self._check_serving()
        self.http_rows += len(requests)
        admission = self.admission
        watch = admission.begin(streamed=False) if admission is not None else None
        try:
            async with self.follower.admitted(len(requests), wait=False) as version:
                with self.metrics.engine_busy() as share:
                    results = await self._serve_many(requests)
        finally:
            if admission is not None and watch is not None:  # the whole answer's time
                admission.end(watch)
        for result in results:  # the call's engine time, shared by its rows
            result[WEIGHT_VERSION], result[ENGINE_S] = version, share.seconds / len(results)
        self.metrics.count("interactive", results)
        return results

    async def stream_http_row(self, request: Request) -> AsyncIterator[Result]:
        self._check_serving()
        self.http_rows += 1
        # The controller sees each part as it comes: the first one's delay is the time to
        # first token, the gaps after it the time per output token.
        admission = self.admission
        watch = admission.begin(streamed=True) if admission is not None else None
        last: Result = {}
        try:
            async with self.follower.admitted(1, wait=False) as version:
                with self.metrics.engine_busy() as share:
                    async for part in self._engine.stream(request):
                        if admission is not None and watch is not None:
                            admission.token(watch)
                        part[WEIGHT_VERSION] = version
                        part[ENGINE_S] = self.metrics.share_now(share)  # up to this part
                        last = part
                        yield part
        finally:
            if admission is not None and watch is not None:
                admission.end(watch)
        self.watch.answered()
        self.metrics.count("interactive", (last,))  # the last part carries the token counts

    def _check_serving(self) -> None:
        self.watch.check_serving()
        if self.follower.paused is not None:  # interactive requests are not held: retry
            raise DeploymentPausedError(f"deployment {self._name()!r} is paused")
        if self.follower.updating_weights:
            raise DeploymentPausedError(f"deployment {self._name()!r} is updating its weights")
        self.watch.serving_loop = asyncio.get_running_loop()

    async def _serve_many(self, requests: list[Request]) -> list[Result]:
        """Rows outside a batch call (the HTTP front)."""
        try:
            results = await self._engine.run_batch(requests)
        except EngineFailedError as exc:
            self.engine_failed(str(exc))
            raise
        except Exception as exc:  # asyncio.CancelledError is not an Exception: it travels on
            return [error_result(describe_exception(exc)) for _ in requests]
        self.watch.answered()
        return results

    def _http_info(self) -> dict[str, Any]:
        front = self.http_front
        return {
            "url": front.config.url_for(self._name()),
            "model": front.model,
            "api_key_required": front.config.api_key_env is not None,
            "rows": self.http_rows,
            "requests": dict(front.requests),
        }


__all__ = ["Replica"]
