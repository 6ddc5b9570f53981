"""Stopping a batch's lines wherever its stage workers run: a local flag file, a deadline,
or a signal in Ray's key-value store, so the batch service's cancel or expiry reaches the
stage workers on every node (the runner raises it; the stage workers of
:mod:`relayllm.batch.ray_job` ask before each line is sent)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

#: Ray's key-value store namespace (in the GCS: seen from every node) of the stop signals.
STOP_NAMESPACE = "relayllm-stop"
#: How often a stage worker asks the cluster for a stop signal (a GCS call): at most once
#: this often per key and process, where the local flag file is a stat per line.
CLUSTER_CHECK_S = 0.5
_cluster_checks: dict[str, tuple[float, bool]] = {}  # key -> (when asked, the answer)


@dataclass(frozen=True)
class StopCheck:
    """When a run's lines stop being sent: once the file ``flag`` exists, the signal ``key``
    is raised (:func:`raise_stop`) or the clock passes ``deadline`` (the batch service's
    cancel and completion window). Asked by the stage workers for each line of a block (each
    pair of a scoring line) before its calls go out, so a stop takes effect within the calls
    in flight, not at the end of a block. The flag is a local file, seen at once on the node
    that writes it (the runner's, the head node); the key is in the cluster's key-value
    store, seen by stage workers on every node within :data:`CLUSTER_CHECK_S`."""

    flag: str | None = None
    deadline: float | None = None
    key: str | None = None

    def __call__(self) -> bool:
        if self.deadline is not None and time.time() >= self.deadline:
            return True
        if self.flag is not None and os.path.exists(self.flag):
            return True
        return self.key is not None and _stop_raised(self.key)


def _stop_raised(key: str) -> bool:
    now = time.monotonic()
    asked = _cluster_checks.get(key)
    if asked is not None and (asked[1] or now - asked[0] < CLUSTER_CHECK_S):
        return asked[1]
    from ray.experimental import internal_kv

    raised = internal_kv._internal_kv_initialized() and bool(
        internal_kv._internal_kv_exists(key, namespace=STOP_NAMESPACE)
    )
    _cluster_checks[key] = (now, raised)
    return raised


def raise_stop(key: str) -> None:
    """Raise the stop signal ``key`` for every :class:`StopCheck` that carries it, on any
    node of the cluster (needs a connection to Ray)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, b"1", namespace=STOP_NAMESPACE)


def clear_stop(key: str) -> None:
    """Forget the signal ``key`` (its run has ended)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=STOP_NAMESPACE)


__all__ = ["CLUSTER_CHECK_S", "STOP_NAMESPACE", "StopCheck", "clear_stop", "raise_stop"]
