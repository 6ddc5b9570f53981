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

    # -- weight updates: every replica, then kept for the ones to come -------------------------

    def update_weights(
        self, source: str, *, version: str | int, timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> None:
        """Load the checkpoint ``source`` into every replica's engine and name it ``version``
        (a string; an int is written as its decimal string): every row answered from then on
        carries it in its ``weight_version`` column (and every HTTP or batch-file answer in
        its body). ``source``: a directory each replica's node can read, or a filesystem URI
        (``s3://...``: copied to a local temporary directory by each replica first).

        On each replica: new rows wait (they do not fail; HTTP requests get 503 with
        Retry-After), the rows in the engine finish on the old weights with the old version,
        the engine loads the new ones, the waiting rows run on them. Returns once every
        replica has; a replica that starts later loads the same checkpoint. A failed load
        records nothing (replicas that loaded already keep the new weights: update again)."""
        import ray

        if isinstance(version, bool) or not isinstance(version, (str, int)) or version == "":
            raise ConfigError(f"version {version!r}: give a non-empty string or an int")
        version = str(version)
        self._each("update_weights", source, version, timeout_s=timeout_s)  # fails first
        actor = state_actor(self.name, create=True)
        ray.get(
            actor.update.remote({"weights": {"source": source, "version": version}}),
            timeout=timeout_s,
        )

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


__all__ = ["DEFAULT_TIMEOUT_S", "Controller"]
