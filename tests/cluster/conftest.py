"""The cluster tier's one fixture: a Ray cluster of a head and worker nodes on this machine.

Each worker node is a raylet of its own (``ray.cluster_utils.Cluster``: its own ports, its own
worker processes) with custom resources that label it, so a replica, a stage worker, the
batch service's gateway or runner asks for a node by name (``{"node1": 0.01}``) or for any
node of a kind (``{"engine": 1}``: one per node). A node is lost as a preempted VM vanishes:
its raylet and every process under it SIGKILLed at once (:meth:`Nodes.kill`); a new one joins
with :meth:`Nodes.add`. One cluster per test module (it takes ~15 s to start on two cores);
the tests of a module kill and add nodes in order on it.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from support import NODE_HEALTH_CHECKS, kill_tree, ray_cluster, wait_for

#: What the head offers: the driver, the stage workers, Serve's controller (fractions of it).
HEAD_CPUS = 2
#: Each worker node: logical CPUs (the machine has two cores; replicas of the echo backend
#: and stage workers ask for fractions) and one ``engine`` slot, so a deployment of
#: ``{"engine": 1}`` replicas puts one on each node.
NODE_CPUS = 1


class Nodes:
    """The running cluster: its address, its worker nodes by name, node loss and joins."""

    def __init__(self, cluster: Any, temp: str) -> None:
        self.cluster = cluster
        self.temp = temp
        self.by_name: dict[str, Any] = {}

    @property
    def address(self) -> str:
        return str(self.cluster.address)

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of a ``relayllm`` command run against this cluster (echo backend)."""
        return {
            **os.environ,
            "RAY_ADDRESS": self.address,
            "RAY_TMPDIR": self.temp,
            "RELAYLLM_ECHO_BACKEND": "1",
            **extra,
        }

    def add(self, name: str, *, num_cpus: float = NODE_CPUS, **resources: float) -> str:
        """A worker node labelled ``name`` (resource ``name``: 100) joins; returns its node id."""
        node = self.cluster.add_node(
            num_cpus=num_cpus,
            resources={name: 100, "engine": 1, **resources},
            object_store_memory=80 * 1024 * 1024,
        )
        self.by_name[name] = node
        return str(node.node_id)

    def node_id(self, name: str) -> str:
        return str(self.by_name[name].node_id)

    def name_of(self, node_id: str) -> str:
        """A node's name (``head`` for the head; a lost node's id as it is)."""
        if node_id == self.cluster.head_node.node_id:
            return "head"
        return next((n for n, node in self.by_name.items() if node.node_id == node_id), node_id)

    def replicas(self, deployment: str) -> dict[str, str]:
        """The live Serve replicas of relayllm deployment ``deployment``: actor name -> the
        name of its node (from the GCS's actor table: the state API needs a dashboard)."""
        from ray._private import state

        return {
            actor["Name"]: self.name_of(actor["Address"]["NodeID"])
            for actor in state.actors().values()
            if actor.get("State") == "ALIVE"
            and actor.get("ActorClassName", "").startswith("ServeReplica:")
            and actor.get("ActorClassName", "").endswith(f":{deployment}")
        }

    def actor_node(self, name: str, namespace: str) -> str | None:
        """The name of the node a live named actor runs on (None: not alive now)."""
        from ray._private import state

        for actor in state.actors().values():
            if actor.get("Name") == name and actor.get("State") == "ALIVE":
                return self.name_of(actor["Address"]["NodeID"])
        return None

    def kill(self, name: str) -> int:
        """SIGKILL the node's raylet and every process under it, all at once (no graceful
        stop, as a preempted VM vanishes); returns how many processes were killed. Ray
        notices through its health checks of the raylet."""
        import ray

        node = self.by_name.pop(name)
        raylet = node.all_processes["raylet"][0].process.pid
        tree = kill_tree(raylet)
        # The rest of the node's own processes (none should be left), and the bookkeeping.
        self.cluster.remove_node(node, allow_graceful=False)
        gone = node.node_id
        wait_for(
            lambda: not any(n["Alive"] for n in ray.nodes() if n["NodeID"] == gone),
            f"Ray saw node {name} die",
            timeout_s=120,
        )
        return len(tree)


@pytest.fixture(scope="module")
def nodes(request):
    """A head node (the driver: this process) and worker nodes ``node1`` and ``node2``
    (more resources each from the module's ``NODE_RESOURCES``: name -> resources); the echo
    backend registered here. Ray's temp dir is private (support.ray_cluster)."""
    import ray

    from relayllm.testing import enable_echo_backend

    enable_echo_backend()
    with ray_cluster(
        HEAD_CPUS,
        resources={"head": 100},
        nodes=True,
        namespace="relayllm",
        system_config=NODE_HEALTH_CHECKS,  # a lost node is seen in seconds
    ) as cluster:
        found = Nodes(cluster, os.environ["RAY_TMPDIR"])
        extra = getattr(request.module, "NODE_RESOURCES", {})
        for name in ("node1", "node2"):
            found.add(name, **extra.get(name, {}))
        ray.data.DataContext.get_current().enable_progress_bars = False
        yield found
