"""Ray across hosts with addresses of their own (tests/hosts/conftest.py): the cluster is
up on those addresses, then a worker host is partitioned mid-job for longer than Ray's node
timeout and restored. One cluster for the module; the tests run in order on it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import check_two_step_rows, two_step_echo_pipeline, wait_for


def test_each_node_runs_at_its_hosts_address(hosts):
    alive = sorted(n["ip"] for n in hosts.nodes() if n["alive"])
    assert alive == [h.address for h in hosts.hosts]


ROWS = 400
#: Rows written (of the job's output) when the worker host is cut off.
CUT_AT = ROWS // 5


def lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_job(hosts, tmp_path, rows: int = ROWS) -> subprocess.Popen:
    """``relayllm run`` in host0 (the driver beside the head), writing ``out.jsonl``."""
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    spec = two_step_echo_pipeline(tmp_path, rows)
    return hosts.head.popen(
        [relayllm, "run", str(spec), "--output", str(tmp_path / "out.jsonl"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def check_rows(out: Path, rows: int = ROWS) -> None:
    check_two_step_rows([json.loads(line) for line in out.read_text().splitlines()], rows)


@pytest.mark.timeout(400)
def test_a_slow_lossy_link_loses_no_row_and_no_node(hosts, tmp_path):
    """host2's link delays every packet 50 ms each way and loses 3 %: the job finishes whole
    and Ray keeps the node (the health checks tolerate this link). Before the partition test,
    which leaves host1's node dead."""
    slow = hosts.hosts[2]
    slow.slow(delay_ms=50, loss_pct=3)
    try:
        job = run_job(hosts, tmp_path, rows=100)
        output, _ = job.communicate(timeout=300)
        assert job.returncode == 0, output[-3000:]
        check_rows(tmp_path / "out.jsonl", rows=100)
        by_ip = {n["ip"]: n["alive"] for n in hosts.nodes()}
        assert by_ip[slow.address], "the slow host's node stayed alive"
    finally:
        slow.unslow()


@pytest.mark.timeout(600)
def test_a_worker_host_partitioned_past_the_node_timeout_loses_no_row(hosts, tmp_path):
    out = tmp_path / "out.jsonl"
    job = run_job(hosts, tmp_path)
    victim = hosts.hosts[1]
    wait_for(lambda: lines(out) >= CUT_AT or job.poll() is not None, f"{CUT_AT} rows out")
    assert job.poll() is None, f"the job ended before the cut: {job.stdout.read()[-3000:]!r}"
    hosts.cut(victim)
    output, _ = job.communicate(timeout=400)
    assert job.returncode == 0, output[-3000:]
    check_rows(out)


# -- the other doors, each with both worker hosts back (hosts.rejoin) ---------------------------

#: Where Serve's HTTP proxy listens, on host0's loopback (the namespace is the run's own).
PORT = 8000
LINES = 400
CLIENTS_PY = str(Path(__file__).with_name("clients.py"))


def deployments_file(tmp_path, name: str, delay_s: float, **fields) -> Path:
    """One echo deployment of two replicas, one per worker host (each has one ``engine``
    slot, the head none)."""
    extra = "".join(f"\n    {key}: {json.dumps(value)}" for key, value in fields.items())
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(
        f"""
deployments:
  - name: {name}
    backend: echo
    num_replicas: 2
    options: {{delay_s: {delay_s}}}
    ray_actor_options: {{num_cpus: 0.1, resources: {{engine: 1}}}}{extra}
"""
    )
    return spec


def jsonl_lines(path: Path) -> list[dict]:
    """The complete lines written so far (a line being written is left out)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def relayllm_in_host0(hosts, *args, **env) -> subprocess.CompletedProcess:
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    done = hosts.head.run([relayllm, *map(str, args)], env=hosts.head.env(**env), timeout=400)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


@pytest.mark.timeout(900)
def test_relayllm_batch_through_a_partition_every_custom_id_once(hosts, tmp_path):
    """``relayllm batch`` (the command in host0, starting its deployment from ``--config``)
    while the host of a replica with calls in flight is partitioned past the node timeout and
    restored: the calls it held are sent again to the other replica, and every ``custom_id``
    comes out once, with no error line."""
    from batch_api import chat_lines, jsonl

    print(f"\nhosts back: {hosts.rejoin()}")
    (tmp_path / "in.jsonl").write_bytes(jsonl(chat_lines(LINES, model="spread")))
    out, err = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    relayllm = str(Path(sys.executable).with_name("relayllm"))
    job = hosts.head.popen(
        [relayllm, "batch", str(tmp_path / "in.jsonl"), "--output", str(out), "--batch-size", "10"]
        + ["--config", str(deployments_file(tmp_path, "spread", 0.2))],
        # Actor calls: the gRPC transport re-sends a failed call once by itself, which would
        # hide a stage without retries (tests/cluster/test_batch_node_lost.py).
        env=hosts.head.env(RELAYLLM_SERVE_TRANSPORT="actor"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(
            lambda: len(jsonl_lines(out)) >= CUT_AT or job.poll() is not None,
            f"{CUT_AT} lines written",
            timeout_s=300,
        )
        assert job.poll() is None, f"the batch ended before the cut: {job.communicate()}"
        victim, replica = hosts.busy_replica("spread")
        cut, dead = hosts.cut(victim, replica["node_id"])
        stdout, stderr = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr[-3000:]
    written, failed = jsonl_lines(out), jsonl_lines(err)
    ids = [line["custom_id"] for line in written + failed]
    assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "every custom_id once"
    assert not failed, (len(failed), failed[:2])
    said = [line for line in stdout.splitlines() if line.startswith('{"request_counts"')]
    assert json.loads(said[-1])["request_counts"] == {
        "total": LINES,
        "completed": LINES,
        "failed": 0,
    }, stdout[-500:]
    for line in written:
        answer = line["response"]["body"]["choices"][0]["message"]["content"]
        assert answer == f"line {line['custom_id'][1:]} words", line
    print(
        f"{victim.name} cut at {CUT_AT}/{LINES} lines, its replica in {replica['ongoing']} "
        f"calls; its node seen dead {dead - cut:.1f} s after the cut"
    )
