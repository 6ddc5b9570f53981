"""Run by test_engine_node_lost.py in its own process: a three-node Ray cluster on one machine.

The head node runs the driver and the Ray Data stage actors (it alone has CPUs); two "engine"
nodes have no CPUs but an ``engine`` resource the echo replica needs. Mid-job, the node that
hosts the replica is lost: its raylet and every process under it SIGKILLed, no graceful
stop. Prints one JSON line with what happened.
"""

import json
import sys
import threading
import time
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.testing import enable_echo_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # support

from support import NODE_HEALTH_CHECKS, ray_cluster

N = 2000


@ray.remote(num_cpus=0)
class Attempts:
    """How many attempts each stage call took (one entry per call, in the order they ended)."""

    def __init__(self) -> None:
        self.per_call: list[int] = []

    def add(self, attempts: int) -> None:
        self.per_call.append(attempts)

    def all(self) -> list[int]:
        return self.per_call


def count_attempts() -> None:
    """Runs in each of the job's worker processes as it starts (Ray's worker setup hook): the
    stage's retry loop reports how many attempts each call took. The retry policy itself is
    relayllm's own, unchanged."""
    from relayllm.stage import udf

    retried = udf.call_with_retries

    async def counted(attempt, **options):
        attempts = 0

        async def one():
            nonlocal attempts
            attempts += 1
            return await attempt()

        try:
            return await retried(one, **options)
        finally:
            ray.get_actor("attempts").add.remote(attempts)

    udf.call_with_retries = counted


def main() -> None:
    hook = {"worker_process_setup_hook": count_attempts}
    with ray_cluster(2, nodes=True, runtime_env=hook, system_config=NODE_HEALTH_CHECKS) as cluster:
        job(cluster)


def job(cluster) -> None:
    engine_nodes = [cluster.add_node(num_cpus=0, resources={"engine": 1}) for _ in range(2)]
    # On the head, which stays: the engine nodes (one of them removed below) hold no CPUs.
    attempts = Attempts.options(
        name="attempts",
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False
        ),
    ).remote()
    ray.data.DataContext.get_current().enable_progress_bars = False
    enable_echo_backend()
    ref = relayllm.deploy(
        DeploymentConfig(
            name="spread",
            backend="echo",
            options={"delay_s": 0.1},
            ray_actor_options={"num_cpus": 0, "resources": {"engine": 1}},
        )
    )
    handle = ref.handle()
    before = handle.info.remote().result(timeout_s=60)
    head = ray.get_runtime_context().get_node_id()

    proc = build_processor(
        ProcessorConfig(
            deployment="spread",
            task="completion",
            batch_size=20,
            max_retries=8,
            timeout_s=30,
        )
    )
    out: dict = {}
    job = threading.Thread(
        target=lambda: out.update(
            rows=proc(
                ray.data.from_items(
                    [{"id": i, "prompt": f"row {i}"} for i in range(N)], override_num_blocks=20
                )
            ).take_all()
        )
    )
    job.start()
    while handle.info.remote().result(timeout_s=60)["rows"] < 300:
        time.sleep(0.2)
    victim = next(n for n in engine_nodes if n.node_id == before["node_id"])
    cluster.remove_node(victim, allow_graceful=False)  # SIGKILL, as a preempted VM vanishes
    killed_at = time.monotonic()
    job.join(timeout=600)
    after = handle.info.remote().result(timeout_s=120)
    rows = out.get("rows", [])
    print(
        json.dumps(
            {
                "rows": len(rows),
                "distinct_ids": len({r["id"] for r in rows}),
                "errors": sum(1 for r in rows if r["error"]),
                "error_messages": sorted({r["error"] for r in rows if r["error"]})[:3],
                "attempts_per_call": sorted(ray.get(attempts.all.remote())),
                "replica_node_before": before["node_id"],
                "replica_node_after": after["node_id"],
                "replica_was_on_head": before["node_id"] == head,
                "seconds_to_finish_after_kill": round(time.monotonic() - killed_at, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
