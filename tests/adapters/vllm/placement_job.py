"""Run by test_placement_vllm.py in its own process: vLLM deployments placed on logical GPUs.

A three-node Ray cluster on one machine: a head node (the driver, Serve's controller) and two
"GPU nodes" that declare 4 GPUs each (Ray lets a node declare GPUs it does not have). The
deployments are the real vllm backend on the real Serve, built as on a GPU machine; each
replica stops at the adapter's documented seam (``VLLMEngine.create_engine``), since no
CUDA engine can start here, and reports what vLLM would have been given. Prints one JSON line.
"""

import json
import sys
import time
from pathlib import Path

import ray

import relayllm
from relayllm import DeploymentConfig
from relayllm.plugin import manager
from relayllm_vllm.backend import VLLMBackend, deployment_resources
from relayllm_vllm.engine import VLLMEngine

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # support

from support import ray_cluster

GPUS_PER_NODE = 4


class LogicalGPUEngine(VLLMEngine):
    """The vLLM engine as on a CUDA machine, up to the point where vLLM would start."""

    def platform(self):
        return "cuda", False  # what vLLM's CUDA platform answers

    def create_engine(self, plan):
        return None  # the seam: no engine; info() reports the plan


class LogicalGPUBackend(VLLMBackend):
    name = "vllm-logical-gpu"

    @classmethod
    def engine_class(cls):
        return LogicalGPUEngine

    @classmethod
    def deployment_options(cls, options):
        return deployment_resources(options, gpu=True)  # what a GPU build of vLLM gets


@relayllm.hookimpl
def relayllm_register_backends(registry):
    registry.add(LogicalGPUBackend)


def live_groups() -> dict:
    return {k: v for k, v in ray.util.placement_group_table().items() if v["state"] != "REMOVED"}


def wait_released(timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while live_groups() and time.monotonic() < deadline:
        time.sleep(0.5)
    time.sleep(1)  # resources return to the nodes right after the groups go
    return {"live_groups": len(live_groups()), "gpus_free": ray.available_resources().get("GPU", 0)}


def replica_infos(ref, replicas: int) -> dict:
    """info() of every replica (the router picks one per call)."""
    handle, seen = ref.handle(), {}
    for _ in range(200):
        info = handle.info.remote().result(timeout_s=60)
        seen[info["replica_id"]] = info
        if len(seen) == replicas:
            break
    return seen


def deploy(name: str, replicas: int, tp: int, pp: int):
    return relayllm.deploy(
        DeploymentConfig(
            name=name,
            backend="vllm-logical-gpu",
            num_replicas=replicas,
            startup_timeout_s=600,
            options={"model": "demo", "tensor_parallel_size": tp, "pipeline_parallel_size": pp},
        )
    )


def main() -> None:
    with ray_cluster(1, nodes=True) as cluster:
        job(cluster)


def job(cluster) -> None:
    gpu_nodes = [cluster.add_node(num_cpus=1, num_gpus=GPUS_PER_NODE) for _ in range(2)]
    manager.MANAGER.register(sys.modules[__name__], "placement-job")
    out: dict = {"gpu_nodes": [n.node_id for n in gpu_nodes]}

    # Two tp2 x pp2 replicas (one start): each one's group and engine plan is what a single
    # replica gets, and together they show how replicas spread over the GPU nodes.
    ref = deploy("two", 2, 2, 2)
    infos = replica_infos(ref, 2)
    groups = live_groups()
    out["replicas"] = [
        {
            k: info[k]
            for k in (
                "node_id",
                "device",
                "tensor_parallel_size",
                "pipeline_parallel_size",
                "placement_group",
                "engine_args",
            )
        }
        for info in infos.values()
    ]
    out["groups"] = {
        k: {
            "bundles": v["bundles"],
            "strategy": v["strategy"],
            "nodes": sorted(set(v["bundles_to_node_id"].values())),
        }
        for k, v in groups.items()
    }
    relayllm.shutdown("two")
    out["after_shutdown"] = wait_released()

    started = time.monotonic()
    try:
        deploy("too-big", 3, 2, 2)
        out["too_big"] = {"error": None}
    except relayllm.ConfigError as exc:
        out["too_big"] = {"error": str(exc), "type": type(exc).__name__}
    out["too_big"].update(
        seconds=round(time.monotonic() - started, 1),
        groups=len(live_groups()),
        apps=[r.name for r in relayllm.list_deployments()],
    )
    print(json.dumps(out))


if __name__ == "__main__":
    main()
