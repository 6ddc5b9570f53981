"""The engines' own prefix-cache figures over one run: prompt tokens looked up, found in the
prefix cache and prefilled, read from every replica of each deployment before and after
(``relayllm.control(name).replicas()``), for the run summaries of ``relayllm run`` and
``relayllm batch``.

An engine counts per step of its own, not per row, so the figures are per deployment: steps
that share a deployment share its figure (the summary names them). A backend that reports no
prefix cache gives none; a replica replaced during the run counts from its start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger(__name__)

#: (prompt tokens looked up, found cached, prefilled) of each replica, by deployment.
Snapshot = dict[str, dict[str, tuple[int, int, int]]]


def snapshot(names: Iterable[str]) -> Snapshot:
    """Every replica's counters now (a deployment that cannot be read is left out)."""
    from relayllm.deployments import control

    found: Snapshot = {}
    for name in dict.fromkeys(names):
        try:
            infos = control(name).replicas(timeout_s=30)
        except Exception:  # figures are an aid: a run summary never fails for them
            logger.debug("no engine figures from %s", name, exc_info=True)
            continue
        found[name] = {}
        for replica, info in infos.items():
            metrics = info.get("metrics") or {}
            queries = metrics.get("prefix_cache_queries") or 0
            steps = metrics.get("engine_step_tokens") or {}
            found[name][replica] = (
                queries,
                metrics.get("prefix_cache_hits") or 0,
                steps.get("prefilled") or 0,
            )
    return found


def delta(before: Snapshot, after: Snapshot) -> dict[str, dict[str, Any]]:
    """Each deployment's figures between two snapshots (none where its engine reports no
    prefix cache)."""
    figures: dict[str, dict[str, Any]] = {}
    for name, replicas in after.items():
        start = before.get(name, {})
        queries = hits = prefilled = 0
        for replica, (q, h, p) in replicas.items():
            q0, h0, p0 = start.get(replica, (0, 0, 0))
            queries, hits, prefilled = queries + q - q0, hits + h - h0, prefilled + p - p0
        if queries > 0:
            figures[name] = {
                "replicas": len(replicas),
                "prompt_tokens": queries,
                "cached_tokens": hits,
                "prefilled_tokens": prefilled,
                "prefix_cache_hit_rate": hits / queries,
            }
    return figures


def summary_lines(figures: dict[str, dict[str, Any]], steps: dict[str, list[str]]) -> str:
    """The run summary's lines: one per deployment, naming the steps it served."""
    lines = []
    for name, f in figures.items():
        served = f" (steps {', '.join(steps[name])})" if steps.get(name) else ""
        lines.append(
            f"{name}{served}: prefix-cache hit rate {f['prefix_cache_hit_rate'] * 100:.0f}%, "
            f"{f['prefilled_tokens']:,} of {f['prompt_tokens']:,} prompt tokens prefilled, "
            f"{f['replicas']} replica(s)"
        )
    return "\n".join(lines)


__all__ = ["Snapshot", "delta", "snapshot", "summary_lines"]
