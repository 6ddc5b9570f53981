"""A replica's metrics handed to Ray (``ray.util.metrics``: Prometheus text on every node's
metrics export port, prefixed ``ray_``): what :class:`~relayllm.serving.metrics.ReplicaMetrics`
counts is gathered here and handed over at most once per :data:`FLUSH_S` (a Ray metric call
costs about 8 us, and Ray exports every few seconds anyway)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

#: Seconds between two hand-overs of the gathered values to Ray's metrics.
FLUSH_S = 1.0
#: Histogram boundaries (seconds) of the exported latencies.
LATENCY_BUCKETS_S = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]
#: The exported metrics' names (Ray prefixes each with ``ray_``; counters end in ``_total``).
ROWS = "relayllm_rows"
INPUT_TOKENS = "relayllm_input_tokens"
GENERATED_TOKENS = "relayllm_generated_tokens"
TTFT = "relayllm_time_to_first_token_seconds"
TPOT = "relayllm_time_per_output_token_seconds"
LATENCY = "relayllm_request_latency_seconds"
WAITING = "relayllm_requests_waiting"
RUNNING = "relayllm_requests_running"
KV_CACHE_USE = "relayllm_kv_cache_use"
PREFIX_QUERIES = "relayllm_prefix_cache_queries"
PREFIX_HITS = "relayllm_prefix_cache_hits"
TAG_KEYS = ("deployment", "backend", "replica")


class RayExport:
    """The values not yet handed to Ray, one replica's (``tags``: its series)."""

    def __init__(self, tags: dict[str, str]) -> None:
        self._tags = tags
        self._ray: dict[str, Any] | None = _ray_metrics()
        # Not yet handed over: counter increments by (name, traffic class or None), gauges'
        # latest values, histogram observations.
        self._counts: dict[tuple[str, str | None], float] = {}
        self._gauges: dict[str, float] = {}
        self._observed: list[tuple[str, float]] = []
        self._flush_scheduled = False

    @property
    def live(self) -> bool:
        """Whether Ray's metrics are there (not in a unit test calling the class)."""
        return self._ray is not None

    def count(self, name: str, traffic_class: str | None, amount: float) -> None:
        if amount:
            key = (name, traffic_class)
            self._counts[key] = self._counts.get(key, 0) + amount
            self._schedule_flush()

    def observe(self, name: str, value: float) -> None:
        if self._ray is not None:
            self._observed.append((name, value))
            self._schedule_flush()

    def set(self, name: str, value: float) -> None:
        if self._ray is not None:
            self._gauges[name] = value
            self._schedule_flush()

    def _schedule_flush(self) -> None:
        if self._flush_scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # not on an event loop: hand over now
            self.flush()
            return
        self._flush_scheduled = True
        loop.call_later(FLUSH_S, self.flush)

    def flush(self) -> None:
        """Hand what was gathered to Ray's metrics."""
        self._flush_scheduled = False
        ray_metrics = self._ray
        if ray_metrics is None:
            return
        counts, self._counts = self._counts, {}
        gauges, self._gauges = self._gauges, {}
        observed, self._observed = self._observed, []
        for (name, traffic_class), amount in counts.items():
            tags = (
                self._tags
                if traffic_class is None
                else {**self._tags, "traffic_class": traffic_class}
            )
            ray_metrics[name].inc(amount, tags=tags)
        for name, value in gauges.items():
            ray_metrics[name].set(value, tags=self._tags)
        for name, value in observed:
            ray_metrics[name].observe(value, tags=self._tags)


def _ray_metrics() -> dict[str, Any] | None:
    """The Ray metric objects (one set per process: Ray keys them by name), or None outside a
    Ray worker (a unit test calling the class): the summary still works."""
    global _RAY_METRICS
    if _RAY_METRICS is not None:
        return _RAY_METRICS
    try:
        import ray
        from ray.util.metrics import Counter, Gauge, Histogram

        if not ray.is_initialized():
            return None
        by_class = (*TAG_KEYS, "traffic_class")
        _RAY_METRICS = {
            ROWS: Counter(ROWS, "Rows answered, by traffic class.", by_class),
            INPUT_TOKENS: Counter(INPUT_TOKENS, "Prompt tokens, by traffic class.", by_class),
            GENERATED_TOKENS: Counter(
                GENERATED_TOKENS, "Generated tokens, by traffic class.", by_class
            ),
            TTFT: Histogram(TTFT, "Time to first token.", LATENCY_BUCKETS_S, TAG_KEYS),
            TPOT: Histogram(TPOT, "Time per output token.", LATENCY_BUCKETS_S, TAG_KEYS),
            LATENCY: Histogram(LATENCY, "A request's whole time.", LATENCY_BUCKETS_S, TAG_KEYS),
            WAITING: Gauge(WAITING, "Requests waiting in the engine's queue.", TAG_KEYS),
            RUNNING: Gauge(RUNNING, "Requests the engine is running.", TAG_KEYS),
            KV_CACHE_USE: Gauge(KV_CACHE_USE, "Fraction of the KV cache in use.", TAG_KEYS),
            PREFIX_QUERIES: Counter(PREFIX_QUERIES, "Prompt tokens looked up.", TAG_KEYS),
            PREFIX_HITS: Counter(PREFIX_HITS, "Prompt tokens found cached.", TAG_KEYS),
        }
    except Exception:  # metrics are an aid: a replica serves without them
        logger.warning("Ray metrics unavailable; info() still summarises", exc_info=True)
        return None
    return _RAY_METRICS


_RAY_METRICS: dict[str, Any] | None = None


__all__ = ["FLUSH_S", "TAG_KEYS", "RayExport"]
