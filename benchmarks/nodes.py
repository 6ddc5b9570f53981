"""Many nodes, simulated on one machine: a head and worker nodes (``ray.cluster_utils.Cluster``,
each node a raylet of its own), echo replicas with fractional CPUs spread across them.

    python benchmarks/nodes.py                       # 4, 8, 16 replicas over 4 nodes; node loss
    python benchmarks/nodes.py --backend vllm --rows 160 --results-name nodes-vllm

1. The control fan-out and ``relayllm status`` as replicas grow: for each replica count, the
   deployment is spread evenly over the nodes (``placement.max_replicas_per_node``), then
   ``relayllm.control(NAME).pause()`` and ``.resume()`` are timed ``--repeats`` times each (one
   call writes the state actor, then calls every replica and waits for each to apply it), and
   the ``relayllm status`` command (a new process: connect, list, ask every replica) is timed
   ``--status-repeats`` times.
2. A node lost mid-job: a two-step echo pipeline of ``--rows`` rows with one replica on each of
   two worker nodes (``run_pipeline``, what ``relayllm run`` calls), timed as it is, then again
   with one of the two nodes SIGKILLed (its raylet and every process under it) once 20% of the
   rows are out -- the one whose replica has calls in flight then: every row once, error rows
   counted, and the ratio of the two times.

Echo's replicas ask 0.05 CPU: what is measured is relayllm's and Ray's own work (a control
call's round trips, a listing), which a GPU cluster does the same way. Writes
benchmarks/results/nodes.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from _common import host_facts, write_results  # the script's folder is on sys.path

NODES = 4  # the head and three worker nodes
DEPLOYMENT = "bench-nodes"


def start_cluster(workers: int) -> tuple[Any, list[Any]]:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "resources": {"head": 100}, "include_dashboard": False},
    )
    nodes = [
        cluster.add_node(
            num_cpus=1,
            resources={f"node{i + 1}": 100, "engine": 1},
            object_store_memory=80 * 2**20,
        )
        for i in range(workers)
    ]
    ray.init(address=cluster.address, namespace="relayllm", log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    return cluster, nodes


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "p50": round(statistics.median(ordered), 3),
        "p90": round(ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 3),
        "min": round(ordered[0], 3),
        "max": round(ordered[-1], 3),
    }


def fan_out(replicas: int, repeats: int, status_repeats: int, address: str) -> dict[str, Any]:
    import relayllm
    from relayllm import DeploymentConfig

    began = time.monotonic()
    relayllm.deploy(
        DeploymentConfig(
            name=DEPLOYMENT,
            backend="echo",
            num_replicas=replicas,
            ray_actor_options={"num_cpus": 0.05},
            placement={"max_replicas_per_node": -(-replicas // NODES)},
            startup_timeout_s=900,
        )
    )
    deploy_s = time.monotonic() - began
    control = relayllm.control(DEPLOYMENT)
    pause, resume = [], []
    for _ in range(repeats):
        t0 = time.monotonic()
        control.pause()
        t1 = time.monotonic()
        control.resume()
        pause.append(t1 - t0)
        resume.append(time.monotonic() - t1)
    env = {**os.environ, "RAY_ADDRESS": address, "RELAYLLM_ECHO_BACKEND": "1"}
    status = []
    relayllm_cli = str(Path(sys.executable).parent / "relayllm")
    for _ in range(status_repeats):
        t0 = time.monotonic()
        done = subprocess.run([relayllm_cli, "status"], env=env, capture_output=True, text=True)
        status.append(time.monotonic() - t0)
        assert done.returncode == 0, done.stderr[-2000:]
    relayllm.shutdown(DEPLOYMENT)
    return {
        "replicas": replicas,
        "deploy_s": round(deploy_s, 1),
        "pause_s": percentiles(pause),
        "resume_s": percentiles(resume),
        "status_s": percentiles(status),
    }


def pipeline_file(folder: Path, rows: int, backend: str = "echo") -> Path:
    """The two-step job, on echo (``delay_s`` per call) or on the demo model (``vllm``: 8
    greedy tokens per answer, longer call timeouts for a CPU engine)."""
    data = folder / "rows.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"row {i}"}) + "\n" for i in range(rows)))
    spec = folder / "pipeline.yaml"
    if backend == "vllm":
        engine = "backend: vllm, options: {model: demo, max_model_len: 1024}"
        cpus = 0.5
        step = (
            "    batch_size: 8\n    max_retries: 8\n    timeout_s: 300\n"
            "    sampling_params: {temperature: 0.0, max_tokens: 8}\n"
        )
    else:
        engine, cpus = "backend: echo, options: {delay_s: 0.05}", 0.1
        step = "    batch_size: 20\n    max_retries: 8\n    timeout_s: 30\n"
    spec.write_text(
        "deployments:\n"
        f"  - {{name: {DEPLOYMENT}, {engine}, num_replicas: 2,\n"
        f"     ray_actor_options: {{num_cpus: {cpus}, resources: {{engine: 1}}}}}}\n"
        f"input: {{path: {data}, id_column: id}}\n"
        "steps:\n"
        f"  - name: answer\n    deployment: {DEPLOYMENT}\n    prompt: '{{q}}'\n{step}"
        "    output_column: answer\n"
        f"  - name: again\n    deployment: {DEPLOYMENT}\n    prompt: 'again {{answer}}'\n{step}"
        "    output_column: again\n"
    )
    return spec


def kill_node(cluster: Any, node: Any) -> None:
    """SIGKILL the node's raylet and every process under it at once, as a VM vanishes."""
    raylet = node.all_processes["raylet"][0].process.pid
    parents = {}
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if proc.name.isdigit():
                fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
                parents[int(proc.name)] = int(fields[1])
    tree, frontier = {raylet}, {raylet}
    while frontier:
        frontier = {p for p, parent in parents.items() if parent in frontier} - tree
        tree |= frontier
    for pid in tree:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    cluster.remove_node(node, allow_graceful=False)


