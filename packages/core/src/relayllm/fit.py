"""Does it fit the Ray cluster? One check, before anything starts, raising one error.

Ray schedules an actor, a task or a placement group only when its whole request fits on a
node, and Serve and Ray Data wait, without a word, for one that never will: relayllm's start-up
timeout would report it much later as a slow engine, a pipeline would hang. So what is about
to run is added up as :class:`Demand` s and compared with the cluster, and
:class:`~relayllm.ResourceFitError` names what is short and what to change:

- ``deploy()``: the deployment's replicas against what the cluster's nodes have (its engine
  may wait for running work to end, never for a node that does not exist);
- a pipeline: its new engines, every stage worker and relayllm's own tasks, all at once,
  against what is free now. relayllm sizes its own tasks and stage workers in fractions of a
  CPU since they mostly wait on the engine.

Pure: the replica bundles arrive as data (``deployments`` computes them) and the cluster as
dicts (:func:`cluster_view`). A cluster that adds nodes on demand (the Ray autoscaler) has less
now than it will: ``RELAYLLM_SKIP_FIT_CHECK=1`` turns the check off there.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from relayllm import env
from relayllm.errors import ResourceFitError

#: CPUs one of relayllm's own Ray Data tasks asks for: a read, a repartition.
TASK_NUM_CPUS = 0.1
#: How long a shortfall of free resources the cluster's total would cover is checked again
#: (resources a stopped deployment held show as free a moment after it stops), and how often.
SETTLE_S = 10.0
SETTLE_POLL_S = 0.25
#: Serve's own default for a replica that names no ``num_cpus``.
SERVE_DEFAULT_NUM_CPUS = 1.0
#: Ray's internal resources that are not a user's concern (node ids, memory, object store).
_IGNORED = ("node:", "memory", "object_store_memory", "accelerator_type:")


@dataclass(frozen=True)
class Demand:
    """One kind of thing that runs: ``count`` of them, each needing ``bundles`` (one bundle
    per placement-group bundle; a plain actor or task is one bundle). ``strategy``: the
    placement group's, when it has one (``STRICT_PACK`` puts all its bundles on one node).
    ``per_node``: at most this many on one node (a deployment's ``max_replicas_per_node``)."""

    what: str
    bundles: tuple[dict[str, float], ...]
    count: int
    hint: str
    strategy: str | None = None
    per_node: int | None = None

    def total(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for bundle in self.bundles:
            for key, amount in bundle.items():
                out[key] = out.get(key, 0.0) + amount * self.count
        return out


def replica_count(config: Mapping[str, Any], at: Literal["start", "max"] = "start") -> int:
    """Replicas of a deployment, from a mapping with ``num_replicas`` and
    ``autoscaling_config`` (a ``DeploymentConfig`` dumped, the config a replica is given, or
    its serve options): at ``"start"``, those Serve starts right away (autoscaling:
    ``initial_replicas``, else ``min_replicas``); at ``"max"``, the most that can run at once
    (autoscaling: ``max_replicas``). At least one: work waits for one."""
    scaling = config.get("autoscaling_config") or {}
    if not scaling:
        return max(int(config.get("num_replicas") or 1), 1)
    if at == "max":
        return max(int(scaling.get("max_replicas") or 1), 1)
    initial = scaling.get("initial_replicas")
    return max(int(initial if initial is not None else scaling.get("min_replicas") or 1), 1)


def replica_bundles(serve_options: Mapping[str, Any]) -> tuple[dict[str, float], ...]:
    """The Ray resources one replica reserves, from its ``serve.deployment`` options."""
    bundles = serve_options.get("placement_group_bundles")
    if bundles:  # the replica actor lives in the first bundle; an engine's workers the rest
        return tuple({k: float(v) for k, v in b.items() if v} for b in bundles)
    actor = serve_options.get("ray_actor_options") or {}
    bundle = {"CPU": float(actor.get("num_cpus", SERVE_DEFAULT_NUM_CPUS) or 0)}
    bundle["GPU"] = float(actor.get("num_gpus") or 0)
    if actor.get("memory"):
        bundle["memory"] = float(actor["memory"])
    for key, amount in (actor.get("resources") or {}).items():
        bundle[key] = float(amount)
    return ({k: v for k, v in bundle.items() if v},)


def engine_demand(name: str, serve_options: Mapping[str, Any]) -> Demand:
    """The replicas deployment ``name`` starts, from its ``serve.deployment`` options."""
    n = replica_count(serve_options)
    bundles = serve_options.get("placement_group_bundles")
    return Demand(
        f"deployment {name!r} ({n} replica{'s' if n > 1 else ''})",
        replica_bundles(serve_options),
        n,
        "lower num_replicas, its ray_actor_options (num_cpus/num_gpus) or the engine's "
        "parallel sizes (tensor_parallel_size x pipeline_parallel_size), raise "
        "placement.max_replicas_per_node, or add nodes",
        serve_options.get("placement_group_strategy", "PACK") if bundles else None,
        serve_options.get("max_replicas_per_node"),
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
    free: dict[str, float] | None,
    total: dict[str, float],
    nodes: list[dict[str, float]] | None = None,
    *,
    subject: str = "the pipeline",
) -> None:
    """Raise :class:`ResourceFitError` unless ``demands`` fit all at once in ``free`` (None:
    in the cluster's ``total``, for what may wait for running work to end), and, when
    ``nodes`` are given, every bundle (a ``STRICT_PACK`` group: all its bundles) fits on one
    of them and each demand's ``count`` fits on them node by node (``per_node`` at most on
    one): a total that suffices is no use when no node has room for the next one.
    ``subject`` names what cannot run."""
    if env.SKIP_FIT_CHECK.get():
        return
    demands = [d for d in demands if d.count]
    have = total if free is None else free
    need: dict[str, float] = {}
    for demand in demands:
        for key, amount in demand.total().items():
            need[key] = need.get(key, 0.0) + amount
    short = {
        k: v for k, v in need.items() if v > have.get(k, 0.0) + 1e-9 and not k.startswith(_IGNORED)
    }
    too_big, too_many = [], []
    if nodes is not None:
        for demand in demands:
            for bundle, where in _placed_together(demand):
                if not any(_fits(bundle, node) for node in nodes):
                    too_big.append((demand, bundle, where))
            placed = _room(demand, nodes)
            if placed < demand.count and not any(d is demand for d, _, _ in too_big):
                too_many.append((demand, placed))
    if not short and not too_big and not too_many:
        return
    lines = [
        f"{subject} cannot run: what it needs at once does not fit on the Ray cluster "
        "(it would wait forever)."
    ]
    for key, amount in sorted(short.items()):
        if free is None:
            lines.append(f"  {key}: needs {_num(amount)}, the cluster has {_num(have.get(key, 0))}")
        else:
            lines.append(
                f"  {key}: needs {_num(amount)}, {_num(free.get(key, 0.0))} free of "
                f"{_num(total.get(key, 0.0))} in the cluster"
            )
    for demand, bundle, where in too_big:
        lines.append(
            f"  {demand.what}: one of them asks {_bundle(bundle)}{where}, more than any node "
            f"has (nodes: {'; '.join(_bundle(n) for n in nodes or [])})"
        )
    for demand, placed in too_many:
        most = f", at most {demand.per_node} on one node" if demand.per_node else ""
        lines.append(
            f"  {demand.what}: only {placed} of them fit on the cluster's nodes, node by node "
            f"(each asks {_bundle(demand.bundles[0])}{most}; nodes: "
            f"{'; '.join(_bundle(n) for n in nodes or [])})"
        )
    lines.append("What it asks for:")
    for demand in demands:
        lines.append(f"  {demand.what}: {_bundle(demand.total())} -- to change: {demand.hint}")
    lines.append(
        "Stop deployments you no longer need (relayllm shutdown NAME) or use a cluster with more "
        f"resources (on a cluster that adds nodes on demand, set {env.SKIP_FIT_CHECK.name}=1)."
    )
    raise ResourceFitError("\n".join(lines))


def check_fit_on_cluster(
    demands: Iterable[Demand], *, subject: str = "the pipeline", settle_s: float = SETTLE_S
) -> None:
    """:func:`check_fit` against the connected cluster's free resources. What a deployment
    stopped a moment ago held shows as free only a moment later, so a shortfall that the
    cluster's total would cover is checked again for up to ``settle_s`` before it is
    reported; one the total cannot cover is reported at once."""
    demands = list(demands)
    deadline = time.monotonic() + settle_s
    while True:
        free, total, nodes = cluster_view()
        try:
            check_fit(demands, free, total, nodes, subject=subject)
            return
        except ResourceFitError as short:
            if time.monotonic() >= deadline or not _fits_idle(demands, total, nodes, subject):
                raise short from None  # (the message names what is free and the total)
            time.sleep(SETTLE_POLL_S)


def _fits_idle(
    demands: list[Demand], total: dict[str, float], nodes: list[dict[str, float]], subject: str
) -> bool:
    try:
        check_fit(demands, None, total, nodes, subject=subject)
    except ResourceFitError:
        return False
    return True


def cluster_view() -> tuple[dict[str, float], dict[str, float], list[dict[str, float]]]:
    """Free resources, total resources and each live node's total (needs ``ray.init``)."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    return dict(ray.available_resources()), dict(ray.cluster_resources()), nodes


def _placed_together(demand: Demand) -> list[tuple[dict[str, float], str]]:
    """What one node must hold: each bundle, or a STRICT_PACK group's bundles together."""
    if demand.strategy == "STRICT_PACK" and len(demand.bundles) > 1:
        one = Demand("", demand.bundles, 1, "").total()
        return [(one, " on one node (strategy STRICT_PACK)")]
    return [(bundle, "") for bundle in demand.bundles]


def _room(demand: Demand, nodes: list[dict[str, float]]) -> int:
    """How many of ``demand`` the nodes hold, each node alone (its whole size: what may wait
    for running work to end), at most ``per_node`` on one. A placement group of several
    bundles that need not share a node is not counted: any count passes."""
    if len(demand.bundles) != 1:
        return demand.count
    bundle = {k: v for k, v in demand.bundles[0].items() if v > 0 and not k.startswith(_IGNORED)}
    room = 0
    for node in nodes:
        fit = min((int(node.get(k, 0.0) / v + 1e-9) for k, v in bundle.items()), default=None)
        fit = demand.count if fit is None else fit  # asks nothing: any node holds them all
        room += fit if demand.per_node is None else min(fit, demand.per_node)
    return room


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(
        node.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items() if not k.startswith(_IGNORED)
    )


def _num(value: float) -> str:
    return f"{value:g}" if value < 1e6 else f"{value / 2**30:.1f} GiB"


def _bundle(bundle: dict[str, float]) -> str:
    parts = [
        f"{_num(v)} {k}"
        for k, v in sorted(bundle.items())
        if v and not math.isclose(v, 0) and not k.startswith(_IGNORED)
    ]
    return ", ".join(parts) or "nothing"


__all__ = [
    "TASK_NUM_CPUS",
    "Demand",
    "check_fit",
    "check_fit_on_cluster",
    "cluster_view",
    "engine_demand",
    "replica_bundles",
    "replica_count",
    "stage_demand",
    "task_demand",
]
