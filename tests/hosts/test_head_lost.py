"""The head lost: with Ray's GCS fault tolerance (the GCS's state in a Redis server outside
the head, as KubeRay runs it), every process of the head's host is SIGKILLed while a client
calls a deployment's HTTP front through a worker host's Serve proxy; a new head is started on
the same address and store. The replicas on the worker hosts keep answering through the loss
and are the same processes after it; Serve's controller comes back on the new head and
manages them again. One cluster for the module (tests/hosts/conftest.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from support import wait_for

NAME = "survivor"
PORT = 8000
#: Answers the client must have before the head is lost, and while it is lost.
BEFORE, DURING = 20, 40


def deploy(hosts, tmp_path: Path) -> None:
    """Serve with a proxy on every node, bound to each host's address, then an echo
    deployment with an HTTP front and one replica on each worker host."""
    start = (
        "import ray; from ray import serve; ray.init(logging_level='ERROR');"
        "serve.start(proxy_location='EveryNode',"
        f" http_options={{'host': '0.0.0.0', 'port': {PORT}}})"
    )
    done = hosts.head.run([sys.executable, "-c", start], timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    spec = tmp_path / "deployments.yaml"
    spec.write_text(
        f"""
deployments:
  - name: {NAME}
    backend: echo
    num_replicas: 2
    ray_actor_options: {{num_cpus: 0.1, resources: {{engine: 1}}}}
    http: {{route_prefix: /{NAME}, host: 0.0.0.0, port: {PORT}}}
"""
    )
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    done = hosts.head.run([relayllm, "deploy", str(spec)], timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def replicas(hosts) -> dict[str, tuple[int, str]]:
    """Each replica's process and node address, as Serve's controller knows them."""
    return {r["replica_id"]: (r["pid"], r["node_ip"]) for r in hosts.replicas(NAME)}


def answers(path: Path) -> list[dict]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def test_the_http_front_answers_through_the_heads_loss_and_the_new_head_manages_it(
    hosts_with_gcs_store, tmp_path
):
    hosts = hosts_with_gcs_store
    deploy(hosts, tmp_path)
    before = replicas(hosts)
    worker_ips = {h.address for h in hosts.hosts[1:]}
    assert {ip for _, ip in before.values()} == worker_ips, before

    # The client on host2, through host1's proxy: neither is on the head.
    url = f"http://{hosts.hosts[1].address}:{PORT}/{NAME}/v1"
    stop, log = tmp_path / "stop", tmp_path / "answers.jsonl"
    with open(log, "w") as out:
        client = hosts.hosts[2].popen(
            [sys.executable, str(Path(__file__).with_name("http_load.py")), url, NAME, str(stop)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        ok = lambda: [a for a in answers(log) if a.get("ok")]  # noqa: E731
        wait_for(lambda: len(ok()) >= BEFORE, f"{BEFORE} answers before the loss", timeout_s=600)
        killed = hosts.lose_head()
        assert killed > 0
        at_loss = len(answers(log))
        wait_for(
            lambda: len([a for a in answers(log)[at_loss:] if a.get("ok")]) >= DURING,
            f"{DURING} answers while the head is lost",
            timeout_s=180,
        )
        during = answers(log)[at_loss:]
        hosts.start_head()
        hosts.wait_nodes(len(hosts.hosts), timeout_s=300)
        wait_for(lambda: replicas(hosts) == before, "the new head's Serve knows the replicas")
        after_restart = len(answers(log))
        wait_for(
            lambda: len([a for a in answers(log)[after_restart:] if a.get("ok")]) >= BEFORE,
            "answers after the new head came",
            timeout_s=180,
        )
    finally:
        stop.touch()
        client.wait(timeout=60)
    every = answers(log)
    assert every and all("ok" in a or "status" in a or "connection" in a for a in every), every
    wrong = [a for a in every if a.get("ok") is False]
    assert wrong == [], wrong  # an answer is the right one or a failure, never another's
    assert len([a for a in during if a.get("ok")]) >= DURING
    # The same replica processes before and after: the loss cost them nothing.
    assert replicas(hosts) == before
    failed = [a for a in every if not a.get("ok")]
    print(f"requests {len(every)}, failed {len(failed)}: {failed[:10]}")
