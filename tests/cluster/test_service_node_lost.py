"""The Batch API service with its gateway and runner off the head node
(``ServiceSettings.node_resources``), on a state directory every node reaches (one machine:
any local directory). First the gateway and the runner, on two nodes, run a batch through
that directory. Then the runner's node is lost mid-batch (the gateway's stays): Ray starts
the runner again on the other node that offers the resource, it resumes the batch, and
every ``custom_id`` comes out once. Then that node is lost too (the gateway's with it) as a
new one joins: the same, on the new node.

Clients talk to Serve's HTTP proxy on the head, which routes to wherever the gateway runs.
"""

from __future__ import annotations

import time

import pytest
from batch_api import chat_lines, client, lines_of, submit, wait
from support import free_port, wait_for

#: Both worker nodes may hold the service; the head holds the echo deployment.
NODE_RESOURCES = {"node1": {"service": 1}, "node2": {"service": 1}}
LINES = 600
KEY = "alpha-key-" + "a" * 24


@pytest.fixture(scope="module")
def service(nodes, tmp_path_factory):
    from ray import serve

    import relayllm
    from relayllm_service.deploy import deploy_gateway, shutdown_gateway
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.keys import KeyMap

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


def where_is(nodes, settings) -> dict:
    """Where the service's parts run and which nodes Ray sees alive: what a test that waited
    in vain reports."""
    import ray

    from relayllm_service.deploy import GATEWAY_DEPLOYMENT

    return {
        "gateway": sorted(nodes.replicas(GATEWAY_DEPLOYMENT).values()),
        "runner": nodes.actor_node(settings.runner_name, "relayllm"),
        "alive": sorted(nodes.name_of(n["NodeID"]) for n in ray.nodes() if n["Alive"]),
    }


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
    last = None  # the last error, if the last try failed
    while True:  # the gateway moves too: the proxy answers 5xx until it is back
        try:
            now = api.batches.retrieve(batch.id)
            last = None
            if now.status in ("completed", "failed", "expired", "cancelled"):
                break
        except Exception as err:
            last = err
        if time.monotonic() > deadline:
            pytest.fail(
                f"the batch did not finish: {where_is(nodes, settings)}; "
                f"its last state {now!r}; the last error {last!r}"
            )
        time.sleep(0.5)
    assert now.status == "completed", now
    out = lines_of(api, now.output_file_id)
    ids = [line["custom_id"] for line in out]
    assert sorted(ids) == sorted(f"r{i}" for i in range(LINES)), "every custom_id once"
    assert len(ids) == len(set(ids))
    assert not lines_of(api, now.error_file_id), "no error line"
    return {"lost": lost, "now_on": nodes.actor_node(settings.runner_name, "relayllm")}


@pytest.mark.timeout(300)
def test_the_gateway_and_the_runner_on_two_nodes_share_the_state_directory(nodes, service):
    """The gateway writes a batch's input file to the state directory and serves its output
    from there; the runner, on another node, reads the one and writes the other. Ray puts
    both wherever ``service`` is offered, mostly together (the gateway starts the runner, and
    Ray prefers the caller's node), so the runner is started again while the gateway's node
    offers no more of it. The runner stays there for the tests after this one."""
    import ray

    from relayllm_service.deploy import GATEWAY_DEPLOYMENT
    from relayllm_service.runner.actor import start_runner, stop_runner

    class Holder:  # defined here: Ray's workers cannot import this module by its name
        """An actor that only holds the resources it was started with."""

        def ready(self) -> bool:
            return True

    (gateway,) = nodes.replicas(GATEWAY_DEPLOYMENT).values()
    stop_runner(service.runner_name)
    # Every `service` left on the gateway's node (1 less the gateway's 0.01), held meanwhile.
    hold = ray.remote(num_cpus=0, resources={gateway: 1, "service": 0.99})(Holder).remote()
    ray.get(hold.ready.remote(), timeout=60)
    try:
        start_runner(service)
        wait_for(
            lambda: nodes.actor_node(service.runner_name, "relayllm") is not None,
            "the runner started",
        )
    finally:
        ray.kill(hold)
    runner = nodes.actor_node(service.runner_name, "relayllm")
    assert {gateway, runner} == {"node1", "node2"}, (gateway, runner)
    api = client(service.url, KEY)
    batch = wait(api, submit(api, chat_lines(100, model="echo")).id, timeout=240)
    assert batch.status == "completed", batch
    out = lines_of(api, batch.output_file_id)
    assert sorted(line["custom_id"] for line in out) == sorted(f"r{i}" for i in range(100))
    assert not lines_of(api, batch.error_file_id), "no error line"
    where = (
        list(nodes.replicas(GATEWAY_DEPLOYMENT).values()),
        nodes.actor_node(service.runner_name, "relayllm"),
    )
    assert where == ([gateway], runner), f"neither moved meanwhile: {where}"


@pytest.mark.timeout(600)
def test_the_runners_node_lost_mid_batch_every_line_once(nodes, service):
    where = run_and_lose_the_runners_node(nodes, service)
    other = {"node1": "node2", "node2": "node1"}[where["lost"]]
    assert where["now_on"] == other, where


@pytest.mark.timeout(600)
def test_the_runners_last_node_lost_as_a_new_one_joins(nodes, service):
    where = run_and_lose_the_runners_node(nodes, service, join="node3")
    assert where["now_on"] == "node3", where
