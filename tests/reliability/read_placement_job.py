"""Run by test_read_placement.py in its own process: a two-node Ray cluster on one machine.

A batch file is on the driver's disk; the cluster has a second node with more CPUs, where
Ray Data would spread tasks. Every read of the file must run on the driver's node. Each
worker process reports the node its reads ran on (Ray's worker setup hook wraps the read
task; what it reads and returns is relayllm's own). Prints one JSON line.
"""

import json
import os
import sys
import tempfile
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import relayllm
from relayllm import DeploymentConfig
from relayllm.testing import enable_echo_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # support

from support import ray_cluster

LINES = 120


@ray.remote(num_cpus=0)
class ReadNodes:
    """The node of every read call, in the order they ran."""

    def __init__(self) -> None:
        self.nodes: list[str] = []

    def add(self, node: str) -> None:
        self.nodes.append(node)

    def all(self) -> list[str]:
        return self.nodes


def report_read_nodes() -> None:
    from relayllm.batch import ray_job

    read = ray_job.ReadChunk.__call__

    def reported(self, batch):
        ray.get_actor("read-nodes").add.remote(ray.get_runtime_context().get_node_id())
        return read(self, batch)

    ray_job.ReadChunk.__call__ = reported


def main() -> None:
    hook = {"worker_process_setup_hook": report_read_nodes}
    with ray_cluster(1, nodes=True, runtime_env=hook) as cluster:
        job(cluster)


def job(cluster) -> None:
    other = cluster.add_node(num_cpus=2)
    head = ray.get_runtime_context().get_node_id()
    nodes = ReadNodes.options(
        name="read-nodes",
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False),
    ).remote()
    ray.data.DataContext.get_current().enable_progress_bars = False
    enable_echo_backend()
    relayllm.deploy(DeploymentConfig(name="echo", backend="echo"))
    folder = tempfile.mkdtemp()
    path = os.path.join(folder, "input.jsonl")
    with open(path, "w") as f:
        for i in range(LINES):
            body = {"model": "echo", "messages": [{"role": "user", "content": f"line {i}"}]}
            line = {"custom_id": f"l{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**line, "body": body}) + "\n")
    counts = relayllm.run_batch_file(
        path, deployment="echo", output=os.path.join(folder, "out.jsonl"), batch_size=2
    )
    read_nodes = ray.get(nodes.all.remote())
    print(
        json.dumps(
            {
                "completed": counts.completed,
                "failed": counts.failed,
                "driver_node": head,
                "other_node": other.node_id,
                "read_nodes": read_nodes,
            }
        )
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
