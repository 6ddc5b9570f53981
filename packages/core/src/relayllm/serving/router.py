"""The Serve request router of ``routing: affinity`` (Ray Serve's ``RequestRouter`` API).

Serve builds one router per deployment handle: in each stage worker, in each HTTP proxy, in
the driver. A call's key travels in Serve's own request metadata, ``session_id``: the stage
sets it per call (``handle.options(session_id=...)``), Serve's HTTP proxy sets it from the
``X-Session-ID`` header, and the batch gateway from a body's ``prompt_cache_key``. The policy
itself is :func:`relayllm.routing.choose` (rendezvous hashing with bounded load); a router
counts the rows it has in flight on each replica (its own calls: each handle balances what
it sends). A call without a key goes to the less busy of two random replicas, as Serve's
default router sends it.

Replicas are named by their unique id, the same in every process, so every router (and the
stage, which splits a batch by :meth:`AffinityRouter.preferred_replica`) ranks them alike.
Imported only where Serve builds the router (it imports Ray Serve).
"""

from __future__ import annotations

import random
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from relayllm import routing


def _rows(pending: PendingRequest | None) -> int:
    """A call's weight: its rows (a stage call's first argument is its list of rows)."""
    if pending is not None and pending.args and isinstance(pending.args[0], list):
        return max(len(pending.args[0]), 1)
    return 1


class AffinityRouter(RequestRouter):
    """Each keyed call to its key's replica by rendezvous hashing, within a load bound."""

    def initialize_state(self, bound: float = routing.LOAD_BOUND, **_: Any) -> None:
        self._bound = float(bound)
        self._in_flight: dict[str, int] = {}  # rows this router has on each replica
        self._calls: dict[str, tuple[str, int]] = {}  # internal id -> (replica, rows)

    def preferred_replica(self, key: str) -> str | None:
        """The unique id of the replica ``key`` prefers (None: no replica known yet)."""
        return routing.preferred(key, [r.unique_id for r in self.curr_replicas])

    def in_flight(self) -> dict[str, int]:
        """Rows this router has in flight, by replica (unique id)."""
        return dict(self._in_flight)

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        key = pending_request.metadata.session_id if pending_request is not None else ""
        if not key:
            return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]
        if pending_request is not None:  # back off between rounds, not spin
            pending_request.routing_context.should_backoff = True
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        rows = _rows(pending_request)
        order = routing.choose(key, list(by_id), self._in_flight, self._bound, rows)
        return [[by_id[unique_id]] for unique_id in order]

    def _fulfill_next_pending_request(self, replica: RunningReplica, request_metadata: Any = None):
        pending = self._get_pending_request_matching_internal_request_id(request_metadata)
        super()._fulfill_next_pending_request(replica, request_metadata)
        if pending is not None and pending.future.done() and request_metadata is not None:
            unique_id, rows = replica.replica_id.unique_id, _rows(pending)
            self._calls[request_metadata.internal_request_id] = (unique_id, rows)
            self._in_flight[unique_id] = self._in_flight.get(unique_id, 0) + rows

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        placed = self._calls.pop(internal_request_id, None)
        if placed is not None:
            unique_id, rows = placed
            left = self._in_flight.get(unique_id, 0) - rows
            if left > 0:
                self._in_flight[unique_id] = left
            else:
                self._in_flight.pop(unique_id, None)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        for gone in set(self._in_flight) - live:  # a dead replica's load is no one's
            del self._in_flight[gone]


__all__ = ["AffinityRouter"]
