"""The wrapper that keeps contract-2 adapters working for one release (goes with contract 4).

A contract-2 adapter subclasses :class:`BatchDeployment` -- the replica itself -- and overrides
``run_request`` or ``run_batch``, ``engine_info``, ``engine_health``, ``stop_engine`` and the
``engine_*`` control hooks. Here that class is a :class:`~relayllm.serving.replica.Replica`
whose engine is :class:`LegacyEngine`, a view of the adapter's own hooks: the replica's parts
(row cache, control follower, health, admission, metrics) run as for a contract-3 engine, and
the attributes contract-2 code reads on ``self`` (``rows``, ``paused``, ``runtime_adapters``,
``weight_version``, ``serving_loop``...) read those parts. Registering such a backend warns
once (:func:`relayllm.backend.contract_problem`), saying what to change.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, ClassVar

from relayllm.errors import EngineFailedError, describe_exception
from relayllm.rows import Request, Result, error_result
from relayllm.serving.engine import CAPABILITIES, Engine, missing, not_offered
from relayllm.serving.replica import Replica

if TYPE_CHECKING:
    from pydantic import BaseModel

#: The contract-2 hook that opted in to each control call (``CAPABILITIES`` gives the
#: contract-3 method; the hook's name is ``engine_`` before it).
_HOOKS = {call: f"engine_{method}" for call, method in CAPABILITIES.items()}


class BatchDeployment(Replica):
    """Deprecated base of a contract-2 adapter's replica: implement a
    :class:`relayllm.adapters.Engine` instead and return it from ``Backend.engine_class``."""

    backend_name: ClassVar[str] = "unknown"  # type: ignore[misc]
    #: Whether a health check that does not answer in time retires the replica.
    retire_when_hung: ClassVar[bool] = True
    #: Left to the adapter, as in contract 2 (SGLang's and vLLM's replicas keep their engine
    #: client there); the replica keeps its view of the adapter in ``_engine``.
    engine: Any = None

    def __init__(self, options: BaseModel, deployment: dict[str, Any]) -> None:
        self._setup(options, deployment, type(self).backend_name)
        self._engine = LegacyEngine(self)
        self._assemble()
        self._follow_control()  # the subclass starts its engine after this returns

    # -- what contract-2 adapters implement -----------------------------------------------------

    async def run_request(self, request: Request) -> Result:
        raise NotImplementedError

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        return list(await asyncio.gather(*(self._guarded(r) for r in requests)))

    async def stream_request(self, request: Request) -> AsyncIterator[Result]:
        (result,) = await self.run_batch([request])
        yield result

    def engine_info(self) -> dict[str, Any]:
        return {}

    async def engine_health(self) -> None:
        pass

    def stop_engine(self) -> None:
        pass

    def control_refusal(self, call: str) -> str | None:
        """Why this replica cannot do ``call`` (None: it can): a hook left alone refuses."""
        return missing(self._engine, call, self.backend_name)

    async def engine_is_paused(self) -> bool:
        return self.paused is not None

    async def engine_resume(self) -> None:
        pass

    # -- contract-2 names for the parts' state ----------------------------------------------------

    @property
    def paused(self) -> str | None:
        return self.follower.paused

    @paused.setter
    def paused(self, mode: str | None) -> None:  # contract-2 code (and its tests) wrote it
        self.follower.paused = mode

    @property
    def runtime_adapters(self) -> dict[str, str]:  # contract-2 code read it as the live dict
        return self.follower.adapters

    @property
    def control_version(self) -> int:
        return self.follower.version

    @property
    def failure(self) -> str | None:
        return self.watch.failure

    @property
    def serving_loop(self) -> asyncio.AbstractEventLoop | None:
        return self.watch.serving_loop

    async def _guarded(self, request: Request) -> Result:
        try:
            result = await self.run_request(request)
            self.watch.answered()
            return result
        except (asyncio.CancelledError, EngineFailedError):
            raise
        except Exception as exc:  # a row's failure is that row's value
            return error_result(describe_exception(exc))


class LegacyEngine(Engine):
    """A contract-2 replica's hooks as an :class:`Engine`: the capabilities it offers are the
    hooks its class overrides."""

    def __init__(self, replica: BatchDeployment) -> None:
        super().__init__(replica.options, replica.context)
        self.replica = replica
        self.backend_name = replica.backend_name  # type: ignore[misc]
        self.retire_when_hung = type(replica).retire_when_hung  # type: ignore[misc]
        for call, hook in _HOOKS.items():  # a hook the adapter left alone refuses its call
            if getattr(type(replica), hook, None) is None:
                not_offered(self, CAPABILITIES[call])

    async def run_batch(self, requests: list[Request]) -> list[Result]:
        return await self.replica.run_batch(requests)

    async def stream(self, request: Request) -> AsyncIterator[Result]:
        async for part in self.replica.stream_request(request):
            yield part

    def info(self) -> dict[str, Any]:
        return self.replica.engine_info()

    async def health(self) -> None:
        await self.replica.engine_health()

    def stop(self) -> None:
        self.replica.stop_engine()

    def refusal(self, call: str) -> str | None:
        replica = self.replica
        own = type(replica).control_refusal
        if own is not BatchDeployment.control_refusal:  # the adapter refuses more itself
            return own(replica, call)
        return None

    async def pause(self, mode: str) -> None:
        await self.replica.engine_pause(mode)  # type: ignore[attr-defined]

    async def resume(self) -> None:
        await self.replica.engine_resume()

    async def is_paused(self) -> bool | None:
        return await self.replica.engine_is_paused()

    async def tokenize(self, text: str) -> list[int]:
        return await self.replica.engine_tokenize(text)  # type: ignore[attr-defined,no-any-return]

    async def detokenize(self, ids: list[int]) -> str:
        return await self.replica.engine_detokenize(ids)  # type: ignore[attr-defined,no-any-return]

    async def sleep(self, level: int) -> None:
        await self.replica.engine_sleep(level)  # type: ignore[attr-defined]

    async def wake_up(self) -> None:
        await self.replica.engine_wake_up()  # type: ignore[attr-defined]

    async def load_adapter(self, name: str, path: str) -> None:
        await self.replica.engine_load_adapter(name, path)  # type: ignore[attr-defined]

    async def unload_adapter(self, name: str) -> None:
        hook = getattr(self.replica, "engine_unload_adapter", None)
        if hook is not None:
            await hook(name)

    async def update_weights(self, path: str, version: str) -> None:
        await self.replica.engine_update_weights(path, version)  # type: ignore[attr-defined]

    async def reset_prefix_cache(self) -> None:
        await self.replica.engine_reset_prefix_cache()  # type: ignore[attr-defined]


__all__ = ["BatchDeployment", "LegacyEngine"]
