"""Placement users steer (relayllm.placement) and the fit check that reasons node by node
(relayllm.fit), without Ray: a deployment whose replicas fit the cluster's total but not its
nodes is refused before Serve starts, naming the node sizes (on a real cluster:
tests/cluster/test_placement_across_nodes.py)."""

from __future__ import annotations

import pytest

from relayllm import ConfigError, DeploymentConfig, ResourceFitError
from relayllm.deployments import resolve, serve_options
from relayllm.fit import check_fit, engine_demand

pytestmark = pytest.mark.usefixtures("echo_backend")


def options_of(**fields) -> dict:
    config = DeploymentConfig(name="spread", backend="echo", **fields)
    backend, options = resolve(config)
    return serve_options(backend, config, options)


def check(serve, nodes):
    total: dict[str, float] = {}
    for node in nodes:
        for key, amount in node.items():
            total[key] = total.get(key, 0.0) + amount
    check_fit([engine_demand("spread", serve)], None, total, nodes, subject="'spread'")


def test_replicas_that_fit_the_total_but_no_node_are_refused_naming_the_node_sizes():
    serve = options_of(num_replicas=3, ray_actor_options={"num_cpus": 1})
    nodes = [{"CPU": 1.5}, {"CPU": 1.5}]  # 3 CPUs in all, room for one replica on each
    with pytest.raises(ResourceFitError) as err:
        check(serve, nodes)
    message = str(err.value)
    assert "only 2 of them fit on the cluster's nodes" in message, message
    assert "nodes: 1.5 CPU; 1.5 CPU" in message, message
    check(options_of(num_replicas=2, ray_actor_options={"num_cpus": 1}), nodes)  # 2 fit


def test_max_replicas_per_node_spreads_replicas_and_counts_in_the_fit():
    spread = {"placement": {"max_replicas_per_node": 1}, "ray_actor_options": {"num_cpus": 0}}
    serve = options_of(num_replicas=2, **spread)
    assert serve["max_replicas_per_node"] == 1
    nodes = [{"CPU": 2.0}, {"CPU": 1.0}]
    check(serve, nodes)  # one on each node
    with pytest.raises(ResourceFitError) as err:
        check(options_of(num_replicas=3, **spread), nodes)
    assert "at most 1 on one node" in str(err.value)
    assert "raise placement.max_replicas_per_node, or add nodes" in str(err.value)


def test_node_resources_keep_replicas_on_nodes_that_offer_them():
    serve = options_of(
        num_replicas=2,
        ray_actor_options={"num_cpus": 0.5, "resources": {"mine": 1}},
        placement={"node_resources": {"pool-a": 1}},
    )
    actor = serve["ray_actor_options"]
    assert actor["resources"] == {"mine": 1, "pool-a": 1} and actor["num_cpus"] == 0.5
    check(serve, [{"CPU": 1.0, "pool-a": 2.0, "mine": 2.0}])
    with pytest.raises(ResourceFitError) as err:  # no node offers pool-a
        check(serve, [{"CPU": 4.0, "mine": 4.0}, {"CPU": 4.0, "mine": 4.0}])
    assert "pool-a" in str(err.value)


def test_default_placement_leaves_the_backends_options_as_they_were():
    serve = options_of()
    assert "max_replicas_per_node" not in serve
    assert "resources" not in serve.get("ray_actor_options", {})


def test_a_placement_serve_would_refuse_is_a_config_error_before_anything_starts():
    from relayllm.placement import Placement, apply_placement

    config = DeploymentConfig(
        name="tp", backend="echo", placement=Placement(max_replicas_per_node=1)
    )
    with pytest.raises(ConfigError, match="node_resources instead"):
        apply_placement(config, {"placement_group_bundles": [{"CPU": 1}, {"CPU": 1}]})
    with pytest.raises(ConfigError, match="max_replicas_per_node"):
        DeploymentConfig(name="x", backend="echo", placement={"max_replicas_per_nod": 1})
