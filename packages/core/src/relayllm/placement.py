"""Does a deployment fit the cluster? Checked before Serve starts anything.

Serve waits, without a word, for a replica whose GPUs or placement group no node can give, and
relayllm's start-up timeout would report it many minutes later as a slow engine. So ``deploy``
compares what the replicas ask for (GPUs: a replica's own, or its placement group's bundles)
with the GPUs the cluster's nodes have now, and fails at once naming both.

A cluster that adds nodes on demand (the Ray autoscaler) has fewer GPUs now than it will:
set ``RELAYLLM_SKIP_FIT_CHECK=1`` there.
"""

from __future__ import annotations

import os
from typing import Any

from relayllm.errors import ConfigError

SKIP_ENV = "RELAYLLM_SKIP_FIT_CHECK"


class DoesNotFitError(ConfigError):
    """The deployment asks for more GPUs than the cluster has."""


def replica_gpus(options: dict[str, Any]) -> tuple[float, list[float], str | None]:
    """(GPUs of one replica, GPUs per placement-group bundle, strategy) from serve options."""
    bundles = options.get("placement_group_bundles")
    if bundles:
        per_bundle = [float(b.get("GPU", 0)) for b in bundles]
        return sum(per_bundle), per_bundle, options.get("placement_group_strategy", "PACK")
    gpus = float((options.get("ray_actor_options") or {}).get("num_gpus", 0) or 0)
    return gpus, [gpus], None


def check_fits(name: str, options: dict[str, Any], node_gpus: dict[str, float]) -> None:
    """Raise :class:`DoesNotFitError` when ``options`` (serve options of deployment ``name``)
    need more GPUs than ``node_gpus`` (node id -> GPUs) hold. Pure: the caller reads the nodes."""
    if os.environ.get(SKIP_ENV, "") not in ("", "0"):
        return
    per_replica, bundles, strategy = replica_gpus(options)
    if per_replica <= 0:
        return
    autoscaling = options.get("autoscaling_config") or {}
    if autoscaling:
        replicas = int(autoscaling.get("min_replicas", 1))
    else:
        replicas = int(options.get("num_replicas", 1))
    total = sum(node_gpus.values())
    listed = sorted(node_gpus.items())
    nodes = ", ".join(f"node {n[:8]}: {g:g}" for n, g in listed) or "no GPU nodes"
    asked = f"{replicas} replica(s) x {per_replica:g} GPUs"
    if strategy:
        asked += f" ({len(bundles)} bundles, strategy {strategy})"
    fix = (
        "lower num_replicas or tensor_parallel_size x pipeline_parallel_size, or add GPU nodes "
        f"(on an autoscaling cluster, set {SKIP_ENV}=1)"
    )
    largest = max(node_gpus.values(), default=0)
    if strategy == "STRICT_PACK" and per_replica > largest:
        raise DoesNotFitError(
            f"deployment {name!r} asks for {per_replica:g} GPUs on one node (strategy STRICT_PACK) "
            f"but the largest node has {largest:g} ({nodes}); {fix}"
        )
    if replicas * per_replica > total:
        raise DoesNotFitError(
            f"deployment {name!r} asks for {replicas * per_replica:g} GPUs ({asked}) but the "
            f"cluster has {total:g} ({nodes}); {fix}"
        )


def cluster_gpus() -> dict[str, float]:
    """GPUs of every live node of the connected cluster (logical GPUs count too)."""
    import ray

    return {
        node["NodeID"]: float(node["Resources"].get("GPU", 0))
        for node in ray.nodes()
        if node.get("Alive")
    }


__all__ = ["DoesNotFitError", "SKIP_ENV", "check_fits", "cluster_gpus", "replica_gpus"]
