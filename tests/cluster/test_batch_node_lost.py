"""One echo replica per worker node, shared by the tests in order. A weight update from a
URI (``file://``, copied by each replica) reaches the replica on every node. Then
``relayllm batch`` (the command, a driver process of its own) loses a worker node mid-job:
every ``custom_id`` comes out once, with no error line. Then the last of the two is lost as
a new node joins: the same, each line answered under the weights of the update.

The command runs as a user runs it: its own process, connected by ``RAY_ADDRESS`` (or
``--address auto``), with a Ray token at hand and ``RAY_AUTH_MODE`` unset. This module's
cluster takes no tokens; a driver that turned token authentication on anyway refused the
cluster's calls into it, and its first Serve call waited until it timed out (reported as
"cannot write None: None").

The stage calls the replicas as actors (``RELAYLLM_SERVE_TRANSPORT=actor``): the gRPC
transport re-sends a failed call once by itself, which would hide a stage without retries.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import echo_deployment, wait_for

LINES = 800
#: Lines in the output file at which a node is lost (20% of the job).
KILL_AT = LINES // 5
NAME = "spread"


@pytest.fixture(scope="module")
def spread(nodes):
    from relayllm.cluster import connect

    connect(nodes.address)
    with echo_deployment(
        NAME,
        num_replicas=2,
        options={"delay_s": 0.2},
        # One replica per worker node: each node has one `engine` slot, the head none.
        ray_actor_options={"num_cpus": 0.1, "resources": {"engine": 1}},
    ):
        yield NAME


def batch_file(path: Path, lines: int = LINES) -> Path:
    path.write_text(
        "".join(
            json.dumps(
                {
                    "custom_id": f"r{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {"model": NAME, "messages": [{"role": "user", "content": f"row {i}"}]},
                }
            )
            + "\n"
            for i in range(lines)
        )
    )
    return path


def lines_in(path: Path) -> list[dict]:
    """The complete lines written so far (a line being written is left out)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text[: text.rfind("\n") + 1].splitlines()]


def calls_in_flight(nodes) -> list[tuple[str, int]]:
    """(node, calls) of each replica of the deployment with calls in flight now, as each
    replica says (its ``info``, asked on that replica)."""
    import ray

    from relayllm import compat
    from relayllm.deployments import app_name

    found = []
    for _, actor in compat.running_replicas(app_name(NAME), NAME):
        info = ray.get(compat.call_replica(actor, app_name(NAME), "info"), timeout=30)
        if info["ongoing"]:
            found.append((nodes.name_of(info["node_id"]), info["ongoing"]))
    return found


def test_this_cluster_takes_no_token(nodes):
    """What the command's connection relies on: the cluster is seen to take calls without a
    token, so the token at hand is not sent."""
    from relayllm import compat

    assert compat.cluster_takes_no_token(nodes.address)


@pytest.mark.timeout(300)
def test_weights_from_a_uri_reach_the_replica_on_every_node(nodes, spread, tmp_path):
    import ray

    import relayllm
    from relayllm import ProcessorConfig, build_processor
    from relayllm.testing.echo import write_echo_checkpoint

    control = relayllm.control(spread)
    # On one machine any local directory is one every node reaches; each replica copies it.
    checkpoint = Path(write_echo_checkpoint(tmp_path / "v3", "v3"))
    control.update_weights(checkpoint.as_uri(), version="v3")
    served = {
        nodes.name_of(info["node_id"]): (info["weight_version"], info["weight_updates"])
        for info in control.replicas().values()
    }
    assert served == {"node1": ("v3", 1), "node2": ("v3", 1)}, served
    processor = build_processor(ProcessorConfig(deployment=spread, task="completion"))
    rows = processor(ray.data.from_items([{"prompt": f"row {i}"} for i in range(20)])).take_all()
    assert not any(r["error"] for r in rows) and {r["weight_version"] for r in rows} == {"v3"}
    assert all(r["generated_text"].startswith("[v3]") for r in rows)


def batch_command(nodes, tmp_path, lines: int = LINES, address: str | None = None):
    """``relayllm batch`` on ``lines`` lines, as a user runs it: its own process, a Ray token
    at hand and ``RAY_AUTH_MODE`` unset; joined by ``RAY_ADDRESS``, else by ``--address``.
    Returns the command, its environment and its output file."""
    out = tmp_path / "out.jsonl"
    env = nodes.env(RAY_AUTH_TOKEN=secrets.token_hex(32), RELAYLLM_SERVE_TRANSPORT="actor")
    env.pop("RAY_AUTH_MODE", None)
    command = [os.path.join(os.path.dirname(sys.executable), "relayllm"), "batch"]
    command += [str(batch_file(tmp_path / "in.jsonl", lines)), "--deployment", NAME]
    command += ["--output", str(out), "--batch-size", "10"]
    if address is not None:
        env.pop("RAY_ADDRESS")
        command += ["--address", address]
    return command, env, out


