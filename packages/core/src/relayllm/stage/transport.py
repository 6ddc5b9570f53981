"""How a stage's calls reach the replicas: the handles, the transport, the request router.

The cost of moving rows is per call, not per row (docs/benchmarks.md has the profile), so the
stage calls its deployment the cheapest way Serve offers -- a router on the stage's own event
loop and Serve's gRPC transport to the replica, which cut the CPU time of a call on both sides
(about a quarter in the stage, half in the replica). That transport caps a message at 4 MiB:
on a gRPC status error (a call over 4 MiB is the case tested) the stage switches to Serve's
ordinary actor-call transport for good and re-sends the call there (not counted as a retry).
It also needs the replica's port to be reachable from the stage; when it is not, Ray 2.60's
router turns the failure into ``ActorUnavailableError`` and keeps retrying the scheduling,
which the stage sees as ``timeout_s``, not as a gRPC error -- no fallback. On such clusters use
the actor transport. ``ProcessorConfig.transport`` ``"actor"`` (default:
``RELAYLLM_SERVE_TRANSPORT``, else ``"grpc"``) uses the actor transport from the start.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from relayllm import compat
from relayllm.errors import describe_exception
from relayllm.rows import Request, Result
from relayllm.stage import affinity

logger = logging.getLogger(__name__)

#: The key a stage task's handles are kept under in its process: (deployment name, Serve
#: controller id, when the app was deployed). A redeploy of the name, with another router
#: maybe, or a Serve started again (a new controller: the old handles are dead) gets fresh ones.
HandlesKey = tuple[str, str | None, float | None]

# HandlesKey -> (actor-call, gRPC) methods, shared by the stage tasks of one process.
_handles: dict[HandlesKey, tuple[Any, Any]] = {}


class Transport:
    """The calls of one stage to its deployment: gRPC until the first gRPC failure, then
    actor calls; both on handles whose router runs on the stage's event loop."""

    def __init__(
        self, deployment: str, *, grpc: bool, run_id: str | None, key: HandlesKey | None
    ) -> None:
        self.deployment = deployment
        #: Serve's gRPC transport still in use (False: actor calls, from the start or since
        #: the first gRPC failure).
        self.grpc = grpc
        self._run_id = run_id  # sent with each call: the job its rows belong to
        self._key = key  # in a task: the process's handles are shared under it
        self._fast: Any = None  # process_batch over gRPC, bound to this stage's event loop
        self._safe: Any = None  # process_batch over actor calls: no size limit
        self.router: Any = None  # the handle's request router, once known (ready_router)

    async def ready_router(self) -> Any:
        """The handle's request router (relayllm.stage.affinity), waited for once."""
        if self.router is None:
            self._bind()
            self.router = await affinity.ready_router(self._safe)
        return self.router

    def forget(self) -> None:
        """The deployment is gone: a redeploy of the name gets fresh handles."""
        if self._key is not None:
            _handles.pop(self._key, None)

    async def call(self, requests: list[Request], key: str | None = None) -> list[Result]:
        """One round trip of ``requests``, routed by ``key`` (Serve's ``session_id``,
        serving/router.py)."""
        self._bind()
        fast, safe = self._fast, self._safe
        if key:
            fast, safe = fast.options(session_id=key), safe.options(session_id=key)
        if self.grpc:
            try:
                return await _answer(fast.remote(requests, job=self._run_id))
            except Exception as exc:
                if not is_grpc_error(exc):
                    raise
                # Too large for gRPC's 4 MiB, or the replica's port is unreachable. A replica
                # that already computed the batch answers the re-sent call from its cache.
                self.grpc = False
                logger.warning(
                    "gRPC transport to deployment %r failed (%s); using actor calls from now on",
                    self.deployment,
                    describe_exception(exc),
                )
        return await _answer(safe.remote(requests, job=self._run_id))

    def _bind(self) -> None:
        """A handle of our own (not Serve's per-process cached one) whose router runs on the
        event loop Ray Data calls us on: no hop to Serve's router thread and back per call."""
        from relayllm.deployments import app_name

        if self._safe is not None:
            return
        key = self._key
        if key is not None and key in _handles:
            self._safe, self._fast = _handles[key]
            return
        handle = compat.handle_on_this_loop(self.deployment, app_name(self.deployment))
        self._safe = handle.process_batch
        self._fast = compat.grpc_transport(handle).process_batch
        if key is not None:
            for old in [k for k in _handles if k[0] == key[0]]:  # an earlier deploy's
                del _handles[old]
            _handles[key] = (self._safe, self._fast)


async def _answer(response: Any) -> Any:
    try:
        return await response
    except asyncio.CancelledError:  # our timeout: let Serve drop the request too
        response.cancel()
        raise


def is_grpc_error(exc: BaseException) -> bool:
    """A failure of the gRPC transport itself (``grpc.aio.AioRpcError``), not of the call."""
    import grpc  # a dependency of Ray Serve, already loaded by the handle

    return isinstance(exc, grpc.RpcError)


__all__ = ["HandlesKey", "Transport", "is_grpc_error"]
