"""A replica's metrics: rows and tokens by traffic class (every backend), and the engine's own
figures where its backend reports them -- time to first token, time per output token, request
latency, queue (waiting and running requests), KV-cache use, prefix-cache hits.

Each is exported through Ray's metrics (``ray.util.metrics``: Prometheus text on every node's
metrics export port, prefixed ``ray_``) and summarised by :meth:`ReplicaMetrics.summary` for the
replica's ``info()`` and ``relayllm status``. A backend whose engine exports its figures itself
(vLLM, through its own Ray stat logger) feeds only the summary: ``export_engine = False``.

The batch path pays one pass over a call's results per call (about 7 us for 64 rows); what
goes to Ray is gathered and handed over in batches (:mod:`relayllm.serving.metrics_export`).
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from relayllm.serving.metrics_export import (
    GENERATED_TOKENS,
    INPUT_TOKENS,
    KV_CACHE_USE,
    LATENCY,
    PREFIX_HITS,
    PREFIX_QUERIES,
    ROWS,
    RUNNING,
    TPOT,
    TTFT,
    WAITING,
    RayExport,
)
from relayllm.serving.traffic import TRAFFIC_CLASSES, TrafficClass

#: How many of the latest samples a latency's percentiles are computed from.
WINDOW = 2048


class Samples:
    """The latest :data:`WINDOW` values of a latency, for its percentiles."""

    def __init__(self, size: int = WINDOW) -> None:
        self._values: deque[float] = deque(maxlen=size)
        self.count = 0  # every value ever added, not only those kept

    def add(self, value: float) -> None:
        self._values.append(value)
        self.count += 1

    def summary(self) -> dict[str, Any] | None:
        if not self._values:
            return None
        ordered = sorted(self._values)
        return {
            "p50": round(_percentile(ordered, 0.50), 4),
            "p99": round(_percentile(ordered, 0.99), 4),
            "count": self.count,
        }


class EngineShare:
    """One call's engine time: every moment the engine was busy while the call was in it,
    divided by the calls in it at that moment. The shares of all calls add up to the
    replica's :attr:`ReplicaMetrics.engine_busy_s` (what an engine hour is billed by)."""

    __slots__ = ("seconds",)

    def __init__(self) -> None:
        self.seconds = 0.0


def split_by_tokens(seconds: float, results: list[Any]) -> list[float]:
    """A call's engine seconds split across its rows by their tokens (input and generated;
    evenly when no row has any): what the batch service's ledger charges each line."""
    weights = [
        (r.get("num_input_tokens") or 0) + (r.get("num_generated_tokens") or 0)
        if isinstance(r, dict)
        else 0
        for r in results
    ]
    total = sum(weights)
    if total <= 0:
        return [seconds / len(results)] * len(results) if results else []
    return [seconds * w / total for w in weights]