def busy_node(nodes: list[Any], job: threading.Thread, timeout_s: float = 120.0) -> tuple[Any, int]:
    """The worker node whose replica has calls in flight, and how many: losing it is what
    the job must survive (a node whose replica is idle at that moment costs nothing)."""
    import relayllm

    by_id = {str(node.node_id): node for node in nodes}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not job.is_alive():
            raise RuntimeError("the job ended before a node was lost: give it more --rows")
        for info in relayllm.control(DEPLOYMENT).replicas().values():
            if info.get("ongoing") and info.get("node_id") in by_id:
                return by_id[info["node_id"]], int(info["ongoing"])
        time.sleep(0.05)
    raise TimeoutError(f"no replica on {sorted(by_id)} had a call in flight for {timeout_s:g}s")


def timed_job(spec: Path, kill_at: int | None = None, victims=None) -> dict[str, Any]:
    """Run the pipeline; with ``kill_at``, once that many rows are out, lose the node (of
    ``victims``: the cluster and its candidate nodes) whose replica has calls in flight."""
    from relayllm.pipelines import run_pipeline

    rows: list[dict] = []
    began = time.monotonic()
    job = threading.Thread(
        target=lambda: run_pipeline(spec, sink=rows.extend, keep_deployments=True)
    )
    job.start()
    killed_at = in_flight = None
    if kill_at is not None:
        while len(rows) < kill_at and job.is_alive():
            time.sleep(0.1)
        cluster, candidates = victims
        node, in_flight = busy_node(candidates, job)
        kill_node(cluster, node)
        killed_at = time.monotonic() - began
    job.join()
    ids = [r["id"] for r in rows]
    return {
        "rows": len(rows),
        "distinct": len(set(ids)),
        "error_rows": sum(1 for r in rows if r.get("error")),
        "seconds": round(time.monotonic() - began, 1),
        "killed_at_s": None if killed_at is None else round(killed_at, 1),
        "calls_in_flight_on_lost_node": in_flight,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--repeats", type=int, default=10, help="pause/resume calls per count")
    parser.add_argument("--status-repeats", type=int, default=3)
    parser.add_argument("--rows", type=int, default=3000, help="rows of the node-loss job")
    parser.add_argument(
        "--backend",
        choices=("echo", "vllm"),
        default="echo",
        help="the node-loss job's engine: echo, or the demo model on vLLM (then only the job "
        "runs, not the fan-out)",
    )
    parser.add_argument(
        "--skip-baseline",
        action="store_true",
        help="run only the job that loses a node (every row once is checked; no time ratio)",
    )
    parser.add_argument("--results-name", default="nodes")
    args = parser.parse_args()

    import ray

    from relayllm.testing import enable_echo_backend

    os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="rb"))  # no other ray.init finds it
    enable_echo_backend()
    facts = host_facts()
    counts = args.replicas if args.backend == "echo" else []
    # The fan-out spreads over three worker nodes; the node-loss job needs two.
    cluster, nodes = start_cluster(NODES - 1 if counts else 2)
    baseline = None
    try:
        fan = [fan_out(n, args.repeats, args.status_repeats, cluster.address) for n in counts]
        for row in fan:
            print(json.dumps(row), flush=True)
        # The node-loss job: one replica on each of two worker nodes (a third node leaves).
        if len(nodes) > 2:
            kill_node(cluster, nodes.pop())
        with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as warm:
            timed_job(pipeline_file(Path(warm), 40, args.backend))  # deploys; the runs reuse it
            spec = pipeline_file(Path(folder), args.rows, args.backend)
            if not args.skip_baseline:
                baseline = timed_job(spec)
                print(json.dumps({"baseline": baseline}), flush=True)
            lost = timed_job(spec, kill_at=args.rows // 5, victims=(cluster, nodes))
            print(json.dumps({"node_lost": lost}), flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
    write_results(
        args.results_name,
        {
            "host": facts,
            "nodes": NODES,
            "backend": args.backend,
            "replica_num_cpus": 0.05,
            "fan_out": fan,
            "node_loss": {
                "rows": args.rows,
                "kill_at_rows": args.rows // 5,
                "baseline": baseline,
                "node_lost": lost,
                "ratio": round(lost["seconds"] / baseline["seconds"], 2) if baseline else None,
            },
        },
    )


if __name__ == "__main__":
    main()
