"""Affinity routing across the replicas of one deployment: which replica a key prefers, and
where its call goes when that replica is hot (pure: no Ray, so the policy is tested alone).

A key (a row's lineage, a shared prefix's hash, OpenAI's ``prompt_cache_key``) ranks the
replicas by rendezvous hashing (highest random weight): every replica gets a pseudo-random
weight from ``hash(key, replica)`` and the key prefers the heaviest. Adding a replica takes
only the keys it now outweighs; removing one moves only its own keys, to their second choice.

Bounded load (consistent hashing with bounded loads, Mirrokni, Thorup and Zadimoghaddam): a
replica takes a call only while its in-flight calls stay within ``bound`` times the mean
(counting the new one); past that the key walks down its own ranking to the first replica
with room. A hot key thus spills to its second choice, then its third, the same ones every
time, and each of those warms up for it; Serve's router then applies its own queue limits.

:mod:`relayllm.serving.router` applies this inside Serve's router; the stage uses
:func:`preferred` to split a batch's rows into calls by the replica each prefers.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Hashable, Iterable, Mapping, Sequence
from typing import Literal, TypeVar

from pydantic import Field

#: How calls find a replica: Serve's default router (power of two choices, the less busy of
#: two random replicas), relayllm's affinity router, or ``auto``: affinity for a deployment
#: that may run more than one replica (where it measured better: fewer prompt tokens
#: prefilled, a shorter job), Serve's default for one (where there is nothing to choose).
Routing = Literal["auto", "default", "affinity"]
DEFAULT_ROUTING: Routing = "auto"
#: A replica takes a call while its in-flight calls stay within this times the mean.
LOAD_BOUND = 1.25
#: Characters of a row's prompt text (roles included) that make its prefix key.
PREFIX_CHARS = 512
#: The Serve request router of ``routing: affinity``.
ROUTER_CLASS = "relayllm.serving.router.AffinityRouter"

ROUTING_FIELD = Field(
    default=DEFAULT_ROUTING,
    description="How calls pick a replica: 'affinity' (a call's key -- a row's lineage "
    "across pipeline steps, a shared prefix, prompt_cache_key or X-Session-ID -- keeps "
    "its replica, spilling to the key's next choice when that replica holds more than "
    f"{LOAD_BOUND:g}x the mean load), 'default' (Serve's power of two choices), or 'auto': "
    "affinity when the deployment may run more than one replica (num_replicas, or "
    "autoscaling's max_replicas), else default. docs/routing.md.",
)

R = TypeVar("R", bound=Hashable)


def key_hash(key: str) -> str:
    """A short stable digest of ``key`` (the same in every process, unlike ``hash()``)."""
    return hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def _weight(key: str, replica: Hashable) -> int:
    digest = hashlib.blake2b(f"{key}\x00{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def ranked(key: str, replicas: Iterable[R]) -> list[R]:
    """``replicas`` in ``key``'s order of preference (rendezvous hashing)."""
    return sorted(replicas, key=lambda r: (_weight(key, r), str(r)), reverse=True)


def preferred(key: str, replicas: Iterable[R]) -> R | None:
    """The replica ``key`` prefers when none is hot (None: no replicas)."""
    return max(replicas, key=lambda r: (_weight(key, r), str(r)), default=None)


def capacity(
    total_in_flight: int, replicas: int, bound: float = LOAD_BOUND, weight: int = 1
) -> int:
    """The most in flight one replica may hold once the next call (``weight``: its rows) is
    placed: ``bound`` times the mean, and never less than two such calls, so a trickle of
    calls (one HTTP request after another, the last one's completion not yet counted) keeps
    its replica instead of spilling at the first call in flight."""
    mean = (total_in_flight + weight) / max(replicas, 1)
    return max(2 * weight, math.ceil(bound * mean))


def choose(
    key: str,
    replicas: Sequence[R],
    in_flight: Mapping[R, int],
    bound: float = LOAD_BOUND,
    weight: int = 1,
) -> list[R]:
    """Where a call keyed ``key`` (``weight``: its rows) goes: the replicas in the order to
    try, the first being the key's highest-ranked replica with room under ``bound`` (then the
    rest of its ranking, for Serve to fall back on when that one refuses)."""
    order = ranked(key, replicas)
    if not order:
        return []
    limit = capacity(sum(in_flight.get(r, 0) for r in order), len(order), bound, weight)
    for i, replica in enumerate(order):
        if in_flight.get(replica, 0) + weight <= limit:
            return [replica, *order[:i], *order[i + 1 :]]
    return order  # cannot happen (the mean is under the limit), but never route nowhere


def resolved(routing: Routing, replicas: int) -> Routing:
    """The router a deployment that may run ``replicas`` at once gets: ``auto`` made
    ``affinity`` or ``default``."""
    if routing == "auto":
        return "affinity" if replicas > 1 else "default"
    return routing


def routing_options(
    routing: Routing, bound: float = LOAD_BOUND, *, replicas: int = 1
) -> dict[str, object]:
    """The ``serve.deployment`` options of ``routing`` for a deployment that may run
    ``replicas`` at once (none for Serve's default): the router as an import path, so
    building the options imports nothing."""
    if resolved(routing, replicas) == "default":
        return {}
    return {
        "request_router_config": {
            "request_router_class": ROUTER_CLASS,
            "request_router_kwargs": {"bound": bound},
        }
    }


def prefix_key(text: str, chars: int = PREFIX_CHARS) -> str:
    """The key of rows that share their first ``chars`` characters of prompt text."""
    return "prefix:" + key_hash(text[:chars])


__all__ = [
    "DEFAULT_ROUTING",
    "LOAD_BOUND",
    "PREFIX_CHARS",
    "ROUTER_CLASS",
    "ROUTING_FIELD",
    "Routing",
    "capacity",
    "choose",
    "key_hash",
    "preferred",
    "prefix_key",
    "ranked",
    "resolved",
    "routing_options",
]
