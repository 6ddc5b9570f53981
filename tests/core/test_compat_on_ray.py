"""The contract with Ray's private APIs (relayllm.compat): each one checked against the
installed Ray, so a Ray upgrade that changes them fails here, by name, not inside a run."""

from __future__ import annotations

import asyncio

import pytest
from support import SHARED_ECHO

import relayllm
from relayllm import compat
from relayllm.deployments import app_name
from relayllm.rows import build_request

pytestmark = pytest.mark.usefixtures("ray_session")

ECHO = SHARED_ECHO  # the `echo` fixture's deployment: the session's, shared


def test_handle_on_this_loop_over_grpc_answers_a_call(echo):
    from ray.serve._private.handle_options import InitHandleOptions

    assert "_run_router_in_separate_loop" in InitHandleOptions.__dataclass_fields__, (
        "DeploymentHandle._init options changed; relayllm.compat.handle_on_this_loop needs updating"
    )
    request = build_request("completion", "one two", {}, None, None, "compat-1")

    async def call():
        handle = compat.handle_on_this_loop(echo.name, app_name(echo.name))
        fast = compat.grpc_transport(handle)
        assert fast.handle_options._by_reference is False
        return await fast.process_batch.remote([request])

    (result,) = asyncio.run(call())
    assert result["generated_text"] == "one two" and not result.get("error")


def test_serve_proxy_reports_whether_serve_has_an_http_proxy(echo):
    running, host, port = compat.serve_proxy()  # Serve runs: the echo deployment is up
    assert isinstance(running, bool) and isinstance(host, str) and host
    assert isinstance(port, int) and port > 0, (
        "Serve's controller proxy location or http_config changed; "
        "relayllm.compat.serve_proxy needs updating"
    )


def test_task_cpus_can_be_set_on_a_repartition(ray_session):
    dataset = ray_session.data.range(8).repartition(target_num_rows_per_block=2, strict=True)
    compat.set_task_num_cpus(dataset, 0.25)
    assert dataset._logical_plan.dag.ray_remote_args["num_cpus"] == 0.25
    assert dataset.count() == 8  # the dataset still runs with it


def test_the_head_resource_is_the_head_nodes_alone(ray_session):
    (name,) = compat.HEAD_RESOURCE
    heads = [n for n in ray_session.nodes() if n["Alive"] and name in n["Resources"]]
    assert len(heads) == 1 and heads[0]["Resources"][name] >= compat.HEAD_RESOURCE[name]


def test_live_serve_controller_names_the_running_controller_after_a_restart():
    from ray import serve

    relayllm.deploy(relayllm.DeploymentConfig(name="compat-restart", backend="echo"))
    first = compat.live_serve_controller()
    serve.shutdown()  # Serve stops; this process's cached client now points at a dead actor
    relayllm.deploy(relayllm.DeploymentConfig(name="compat-restart", backend="echo"))
    try:
        second = compat.live_serve_controller()
    finally:
        relayllm.shutdown("compat-restart")
    assert first and second and first != second, (
        "Serve's cached controller client changed; relayllm.compat.live_serve_controller needs "
        "updating"
    )


def test_a_cluster_that_takes_tokens_is_told_from_one_that_does_not(ray_session):
    """relayllm sends a token at hand only to a cluster that does not answer without one
    (this session's cluster uses tokens when Ray turned them on at its start; the cluster
    tier's takes none: tests/cluster/test_batch_node_lost.py)."""
    import os

    address = ray_session.get_runtime_context().gcs_address
    tokens = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    assert compat.cluster_takes_no_token(address) is not tokens, (
        "the GCS call relayllm.compat.cluster_takes_no_token makes changed"
    )
    assert not compat.cluster_takes_no_token("ray://127.0.0.1:1"), "a client address: unknown"
