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
    node = next(n["id"] for n in hosts.nodes() if n["ip"] == victim.address and n["alive"])
    wait_for(lambda: lines(out) >= CUT_AT or job.poll() is not None, f"{CUT_AT} rows out")
    assert job.poll() is None, f"the job ended before the cut: {job.stdout.read()[-3000:]!r}"
    victim.partition()
    try:
        # The event, not a clock: Ray's GCS declares the unreachable node dead.
        wait_for(
            lambda: not any(n["alive"] for n in hosts.nodes() if n["id"] == node),
            f"Ray declared {victim.name}'s node dead",
            timeout_s=90,
            period_s=1,
        )
    finally:
        victim.restore()
    output, _ = job.communicate(timeout=400)
    assert job.returncode == 0, output[-3000:]
    check_rows(out)
