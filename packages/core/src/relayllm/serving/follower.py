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
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from relayllm.errors import ControlRefusedError, describe_exception
from relayllm.serving.control_state import PAUSE_MODES, WAIT_S, state_actor
from relayllm.serving.engine import CAPABILITIES, refusal

logger = logging.getLogger(__name__)


class ControlFollower:
    """The pause gate, the runtime adapters, the weights and the control-state version of one
    replica, applied to its ``engine`` (an :class:`~relayllm.serving.engine.Engine`)."""

    def __init__(
        self,
        engine: Any,
        backend: str,
        deployment: str,
        adapters: dict[str, str] | None = None,
        retire: Callable[[str], None] | None = None,
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
        self._loading = False
        # The weight-update transaction (control_state): the pending update of the state
        # last applied, the one this replica loaded and awaits the outcome of, and the one
        # whose outcome its gate is held for.
        self.pending: dict[str, str] | None = None
        self.prepared: dict[str, Any] | None = None
        self.holding: str | None = None
        #: Retires the replica: its engine's weights are not the deployment's committed ones
        #: (a failed load may leave them half-written) and it cannot put them back.
        self.retire: Callable[[str], None] = retire or (lambda reason: None)
        self.retired: str | None = None
        self._touched = False  # whether the last load reached the engine
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

    @property
    def updating_weights(self) -> bool:
        """Whether a weight update holds this replica's rows (HTTP requests get 503)."""
        return self._loading or self.holding is not None

    def _regate(self) -> None:
        """Open the gate unless a pause, a weight update or a retirement holds it."""
        if self.paused is None and self.holding is None and self.retired is None:
            self._open.set()
        else:
            self._open.clear()

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
                try:
                    await self._load_weights(str(source), str(version))
                finally:
                    self._regate()
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
            committed, pending = state.get("weights"), state.get("weights_pending")
            self.pending = pending
            if pending is not None:  # held until the update's outcome is written
                self.holding = pending["txn"]
                self._open.clear()
            # Still held while the outcome is applied: no row (batch or HTTP) meets weights
            # the deployment has not committed.
            await self._settle(committed, pending)
            await self._apply_weights(committed)
            if pending is None:
                self.holding = None
            mode = state.get("paused")
            if mode in PAUSE_MODES and self.paused != mode:
                await self._pause(str(mode))
            elif mode is None and self.paused is not None:
                await self._resume()
            self._regate()
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
        """Load the deployment's committed weights if this replica has not (it started later,
        or during the update). A replica that cannot load them retires: it would serve rows
        outside the committed version."""
        if wanted is None or wanted == self.weights or self.retired is not None:
            return
        if self.refusal("update_weights") is not None:
            return
        try:
            await self._load_weights(wanted["source"], wanted["version"])
        except Exception as exc:
            logger.exception("could not load the weights %s (version %s)", *wanted.values())
            self._retire(f"could not load the committed weights: {describe_exception(exc)}")
            return
        self.weights = dict(wanted)

    # -- the weight-update transaction ---------------------------------------------------------

    async def prepare_weights(self, state_version: int, update: dict[str, str]) -> dict[str, Any]:
        """The prepare step of the update ``update`` (``txn``, ``source``, ``version``), once
        the state that began it (``state_version``) is applied: rows held, the rows in the
        engine finished, the checkpoint loaded -- and the gate kept closed until the outcome
        (:meth:`_settle`). A load that fails in the engine retires the replica (its engine's
        weights are no longer known); a checkpoint that cannot be fetched leaves the engine
        as it was. The answer is a value, never a raise: the driver decides on all."""
        await self.sync(state_version)
        txn = update["txn"]
        async with self._lock:
            if self.prepared is not None and self.prepared["txn"] == txn:
                return self._report("prepared")
            if self.pending is None or self.pending["txn"] != txn:
                return self._report("aborted", "the update was decided before it loaded here")
            if self.retired is not None:
                return self._report("retired", self.retired)
            reason = self.refusal("update_weights") or self._keep_frozen()
            if reason is not None:
                return self._report("refused", reason)
            self._touched = False
            try:
                digest = await self._load_weights(update["source"], update["version"], txn=txn)
            except Exception as exc:
                why = describe_exception(exc)
                if not self._touched:  # not fetched: the engine still holds committed weights
                    return self._report("failed", why)
                self._retire(f"could not load the weights of version {update['version']}: {why}")
                return self._report("retired", why)
            self.prepared = {**update, "digest": digest}
            return self._report("prepared")

    async def _settle(self, committed: dict[str, str] | None, pending: dict[str, str] | None):
        """Apply the outcome of the update this replica prepared, once it is written:
        committed, its rows get the new version; aborted, the engine reloads the committed
        checkpoint -- or, when the committed weights are the deployment's own (no checkpoint
        to reload), the replica retires and Serve replaces it."""
        prepared = self.prepared
        if prepared is None or (pending is not None and pending["txn"] == prepared["txn"]):
            return
        self.prepared = None
        if committed is not None and committed.get("txn") == prepared["txn"]:
            self.weight_version = prepared["version"]
            self.weights = dict(committed)
            self.weight_updates += 1
        elif committed is None:
            self._retire(
                "a weight update aborted after it loaded here, and the weights the "
                "deployment started with cannot be reloaded"
            )
        else:
            try:
                await self._load_weights(committed["source"], committed["version"])
                self.weights = dict(committed)
            except Exception as exc:
                self._retire(f"could not reload the committed weights: {describe_exception(exc)}")

    def _keep_frozen(self) -> str | None:
        if self.paused == "keep" and self.in_engine:
            return (
                "the deployment is paused in mode 'keep' with rows frozen in the engine, which "
                "would finish on other weights than they started with: resume it (or pause "
                "with mode 'wait') before updating its weights"
            )
        return None

    def _retire(self, reason: str) -> None:
        if self.retired is None:
            self.retired = reason
            self._open.clear()
            self.retire(reason)

    def _report(self, state: str, error: str | None = None) -> dict[str, Any]:
        prepared = self.prepared or {}
        return {
            "state": state,
            "weight_version": self.weight_version,
            "digest": prepared.get("digest"),
            **({"error": error} if error is not None else {}),
        }

    async def _load_weights(
        self, source: str, version: str, *, txn: str | None = None
    ) -> str | None:
        """New rows wait at the gate, the rows in the engine finish on the old weights, the
        engine loads the new ones, the rows let in after carry the new version. A URI's
        checkpoint is copied to a local directory first, while rows run. With ``txn`` (a
        transaction's prepare) the version is not taken yet: the gate stays held for the
        outcome, and the answer is the digest of what was loaded (:meth:`_digest`)."""
        from relayllm.serving.weights import fetch_checkpoint

        reason = self._keep_frozen()
        if reason is not None:
            raise RuntimeError(reason)
        path, cleanup = await asyncio.to_thread(fetch_checkpoint, source)
        self._open.clear()  # no batch row enters the engine from now on...
        self._loading = True  # ...and no interactive one (503, as when paused)
        try:
            await self._drained.wait()  # the rows in the engine finish with the old weights
            self._touched = True
            await self.engine.update_weights(path, version)
            if txn is None:
                self.weight_version = version
                self.weights = {"source": source, "version": version}
                self.weight_updates += 1
                return None
            return await self._digest(path)
        finally:
            self._loading = False
            await asyncio.to_thread(cleanup)

    async def _digest(self, path: str) -> str:
        """The digest of the weights just loaded from ``path``: the engine's own checker
        where it has one (``weights_digest``), else relayllm's digest of the checkpoint's
        files (:func:`~relayllm.serving.weights.checkpoint_digest`)."""
        from relayllm.serving.weights import checkpoint_digest

        checker = getattr(self.engine, "weights_digest", None)
        said = await checker() if checker is not None else None
        if said is not None:
            return str(said)
        return await asyncio.to_thread(checkpoint_digest, path)

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
        self._regate()


__all__ = ["ControlFollower"]
