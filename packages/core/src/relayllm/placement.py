"""Where a deployment's replicas run, as users steer it: spread across nodes (at most N
replicas on one node, so losing a node loses at most N of them) and on nodes of a kind (custom
resources the chosen nodes offer), over the backend's own actor options.

``DeploymentConfig.placement`` holds it; :func:`apply_placement` turns it (and the config's
``ray_actor_options``) into Serve's deployment options. :mod:`relayllm.fit` then checks, node
by node, that the replicas can be placed at all before Serve starts (pure: no Ray here).
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import ConfigDict, Field, PositiveFloat, PositiveInt

from relayllm.configbase import ConfigModel
from relayllm.errors import ConfigError

#: Serve's own bounds of ``max_replicas_per_node``.
MAX_PER_NODE = 100


class Placement(ConfigModel):
    """How a deployment's replicas spread over the cluster's nodes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_replicas_per_node: PositiveInt | None = Field(
        default=None,
        le=MAX_PER_NODE,
        description="At most this many replicas on one node (Serve's max_replicas_per_node): "
        "1 puts each replica on a node of its own, so a lost node takes one replica with it. "
        "Not with backends whose replicas reserve a placement group (Serve refuses the pair).",
    )
    node_resources: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="Custom Ray resources each replica asks for, so it runs only on nodes that "
        "offer them: start those nodes with `ray start --resources '{\"pool-a\": 8}'` and "
        "set {pool-a: 1} (8 replicas at most there). Added to every bundle of a replica's "
        "placement group.",
    )


PLACEMENT_FIELD = Field(
    default_factory=Placement,
    description="Where the replicas run: max_replicas_per_node spreads them across nodes, "
    "node_resources keeps them on nodes that offer those custom resources.",
)


class Placed(Protocol):
    """What :func:`apply_placement` reads of a deployment's config (``DeploymentConfig`` has
    it; typed here so that placement, below the deployments package, does not name it)."""

    @property
    def name(self) -> str: ...
    @property
    def backend(self) -> str: ...
    @property
    def ray_actor_options(self) -> dict[str, Any] | None: ...
    @property
    def placement(self) -> Placement: ...


def apply_placement(config: Placed, serve_options: dict[str, Any]) -> dict[str, Any]:
    """``serve_options`` (the backend's) with the config's ``ray_actor_options`` over the
    backend's and its ``placement`` applied. A pair Serve would refuse at deploy time is a
    :class:`ConfigError` now, saying what to change."""
    placement = config.placement
    extra = dict(placement.node_resources)
    if config.ray_actor_options or extra:
        actor = {**serve_options.get("ray_actor_options", {}), **(config.ray_actor_options or {})}
        if extra:
            actor["resources"] = {**(actor.get("resources") or {}), **extra}
        serve_options["ray_actor_options"] = actor
    bundles = serve_options.get("placement_group_bundles")
    if bundles and extra:  # the replica lives in the first bundle; its engine's workers the rest
        serve_options["placement_group_bundles"] = [{**b, **extra} for b in bundles]
    if placement.max_replicas_per_node is not None:
        if bundles:
            raise ConfigError(
                f"deployment {config.name!r}: placement.max_replicas_per_node cannot be set "
                f"for backend {config.backend!r} with these options: its replicas reserve a "
                "placement group, and Serve refuses the pair. Keep replicas on chosen nodes "
                "with placement.node_resources instead"
            )
        serve_options["max_replicas_per_node"] = placement.max_replicas_per_node
    return serve_options


__all__ = ["MAX_PER_NODE", "PLACEMENT_FIELD", "Placed", "Placement", "apply_placement"]