@pytest.mark.timeout(300)
def test_the_cluster_found_on_this_machine_gets_no_token_either(nodes, spread, tmp_path):
    """``--address auto`` (and no address): Ray, finding the cluster itself, would turn token
    authentication on whenever a token is at hand; relayllm finds it first, asks it once
    without a token, and joins it by its address. (This module's cluster is the one Ray's
    temp dir, private to the tier, names.)"""
    command, env, out = batch_command(nodes, tmp_path, lines=20, address="auto")
    done = subprocess.run(command, env=env, capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    ids = [line["custom_id"] for line in lines_in(out)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(20)), done.stdout.decode()[-500:]
    # The command names the cluster it found, not "auto".
    said = f"connected to the Ray cluster at {nodes.address}, found running on this machine"
    assert said in done.stderr.decode(), done.stderr.decode()[-3000:]


def run_and_lose_a_node(nodes, tmp_path, join: str | None = None) -> list[dict]:
    """``relayllm batch`` on :data:`LINES` lines; at :data:`KILL_AT` lines the node of a
    replica with calls in flight is lost (``join``: a new node joins at once). Checks the
    batch ends with every ``custom_id`` once and no error line; returns the output lines."""
    command, env, out = batch_command(nodes, tmp_path)
    err = tmp_path / "out.errors.jsonl"
    began = time.monotonic()
    job = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for(
            lambda: len(lines_in(out)) >= KILL_AT or job.poll() is not None,
            f"{KILL_AT} lines written",
            timeout_s=300,
        )
        assert job.poll() is None, f"the batch ended before {KILL_AT} lines: {job.communicate()}"
        on = set(nodes.replicas(NAME).values())
        assert on == set(nodes.by_name), f"a replica on each worker node: {on}"
        busy: list[tuple[str, int]] = []
        wait_for(lambda: busy.extend(calls_in_flight(nodes)) or busy, "a call in flight")
        lost, ongoing = busy[0]
        killed = nodes.kill(lost)  # with calls in flight: the stage must send them again
        if join:
            nodes.add(join)
        stdout, stderr = job.communicate(timeout=400)
    finally:
        if job.poll() is None:
            job.kill()
    assert job.returncode == 0, stderr.decode()[-3000:]
    written, failed = lines_in(out), lines_in(err)
    ids = [line["custom_id"] for line in written + failed]
    assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "every custom_id once"
    assert not failed, (len(failed), failed[:2])
    said = [line for line in stdout.decode().splitlines() if line.startswith('{"request_counts"')]
    assert said, stdout.decode()[-500:]
    assert json.loads(said[-1])["request_counts"] == {
        "total": LINES,
        "completed": LINES,
        "failed": 0,
    }
    print(
        f"\n{lost} lost at {KILL_AT}/{LINES} lines ({killed} processes, its replica in "
        f"{ongoing} calls){f', {join} joined' if join else ''}: "
        f"{time.monotonic() - began:.1f} s"
    )
    return written


@pytest.mark.timeout(600)
def test_a_node_lost_mid_batch_every_custom_id_once(nodes, spread, tmp_path):
    assert set(nodes.by_name) == {"node1", "node2"}
    run_and_lose_a_node(nodes, tmp_path)


@pytest.mark.timeout(600)
def test_the_last_node_lost_as_a_new_one_joins(nodes, spread, tmp_path):
    """The replica left after the test before (on node1 or node2) is lost with calls in
    flight as node3 joins: no replica runs until the replacement starts on node3, with the
    weights the first test gave (the control state outlives every replica). Each line's
    answer is echo's answer to that line, under those weights."""
    (last,) = nodes.by_name
    written = run_and_lose_a_node(nodes, tmp_path, join="node3")
    assert last not in nodes.by_name
    on = set(nodes.replicas(NAME).values())
    assert on == {"node3"}, f"the replacement runs on the new node: {on}"
    for line in written:
        answer = line["response"]["body"]["choices"][0]["message"]["content"]
        assert answer == f"[v3] row {line['custom_id'][1:]}", line
