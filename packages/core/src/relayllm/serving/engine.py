"""The engine contract (adapter contract 3): what an adapter implements, and nothing else.

An adapter's :class:`Engine` runs one model in one Serve replica. The core's
:class:`~relayllm.serving.replica.Replica` owns everything around it -- idempotency by request
id, the control state every replica follows, health and retirement, admission, metrics, the
HTTP front -- so an engine only turns requests into results (the split of Ray's ``LLMEngine``
and ``LLMServer``). Adapters import it as :class:`relayllm.adapters.Engine`.

Required: :meth:`Engine.start`, :meth:`Engine.run_batch` (or :meth:`Engine.run_request`, one
row, which the default ``run_batch`` fans out concurrently), :meth:`Engine.info`,
:meth:`Engine.health`, :meth:`Engine.stop`; :meth:`Engine.stream` when the engine can stream.
Optional capability groups: an engine offers a control call by implementing its method, and
:data:`CAPABILITIES` (control call -> the method) is the one list the replica, the control
plane and the command line derive theirs from.

It lives here, beside the replica that calls it, because it runs in the replica and needs only
the foundation (errors, rows); :mod:`relayllm.adapters` is where adapters import it from.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from relayllm.errors import EngineFailedError, describe_exception
from relayllm.rows import Request, Result, error_result

if TYPE_CHECKING:
    from pydantic import BaseModel

    from relayllm.serving.metrics import ReplicaMetrics

F = TypeVar("F", bound=Callable[..., Any])

#: Every control call, and the engine method whose implementation offers it. ``pause``,
#: ``resume`` and ``is_paused`` are one capability (``pause``); the adapter calls
#: (``load_adapter``, ``unload_adapter``, ``adapters``) another; ``weight_version`` comes with
#: ``update_weights``. The replica does the shared part (the gate, the state actor, which
#: adapters and weights are loaded); the method does the engine's.
CAPABILITIES: dict[str, str] = {
    "pause": "pause",
    "resume": "pause",
    "is_paused": "pause",
    "reset_prefix_cache": "reset_prefix_cache",
    "sleep": "sleep",
    "wake_up": "wake_up",
    "tokenize": "tokenize",
    "detokenize": "detokenize",
    "load_adapter": "load_adapter",
    "unload_adapter": "load_adapter",
    "adapters": "load_adapter",
    "update_weights": "update_weights",
    "weight_version": "update_weights",
}
_NOT_OFFERED = "__relayllm_not_offered__"


def _optional(method: F) -> F:
    """Marks the base class's stand-in of an optional method: an engine that does not
    override it does not offer the capability (the replica refuses its calls up front)."""
    setattr(method, _NOT_OFFERED, True)
    return method


@dataclass
class EngineContext:
    """What the replica hands its engine: the deployment it serves and the metrics an engine
    feeds with its own figures (queue, latency, KV cache, prefix-cache hits)."""

    #: The deployment's config as the replica got it (``name``, ``num_replicas``, ``http``...).
    deployment: dict[str, Any]
    metrics: ReplicaMetrics
    #: The LoRA adapters loaded at runtime (name -> path), kept by the replica: rows whose
    #: ``model`` names one are that adapter's.
    adapters: dict[str, str] = field(default_factory=dict)
    #: Called by the default :meth:`Engine.run_batch` as each row is answered (the replica's
    #: hang watch: a long call whose rows keep finishing is busy, not hung). An engine with
    #: its own ``run_batch`` may call it too; the replica also notes each answered call.
    answered: Callable[[], None] = lambda: None

    @property
    def name(self) -> str:
        return str(self.deployment.get("name"))


class Engine:
    """One model in one replica. Subclass it, set :attr:`backend_name`, and implement
    :meth:`start`, :meth:`run_batch` (or :meth:`run_request`), :meth:`info`, :meth:`health`
    and :meth:`stop`; the optional methods below offer their control calls."""

    #: The backend's name, as ``Backend.name`` (the replica's ``info()`` and errors name it).
    backend_name: ClassVar[str] = "unknown"
    #: Whether a health check that does not answer in time retires the replica. A local
    #: engine that hangs is replaced; a remote endpoint that is slow is not helped by that.
    retire_when_hung: ClassVar[bool] = True
    #: Whether Serve's periodic health check probes the engine (:meth:`health`). False for an
    #: engine whose outage a new replica would not mend (an external endpoint): restarting
    #: would drop its state and the rows in flight, which retry on their own.
    probed_by_serve: ClassVar[bool] = True

    def __init__(self, options: BaseModel, context: EngineContext) -> None:
        """Cheap: keep what :meth:`start` needs. The backend's validated ``Options`` instance
        is :attr:`options` (typed attributes)."""
        self.options = options
        self.context = context

    # -- required ------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the engine (load the model, open the client). Called once, in the replica's
        constructor, on the event loop the calls will run on; raise to fail the deploy."""

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        """One result per request, in order, a row's failure as that row's value
        (:func:`~relayllm.rows.error_result`). Raise :class:`~relayllm.EngineFailedError`
        when the engine itself is dead (the call fails, the replica retires, the stage
        retries the rows elsewhere); any other exception fails every row of the call. By
        default one :meth:`run_request` per row, run concurrently so continuous batching
        sees them all at once."""
        return list(await asyncio.gather(*(self._one(r) for r in requests)))

    async def run_request(self, request: Request) -> Result:
        """One row, for the default :meth:`run_batch`. Raise to fail just this row (the
        message becomes its ``error``)."""
        raise NotImplementedError(
            f"{type(self).__name__} implements neither run_batch nor run_request"
        )

    async def stream(self, request: Request) -> AsyncIterator[Result]:
        """One row in parts as the engine makes them: each part's ``generated_text`` is the
        text new since the last part, the last part carries ``finish_reason`` and the token
        counts; a part with ``error`` fails it. By default the whole answer is one part."""
        (result,) = await self.run_batch([request])
        yield result

    def info(self) -> dict[str, Any]:
        """Facts for the replica's ``info()``: ``model``, the engine's version, ``device``,
        ``engine_pids``... (the replica adds its own keys after these)."""
        return {}

    async def health(self) -> dict[str, Any] | None:
        """Raise if the engine is not serving; what it returns (a dict) is added to the
        replica's ``health()`` report. Serve's health check calls it, bounded by half the
        deployment's ``health_check_timeout_s``: no answer in time counts as hung."""
        return None

    def stop(self) -> None:
        """Stop the engine's processes: called once, from a thread, when the replica retires
        (bounded by ``STOP_ENGINE_TIMEOUT_S``), and by tests that check health() sees it."""

    def refusal(self, call: str) -> str | None:
        """Why this engine cannot do the control ``call`` it implements (None: it can); for
        a device that cannot (vLLM refuses ``sleep`` on CPU). Calls whose method is not
        implemented are refused already."""
        return None

    # -- optional capability groups (CAPABILITIES) ---------------------------------------------

    @_optional
    async def pause(self, mode: str) -> None:
        """Pause the engine's own scheduling (``wait`` or ``keep``). The replica already holds
        new rows at its gate and, for ``wait``, waits for its rows in the engine before this;
        implementing it (even as ``pass``) is how an engine offers pause/resume."""
        raise NotImplementedError

    async def resume(self) -> None:
        """Undo :meth:`pause`."""

    async def is_paused(self) -> bool | None:
        """Whether the engine says it is paused (None: the replica's gate answers)."""
        return None

    @_optional
    async def tokenize(self, text: str) -> list[int]:
        raise NotImplementedError

    @_optional
    async def detokenize(self, ids: list[int]) -> str:
        raise NotImplementedError

    @_optional
    async def sleep(self, level: int) -> None:
        raise NotImplementedError

    @_optional
    async def wake_up(self) -> None:
        raise NotImplementedError

    @_optional
    async def load_adapter(self, name: str, path: str) -> None:
        """Load the LoRA adapter at ``path`` as ``name`` (the replica records it in
        :attr:`EngineContext.adapters` and loads it on replicas that start later)."""
        raise NotImplementedError

    async def unload_adapter(self, name: str) -> None:
        """Free what :meth:`load_adapter` loaded (default: nothing to free)."""

    @_optional
    async def update_weights(self, path: str, version: str) -> None:
        """Load the checkpoint in the local directory ``path`` in place. Called with no row in
        the engine and none let in until it returns; the replica stamps each row with the
        ``version`` it ran on."""
        raise NotImplementedError

    async def weights_digest(self) -> str | None:
        """A digest of the weights the engine holds now, from the engine's own checker
        (called after :meth:`update_weights`): replicas whose digests differ abort the
        update. None (the default): the replica digests the checkpoint's files instead."""
        return None

    @_optional
    async def reset_prefix_cache(self) -> None:
        raise NotImplementedError

    # -- internals -------------------------------------------------------------------------------

    async def _one(self, request: Request) -> Result:
        try:
            result = await self.run_request(request)
        except (asyncio.CancelledError, EngineFailedError):
            raise
        except Exception as exc:  # a row's failure is that row's value
            result = error_result(describe_exception(exc))
        self.context.answered()
        return result


