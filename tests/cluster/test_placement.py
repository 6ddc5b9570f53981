"""Placement across nodes on a real multi-node cluster: ``placement.max_replicas_per_node``
puts each replica on a node of its own; a deployment that fits the cluster's total but not
its nodes is refused before Serve starts; a batch's stop signal reaches a stage worker on
another node (the key-value store in the GCS, not a local flag file)."""

from __future__ import annotations

import time

import pytest

from relayllm import DeploymentConfig, ResourceFitError


def spread(replicas: int) -> DeploymentConfig:
    return DeploymentConfig(
        name="spread",
        backend="echo",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": 0.1},
        placement={"max_replicas_per_node": 1},
    )


def test_max_replicas_per_node_puts_each_replica_on_a_node_of_its_own(nodes):
    import relayllm

    relayllm.deploy(spread(3))
    try:
        on = sorted(nodes.replicas("spread").values())
        assert on == ["head", "node1", "node2"], on
    finally:
        relayllm.shutdown("spread")


def test_more_replicas_than_nodes_allow_are_refused_before_serve_starts(nodes):
    from ray import serve

    import relayllm

    with pytest.raises(ResourceFitError) as err:
        relayllm.deploy(spread(4))  # three nodes, at most one replica on each
    message = str(err.value)
    assert "only 3 of them fit on the cluster's nodes" in message, message
    assert "at most 1 on one node" in message and "nodes: " in message, message
    assert "relayllm-spread" not in serve.status().applications, "nothing was started"


def test_a_stop_signal_reaches_a_worker_on_another_node(nodes):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from relayllm.batch.run import StopCheck, clear_stop, raise_stop

    @ray.remote(num_cpus=0.1)
    class Worker:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

        def stopped(self, check: StopCheck) -> bool:
            return check()

    worker = Worker.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes.node_id("node2"), soft=False)
    ).remote()
    check = StopCheck(flag=None, key="cluster-test.1")
    assert ray.get(worker.node.remote()) == nodes.node_id("node2")
    assert not ray.get(worker.stopped.remote(check)), "no signal yet"
    raise_stop("cluster-test.1")
    try:
        deadline = time.monotonic() + 30
        while not ray.get(worker.stopped.remote(check)):
            assert time.monotonic() < deadline, "the stop never reached node2"
            time.sleep(0.2)
    finally:
        clear_stop("cluster-test.1")
        ray.kill(worker)
