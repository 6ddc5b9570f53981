"""The affinity policy alone (relayllm.routing, no Ray): a key keeps its replica, a hot key
spills within the load bound, and a replica added or removed moves only its share of keys."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from relayllm import routing
from relayllm.deployments import DeploymentConfig

REPLICAS = [f"replica-{i}" for i in range(8)]
#: The bound and the prefix docs/routing.md states ("within 1.25x the mean", "the row's
#: first 512 characters"), not the module's constants: a changed one fails here.
LOAD_BOUND, PREFIX_CHARS = 1.25, 512
KEYS = [f"row-{i}" for i in range(4000)]


def test_a_key_prefers_the_same_replica_every_time_and_in_any_listing_order():
    first = {key: routing.preferred(key, REPLICAS) for key in KEYS}
    shuffled = list(reversed(REPLICAS))
    assert {key: routing.preferred(key, shuffled) for key in KEYS} == first
    assert routing.choose("row-1", REPLICAS, {})[0] == first["row-1"]
    assert routing.ranked("row-1", REPLICAS)[0] == first["row-1"]


def test_keys_spread_over_the_replicas():
    counts = Counter(routing.preferred(key, REPLICAS) for key in KEYS)
    mean = len(KEYS) / len(REPLICAS)
    assert set(counts) == set(REPLICAS)
    assert max(counts.values()) < 1.15 * mean and min(counts.values()) > 0.85 * mean


def test_adding_a_replica_moves_only_the_keys_it_takes():
    before = {key: routing.preferred(key, REPLICAS) for key in KEYS}
    after = {key: routing.preferred(key, [*REPLICAS, "replica-new"]) for key in KEYS}
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == "replica-new" for key in moved)
    assert 0.5 / 9 < len(moved) / len(KEYS) < 1.5 / 9  # about its share, 1/9


def test_removing_a_replica_moves_only_its_own_keys():
    before = {key: routing.preferred(key, REPLICAS) for key in KEYS}
    left = [r for r in REPLICAS if r != "replica-3"]
    after = {key: routing.preferred(key, left) for key in KEYS}
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "replica-3"}
    # ...each to its own second choice, so they spread over the others
    assert len(Counter(after[key] for key in moved)) == len(left)


def _place(calls: list[str], replicas: list[str], concurrency: int) -> Counter[str]:
    """Route ``calls`` (their keys, one row each) with ``concurrency`` in flight: the oldest
    finishes before the next is placed once the window is full."""
    in_flight: Counter[str] = Counter()
    window: list[str] = []
    placed: Counter[str] = Counter()
    for key in calls:
        if len(window) == concurrency:
            in_flight[window.pop(0)] -= 1
        target = routing.choose(key, replicas, in_flight)[0]
        in_flight[target] += 1
        window.append(target)
        placed[target] += 1
        limit = routing.capacity(sum(in_flight.values()) - 1, len(replicas))
        assert in_flight[target] <= limit  # never over the bound when it is placed
    return placed


def test_a_hot_key_spills_and_no_replica_passes_the_bound():
    # A quarter of the calls share one key (one session, one prompt prefix); the rest differ.
    calls = [("hot" if i % 4 == 0 else f"row-{i}") for i in range(4000)]
    placed = _place(calls, REPLICAS, concurrency=64)
    mean = len(calls) / len(REPLICAS)
    assert max(placed.values()) <= LOAD_BOUND * mean * 1.02
    # The hot key's calls went to its own replicas in its order, not everywhere.
    hot = Counter(routing.choose("hot", REPLICAS, {})[0] for _ in range(3))
    assert len(hot) == 1


def test_the_bound_and_the_prefix_are_the_documented_ones():
    page = " ".join(
        (Path(__file__).resolve().parents[3] / "docs" / "routing.md").read_text().split()
    )
    assert "within **1.25x the mean**" in page and "the row's first 512 characters" in page
    # 99 rows in flight and the new one over 4 replicas: a mean of 25, 1.25x that is 31.25.
    assert routing.capacity(99, 4) == 32
    assert routing.capacity(0, 4) == 2  # room for two calls of the new one's size, always


def test_without_the_bound_the_hot_key_overloads_its_replica():
    """The broken variant the bound exists for: plain consistent hashing."""
    calls = [("hot" if i % 4 == 0 else f"row-{i}") for i in range(4000)]
    placed = Counter(routing.preferred(key, REPLICAS) for key in calls)
    assert max(placed.values()) > 2 * len(calls) / len(REPLICAS)


def test_a_spilled_key_walks_its_own_ranking():
    order = routing.ranked("hot", REPLICAS)
    full = {order[0]: 10}  # its first choice holds all the load
    assert routing.choose("hot", REPLICAS, full)[0] == order[1]
    assert routing.choose("hot", REPLICAS, {order[0]: 10, order[1]: 10})[0] == order[2]
    assert sorted(routing.choose("hot", REPLICAS, full)) == sorted(REPLICAS)  # all to try


def test_a_trickle_of_calls_keeps_its_replica():
    """One request after another, the last one's completion not yet counted: no spill."""
    first = routing.preferred("session", REPLICAS)
    assert routing.choose("session", REPLICAS, {first: 1})[0] == first
    assert routing.choose("session", REPLICAS, {first: 2})[0] != first  # two: it spills
    # A call of many rows is weighed by its rows.
    assert routing.choose("session", REPLICAS, {first: 8}, weight=8)[0] == first


def test_no_replicas_no_choice():
    assert routing.choose("k", [], {}) == []
    assert routing.preferred("k", []) is None


def test_prefix_keys_are_equal_for_a_shared_prefix():
    shared = "x" * PREFIX_CHARS
    assert routing.prefix_key(shared + "a") == routing.prefix_key(shared + "b")
    assert routing.prefix_key(shared[1:] + "a") != routing.prefix_key(shared[1:] + "b")
    assert routing.prefix_key("a" + shared) != routing.prefix_key("b" + shared)


def test_the_setting_turns_the_router_on_and_off():
    assert routing.routing_options("default", replicas=4) == {}
    options = routing.routing_options("affinity")["request_router_config"]
    assert options["request_router_class"] == routing.ROUTER_CLASS
    config = DeploymentConfig(name="d", backend="echo")
    assert config.routing == routing.DEFAULT_ROUTING == "auto"
    with pytest.raises(Exception, match="routing"):
        DeploymentConfig(name="d", backend="echo", routing="random")


def test_auto_routes_by_affinity_only_where_there_is_more_than_one_replica():
    assert routing.routing_options("auto", replicas=1) == {}
    assert routing.routing_options("auto", replicas=2) == routing.routing_options("affinity")
    assert routing.resolved("auto", 1) == "default" and routing.resolved("auto", 8) == "affinity"
    assert routing.resolved("default", 8) == "default"
