"""Affinity keys of a stage's rows, and calls split by the replica each row prefers.

A row's key is its lineage where it has one -- the value of ``affinity_column`` (a pipeline
sets its own hidden lineage column there), else of ``id_column`` -- so every step of a row
prefers the replica that served its earlier steps, whose prefix cache holds its
conversation. With ``order_by_prefix``, or with neither column, the key is the hash of the
row's first :data:`~relayllm.routing.PREFIX_CHARS` characters of prompt text (roles
included): rows sharing a system prompt or a few-shot block prefer one replica, which
computes that prefix once. A row's ``prompt_cache_key`` (OpenAI's field, a batch line's)
comes first.

A call carries one key (Serve's ``session_id``), and a batch's rows prefer different
replicas. The stage splits a batch by the replica each row prefers
(:meth:`relayllm.serving.router.AffinityRouter.preferred_replica`, the router's own view of
the replicas), then into calls of ``batch_size`` rows, each keyed by its first row: a row's
replica depends on its own key, never on which rows share its batch, so step 2 finds a row
where step 1 left it even when a failed row shifts the calls. (Keying a call by its block
instead sends a whole batch to one replica: docs/architecture.md has the measurement.) Under
``routing: default`` the router has no preference and the calls are what they always were.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from relayllm import compat, routing
from relayllm.rows import Request, request_text
from relayllm.stage.calls import split_into_calls

if TYPE_CHECKING:
    from relayllm.config import ProcessorConfig

#: The field of a row's ``sampling_params`` that names its key (OpenAI's; build_request moves
#: it onto the request).
PROMPT_CACHE_KEY = "prompt_cache_key"
#: How long a stage's first batch waits for its router to learn the replicas.
ROUTER_WAIT_S = 5.0


def row_key(request: Request, lineage: Any, by_prefix: bool) -> str:
    """The affinity key of one row (see the module's docstring for the order)."""
    given = request.get(PROMPT_CACHE_KEY)
    if given:
        return f"key:{given}"
    if lineage is not None and not by_prefix:
        return f"row:{lineage}"
    return routing.prefix_key(request_text(request, roles=True))


def lineage(config: ProcessorConfig, rows: list[dict[str, Any]] | None, batch: Any) -> Any:
    """Each row's lineage value (None: the config names no lineage column): ``rows`` are the
    preprocessed rows where there are any, else the batch (an Arrow table) has the column."""
    column = config.affinity_column or config.id_column
    if not column:
        return None
    if rows is not None:
        return [row.get(column) for row in rows]
    if column not in batch.column_names:
        return None
    return batch.column(column).to_pylist()


def keyed_calls(
    pending: Sequence[tuple[int, Request]],
    lineage: Sequence[Any] | None,
    config: ProcessorConfig,
    router: Any,
) -> list[tuple[str | None, list[tuple[int, Request]]]]:
    """``pending`` (row index, request) as calls, each with the key it is routed by (None
    under Serve's default router, which routes by no key). ``lineage``: each row's lineage
    value by row index (None: no lineage column)."""
    prefers = getattr(router, "preferred_replica", None)
    if prefers is None and router is not None:  # routing: default: no key, no split
        plain = split_into_calls(pending, config.batch_size, config.token_budget)
        return [(None, call) for call in plain]
    by_prefix = config.order_by_prefix
    keys = {i: row_key(r, lineage[i] if lineage else None, by_prefix) for i, r in pending}
    groups: dict[str | None, list[tuple[int, Request]]] = {}
    for item in pending:
        replica = prefers(keys[item[0]]) if prefers is not None else None
        groups.setdefault(replica, []).append(item)
    calls: list[tuple[str | None, list[tuple[int, Request]]]] = []
    for rows in groups.values():
        for call in split_into_calls(rows, config.batch_size, config.token_budget):
            calls.append((keys[call[0][0]], call))
    return calls


async def ready_router(handle: Any, timeout_s: float = ROUTER_WAIT_S) -> Any:
    """``handle``'s request router once it knows the replicas (an affinity router) or its
    class (any other); None if neither within ``timeout_s``: the first batch of a stage then
    goes out as calls of consecutive rows, routed by their keys all the same."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        router = compat.request_router(handle)
        if router is not None and (
            not hasattr(router, "preferred_replica") or router.curr_replicas
        ):
            return router
        if asyncio.get_running_loop().time() > deadline:
            return router
        await asyncio.sleep(0.02)


__all__ = [
    "PROMPT_CACHE_KEY",
    "ROUTER_WAIT_S",
    "keyed_calls",
    "lineage",
    "ready_router",
    "row_key",
]
