"""What a pipeline asks of the cluster at once, and whether that fits -- checked before any
engine starts.

Ray schedules a task or an actor only when its whole request fits on a node, and Ray Data
gives every operator a share of the cluster. A Serve replica holds its CPUs for as long as it
runs, so on a small machine an engine replica, the Serve controller, the stage actors and a
read task that asks for a whole CPU can leave that task waiting forever, with no error. So
relayllm sizes its own tasks (read, repartition) and stage actors in fractions
of a CPU -- they mostly wait on the engine -- and :func:`check_fit` adds up what a pipeline
runs at once (new engine replicas, every stage actor, one task per task operator) and compares
it with what the cluster has free, naming what does not fit and what to change.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from relayllm.errors import ResourceFitError

if TYPE_CHECKING:
    from relayllm.deployments import DeploymentConfig

#: CPUs one of relayllm's own Ray Data tasks asks for: a read, a repartition.
TASK_NUM_CPUS = 0.1
#: Serve's own default for a replica that names no ``num_cpus``.
SERVE_DEFAULT_NUM_CPUS = 1.0
#: Ray's internal resources that are not a user's concern (node ids, memory, object store).
_IGNORED = ("node:", "memory", "object_store_memory", "accelerator_type:")


@dataclass(frozen=True)
class Demand:
    """One kind of thing a pipeline runs: ``count`` of them, each needing ``bundles`` (one
    bundle per placement-group bundle; a plain actor or task is one bundle)."""

    what: str
    bundles: tuple[dict[str, float], ...]
    count: int
    hint: str

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for key, amount in bundle.items():
                out[key] = out.get(key, 0.0) + amount * self.count
        return out


def replica_bundles(config: DeploymentConfig) -> tuple[dict[str, float], ...]:
    """The Ray resources one replica of ``config`` reserves (pure: no cluster, no engine; the
    engine package need not be installed here)."""
    from relayllm.plugin.manager import get_registry

    backend = get_registry().get(config.backend)
    options = backend.parse_options(config.options)
    serve_options: dict[str, Any] = dict(backend.deployment_options(options))
    actor = dict(serve_options.get("ray_actor_options") or {})
    actor.update(config.ray_actor_options or {})
    bundles = serve_options.get("placement_group_bundles")
    if bundles:  # the replica actor lives in the first bundle; vLLM workers fill the rest
        return tuple({k: float(v) for k, v in b.items() if v} for b in bundles)
    bundle = {"CPU": float(actor.get("num_cpus", SERVE_DEFAULT_NUM_CPUS) or 0)}
    bundle["GPU"] = float(actor.get("num_gpus") or 0)
    if actor.get("memory"):
        bundle["memory"] = float(actor["memory"])
    for key, amount in (actor.get("resources") or {}).items():
        bundle[key] = float(amount)
    return ({k: v for k, v in bundle.items() if v},)


def starting_replicas(config: DeploymentConfig) -> int:
    """Replicas Serve starts right away (autoscaling: ``initial_replicas`` or
    ``min_replicas``; at least one, since a pipeline waits for one)."""
    scaling = config.autoscaling_config
    if not scaling:
        return config.num_replicas
    initial = scaling.get("initial_replicas")
    return max(int(initial if initial is not None else scaling.get("min_replicas", 1)), 1)


def engine_demand(config: DeploymentConfig) -> Demand:
    n = starting_replicas(config)
    return Demand(
        f"deployment {config.name!r} ({n} replica{'s' if n > 1 else ''})",
        replica_bundles(config),
        n,
        "lower its ray_actor_options (num_cpus/num_gpus) or num_replicas, or start it on a "
        "bigger cluster",
    )


def stage_demand(step: str, num_cpus: float, workers: int, compute: str = "actors") -> Demand:
    """``workers`` stage actors or tasks at once (``processor.stage_workers``)."""
    return Demand(
        f"stage {compute} of step {step!r} ({workers} x {num_cpus:g} CPU)",
        ({"CPU": num_cpus},),
        workers,
        "lower the step's concurrency",
    )


def task_demand(operators: int) -> Demand:
    return Demand(
        f"Ray Data tasks (read, repartition: {operators} x {TASK_NUM_CPUS:g} CPU)",
        ({"CPU": TASK_NUM_CPUS},),
        operators,
        "(relayllm's own tasks; already as small as they go)",
    )


def check_fit(
    demands: Iterable[Demand],
    free: dict[str, float],
    total: dict[str, float],
    nodes: list[dict[str, float]] | None = None,
) -> None:
    """Raise :class:`ResourceFitError` unless ``demands`` fit in ``free`` all at once (and every
    bundle fits on one node of ``nodes``, when given)."""
    demands = [d for d in demands if d.count]
    need: dict[str, float] = {}
    for demand in demands:
        for key, amount in demand.total().items():
            need[key] = need.get(key, 0.0) + amount
    short = {
        k: v for k, v in need.items() if v > free.get(k, 0.0) + 1e-9 and not k.startswith(_IGNORED)
    }
    too_big = []
    if nodes is not None:
        for demand in demands:
            for bundle in demand.bundles:
                if not any(_fits(bundle, node) for node in nodes):
                    too_big.append((demand, bundle))
    if not short and not too_big:
        return
    lines = [
        "the pipeline cannot run: what it needs at once does not fit on the Ray cluster "
        "(it would wait forever)."
    ]
    for key, amount in sorted(short.items()):
        lines.append(
            f"  {key}: needs {_num(amount)}, {_num(free.get(key, 0.0))} free of "
            f"{_num(total.get(key, 0.0))} in the cluster"
        )
    for demand, bundle in too_big:
        lines.append(f"  {demand.what}: one of them asks {_bundle(bundle)}, more than any node has")
    lines.append("What it asks for:")
    for demand in demands:
        lines.append(f"  {demand.what}: {_bundle(demand.total())} -- to change: {demand.hint}")
    lines.append(
        "Stop deployments you no longer need (relayllm shutdown NAME) or use a cluster "
        "with more resources."
    )
    raise ResourceFitError("\n".join(lines))


def cluster_view() -> tuple[dict[str, float], dict[str, float], list[dict[str, float]]]:
    """Free resources, total resources and each live node's total (needs ``ray.init``)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    return dict(ray.available_resources()), dict(ray.cluster_resources()), nodes


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(
        node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items() if not k.startswith(_IGNORED)
    )


def _num(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value / 2**30:.1f} GiB"


def _bundle(bundle: dict[str, float]) -> str:
    parts = [f"{_num(v)} {k}" for k, v in sorted(bundle.items()) if v and not math.isclose(v, 0)]
    return ", ".join(parts) or "nothing"


__all__ = [
    "TASK_NUM_CPUS",
    "Demand",
    "check_fit",
    "cluster_view",
    "engine_demand",
    "replica_bundles",
    "stage_demand",
    "starting_replicas",
    "task_demand",
]
