"""The replica: the base class of the Serve deployment every backend builds.

The stage calls exactly three methods on a deployment: ``process_batch(requests, job=...)`` (one
call, many rows, one result per row in order, errors as values; ``job`` names the processor run
the rows belong to), ``health()`` and ``info()``.
:class:`BatchDeployment` implements the bookkeeping once -- per-row error capture, idempotency by
request id, counters -- so an adapter only writes :meth:`BatchDeployment.run_request` (or
:meth:`BatchDeployment.run_batch` when its engine takes a list in one call).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar

from relayllm.errors import (
    ControlRefusedError,
    DeploymentPausedError,
    EngineFailedError,
    describe_exception,
)
from relayllm.rows import WEIGHT_VERSION, Request, Result, error_result
from relayllm.serving.admission import Admission, AdmissionConfig
from relayllm.serving.control import CONTROL_CALLS, PAUSE_MODES, WAIT_S, state_actor
from relayllm.serving.metrics import ReplicaMetrics

if TYPE_CHECKING:
    from pydantic import BaseModel
    from starlette.requests import Request as HttpRequest
    from starlette.responses import Response

logger = logging.getLogger(__name__)

#: How many finished results a replica remembers, so a batch retried after a caller-side
#: timeout is answered from memory instead of being generated (and counted) twice.
RESULT_CACHE_SIZE = 8192
#: Seconds a replica whose engine failed waits (for the failed calls' answers to leave) before
#: it ends its process, so Serve replaces it at once instead of after three failed health checks.
RETIRE_DELAY_S = 0.5
#: Seconds the engine may take to stop before the replica ends anyway.
STOP_ENGINE_TIMEOUT_S = 15.0
#: The engine hook an adapter overrides to opt in to each control call (``pause``,
#: ``resume`` and ``is_paused`` are one capability).
CONTROL_HOOKS = {
    "pause": "engine_pause",
    "resume": "engine_pause",
    "is_paused": "engine_pause",
    "reset_prefix_cache": "engine_reset_prefix_cache",
    "sleep": "engine_sleep",
    "wake_up": "engine_wake_up",
    "tokenize": "engine_tokenize",
    "detokenize": "engine_detokenize",
    "load_adapter": "engine_load_adapter",
    "unload_adapter": "engine_load_adapter",
    "adapters": "engine_load_adapter",
    "update_weights": "engine_update_weights",
    "weight_version": "engine_update_weights",
}


class BatchDeployment:
    """Base class of the Serve deployment a backend builds."""

    backend_name: ClassVar[str] = "unknown"
    #: Whether a health check that does not answer in time retires the replica. A local
    #: engine that hangs is replaced; a remote endpoint that is slow is not helped by that.
    retire_when_hung: ClassVar[bool] = True

    def __init__(self, options: BaseModel, deployment: dict[str, Any]) -> None:
        #: The backend's ``Options`` instance, validated before deploy (typed attributes).
        self.options = options
        self.deployment = deployment
        self.calls = 0  # process_batch calls served by this replica
        self.rows = 0  # rows this replica computed (cache hits excluded)
        self.ongoing = 0  # process_batch calls in progress now...
        self.peak_ongoing = 0  # ...and the most ever at once (checks the admission limit)
        self._inflight: dict[str, tuple[asyncio.Future[list[Result]], int]] = {}
        self._finished: OrderedDict[str, Result] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self.failure: str | None = None  # why the engine as a whole failed (then: retiring)
        self._last_answer = time.monotonic()  # when the engine last finished a row
        self._busy_since = self._last_answer  # when the replica last went from idle to busy
        # The event loop the calls run on. Serve runs the health check on another loop; an
        # engine's client (vLLM's) answers only on the loop it serves from, so the probe is
        # sent there.
        self.serving_loop: asyncio.AbstractEventLoop | None = None
        self.http_rows = 0  # rows that came through the HTTP front (interactive traffic)
        #: Rows and tokens by traffic class (counted here, for every backend) and the engine's
        #: figures (fed by the adapter): exported through Ray's metrics, summarised in info().
        self.metrics = ReplicaMetrics(str(deployment.get("name")), self.backend_name)
        self.http_front: Any = None
        # Batch rows pass the admission gate only where interactive traffic can arrive: the
        # batch-only path stays as it was.
        self.admission: Admission | None = None
        if deployment.get("http") is not None:  # built at start: a bad key setup fails deploy
            from relayllm.serving.http_config import HttpConfig
            from relayllm.serving.http_front import HttpFront

            config = HttpConfig.model_validate(deployment["http"])
            self.http_front = HttpFront(self, config, str(deployment.get("name")))
            admission = AdmissionConfig.model_validate(deployment.get("admission") or {})
            self.admission = Admission(admission)
        # The control plane (issue 36): the pause mode while paused, the gate batch rows pass
        # before they enter the engine, the rows inside it, the control-state version applied.
        self.paused: str | None = None
        self._open = asyncio.Event()
        self._open.set()
        self._in_engine = 0
        self._drained = asyncio.Event()
        self._drained.set()
        self.control_version = 0
        self._control_lock = asyncio.Lock()
        self.runtime_adapters: dict[str, str] = {}  # loaded by control calls: name -> path
        # Weight updates: the version every row entering the engine is stamped with (None:
        # never updated), the update (source, version) applied, and whether one is under way.
        self.weight_version: str | None = None
        self.weights: dict[str, str] | None = None
        self.weight_updates = 0
        self.updating_weights = False
        self._follow_control()

    # -- what adapters implement -------------------------------------------------------------

    async def run_request(self, request: Request) -> Result:
        """Serve one row. Raise to fail just this row (the message becomes its ``error``);
        raise :class:`~relayllm.EngineFailedError` when the engine itself is dead: then the
        whole call fails, the replica retires and the stage retries on its replacement."""
        raise NotImplementedError

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        """Serve many rows; by default one :meth:`run_request` per row, run concurrently so the
        engine's continuous batching sees them all at once."""
        return list(await asyncio.gather(*(self._guarded(r) for r in requests)))

    async def stream_request(self, request: Request) -> AsyncIterator[Result]:
        """Serve one row, yielding its answer in parts as the engine makes them: each part's
        ``generated_text`` is the text new since the last part, the last part carries
        ``finish_reason`` and the token counts. Raise or yield a part with ``error`` to fail.
        By default the whole answer is one part (backends that cannot stream)."""
        yield await self._serve_one(request)

    def engine_info(self) -> dict[str, Any]:
        """Backend-specific facts for :meth:`info` (model, engine version, device)."""
        return {}

    async def engine_health(self) -> None:
        """Raise if the engine is not serving. Called by Serve's health check, bounded by
        half the deployment's ``health_check_timeout_s``: an engine that does not answer in
        time counts as hung, and the replica retires."""

    def stop_engine(self) -> None:
        """Stop the engine's processes (called once, when the replica retires after an
        engine failure, from a thread; bounded by ``STOP_ENGINE_TIMEOUT_S``)."""

    # -- control calls: an adapter opts in per call by overriding its hook -------------------
    # A hook left as it is here refuses its call (control_refusal) before anything changes.

    async def engine_pause(self, mode: str) -> None:
        """Pause the engine's own scheduling (``mode``: ``wait`` or ``keep``, see
        :data:`relayllm.serving.control.PauseMode`). The base class already holds new batch
        rows at its gate and, for ``wait``, has waited for its rows inside the engine before
        this is called; overriding this (even with nothing to add) is how a backend offers
        pause/resume."""
        raise NotImplementedError

    async def engine_resume(self) -> None:
        """Undo :meth:`engine_pause`."""

    async def engine_is_paused(self) -> bool:
        """Whether the engine says it is paused (default: this replica's gate)."""
        return self.paused is not None

    async def engine_reset_prefix_cache(self) -> None:
        raise NotImplementedError

    async def engine_sleep(self, level: int) -> None:
        raise NotImplementedError

    async def engine_wake_up(self) -> None:
        raise NotImplementedError

    async def engine_tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    async def engine_detokenize(self, ids: list[int]) -> str:
        raise NotImplementedError

    async def engine_load_adapter(self, name: str, path: str) -> None:
        """Load the LoRA adapter at ``path`` as ``name``: rows whose ``model`` is ``name`` get
        its answers (with :meth:`engine_unload_adapter`, how a backend offers runtime LoRA)."""
        raise NotImplementedError

    async def engine_unload_adapter(self, name: str) -> None:
        raise NotImplementedError

    async def engine_update_weights(self, path: str, version: str) -> None:
        """Load the checkpoint in the local directory ``path`` into the engine, in place, and
        record ``version`` where the engine keeps one (how a backend offers weight updates).
        Called with no row in the engine and none let in until it returns: the base class
        holds the rows and stamps each with the version it ran with."""
        raise NotImplementedError

    def control_refusal(self, call: str) -> str | None:
        """Why this replica cannot do ``call`` (None: it can). By default a call is refused
        unless the adapter overrides its hook; an adapter refuses more (a device that cannot)
        by overriding this."""
        hook = CONTROL_HOOKS.get(call)
        if hook is None:
            return f"no such control call; the calls are {', '.join(CONTROL_CALLS)}"
        if getattr(type(self), hook) is getattr(BatchDeployment, hook):
            return f"the {self.backend_name} adapter does not implement it"
        return None

    # -- what the stage calls ----------------------------------------------------------------

    async def process_batch(self, requests: list[Request], job: str | None = None) -> list[Result]:
        if self.failure:  # a replica on its way out takes no new work: the caller retries
            raise EngineFailedError(self.failure)
        self.serving_loop = asyncio.get_running_loop()
        self.calls += 1
        if not self.ongoing:
            self._busy_since = time.monotonic()
        self.ongoing += 1
        self.peak_ongoing = max(self.peak_ongoing, self.ongoing)
        try:
            return await self._process(requests, job)
        finally:
            self.ongoing -= 1

    async def _process(self, requests: list[Request], job: str | None) -> list[Result]:
        # Each row is answered from memory (finished), joins a computation already running
        # (a retry of a call that timed out on the caller's side), or is computed fresh.
        # Bookkeeping is per batch, not per row: this is the hot path.
        sources: list[tuple[asyncio.Future[list[Result]] | None, int | Result]] = []
        fresh: list[Request] = []
        batch_future: asyncio.Future[list[Result]] = asyncio.get_running_loop().create_future()
        for request in requests:
            rid = request.get("request_id")
            if rid is not None and rid in self._finished:
                sources.append((None, self._finished[rid]))
            elif rid is not None and rid in self._inflight:
                sources.append(self._inflight[rid])
            else:
                source = (batch_future, len(fresh))
                if rid is not None:
                    self._inflight[rid] = source
                sources.append(source)
                fresh.append(request)
        if fresh:
            # A separate task: if the caller times out and cancels this call, the work goes on
            # and its retry (same request ids) picks up the same future.
            task = asyncio.get_running_loop().create_task(self._compute(fresh, batch_future, job))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            batch_future.set_result([])
        answers: dict[int, list[Result]] = {}
        out: list[Result] = []
        for future, item in sources:
            if future is None:
                out.append(item)  # type: ignore[arg-type]
                continue
            key = id(future)
            if key not in answers:
                answers[key] = await asyncio.shield(future)
            out.append(answers[key][item])  # type: ignore[index]
        return out

    # -- what relayllm.control calls on every replica -----------------------------------------

    async def control_refusals(self) -> dict[str, Any]:
        """The backend and the control calls this replica refuses, with why (asked before a
        call changes anything on any replica)."""
        found = {call: self.control_refusal(call) for call in CONTROL_CALLS}
        refused = {call: reason for call, reason in found.items() if reason is not None}
        return {"backend": self.backend_name, "refused": refused}

    async def control_sync(self, version: int) -> dict[str, Any]:
        """Apply the deployment's control state up to at least ``version`` (written by the
        driver before it calls every replica), then say where this replica stands."""
        self.serving_loop = asyncio.get_running_loop()
        if self.control_version < version:
            actor = await asyncio.to_thread(state_actor, self._name(), create=False)
            if actor is None:
                raise RuntimeError("the deployment's control state is gone (shut down?)")
            await self._apply_control(*(await actor.get.remote()))
        return {"replica_id": _replica_id(), "paused": self.paused, "version": self.control_version}

    async def control(self, call: str, *args: Any) -> Any:
        """A control call on this replica: ``is_paused``, ``reset_prefix_cache``, ``sleep``,
        ``wake_up``, ``tokenize``, ``detokenize``, and the adapter calls (which the driver
        records in the deployment's state once every replica has done them)."""
        refusal = self.control_refusal(call)
        if refusal is not None:
            raise ControlRefusedError(self.backend_name, call, refusal, self._name())
        self.serving_loop = asyncio.get_running_loop()
        if call == "is_paused":
            return await self.engine_is_paused()
        if call in ("pause", "resume"):  # shared state: through relayllm.control only
            raise ValueError(f"{call} goes through relayllm.control(name).{call}()")
        if call == "sleep":
            await self.engine_sleep(*args)
        elif call == "wake_up":
            await self.engine_wake_up()
        elif call == "reset_prefix_cache":
            await self.engine_reset_prefix_cache()
        elif call == "tokenize":
            return await self.engine_tokenize(*args)
        elif call == "detokenize":
            return await self.engine_detokenize(*args)
        elif call == "load_adapter":
            name, path = args
            async with self._control_lock:
                await self.engine_load_adapter(name, path)
                self.runtime_adapters[name] = path
        elif call == "unload_adapter":
            (name,) = args
            async with self._control_lock:
                if name in self.runtime_adapters:
                    await self.engine_unload_adapter(name)
                    self.runtime_adapters.pop(name)
        elif call == "adapters":
            return dict(self.runtime_adapters)
        elif call == "update_weights":
            source, version = args
            async with self._control_lock:
                await self._load_weights(str(source), str(version))
        elif call == "weight_version":
            return self.weight_version
        return None

    def _name(self) -> str:
        return str(self.deployment.get("name"))

    def _follow_control(self) -> None:
        """Inside a Serve replica: hold batch rows until the deployment's control state is
        read (a replica that starts while the deployment is paused comes up paused), then
        follow its changes."""
        if _replica_id() is None:  # a test calling the class: no deployment to follow
            return
        try:
            loop = asyncio.get_running_loop()  # Serve runs the constructor on the user loop
        except RuntimeError:
            return
        self._open.clear()
        task = loop.create_task(self._follow())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _follow(self) -> None:
        try:
            actor = await asyncio.to_thread(state_actor, self._name(), create=True)
            await self._apply_control(*(await actor.get.remote()))
        except Exception:  # never hold rows for a state that cannot be read
            logger.exception("could not read the control state of %s", self._name())
            self._open.set()
            return
        while True:
            try:
                version, state = await actor.wait.remote(self.control_version, WAIT_S)
            except Exception:  # the state was dropped (shut down): nothing more to follow
                return
            await self._apply_control(version, state)

    async def _apply_control(self, version: int, state: dict[str, Any]) -> None:
        async with self._control_lock:  # one change at a time, in version order
            if version < self.control_version or (version == self.control_version and version):
                return
            await self._apply_adapters(state.get("adapters") or {})
            await self._apply_weights(state.get("weights"))
            mode = state.get("paused")
            if mode in PAUSE_MODES and self.paused != mode:
                await self._pause(str(mode))
            elif mode is None and (self.paused is not None or not self._open.is_set()):
                await self._resume()
            self.control_version = version

    async def _apply_adapters(self, wanted: dict[str, str]) -> None:
        """Load the runtime adapters the deployment has and this replica lacks (a replica that
        started after they were loaded), unload the ones it dropped. A load that fails is
        logged: rows naming that adapter fail, the replica serves the rest."""
        if self.control_refusal("load_adapter") is not None:
            return
        for name in [n for n in self.runtime_adapters if n not in wanted]:
            await self.engine_unload_adapter(name)
            self.runtime_adapters.pop(name)
        for name, path in wanted.items():
            if self.runtime_adapters.get(name) == path:
                continue
            try:
                await self.engine_load_adapter(name, path)
                self.runtime_adapters[name] = path
            except Exception:
                logger.exception("could not load the LoRA adapter %r from %s", name, path)

    async def _apply_weights(self, wanted: dict[str, str] | None) -> None:
        """Load the deployment's last weight update if this replica has not (one that started
        after it). A load that fails is logged: the replica serves its weights and says which
        (its rows' weight_version, info())."""
        if wanted is None or wanted == self.weights:
            return
        if self.control_refusal("update_weights") is not None:
            return
        try:
            await self._load_weights(wanted["source"], wanted["version"])
        except Exception:
            logger.exception("could not load the weights %s (version %s)", *wanted.values())

    async def _load_weights(self, source: str, version: str) -> None:
        """A weight update on this replica (the caller holds the control lock): new rows wait
        at the gate, the rows in the engine finish with the old weights (stamped with the old
        version), the engine loads the new ones, and the rows let in after carry the new
        version. A URI's checkpoint is copied to a local directory first, while rows run."""
        from relayllm.serving.weights import fetch_checkpoint

        if self.paused == "keep" and self._in_engine:
            raise RuntimeError(
                "the deployment is paused in mode 'keep' with rows frozen in the engine, which "
                "would finish on other weights than they started with: resume it (or pause "
                "with mode 'wait') before updating its weights"
            )
        path, cleanup = await asyncio.to_thread(fetch_checkpoint, source)
        was_open = self._open.is_set()
        self._open.clear()  # no batch row enters the engine from now on...
        self.updating_weights = True  # ...and no interactive one (503, as when paused)
        try:
            await self._drained.wait()  # the rows in the engine finish with the old weights
            await self.engine_update_weights(path, version)
            self.weight_version = version
            self.weights = {"source": source, "version": version}
            self.weight_updates += 1
        finally:
            self.updating_weights = False
            if was_open:
                self._open.set()
            await asyncio.to_thread(cleanup)

    async def _pause(self, mode: str) -> None:
        self._open.clear()  # no batch row enters the engine from now on
        self.paused = mode
        if mode == "wait":
            # Every row already handed to the engine finishes first, before the engine's own
            # pause: vLLM's "wait" drains only the running requests and leaves its queued ones
            # queued, which would hold them (and this wait) until the resume.
            await self._drained.wait()
        await self.engine_pause(mode)

    async def _resume(self) -> None:
        if self.paused is not None:
            await self.engine_resume()
        self.paused = None
        self._open.set()

    async def _engine_batch(self, requests: list[Request]) -> list[Result]:
        """``run_batch`` behind the pause gate, counting the rows inside the engine."""
        while not self._open.is_set():  # paused: the rows wait here, they do not fail
            await self._open.wait()
        # The version is read as the rows enter the engine: a weight update waits for every
        # row inside it before it loads, so these rows run on exactly these weights.
        version = self.weight_version
        self._enter(len(requests))
        try:
            results = await self.run_batch(requests)
        finally:
            self._leave(len(requests))
        for result in results:
            if isinstance(result, dict):
                result[WEIGHT_VERSION] = version
        return results

    def _enter(self, rows: int) -> None:
        self._in_engine += rows
        self._drained.clear()

    def _leave(self, rows: int) -> None:
        self._in_engine -= rows
        if not self._in_engine:
            self._drained.set()

    # -- what the HTTP front calls (interactive traffic, one row per request) ------------------

    async def __call__(self, request: HttpRequest) -> Response:
        """Serve's HTTP ingress: requests to the deployment's route prefix arrive here."""
        if self.http_front is None:  # no route is published without an http section
            from starlette.responses import PlainTextResponse

            return PlainTextResponse("this deployment has no HTTP front", status_code=404)
        response: Response = await self.http_front(request)
        return response

    async def serve_http_row(self, request: Request) -> Result:
        self._check_serving()
        version = self.weight_version  # as for batch rows (_engine_batch)
        self._enter(1)
        self.http_rows += 1
        admission = self.admission
        watch = admission.begin(streamed=False) if admission is not None else None
        try:
            result = await self._serve_one(request)
        finally:
            self._leave(1)
            if admission is not None and watch is not None:  # the whole answer's time
                admission.end(watch)
        result[WEIGHT_VERSION] = version
        self.metrics.count("interactive", (result,))
        return result

    async def stream_http_row(self, request: Request) -> AsyncIterator[Result]:
        self._check_serving()
        version = self.weight_version  # as for batch rows (_engine_batch)
        self._enter(1)
        try:
            async for part in self._stream_http_row(request):
                part[WEIGHT_VERSION] = version
                yield part
        finally:
            self._leave(1)

    async def _stream_http_row(self, request: Request) -> AsyncIterator[Result]:
        self.http_rows += 1
        # The controller sees each part as it comes: the first one's delay is the time to
        # first token, the gaps after it the time per output token.
        admission = self.admission
        watch = admission.begin(streamed=True) if admission is not None else None
        last: Result = {}
        try:
            async for part in self.stream_request(request):
                if admission is not None and watch is not None:
                    admission.token(watch)
                last = part
                yield part
        finally:
            if admission is not None and watch is not None:
                admission.end(watch)
        self._last_answer = time.monotonic()
        self.metrics.count("interactive", (last,))  # the last part carries the token counts

    def _check_serving(self) -> None:
        if self.failure:
            raise EngineFailedError(self.failure)
        if self.paused is not None:  # interactive requests are not held: the client retries
            raise DeploymentPausedError(f"deployment {self._name()!r} is paused")
        if self.updating_weights:
            raise DeploymentPausedError(f"deployment {self._name()!r} is updating its weights")
        self.serving_loop = asyncio.get_running_loop()

    async def health(self) -> dict[str, Any]:
        await self.engine_health()
        return {
            "ok": True,
            "backend": self.backend_name,
            "deployment": self.deployment.get("name"),
            "replica_id": _replica_id(),  # which replica answered: Serve may have replaced one
        }

    async def info(self) -> dict[str, Any]:
        return {
            "backend": self.backend_name,
            "deployment": self.deployment.get("name"),
            "replica_id": _replica_id(),
            "node_id": _node_id(),
            "pid": os.getpid(),
            "calls": self.calls,
            "rows": self.rows,
            "ongoing": self.ongoing,
            "peak_ongoing": self.peak_ongoing,
            # How long calls have been waiting with no row answered: a stall when long
            # (``relayllm status`` shows it); 0 when idle.
            "seconds_without_answer": (
                round(time.monotonic() - max(self._last_answer, self._busy_since), 1)
                if self.ongoing
                else 0.0
            ),
            "tasks": self.deployment.get("tasks"),
            "paused": self.paused,
            "weight_version": self.weight_version,
            "weight_updates": self.weight_updates,
            **self.engine_info(),
            "rows_by_class": {"batch": self.rows, "interactive": self.http_rows},
            # Tokens by class and the engine's figures (TTFT, queue, KV cache, prefix hits).
            "metrics": self.metrics.summary(),
            **({"http": self._http_info()} if self.http_front is not None else {}),
            **({"admission": self.admission.describe()} if self.admission is not None else {}),
        }

    def _http_info(self) -> dict[str, Any]:
        front = self.http_front
        return {
            "url": front.config.url_for(str(self.deployment.get("name"))),
            "model": front.model,
            "api_key_required": front.config.api_key_env is not None,
            "rows": self.http_rows,
            "requests": dict(front.requests),
        }

    async def describe(self) -> dict[str, Any]:
        """The DeploymentConfig this replica was started with (used to detect conflicts)."""
        return self.deployment

    async def check_health(self) -> None:
        """Serve's periodic health check: a dead or hung engine gets the replica replaced."""
        if self.failure:
            raise EngineFailedError(self.failure)
        bound = float(self.deployment.get("health_check_timeout_s") or 30.0) / 2
        asked = time.monotonic()
        loop = self.serving_loop
        probe: Any = self.engine_health()
        if loop is not None and loop is not asyncio.get_running_loop():
            probe = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(probe, loop))
        try:
            await asyncio.wait_for(probe, bound)
        except TimeoutError:
            if self._last_answer >= asked:  # slow to answer but still finishing rows: busy
                logger.warning(
                    "health check: the engine took over %gs to answer but is "
                    "finishing rows (busy, not hung)",
                    bound,
                )
                return
            if not self.retire_when_hung:
                raise TimeoutError(
                    f"the engine did not answer a health check within {bound:g}s"
                ) from None
            self.engine_failed(f"the engine did not answer a health check within {bound:g}s (hung)")
            raise EngineFailedError(self.failure) from None
        except EngineFailedError as exc:  # other errors count as Serve counts them (3 in a row)
            self.engine_failed(str(exc))
            raise

    def engine_failed(self, reason: str) -> None:
        """The engine as a whole is gone: fail every call from now on and retire the replica.

        Serve marks a replica whose health check fails unhealthy only after three checks in a
        row, but a replica whose process ended at once; so the replica stops its engine and
        ends its process, and Serve starts a new one. The stage's calls that failed here are
        retried there (same request ids); rows answered before the failure are not redone."""
        if self.failure:
            return
        self.failure = reason
        logger.error("engine failed in %s: %s; retiring this replica", type(self).__name__, reason)
        # Calls waiting on a hung engine would wait until the process ends: fail them now, so
        # their answers (retry elsewhere) leave before it does. The futures belong to the loop
        # the calls run on; a health check runs on another.
        loop = self.serving_loop
        if loop is not None and loop is not asyncio.get_running_loop():
            loop.call_soon_threadsafe(self._fail_inflight, reason)
        else:
            self._fail_inflight(reason)
        if _replica_id() is None:  # not inside a Serve replica (a test calling the class)
            return
        task = asyncio.get_running_loop().create_task(self._retire())
        self._tasks.add(task)

    # -- internals ---------------------------------------------------------------------------

    def _fail_inflight(self, reason: str) -> None:
        for future, _ in list(self._inflight.values()):
            if not future.done():
                future.set_exception(EngineFailedError(reason))
        self._inflight.clear()

    async def _guarded(self, request: Request) -> Result:
        try:
            result = await self.run_request(request)
            self._last_answer = time.monotonic()
            return result
        except (asyncio.CancelledError, EngineFailedError):
            raise
        except Exception as exc:  # a row's failure is that row's value
            return error_result(describe_exception(exc))

    async def _serve_one(self, request: Request) -> Result:
        """One row outside a batch call (the HTTP front), through whichever of
        :meth:`run_request` / :meth:`run_batch` the adapter wrote."""
        if type(self).run_request is not BatchDeployment.run_request:
            return await self._guarded(request)
        try:
            (result,) = await self.run_batch([request])
        except EngineFailedError as exc:
            self.engine_failed(str(exc))
            raise
        except Exception as exc:  # asyncio.CancelledError is not an Exception: it travels on
            return error_result(describe_exception(exc))
        self._last_answer = time.monotonic()
        return result

    async def _retire(self) -> None:
        await asyncio.sleep(RETIRE_DELAY_S)
        try:
            await asyncio.wait_for(asyncio.to_thread(self.stop_engine), STOP_ENGINE_TIMEOUT_S)
        except Exception:  # the process ends anyway; its children go with it
            logger.exception("stopping the engine of %s failed", type(self).__name__)
        os._exit(1)

    async def _compute(
        self, fresh: list[Request], future: asyncio.Future[list[Result]], job: str | None
    ) -> None:
        try:
            if self.admission is not None:
                results = await self.admission.run(fresh, self._engine_batch, job=job)
            else:
                results = await self._engine_batch(fresh)
            if len(results) != len(fresh):
                raise RuntimeError(
                    f"{type(self).__name__}.run_batch returned {len(results)} results "
                    f"for {len(fresh)} requests"
                )
        except EngineFailedError as exc:  # the call fails, not its rows: nothing is cached
            self.engine_failed(str(exc))
            for request in fresh:
                self._inflight.pop(request.get("request_id") or "", None)
            if not future.done():
                future.set_exception(exc)
            return
        except Exception as exc:
            logger.exception("batch failed in %s", type(self).__name__)
            results = [error_result(describe_exception(exc)) for _ in fresh]
        self.rows += len(fresh)
        self.metrics.count("batch", results)
        self._last_answer = time.monotonic()
        for request, result in zip(fresh, results, strict=True):
            rid = request.get("request_id")
            if rid is not None:
                self._inflight.pop(rid, None)
                self._finished[rid] = result
        while len(self._finished) > RESULT_CACHE_SIZE:
            self._finished.popitem(last=False)
        if not future.done():
            future.set_result(results)


def _replica_id() -> str | None:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # not inside a replica (a unit test calling the class directly)
        return None


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id()
    except Exception:
        return None


__all__ = ["RESULT_CACHE_SIZE", "BatchDeployment"]
