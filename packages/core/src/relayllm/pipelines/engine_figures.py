"""The engines' own figures over one run, read from every replica of each deployment before
and after (``relayllm.control(name).replicas()``), for the run summaries of ``relayllm run``
and ``relayllm batch``: engine time (the seconds each replica's engine had work, summed over
the replicas), and the prefix cache's prompt tokens looked up, found cached and prefilled.

An engine counts per step of its own, not per row, so the figures are per deployment: steps
that share a deployment share its figure (the summary names them). A backend that reports no
prefix cache gives no prefix figures; a replica replaced during the run counts from its start.

A cost is estimated only when told what an engine hour costs (``RELAYLLM_ENGINE_HOUR_COST``:
one price, or one per deployment); there is no default price.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from relayllm import env

logger = logging.getLogger(__name__)

#: What an engine hour costs: ``PRICE`` for every deployment, or ``NAME=PRICE,...``.

#: (prompt tokens looked up, found cached, prefilled, engine busy seconds) of each replica,
#: by deployment.
Snapshot = dict[str, dict[str, tuple[int, int, int, float]]]


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
                float(metrics.get("engine_busy_s") or 0.0),
            )
    return found


def hour_costs(environ: Mapping[str, str] | None = None) -> dict[str, float]:
    """The prices of ``RELAYLLM_ENGINE_HOUR_COST`` by deployment (``"*"``: every deployment
    not named); empty when it is not set. A malformed value is a ConfigError naming the variable."""
    from relayllm.errors import ConfigError

    text = env.ENGINE_HOUR_COST.get(environ) or ""
    prices: dict[str, float] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        name, _, price = entry.rpartition("=")
        try:
            value = float(price)
        except ValueError:
            value = -1.0
        if value < 0:
            raise ConfigError(
                f"{env.ENGINE_HOUR_COST.name}: {entry!r} is not a price; give PRICE (e.g. 2.5) "
                f"for every deployment or NAME=PRICE,... per deployment"
            )
        prices[name.strip() or "*"] = value
    return prices


def delta(
    before: Snapshot, after: Snapshot, costs: Mapping[str, float] | None = None
) -> dict[str, dict[str, Any]]:
    """Each deployment's figures between two snapshots; ``costs`` (:func:`hour_costs`):
    an estimate from its engine time where a price applies to it."""
    figures: dict[str, dict[str, Any]] = {}
    for name, replicas in after.items():
        start = before.get(name, {})
        queries = hits = prefilled = 0
        busy = 0.0
        for replica, (q, h, p, b) in replicas.items():
            q0, h0, p0, b0 = start.get(replica, (0, 0, 0, 0.0))
            queries, hits, prefilled = queries + q - q0, hits + h - h0, prefilled + p - p0
            busy += max(b - b0, 0.0)
        found: dict[str, Any] = {"replicas": len(replicas), "engine_s": round(busy, 3)}
        price = (costs or {}).get(name, (costs or {}).get("*"))
        if price is not None:
            found["cost_estimate"] = round(busy / 3600 * price, 6)
        if queries > 0:
            found.update(
                prompt_tokens=queries,
                cached_tokens=hits,
                prefilled_tokens=prefilled,
                prefix_cache_hit_rate=hits / queries,
            )
        if queries > 0 or busy > 0:
            figures[name] = found
    return figures


def summary_lines(figures: dict[str, dict[str, Any]], steps: dict[str, list[str]]) -> str:
    """The run summary's lines: one per deployment, naming the steps it served."""
    lines = []
    for name, f in figures.items():
        served = f" (steps {', '.join(steps[name])})" if steps.get(name) else ""
        parts = []
        if "prompt_tokens" in f:
            parts.append(
                f"prefix-cache hit rate {f['prefix_cache_hit_rate'] * 100:.0f}%, "
                f"{f['prefilled_tokens']:,} of {f['prompt_tokens']:,} prompt tokens prefilled"
            )
        parts.append(f"engine time {f.get('engine_s', 0.0):.1f} s")
        if "cost_estimate" in f:
            parts.append(
                f"estimated cost {f['cost_estimate']:.4f} (from {env.ENGINE_HOUR_COST.name})"
            )
        parts.append(f"{f['replicas']} replica(s)")
        lines.append(f"{name}{served}: " + ", ".join(parts))
    return "\n".join(lines)


__all__ = ["delta", "hour_costs", "snapshot", "summary_lines"]
