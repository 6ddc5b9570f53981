"""The batch service after the whole cluster is lost: every Ray process of a ``ray start``
cluster SIGKILLed mid-batch (no graceful stop, as when the head machine goes down), then a new
cluster and ``relayllm serve`` again with the same ``--state-dir``: the unfinished batch
resumes from its output, each ``custom_id`` exactly once, none lost.

Two clusters of the test's own, one after the other (no ``ray_session``): the state directory
on disk is all that carries over."""

import glob
import json
import os
import time

import pytest
from batch_api import chat_lines, finished_lines, lines_of, submit, wait
from support import (
    alive,
    cli,
    descendants,
    free_port,
    processes,
    ray_head_node,
    stop_process,
    wait_started,
)

openai = pytest.importorskip("openai")

KEY = "restart-key-" + "r" * 24
LINES = 48
#: One call of 2 lines at a time, a second each: the batch takes half a minute, so the cluster
#: is lost mid-batch however slowly a busy machine answers the polls.
DEPLOYMENTS = """\
deployments:
  - name: slow
    backend: echo
    max_ongoing_requests: 1
    options:
      delay_s: 1.0
"""
#: The blocks a stopped runner can leave computed and unwritten: the one it was writing,
#: those Ray Data finished for it meanwhile and those its stage worker held.
IN_FLIGHT_BLOCKS = 4


def serve(path, state, env):
    """``relayllm serve`` on the cluster ``env`` names; the client of the gateway it starts."""
    from batch_api import client

    served = cli(
        "serve", path, "--port", free_port(), "--direct-port", 0, "--state-dir", state,
        "--batch-size", 2, env={**env, "RELAYLLM_API_KEYS": f"team={KEY}"}, check=0,
    )  # fmt: skip
    return client(served.stdout.split("base URL: ")[1].split()[0], KEY)


def served_rows(env, name="slow"):
    """Rows the deployment's replica has computed so far (``relayllm status``'s counter)."""
    status = json.loads(cli("status", "--json", env=env, check=0).stdout)
    return next(d["rows"] for d in status if d.get("name") == name)


def settled_rows(env, quiet_s=3.0):
    """The replica's row counter once it has not moved for ``quiet_s`` (every call sent
    before the runner stopped has been answered; a call takes a second)."""
    rows, since = served_rows(env), time.monotonic()
    while time.monotonic() - since < quiet_s:
        now = served_rows(env)
        if now != rows:
            rows, since = now, time.monotonic()
    return rows


def work_lines(state, batch_id):
    (path,) = glob.glob(os.path.join(state, "work", batch_id, "out.*.jsonl"))
    with open(path, "rb") as work:
        return [line for line in work.read().split(b"\n")[:-1] if line.strip()]


def test_a_batch_resumes_each_line_once_after_the_cluster_is_lost_and_served_again(tmp_path):
    """The runner is stopped mid-batch (SIGSTOP: its work file stays as it is) and the
    deployment's counter read once it settles: it computed more rows than the work file
    kept (work in flight). Then every process of the cluster is SIGKILLed (the stopped runner
    before its parents: it never runs again), and the runner's and the replica's processes
    are checked gone, not only ``ray start``. The new cluster answers exactly the lines the
    work file lacked (by each answer's time) and its replica computes no line the file kept,
    the lines lost being whole blocks; each custom_id once, each body its own line's
    answer."""
    from relayllm.blocks import block_rows, stage_batch

    path, state = tmp_path / "deployments.yaml", tmp_path / "state"
    path.write_text(DEPLOYMENTS)
    ids = [f"c{i}" for i in range(LINES)]
    per_block = block_rows(LINES, stage_batch(2))

    with ray_head_node("rlsvc-", kill=True) as (head, log, env):
        wait_started(head, log)
        api = serve(path, state, env)
        created = submit(api, chat_lines(LINES, model="slow", prefix="c"))
        before = wait(api, created.id, finished_lines(8), timeout=120)
        assert before.status == "in_progress", before
        assert 0 < before.request_counts.completed < LINES
        titles = dict(processes())
        cluster = {
            pid: titles.get(pid, b"").replace(b"\0", b" ").decode(errors="replace")
            for level in descendants(head.pid)
            for pid in level
        }
        (runner,) = [pid for pid, command in cluster.items() if "BatchRunner" in command]
        replicas = [
            pid for pid, command in cluster.items() if "ServeReplica:relayllm-slow" in command
        ]
        assert replicas, cluster
        stop_process(runner)  # every thread, a write it was in the middle of done
        computed = settled_rows(env)
        kept = len(work_lines(state, created.id))
        assert before.request_counts.completed <= kept < LINES, (before, kept)
        assert computed > kept, ("no work in flight at the loss", computed, kept)
    assert head.poll() is not None  # the whole cluster is gone, mid-batch...
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {pid: cluster[pid] for pid in cluster if alive(pid)}
    assert left == {}, left  # ...the runner, the replica and every other process with it
    assert not alive(runner) and not any(alive(pid) for pid in replicas)
    after_loss = int(time.time()) + 1  # a line answered from this second on is the new cluster's

    with ray_head_node("rlsvc-") as (head, log, env):
        wait_started(head, log)
        api = serve(path, state, env)  # a new gateway and runner on the same state
        batch = wait(api, created.id, timeout=300)
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == LINES
        done = lines_of(api, batch.output_file_id)
        answered = [line["response"]["body"]["created"] for line in done]
        rewritten = sum(moment >= after_loss for moment in answered)
        lacked = LINES - kept
        # No line the file kept was answered again, and every line it lacked was.
        assert rewritten == lacked, ("answered again", answered, kept)
        # And the replica computed no line the file kept. (Its counter starts again with a
        # replica Serve replaces: hence at most.)
        resumed = served_rows(env)
        assert resumed <= lacked, ("recomputed lines the work file kept", resumed, lacked)
        # Lost: whole blocks the stage worker had been handed and the stopped runner never
        # wrote (it finishes every block it holds), never a line of a block the file kept,
        # and no more than the blocks in flight.
        lost = computed - kept
        assert lost % per_block == 0 and kept % per_block == 0, ("not whole blocks", lost, kept)
        assert lost <= IN_FLIGHT_BLOCKS * per_block, ("more than the blocks in flight", lost)
        assert batch.error_file_id is None
        ids_written = sorted(line["custom_id"] for line in done)
        assert ids_written == sorted(ids), "each custom_id exactly once: none lost, none twice"
        for line in done:
            number = line["custom_id"][1:]
            content = line["response"]["body"]["choices"][0]["message"]["content"]
            assert content == f"line {number} words", ("a body not its own line's", line)
        cli("unserve", env=env, check=0)
