"""Reading what Ray's metrics endpoint serves, for tests of exported metrics.

Every Ray node serves its processes' metrics (``ray.util.metrics``, prefixed ``ray_``) as
Prometheus text on its metrics export port; a process's values reach it after Ray's report
interval (about 10 s), so :func:`wait_for_sample` polls.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable


def metrics_urls() -> list[str]:
    """The metrics endpoint of every live node of the connected cluster."""
    import ray

    return [
        f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
        for node in ray.nodes()
        if node.get("Alive") and node.get("MetricsExportPort")
    ]


def samples(name: str, **labels: str) -> list[float]:
    """The values of every sample called ``name`` (full Prometheus name, e.g.
    ``ray_relayllm_rows_total``) whose labels include ``labels``, across the cluster's nodes."""
    from prometheus_client.parser import text_string_to_metric_families

    found = []
    for url in metrics_urls():
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and labels.items() <= sample.labels.items():
                    found.append(float(sample.value))
    return found


def wait_for_sample(
    name: str, check: Callable[[float], bool], timeout_s: float = 60.0, **labels: str
) -> float:
    """The sum of :func:`samples` once ``check`` accepts it; AssertionError after
    ``timeout_s`` with the last value seen."""
    deadline = time.monotonic() + timeout_s
    total = None
    while True:
        values = samples(name, **labels)
        total = sum(values) if values else None
        if total is not None and check(total):
            return total
        if time.monotonic() > deadline:
            raise AssertionError(
                f"{name}{labels or ''} on Ray's metrics endpoint: {total} after {timeout_s:g}s"
            )
        time.sleep(1.0)


__all__ = ["metrics_urls", "samples", "wait_for_sample"]
