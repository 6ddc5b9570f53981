"""Control calls on a running deployment, by name, fanned out to every replica.

``relayllm.control("NAME").pause()`` holds the deployment's batch rows (they wait, they do not
fail) until ``resume()``; ``reset_prefix_cache``, ``sleep``/``wake_up``, ``tokenize`` and
``detokenize`` reach the engines. Each call is first checked on every running replica: a call
the backend or its device cannot do is refused (:class:`~relayllm.errors.ControlRefusedError`,
naming backend and call) before anything changes anywhere.

Shared state (paused or not) is written to the deployment's state actor first
(:mod:`relayllm.serving.control_state`), then every running replica is told to apply it and the call
returns once each has: a replica that starts later reads the same state when it starts.
Serve's handle reaches one replica of its choosing, so the replicas are called one by one
through :func:`relayllm.compat.call_replica`.

A :class:`Controller` needs only Ray and the deployment's Serve names, so it runs in a driver
(:func:`relayllm.control`, which finds those names) and in a replica (the HTTP front's control
routes) alike.
"""

from __future__ import annotations

import time
from typing import Any

from relayllm.errors import (
    ConfigError,
    ControlCallError,
    ControlRefusedError,
    DeploymentNotFoundError,
    RelayLLMError,
    describe_exception,
)
from relayllm.serving.control_state import PAUSE_MODES, PauseMode, state_actor

#: How long a control call waits for every replica to answer (a ``wait`` pause waits for the
#: rows already in the engines).
DEFAULT_TIMEOUT_S = 600.0
#: How long the steps around a weight update's prepare may take (write its outcome, have every
#: replica apply it), and how much later than the call the state actor aborts it by itself.
_ACTOR_GRACE_S = 60.0


def abort_reason(states: dict[str, dict[str, Any]]) -> str | None:
    """Why a weight update whose prepare step ended in ``states`` (replica id -> its answer)
    must abort, None when it commits: every replica prepared and their digests agree."""
    failed = {rid: s for rid, s in states.items() if s.get("state") != "prepared"}
    if failed:
        return "; ".join(
            f"replica {rid}: {s.get('state')}: {s.get('error', '')}" for rid, s in failed.items()
        )
    digests = {rid: s.get("digest") for rid, s in states.items()}
    if len(set(digests.values())) > 1:
        said = ", ".join(f"{rid}: {digest}" for rid, digest in digests.items())
        return f"the replicas loaded different weights (digests {said})"
    return None