class ReplicaMetrics:
    """One replica's counters and engine figures, kept on its event loop."""

    def __init__(self, deployment: str, backend: str, replica: str | None = None) -> None:
        self.rows: dict[str, int] = dict.fromkeys(TRAFFIC_CLASSES, 0)
        self.input_tokens: dict[str, int] = dict.fromkeys(TRAFFIC_CLASSES, 0)
        self.generated_tokens: dict[str, int] = dict.fromkeys(TRAFFIC_CLASSES, 0)
        self.ttft = Samples()
        self.tpot = Samples()
        self.latency = Samples()
        self.waiting: int | None = None
        self.running: int | None = None
        self.kv_cache_use: float | None = None  # fraction of the KV cache in use now...
        self.kv_cache_peak: float | None = None  # ...and the most since the replica started
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache...
        self.prefix_hits = 0  # ...and found there
        # Tokens the engine's steps processed, every class together, counted as each step
        # runs (the class counters count a request's tokens only once it finishes, a whole
        # call's time later): the engine's work over a window shorter than a call.
        self.engine_step_tokens: dict[str, int] | None = None
        # Requests the engine's scheduler took out of a step to make room (their work so far
        # is computed again when they return): where its backend counts them.
        self.engine_preemptions: int | None = None
        # Seconds the engine had work (calls at once count once): its busy time, what an
        # engine hour is billed by (pipelines/engine_figures.py reads it over a run).
        self.engine_busy_s = 0.0
        self._in_engine: list[EngineShare] = []  # the calls in the engine now, each its share
        self._busy_since = 0.0
        self._shared_until = 0.0
        #: Whether the engine figures are exported here (False: the engine exports its own).
        self.export_engine = True
        self.exported_as: str | None = None  # where to find the engine's own metrics, if so
        # Each replica's series apart (Serve's replica id): routing is judged per replica.
        self.export = RayExport(
            {"deployment": deployment, "backend": backend, "replica": replica or ""}
        )

    # -- traffic (the core counts these for every backend) ------------------------------------

    def count(self, traffic_class: TrafficClass, results: Iterable[Any]) -> None:
        """Rows answered for ``traffic_class`` and their tokens (errors count as rows)."""
        rows = prompt = generated = 0
        for result in results:
            rows += 1
            prompt += result.get("num_input_tokens") or 0
            generated += result.get("num_generated_tokens") or 0
        self.rows[traffic_class] += rows
        self.input_tokens[traffic_class] += prompt
        self.generated_tokens[traffic_class] += generated
        if self.export.live:
            self._count(ROWS, traffic_class, rows)
            self._count(INPUT_TOKENS, traffic_class, prompt)
            self._count(GENERATED_TOKENS, traffic_class, generated)

    @contextlib.contextmanager
    def engine_busy(self) -> Iterator[EngineShare]:
        """Around a call in the engine: the time from the first call in to the last one out
        adds to :attr:`engine_busy_s` (the replica's event loop runs them: no lock), and each
        call's :class:`EngineShare` gets its part of that time."""
        now = time.monotonic()
        self._share_out(now)
        if not self._in_engine:
            self._busy_since = now
        share = EngineShare()
        self._in_engine.append(share)
        try:
            yield share
        finally:
            now = time.monotonic()
            self._share_out(now)
            self._in_engine.remove(share)
            if not self._in_engine:
                self.engine_busy_s += now - self._busy_since

    def _share_out(self, now: float) -> None:
        """The busy time since the last call went in or out, split evenly among the calls
        in the engine over it."""
        if self._in_engine:
            each = (now - self._shared_until) / len(self._in_engine)
            for share in self._in_engine:
                share.seconds += each
        self._shared_until = now

    def share_now(self, share: EngineShare) -> float:
        """``share``'s seconds up to now, its call still in the engine or not."""
        if share not in self._in_engine:
            return share.seconds
        return share.seconds + (time.monotonic() - self._shared_until) / len(self._in_engine)

    def busy_s(self) -> float:
        """The engine's busy seconds so far, a call in progress counted up to now."""
        running = time.monotonic() - self._busy_since if self._in_engine else 0.0
        return self.engine_busy_s + running

    # -- engine figures (fed by the adapter, where its engine has them) ------------------------

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.add(seconds)
        self._observe(TTFT, seconds)

    def observe_tpot(self, seconds: float) -> None:
        self.tpot.add(seconds)
        self._observe(TPOT, seconds)

    def observe_latency(self, seconds: float) -> None:
        """A whole request's time, as the backend sees it (an endpoint's answer time)."""
        self.latency.add(seconds)
        self._observe(LATENCY, seconds)

    def set_queue(self, waiting: int, running: int) -> None:
        self.waiting, self.running = waiting, running
        self._set(WAITING, waiting)
        self._set(RUNNING, running)

    def set_kv_cache_use(self, fraction: float) -> None:
        self.kv_cache_use = fraction
        if self.kv_cache_peak is None or fraction > self.kv_cache_peak:
            self.kv_cache_peak = fraction
        self._set(KV_CACHE_USE, fraction)

    def add_prefix_cache(self, queries: int, hits: int) -> None:
        self.prefix_queries += queries
        self.prefix_hits += hits
        if self.export.live and self.export_engine:
            self._count(PREFIX_QUERIES, None, queries)
            self._count(PREFIX_HITS, None, hits)

    def add_engine_step(
        self, prefilled_tokens: int, generated_tokens: int, preempted_requests: int = 0
    ) -> None:
        """One engine step: the prompt tokens it prefilled (not found in the prefix cache) and
        the tokens it generated, every class together, and the requests it preempted."""
        if self.engine_step_tokens is None:
            self.engine_step_tokens = {"prefilled": 0, "generated": 0}
            self.engine_preemptions = 0
        self.engine_step_tokens["prefilled"] += prefilled_tokens
        self.engine_step_tokens["generated"] += generated_tokens
        self.engine_preemptions = (self.engine_preemptions or 0) + preempted_requests

    # -- the summary ---------------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """What ``info()["metrics"]`` carries; None where the backend reports nothing."""
        return {
            "rows_by_class": dict(self.rows),
            "tokens_by_class": {
                c: {"input": self.input_tokens[c], "generated": self.generated_tokens[c]}
                for c in TRAFFIC_CLASSES
            },
            "ttft_s": self.ttft.summary(),
            "tpot_s": self.tpot.summary(),
            "latency_s": self.latency.summary(),
            "queue": (
                None if self.waiting is None else {"waiting": self.waiting, "running": self.running}
            ),
            "kv_cache_use": None if self.kv_cache_use is None else round(self.kv_cache_use, 4),
            "kv_cache_peak": None if self.kv_cache_peak is None else round(self.kv_cache_peak, 4),
            "prefix_cache_hit_rate": (
                round(self.prefix_hits / self.prefix_queries, 4) if self.prefix_queries else None
            ),
            "prefix_cache_queries": self.prefix_queries,
            "prefix_cache_hits": self.prefix_hits,
            "engine_step_tokens": (
                None if self.engine_step_tokens is None else dict(self.engine_step_tokens)
            ),
            "engine_preemptions": self.engine_preemptions,
            "engine_busy_s": round(self.busy_s(), 3),
            # Prometheus names: ray_relayllm_* always; the engine's own where it exports them.
            "exported_as": ["ray_relayllm_*", *([self.exported_as] if self.exported_as else [])],
        }

    # -- the hand-over to Ray ------------------------------------------------------------------

    def _count(self, name: str, traffic_class: str | None, amount: float) -> None:
        self.export.count(name, traffic_class, amount)

    def _observe(self, name: str, value: float) -> None:
        if self.export_engine:
            self.export.observe(name, value)

    def _set(self, name: str, value: float) -> None:
        if self.export_engine:
            self.export.set(name, value)

    def flush(self) -> None:
        """Hand what was gathered to Ray's metrics."""
        self.export.flush()


def _percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


__all__ = ["WINDOW", "ReplicaMetrics", "Samples"]
