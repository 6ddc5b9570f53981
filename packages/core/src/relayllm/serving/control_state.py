"""The control plane's state, on the replica's side: what every replica of a deployment must
agree on (paused or not) lives in one small detached actor per deployment, so a replica that
starts later -- scale-up, a replacement after an engine death -- comes up in the current state.

Why an actor and not Serve's ``user_config``: changing ``user_config`` means redeploying the
application (the driver would rebuild it from the replica's config), Serve applies it to the
replicas in the background with no answer per replica, and the deployment's config -- which
``deploy()`` compares to detect a conflict -- would then change with every pause. The actor
holds only the state and a version; each replica follows it (a long poll) and the driver's
control call waits until every running replica has applied the version it wrote
(:mod:`relayllm.serving.controller`).

Nothing here imports Ray at module level: this module is imported by every replica.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, Literal

from relayllm.serving.engine import CAPABILITIES

#: Every control call a deployment may be asked to do: derived from the engine contract's one
#: list (an engine offers a call by implementing its method).
CONTROL_CALLS: tuple[str, ...] = tuple(CAPABILITIES)
#: How a pause treats the rows already in the engine: ``wait`` lets them finish (``pause()``
#: returns once they have), ``keep`` freezes them where they are until ``resume()``. vLLM's
#: third mode, ``abort``, would fail rows and is not offered.
PauseMode = Literal["wait", "keep"]
PAUSE_MODES: tuple[str, ...] = ("wait", "keep")
#: What a paused deployment's HTTP front tells a client (seconds, the ``Retry-After`` header).
PAUSED_RETRY_AFTER_S = 5
#: The namespace of the state actors (not Serve's: ``serve`` holds only Serve's own actors).
STATE_NAMESPACE = "relayllm"
#: A replica's long poll on the state actor ends after this long without a change (then it
#: asks again): bounds how long a replica keeps a call on an actor that was replaced.
WAIT_S = 30.0


def state_actor_name(deployment: str) -> str:
    return f"relayllm-control-{deployment}"


class ControlState:
    """The durable control state of one deployment (a detached actor, no CPU): the state as a
    dict (``paused``: None or the pause mode; ``adapters``: LoRA adapter name -> path, loaded
    at runtime; ``weights``: None, or the last committed weight update's ``source``,
    ``version`` and ``txn``; ``weights_pending``: the weight update under way, None when none
    is) and a version that grows with every change.

    A weight update is a transaction this actor decides (:meth:`begin_weights`,
    :meth:`finish_weights`): while one is pending every replica holds its rows, and its
    outcome is one write that every replica, including one that starts meanwhile, applies.
    The actor aborts a pending update itself once its deadline passes, so a driver that
    vanishes mid-update leaves the deployment on its committed weights, not held forever.

    When the last change was is kept on this actor's own monotonic clock and told only as a
    duration (:meth:`since_change`): no other process, on another node, compares its clock
    with it."""

    def __init__(self) -> None:
        self.version = 0
        self.state: dict[str, Any] = {
            "paused": None,
            "adapters": {},
            "weights": None,
            "weights_pending": None,
        }
        self._changed = asyncio.Event()
        self._changed_mono: float | None = None  # time.monotonic() of the last change
        self._deadlines: dict[str, asyncio.Task[None]] = {}

    async def set_adapter(self, name: str, path: str | None) -> int:
        """Record a loaded adapter (``path``) or forget it (None), in one step: two drivers
        loading adapters at once each keep theirs."""
        adapters = dict(self.state["adapters"])
        if path is None:
            adapters.pop(name, None)
        else:
            adapters[name] = path
        return await self.update({"adapters": adapters})

    async def begin_weights(self, update: dict[str, str], timeout_s: float) -> int:
        """Start the weight update ``update`` (``txn``, ``source``, ``version``): every replica
        holds its rows from this state on. One at a time: a second update while one is
        pending is refused. Aborted here if not finished within ``timeout_s``."""
        pending = self.state.get("weights_pending")
        if pending is not None:
            raise RuntimeError(
                f"a weight update (version {pending['version']!r}) is under way: wait for it"
            )
        txn = update["txn"]
        task = asyncio.get_running_loop().create_task(self._expire(txn, timeout_s))
        self._deadlines[txn] = task
        return await self.update({"weights_pending": dict(update)})

    async def finish_weights(self, txn: str, commit: bool) -> tuple[int, bool]:
        """Decide the update ``txn``: committed (its weights become the deployment's) or
        aborted (the committed weights stay). Returns the state version and whether it was
        committed: False also when it had expired (or is unknown) -- a late commit fails
        closed."""
        pending = self.state.get("weights_pending")
        task = self._deadlines.pop(txn, None)
        if task is not None:
            task.cancel()
        if pending is None or pending["txn"] != txn:
            return self.version, False
        changes: dict[str, Any] = {"weights_pending": None}
        if commit:
            changes["weights"] = dict(pending)
        return await self.update(changes), commit

    async def _expire(self, txn: str, timeout_s: float) -> None:
        await asyncio.sleep(timeout_s)
        self._deadlines.pop(txn, None)
        pending = self.state.get("weights_pending")
        if pending is not None and pending["txn"] == txn:
            await self.update({"weights_pending": None})

    async def get(self) -> tuple[int, dict[str, Any]]:
        return self.version, dict(self.state)

    async def since_change(self) -> tuple[dict[str, Any], float]:
        """The state and how many seconds ago it last changed, measured here (inf: never):
        a stage that waited N seconds by its own clock asks whether a change (a pause) fell
        within them, comparing two durations instead of two nodes' clocks."""
        if self._changed_mono is None:
            return dict(self.state), math.inf
        return dict(self.state), time.monotonic() - self._changed_mono

    async def update(self, changes: dict[str, Any]) -> int:
        self.state.update(changes)
        self._changed_mono = time.monotonic()
        self.version += 1
        self._changed.set()
        self._changed = asyncio.Event()
        return self.version

    async def wait(self, after: int, timeout_s: float) -> tuple[int, dict[str, Any]]:
        """The state once its version is past ``after`` (or as it is after ``timeout_s``)."""
        if self.version <= after:
            try:
                await asyncio.wait_for(self._changed.wait(), timeout_s)
            except TimeoutError:
                pass
        return self.version, dict(self.state)


def state_actor(deployment: str, *, create: bool) -> Any:
    """The state actor of ``deployment`` (created when ``create``; None if there is none)."""
    import ray

    from relayllm.compat import HEAD_RESOURCE

    name = state_actor_name(deployment)
    if not create:
        try:
            return ray.get_actor(name, namespace=STATE_NAMESPACE)
        except ValueError:
            return None
    actor_class: Any = ray.remote(ControlState)
    return actor_class.options(
        name=name,
        namespace=STATE_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,
        # On the head node: the state must outlive the worker nodes its replicas run on
        # (created from a replica it would sit on that replica's node and die with it).
        resources=HEAD_RESOURCE,
        max_concurrency=1000,  # one long poll per replica waits in it
    ).remote()


def drop_state(deployment: str) -> None:
    """Forget a deployment's control state (it was shut down, or is deployed anew: a new
    deployment of the name must not come up paused by an old one's state)."""
    import ray

    actor = state_actor(deployment, create=False)
    if actor is not None:
        ray.kill(actor, no_restart=True)


__all__ = [
    "CONTROL_CALLS",
    "PAUSED_RETRY_AFTER_S",
    "PAUSE_MODES",
    "STATE_NAMESPACE",
    "ControlState",
    "PauseMode",
    "drop_state",
    "state_actor",
    "state_actor_name",
]
