"""The Batch API service with its gateway and runner off the head node
(``ServiceSettings.node_resources``), on a state directory every node reaches (one machine:
any local directory). The runner's node is lost mid-batch: Ray starts the runner again on
the other node that offers the resource, it resumes the batch, and every ``custom_id``
comes out once. Then that node is lost too as a new one joins: the same, on the new node.

Clients talk to Serve's HTTP proxy on the head, which routes to wherever the gateway runs.
"""

from __future__ import annotations

import time

import pytest
from batch_api import chat_lines, client, lines_of, submit
from support import free_port

#: Both worker nodes may hold the service; the head holds the echo deployment.
NODE_RESOURCES = {"node1": {"service": 1}, "node2": {"service": 1}}
LINES = 600
KEY = "alpha-key-" + "a" * 24


@pytest.fixture(scope="module")
def service(nodes, tmp_path_factory):
    from ray import serve

    import relayllm
    from relayllm.batch.service.deploy import deploy_gateway, shutdown_gateway
    from relayllm.batch.service.keys import KeyMap
    from relayllm.batch.service.settings import ServiceSettings

    serve.shutdown()  # Serve takes its HTTP proxy only while nothing runs
    port = free_port()
    settings = ServiceSettings(
        state_dir=str(tmp_path_factory.mktemp("shared-state")),
        port=port,
        direct_port=None,
        batch_size=10,
        poll_s=0.5,
        node_resources={"service": 0.01},
    )
    from relayllm.cluster import connect, ensure_http_proxy

    connect(nodes.address)
    ensure_http_proxy(settings.host, settings.port)
    relayllm.deploy(
        relayllm.DeploymentConfig(
            name="echo",
            backend="echo",
            options={"delay_s": 0.05},
            ray_actor_options={"num_cpus": 0.1, "resources": {"head": 1}},
        )
    )
    deploy_gateway(settings, KeyMap([("alpha", KEY)]))
    yield settings
    shutdown_gateway()
    relayllm.shutdown()


def run_and_lose_the_runners_node(nodes, settings, join: str | None = None) -> dict:
    api = client(settings.url, KEY)
    batch = submit(api, chat_lines(LINES, model="echo"))
    deadline = time.monotonic() + 300
    while True:  # 20% of the lines done
        now = api.batches.retrieve(batch.id)
        if now.request_counts.completed >= LINES // 5:
            break
        assert now.status not in ("completed", "failed"), now
        assert time.monotonic() < deadline, "the batch did not get going"
        time.sleep(0.2)
    lost = nodes.actor_node(settings.runner_name, "relayllm")
    assert lost in ("node1", "node2"), f"the runner runs on a worker node, not {lost}"
    nodes.kill(lost)
    if join:
        nodes.add(join, service=1)
    deadline = time.monotonic() + 400
    while True:  # the gateway moves too: the proxy answers 5xx until it is back
        try:
            now = api.batches.retrieve(batch.id)
            if now.status in ("completed", "failed", "expired", "cancelled"):
                break
        except Exception:
            pass
        assert time.monotonic() < deadline, "the batch did not finish"
        time.sleep(0.5)
    assert now.status == "completed", now
    out = lines_of(api, now.output_file_id)
    ids = [line["custom_id"] for line in out]
    assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "every custom_id once"
    assert len(ids) == len(set(ids))
    assert not lines_of(api, now.error_file_id), "no error line"
    return {"lost": lost, "now_on": nodes.actor_node(settings.runner_name, "relayllm")}


@pytest.mark.timeout(600)
def test_the_runners_node_lost_mid_batch_every_line_once(nodes, service):
    where = run_and_lose_the_runners_node(nodes, service)
    other = {"node1": "node2", "node2": "node1"}[where["lost"]]
    assert where["now_on"] == other, where


@pytest.mark.timeout(600)
def test_the_runners_last_node_lost_as_a_new_one_joins(nodes, service):
    where = run_and_lose_the_runners_node(nodes, service, join="node3")
    assert where["now_on"] == "node3", where
