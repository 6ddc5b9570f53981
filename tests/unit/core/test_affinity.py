"""A stage's affinity keys and its calls split by replica (relayllm.stage.affinity), and echo's
simulated prefix cache (relayllm.testing.echo_cache): without Ray."""

from __future__ import annotations

from relayllm import routing
from relayllm.config import ProcessorConfig
from relayllm.rows import build_request
from relayllm.stage.affinity import keyed_calls, row_key
from relayllm.testing.echo_cache import PrefixCache

REPLICAS = ["a", "b", "c"]


class Router:
    """What the stage asks of the affinity router: the replica a key prefers."""

    curr_replicas = REPLICAS

    def preferred_replica(self, key: str) -> str | None:
        return routing.preferred(key, REPLICAS)


def _request(i: int, **params) -> dict:
    request = build_request(
        "chat", [{"role": "user", "content": f"row {i}"}], {}, params or None, None, f"r{i}", {}
    )
    assert isinstance(request, dict)
    return request


def test_a_rows_key_is_its_prompt_cache_key_then_its_lineage_then_its_prefix():
    keyed = _request(1, prompt_cache_key="session-7")
    assert "prompt_cache_key" not in keyed["sampling_params"]  # the engine never sees it
    assert row_key(keyed, "lineage", by_prefix=False) == "key:session-7"
    plain = _request(1)
    assert row_key(plain, "id-1", by_prefix=False) == "row:id-1"
    assert row_key(plain, None, by_prefix=False).startswith("prefix:")
    assert row_key(plain, "id-1", by_prefix=True) == row_key(_request(1), None, False)


def test_a_batch_splits_by_the_replica_each_row_prefers():
    config = ProcessorConfig(deployment="d", batch_size=4)
    pending = [(i, _request(i)) for i in range(40)]
    lineage = [f"id-{i}" for i in range(40)]
    calls = keyed_calls(pending, lineage, config, Router())
    assert sorted(i for _, call in calls for i, _ in call) == list(range(40))
    placed = {}
    for key, call in calls:
        assert len(call) <= 4
        replica = routing.preferred(key, REPLICAS)  # where the router sends the call
        for i, _ in call:
            assert routing.preferred(f"row:id-{i}", REPLICAS) == replica
            placed[i] = replica
    assert len(set(placed.values())) == 3
    # A row's replica depends on its own key, not on its neighbours: without row 0 (a row
    # that failed an earlier step) every other row goes where it went.
    again = keyed_calls(pending[1:], lineage, config, Router())
    for key, call in again:
        for i, _ in call:
            assert routing.preferred(key, REPLICAS) == placed[i]


def test_without_an_affinity_router_calls_are_consecutive_rows():
    config = ProcessorConfig(deployment="d", batch_size=4)
    pending = [(i, _request(i)) for i in range(10)]
    calls = keyed_calls(pending, None, config, router=None)
    assert [[i for i, _ in call] for _, call in calls] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_the_simulated_cache_hits_whole_leading_blocks_only():
    cache = PrefixCache(blocks=100, block_words=4)
    doc = [f"w{i}" for i in range(10)]  # two whole blocks and two words
    assert cache.lookup(doc) == 0
    assert cache.lookup(doc) == 8
    assert cache.lookup([*doc, "more", "words"]) == 8  # the new third block missed...
    assert cache.lookup([*doc, "more", "words"]) == 12  # ...and is cached now
    assert cache.lookup(["other", *doc]) == 0  # a block hits only after a cached prefix


def test_the_simulated_cache_forgets_the_least_recently_used_blocks():
    cache = PrefixCache(blocks=2, block_words=2)
    first, second = ["a", "b"], ["c", "d"]
    cache.lookup(first)
    cache.lookup(second)
    cache.lookup(first)  # used again: second is now the oldest
    cache.lookup(["e", "f"])
    assert cache.lookup(first) == 2 and cache.lookup(second) == 0


def test_under_serves_default_router_calls_carry_no_key():
    config = ProcessorConfig(deployment="d", batch_size=4)
    pending = [(i, _request(i)) for i in range(6)]
    calls = keyed_calls(pending, None, config, router=object())  # a router with no preference
    assert [(key, [i for i, _ in call]) for key, call in calls] == [
        (None, [0, 1, 2, 3]),
        (None, [4, 5]),
    ]
