"""The batch service after the whole cluster is lost: every Ray process of a ``ray start``
cluster SIGKILLed mid-batch (no graceful stop, as when the head machine goes down), then a new
cluster and ``relayllm serve`` again with the same ``--state-dir``: the unfinished batch
resumes from its output, each ``custom_id`` exactly once, none lost.

Two clusters of the test's own, one after the other (no ``ray_session``): the state directory
on disk is all that carries over."""

import pytest
from batch_api import chat_lines, finished_lines, lines_of, submit, wait
from support import cli, free_port, ray_head_node, wait_started

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


def serve(path, state, env):
    """``relayllm serve`` on the cluster ``env`` names; the client of the gateway it starts."""
    from batch_api import client

    served = cli(
        "serve", path, "--port", free_port(), "--direct-port", 0, "--state-dir", state,
        "--batch-size", 2, env={**env, "RELAYLLM_API_KEYS": f"team={KEY}"}, check=0,
    )  # fmt: skip
    return client(served.stdout.split("base URL: ")[1].split()[0], KEY)


def test_a_batch_resumes_each_line_once_after_the_cluster_is_lost_and_served_again(tmp_path):
    path, state = tmp_path / "deployments.yaml", tmp_path / "state"
    path.write_text(DEPLOYMENTS)
    ids = [f"c{i}" for i in range(LINES)]

    with ray_head_node("rlsvc-", kill=True) as (head, log, env):
        wait_started(head, log)
        api = serve(path, state, env)
        created = submit(api, chat_lines(LINES, model="slow", prefix="c"))
        before = wait(api, created.id, finished_lines(8), timeout=120)
        assert before.status == "in_progress", before
        assert 0 < before.request_counts.completed < LINES
    assert head.poll() is not None  # the whole cluster is gone, mid-batch

    with ray_head_node("rlsvc-") as (head, log, env):
        wait_started(head, log)
        api = serve(path, state, env)  # a new gateway and runner on the same state
        batch = wait(api, created.id, timeout=300)
        assert batch.status == "completed", batch
        assert batch.request_counts.completed == LINES
        done = lines_of(api, batch.output_file_id) + lines_of(api, batch.error_file_id)
        assert sorted(line["custom_id"] for line in done) == sorted(ids)  # none lost or twice
        assert all(line["response"]["status_code"] == 200 for line in done)
        cli("shutdown", "--gateways", env=env, check=0)
