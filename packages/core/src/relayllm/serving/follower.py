"""The control follower: one replica's side of the control plane.

It holds the gate batch rows pass before they enter the engine (closed while paused or while
weights load), counts the rows inside the engine (a ``wait`` pause and a weight update wait
for them), follows the deployment's state actor (:mod:`relayllm.serving.control_state`: a replica
that starts later comes up paused, with the adapters and weights the others have), and runs
the control calls the driver fans out, each through the engine method
:data:`~relayllm.serving.engine.CAPABILITIES` names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from relayllm.errors import ControlRefusedError
from relayllm.serving.control_state import PAUSE_MODES, WAIT_S, state_actor
from relayllm.serving.engine import CAPABILITIES, refusal

logger = logging.getLogger(__name__)


class ControlFollower:
    """The pause gate, the runtime adapters, the weights and the control-state version of one
    replica, applied to its ``engine`` (an :class:`~relayllm.serving.engine.Engine`)."""

    def __init__(
        self, engine: Any, backend: str, deployment: str, adapters: dict[str, str] | None = None
    ) -> None:
        self.engine = engine
        self.backend = backend
        self.deployment = deployment
        self.paused: str | None = None  # the pause mode while paused
        self._open = asyncio.Event()
        self._open.set()
        self.in_engine = 0  # rows handed to the engine and not answered yet
        self._drained = asyncio.Event()
        self._drained.set()
        self.version = 0  # the control-state version applied
        self._lock = asyncio.Lock()  # one change at a time, in version order
        #: Loaded at runtime: name -> path (the engine's context holds the same dict).
        self.adapters: dict[str, str] = {} if adapters is None else adapters
        # Weight updates: the version every row entering the engine is stamped with (None:
        # never updated), the update (source, version) applied, and whether one is under way.
        self.weight_version: str | None = None
        self.weights: dict[str, str] | None = None
        self.weight_updates = 0
        self.updating_weights = False
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the gate --------------------------------------------------------------------------------

    @asynccontextmanager
    async def admitted(self, rows: int, *, wait: bool = True) -> AsyncIterator[str | None]:
        """Let ``rows`` into the engine (waiting at the gate while it is closed, if ``wait``)
        and count them there; yields the weight version they run with, read as they enter:
        a weight update waits for every row inside before it loads."""
        while wait and not self._open.is_set():  # paused: the rows wait, they do not fail
            await self._open.wait()
        version = self.weight_version
        self.in_engine += rows
        self._drained.clear()
        try:
            yield version
        finally:
            self.in_engine -= rows
            if not self.in_engine:
                self._drained.set()

    @property
    def open(self) -> bool:
        return self._open.is_set()

    # -- control calls ---------------------------------------------------------------------------

    def refusal(self, call: str) -> str | None:
        return refusal(self.engine, call, self.backend)

    def refusals(self) -> dict[str, str]:
        found = {call: self.refusal(call) for call in CAPABILITIES}
        return {call: reason for call, reason in found.items() if reason is not None}

    async def call(self, call: str, *args: Any) -> Any:
        """One control call on this replica (shared state -- pause, resume -- goes through
        the state actor: :meth:`sync`)."""
        reason = self.refusal(call)
        if reason is not None:
            raise ControlRefusedError(self.backend, call, reason, self.deployment)
        engine = self.engine
        if call == "is_paused":
            said = await engine.is_paused()
            return self.paused is not None if said is None else said
        if call in ("pause", "resume"):
            raise ValueError(f"{call} goes through relayllm.control(name).{call}()")
        if call == "adapters":
            return dict(self.adapters)
        if call == "weight_version":
            return self.weight_version
        if call == "load_adapter":
            name, path = args
            async with self._lock:
                await engine.load_adapter(name, path)
                self.adapters[name] = path
        elif call == "unload_adapter":
            (name,) = args
            async with self._lock:
                if name in self.adapters:
                    await engine.unload_adapter(name)
                    self.adapters.pop(name)
        elif call == "update_weights":
            source, version = args
            async with self._lock:
                await self._load_weights(str(source), str(version))
        else:  # an engine call with nothing shared: tokenize, sleep, reset_prefix_cache...
            return await getattr(engine, CAPABILITIES[call])(*args)
        return None

    # -- following the deployment's state ----------------------------------------------------

    def follow(self) -> None:
        """Hold batch rows until the deployment's control state is read (a replica that starts
        while the deployment is paused comes up paused), then follow its changes. Call on
        the replica's event loop."""
        self._open.clear()
        task = asyncio.get_running_loop().create_task(self._follow())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def sync(self, version: int) -> None:
        """Apply the state up to at least ``version`` (written before the driver asks)."""
        if self.version < version:
            actor = await asyncio.to_thread(state_actor, self.deployment, create=False)
            if actor is None:
                raise RuntimeError("the deployment's control state is gone (shut down?)")
            await self.apply(*(await actor.get.remote()))

    async def _follow(self) -> None:
        try:
            actor = await asyncio.to_thread(state_actor, self.deployment, create=True)
            await self.apply(*(await actor.get.remote()))
        except Exception:  # never hold rows for a state that cannot be read
            logger.exception("could not read the control state of %s", self.deployment)
            self._open.set()
            return
        while True:
            try:
                version, state = await actor.wait.remote(self.version, WAIT_S)
            except Exception:  # the state was dropped (shut down): nothing more to follow
                return
            await self.apply(version, state)

    async def apply(self, version: int, state: dict[str, Any]) -> None:
        async with self._lock:
            if version < self.version or (version == self.version and version):
                return
            await self._apply_adapters(state.get("adapters") or {})
            await self._apply_weights(state.get("weights"))
            mode = state.get("paused")
            if mode in PAUSE_MODES and self.paused != mode:
                await self._pause(str(mode))
            elif mode is None and (self.paused is not None or not self._open.is_set()):
                await self._resume()
            self.version = version

    async def _apply_adapters(self, wanted: dict[str, str]) -> None:
        """Load the adapters the deployment has and this replica lacks, unload the ones it
        dropped. A load that fails is logged: rows naming it fail, the replica serves the
        rest."""
        if self.refusal("load_adapter") is not None:
            return
        for name in [n for n in self.adapters if n not in wanted]:
            await self.engine.unload_adapter(name)
            self.adapters.pop(name)
        for name, path in wanted.items():
            if self.adapters.get(name) == path:
                continue
            try:
                await self.engine.load_adapter(name, path)
                self.adapters[name] = path
            except Exception:
                logger.exception("could not load the LoRA adapter %r from %s", name, path)

    async def _apply_weights(self, wanted: dict[str, str] | None) -> None:
        """Load the deployment's last weight update if this replica has not. A load that
        fails is logged: the replica serves its weights and says which."""
        if wanted is None or wanted == self.weights:
            return
        if self.refusal("update_weights") is not None:
            return
        try:
            await self._load_weights(wanted["source"], wanted["version"])
        except Exception:
            logger.exception("could not load the weights %s (version %s)", *wanted.values())

    async def _load_weights(self, source: str, version: str) -> None:
        """New rows wait at the gate, the rows in the engine finish on the old weights, the
        engine loads the new ones, the rows let in after carry the new version. A URI's
        checkpoint is copied to a local directory first, while rows run."""
        from relayllm.serving.weights import fetch_checkpoint

        if self.paused == "keep" and self.in_engine:
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
            await self.engine.update_weights(path, version)
            self.weight_version = version
            self.weights = {"source": source, "version": version}
            self.weight_updates += 1
        finally:
            self.updating_weights = False
            if was_open:
                self._open.set()
            await asyncio.to_thread(cleanup)

    async def _pause(self, mode: str) -> None:
        self._open.clear()
        self.paused = mode
        if mode == "wait":
            # Every row already in the engine finishes before the engine's own pause: vLLM's
            # "wait" drains only running requests and would hold its queued ones (and this
            # wait) until the resume.
            await self._drained.wait()
        await self.engine.pause(mode)

    async def _resume(self) -> None:
        if self.paused is not None:
            await self.engine.resume()
        self.paused = None
        self._open.set()


__all__ = ["ControlFollower"]
