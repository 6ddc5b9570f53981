"""The stage as Ray Data tasks (``ProcessorConfig(compute="tasks")``) across Serve restarts.

Stage tasks run in Ray's reused worker processes, which outlive a run and keep Serve's client
and the deployment handles: after Serve is shut down and started again, those point at a dead
controller. A run after the restart must find the new one.
"""

import pytest
import ray
from ray import serve

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor

pytestmark = pytest.mark.usefixtures("ray_session")


def _run(rows):
    config = ProcessorConfig(compute="tasks", deployment="restarted", task="completion")
    return build_processor(config)(ray.data.from_items(rows, override_num_blocks=2)).take_all()


def test_stage_tasks_find_serve_again_after_it_restarts():
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    rows = [{"id": i, "prompt": f"a{i} b"} for i in range(8)]
    relayllm.deploy(DeploymentConfig(name="restarted", backend="echo", options={"mode": "reverse"}))
    first = _run(rows)
    serve.shutdown()  # the controller, the proxy and every deployment go
    relayllm.deploy(DeploymentConfig(name="restarted", backend="echo", options={"mode": "echo"}))
    try:
        again = _run(rows)
    finally:
        relayllm.shutdown("restarted")
    assert [r["generated_text"] for r in first] == [f"b a{i}" for i in range(8)]
    assert [r["generated_text"] for r in again] == [f"a{i} b" for i in range(8)]
    assert all(r["error"] is None for r in first + again)