class Controller:
    """The control plane of one running deployment (:func:`control`)."""

    def __init__(self, name: str, app_name: str, deployment_name: str) -> None:
        """The deployment ``name`` is Serve's deployment ``deployment_name`` of the application
        ``app_name``: :func:`relayllm.control` finds them by name (its error lists the running
        deployments); a replica's control routes know their own."""
        self.name = name
        self.app_name = app_name
        self.deployment_name = deployment_name

    # -- shared state: written once, applied by every replica ----------------------------------

    def pause(self, mode: PauseMode = "wait", *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Hold every replica's batch rows until :meth:`resume`: new rows wait in the replica,
        rows in the engine finish first (``wait``, returns once they have) or stay frozen there
        (``keep``). Interactive HTTP requests get 503 with Retry-After meanwhile."""
        if mode not in PAUSE_MODES:
            raise ConfigError(f"pause mode {mode!r}: use one of {', '.join(PAUSE_MODES)}")
        self._change("pause", {"paused": mode}, timeout_s)

    def resume(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Let every replica's rows into its engine again."""
        self._change("resume", {"paused": None}, timeout_s)

    def is_paused(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
        """Whether every running replica is paused (the engine's own answer where the backend
        has one)."""
        return all(self._each("is_paused", timeout_s=timeout_s).values())

    # -- runtime LoRA adapters: loaded on every replica, then kept for the ones to come -------

    def load_adapter(self, name: str, path: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Load the LoRA adapter at ``path`` (a directory every replica's node can read) as
        ``name`` on every replica; rows whose ``model`` is ``name`` then get its answers. A
        replica that starts later loads it too."""
        import ray

        self._each("load_adapter", name, path, timeout_s=timeout_s)  # fails before recording
        actor = state_actor(self.name, create=True)
        ray.get(actor.set_adapter.remote(name, path), timeout=timeout_s)

    def unload_adapter(self, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        import ray

        actor = state_actor(self.name, create=True)
        self._check("unload_adapter", self._replicas(), timeout_s)
        ray.get(actor.set_adapter.remote(name, None), timeout=timeout_s)
        self._each("unload_adapter", name, timeout_s=timeout_s)

    def adapters(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, str]:
        """The runtime adapters, name -> path (those every running replica has loaded)."""
        answers = list(self._each("adapters", timeout_s=timeout_s).values())
        return {k: v for k, v in answers[0].items() if all(a.get(k) == v for a in answers)}

    # -- weight updates: a transaction over every replica ------------------------------------

    def update_weights(
        self, source: str, *, version: str | int, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> dict[str, Any]:
        """Load the checkpoint ``source`` into every replica's engine and name it ``version``
        (a string; an int is written as its decimal string): every row answered from then on
        carries it in its ``weight_version`` column (and every HTTP or batch-file answer in
        its body). ``source``: a directory each replica's node can read, or a filesystem URI
        (``s3://...``: copied to a local temporary directory by each replica first).

        A transaction, so that no row is served by a fleet of mixed weights: the update is
        begun in the deployment's control state (every replica holds its rows: they wait,
        HTTP requests get 503), each replica prepares (the rows in its engine finish on the
        old weights, it loads the new ones and reports their digest), then the outcome is
        written once and every replica applies it -- committed if every replica loaded and
        their digests agree, aborted otherwise: a replica that failed its load retires (Serve
        replaces it, on the committed weights), the others reload the committed checkpoint
        (or retire, when the committed weights are the deployment's own). A replica that
        starts meanwhile holds its rows and adopts the outcome. Past ``timeout_s`` the update
        aborts (also if this process is gone: the state actor keeps the deadline).

        Returns ``{"version": the committed version, "replicas": {replica id: its state}}``;
        an aborted update raises :class:`~relayllm.errors.WeightUpdateAbortedError`, which
        carries the same."""
        import uuid

        import ray

        from relayllm.errors import WeightUpdateAbortedError

        if isinstance(version, bool) or not isinstance(version, (str, int)) or version == "":
            raise ConfigError(f"version {version!r}: give a non-empty string or an int")
        version = str(version)
        replicas = self._replicas()
        if not replicas:
            raise DeploymentNotFoundError(
                f"deployment {self.name!r} has no running replica to update yet"
            )
        self._check("update_weights", replicas, timeout_s)
        actor = state_actor(self.name, create=True)
        update = {"txn": uuid.uuid4().hex, "source": source, "version": version}
        deadline = time.monotonic() + timeout_s
        # The actor's own deadline is a little later than this call's: this call decides
        # first when it can, the actor only when this process is gone.
        try:
            begun = ray.get(
                actor.begin_weights.remote(update, timeout_s + _ACTOR_GRACE_S), timeout=timeout_s
            )
        except ray.exceptions.RayTaskError as exc:  # another update is under way
            why = describe_exception(exc.cause) if exc.cause is not None else str(exc)
            raise ControlCallError("update_weights", "(none yet)", why, self.name) from None
        states = self._prepare(replicas, begun, update, deadline)
        reason = abort_reason(states)
        written, committed = ray.get(
            actor.finish_weights.remote(update["txn"], reason is None), timeout=_ACTOR_GRACE_S
        )
        # Every replica running now applies the outcome, those started meanwhile included;
        # not waited for: one still loading (timed out), which holds its rows until it has.
        late = {rid for rid, answer in states.items() if answer["state"] == "timed out"}
        running = [r for r in self._replicas() if r[0] not in late]
        self._fan(running, "control_sync", (written,), _ACTOR_GRACE_S + timeout_s)
        _, state = ray.get(actor.get.remote(), timeout=_ACTOR_GRACE_S)
        now = (state.get("weights") or {}).get("version")
        settled = self._settled(states, committed)
        if committed:
            return {"version": now, "replicas": settled}
        if reason is None:  # every replica prepared, but the state actor's deadline passed
            reason = f"it was not decided within {timeout_s:g}s"
        raise WeightUpdateAbortedError(version, now, settled, reason, self.name)

    def _prepare(
        self,
        replicas: list[tuple[str, str]],
        begun: int,
        update: dict[str, str],
        deadline: float,
    ) -> dict[str, dict[str, Any]]:
        """Every replica's answer to the prepare step, by replica id: a replica that does not
        answer by ``deadline`` counts as ``timed out``, one that died as ``gone`` -- either
        aborts the update."""
        import ray

        from relayllm import compat

        refs = {
            rid: compat.call_replica(actor, self.app_name, "weights_prepare", begun, update)
            for rid, actor in replicas
        }
        states: dict[str, dict[str, Any]] = {}
        for rid, ref in refs.items():
            if ref is None:
                states[rid] = {"state": "gone", "error": "the replica is gone"}
                continue
            try:
                left = max(0.0, deadline - time.monotonic())
                states[rid] = dict(ray.get(ref, timeout=left))
            except ray.exceptions.GetTimeoutError:
                states[rid] = {"state": "timed out", "error": "no answer in time"}
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError) as exc:
                states[rid] = {"state": "gone", "error": describe_exception(exc)}
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if exc.cause is not None else exc
                states[rid] = {"state": "failed", "error": describe_exception(cause)}
        return states

    def _settled(
        self, states: dict[str, dict[str, Any]], committed: bool
    ) -> dict[str, dict[str, Any]]:
        """Each replica's state once the outcome is applied: ``committed`` (serves the new
        version), ``rolled back`` (reloaded the committed one), ``kept`` (never loaded the
        new one: its checkpoint could not be fetched there), ``retired`` (being replaced, on
        the committed weights), or what kept it from preparing (``refused``, ``timed out``,
        ``gone``)."""
        settled: dict[str, dict[str, Any]] = {}
        for rid, answer in states.items():
            state = answer["state"]
            if state == "prepared":
                state = "committed" if committed else "rolled back"
            elif state == "failed" and "replica_id" in answer:
                state = "kept"
            settled[rid] = {**answer, "state": state}
        try:
            now = self._fan(self._replicas(), "info", (), _ACTOR_GRACE_S)
        except RelayLLMError:
            now = {}
        for rid, info in now.items():
            entry = settled.setdefault(rid, {"state": "started during the update"})
            entry["weight_version"] = info.get("weight_version")
        for rid, entry in settled.items():
            if rid not in now and entry["state"] in ("committed", "rolled back"):
                entry["state"] = "retired"  # it could not reload the committed weights
        return settled

    def weight_version(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str | None:
        """The version of the weights every running replica serves (None: never updated).
        Raises if the replicas disagree (an update under way, or one that failed part-way)."""
        versions = set(self._each("weight_version", timeout_s=timeout_s).values())
        if len(versions) > 1:
            raise RuntimeError(
                f"the replicas of {self.name!r} serve different weight versions: "
                f"{sorted(map(str, versions))}"
            )
        return versions.pop()

    def replicas(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, dict[str, Any]]:
        """Every running replica's ``info()``, by replica id. Asked of each replica directly:
        a handle's ``info()`` waits in Serve's queue behind the batch calls a pause holds."""
        return self._fan(self._replicas(), "info", (), timeout_s)

    # -- engine calls, on every replica --------------------------------------------------------

    def reset_prefix_cache(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._each("reset_prefix_cache", timeout_s=timeout_s)

    def sleep(self, level: int = 1, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        """Release the engines' memory (level 1: KV cache, weights kept in host memory;
        level 2: both dropped), where the engine and device can."""
        self._each("sleep", level, timeout_s=timeout_s)

    def wake_up(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._each("wake_up", timeout_s=timeout_s)

    def tokenize(self, text: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[int]:
        """The token ids of ``text`` in the deployment's model (one replica answers: they all
        serve the same model)."""
        answers = self._each("tokenize", text, timeout_s=timeout_s, one=True)
        return list(next(iter(answers.values())))

    def detokenize(self, ids: list[int], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
        answers = self._each("detokenize", list(ids), timeout_s=timeout_s, one=True)
        return str(next(iter(answers.values())))

    # -- internals -----------------------------------------------------------------------------

    def _replicas(self) -> list[tuple[str, str]]:
        from relayllm import compat

        return compat.running_replicas(self.app_name, self.deployment_name)

    def _check(self, call: str, replicas: list[tuple[str, str]], timeout_s: float) -> None:
        """Refuse ``call`` if any replica cannot do it, before anything changes."""
        for answer in self._fan(replicas, "control_refusals", (), timeout_s).values():
            reason = answer["refused"].get(call)
            if reason is not None:
                raise ControlRefusedError(answer["backend"], call, reason, self.name)

    def _change(self, call: str, changes: dict[str, Any], timeout_s: float) -> None:
        import ray

        replicas = self._replicas()
        self._check(call, replicas, timeout_s)
        actor = state_actor(self.name, create=True)
        version = ray.get(actor.update.remote(changes), timeout=timeout_s)
        # Replicas that started since the list above read the new state when they start.
        self._fan(self._replicas(), "control_sync", (version,), timeout_s)

    def _each(self, call: str, *args: Any, timeout_s: float, one: bool = False) -> dict[str, Any]:
        replicas = self._replicas()
        if not replicas:
            raise DeploymentNotFoundError(
                f"deployment {self.name!r} has no running replica to answer {call!r} yet"
            )
        self._check(call, replicas, timeout_s)
        return self._fan(replicas[:1] if one else replicas, "control", (call, *args), timeout_s)

    def _fan(
        self, replicas: list[tuple[str, str]], method: str, args: tuple[Any, ...], timeout_s: float
    ) -> dict[str, Any]:
        import ray

        from relayllm import compat

        refs = {
            rid: compat.call_replica(actor, self.app_name, method, *args) for rid, actor in replicas
        }
        answers: dict[str, Any] = {}
        for rid, ref in refs.items():
            if ref is None:
                continue
            try:
                answers[rid] = ray.get(ref, timeout=timeout_s)
            except (ray.exceptions.ActorDiedError, ray.exceptions.ActorUnavailableError):
                # A replica on its way out: its replacement reads the state when it starts.
                continue
            except ray.exceptions.RayTaskError as exc:  # the replica's own error, said plainly
                cause = exc.cause
                if isinstance(cause, RelayLLMError):
                    raise cause from None
                call = str(args[0]) if method == "control" and args else method
                reason = describe_exception(cause) if cause is not None else str(exc)
                raise ControlCallError(call, rid, reason, self.name) from None
        return answers


__all__ = ["DEFAULT_TIMEOUT_S", "Controller", "abort_reason"]
