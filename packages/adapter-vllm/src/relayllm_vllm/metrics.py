"""The engine's metrics: vLLM's own stat loggers, given to ``AsyncLLM`` when
``options.engine_metrics`` is on.

Two loggers see every engine step's stats: vLLM's ``RayPrometheusStatLogger`` exports vLLM's
whole metric set (``vllm:time_to_first_token_seconds``, ``vllm:kv_cache_usage_perc``, ...)
through Ray's metrics, where Prometheus finds them as ``ray_vllm_*``; :class:`SummaryStatLogger`
feeds the replica's summary (``info()["metrics"]``, ``relayllm status``). With custom loggers
only, vLLM adds neither its log-line logger nor its plain Prometheus one.

Imported only inside a replica (it imports vLLM).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from vllm.v1.metrics.loggers import StatLoggerBase
from vllm.v1.metrics.ray_wrappers import RayPrometheusStatLogger

from relayllm.adapters import ReplicaMetrics

#: Where vLLM's own metrics appear on Ray's metrics endpoint.
EXPORTED_AS = "ray_vllm_*"


class SummaryStatLogger(StatLoggerBase):
    """One engine's step stats into the replica's :class:`~relayllm.serving.metrics.ReplicaMetrics`
    (summary only: vLLM's own logger exports them)."""

    def __init__(self, vllm_config: Any, engine_index: int = 0, *, metrics: ReplicaMetrics):
        self.metrics = metrics

    def record(
        self,
        scheduler_stats: Any,
        iteration_stats: Any,
        mm_cache_stats: Any = None,
        engine_idx: int = 0,
    ) -> None:
        metrics = self.metrics
        if scheduler_stats is not None:
            metrics.set_queue(
                waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                running=scheduler_stats.num_running_reqs,
            )
            metrics.set_kv_cache_use(scheduler_stats.kv_cache_usage)
            prefix = scheduler_stats.prefix_cache_stats
            metrics.add_prefix_cache(prefix.queries, prefix.hits)
        if iteration_stats is not None:
            metrics.add_engine_step(  # prefilled: computed, not found in the prefix cache
                iteration_stats.prompt_token_stats.computed,
                iteration_stats.num_generation_tokens,
                iteration_stats.num_preempted_reqs,
            )
            for seconds in iteration_stats.time_to_first_tokens_iter:
                metrics.observe_ttft(seconds)
            for finished in iteration_stats.finished_requests:
                metrics.observe_latency(finished.e2e_latency)
                if finished.num_generation_tokens > 1:  # one token has no time per token
                    metrics.observe_tpot(finished.mean_time_per_output_token)

    def log_engine_initialized(self) -> None:
        pass


def stat_loggers(metrics: ReplicaMetrics) -> list[Any]:
    """The loggers for ``AsyncLLM(stat_loggers=...)``; marks ``metrics`` as fed by vLLM."""
    metrics.export_engine = False  # vLLM's logger exports the engine figures itself
    metrics.exported_as = EXPORTED_AS
    return [RayPrometheusStatLogger, partial(SummaryStatLogger, metrics=metrics)]


__all__ = ["EXPORTED_AS", "SummaryStatLogger", "stat_loggers"]