def offers(engine: object, call: str) -> bool:
    """Whether ``engine`` implements the method of the control ``call``."""
    method = CAPABILITIES.get(call)
    found = getattr(engine, method, None) if method is not None else None
    return found is not None and not getattr(found, _NOT_OFFERED, False)


def missing(engine: object, call: str, backend: str) -> str | None:
    """Why ``engine`` lacks ``call`` altogether (None: it implements it)."""
    if call not in CAPABILITIES:
        return f"no such control call; the calls are {', '.join(CAPABILITIES)}"
    if not offers(engine, call):
        return f"the {backend} adapter does not implement it"
    return None


def refusal(engine: Any, call: str, backend: str) -> str | None:
    """Why ``engine`` cannot do ``call`` (None: it can): an unknown call, a capability it does
    not implement, or its own :meth:`Engine.refusal`."""
    reason: str | None = missing(engine, call, backend) or engine.refusal(call)
    return reason


def not_offered(engine: Engine, method: str) -> None:
    """Withdraw the capability ``method`` from this one engine object (the contract-2
    wrapper, whose capabilities are the hooks its adapter overrides)."""
    setattr(engine, method, getattr(Engine, method).__get__(engine))


__all__ = ["CAPABILITIES", "Engine", "EngineContext", "missing", "not_offered", "offers", "refusal"]
