"""Placement across nodes on a real multi-node cluster: ``placement.max_replicas_per_node``
puts each replica on a node of its own; a deployment that fits the cluster's total but not
its nodes is refused before Serve starts; a batch's stop signal reaches a worker on another
node (the key-value store in the GCS, not a local flag file), and the real stage's workers
there send no line once it is raised."""

from __future__ import annotations

import time

import pytest

from relayllm import DeploymentConfig, ResourceFitError


def spread(replicas: int) -> DeploymentConfig:
    return DeploymentConfig(
        name="spread",
        backend="echo",
        num_replicas=replicas,
        ray_actor_options={"num_cpus": 0.1},
        placement={"max_replicas_per_node": 1},
    )


def test_max_replicas_per_node_puts_each_replica_on_a_node_of_its_own(nodes):
    import relayllm

    relayllm.deploy(spread(3))
    try:
        on = sorted(nodes.replicas("spread").values())
        assert on == ["head", "node1", "node2"], on
    finally:
        relayllm.shutdown("spread")


def test_more_replicas_than_nodes_allow_are_refused_before_serve_starts(nodes):
    from ray import serve

    import relayllm

    with pytest.raises(ResourceFitError) as err:
        relayllm.deploy(spread(4))  # three nodes, at most one replica on each
    message = str(err.value)
    assert "only 3 of them fit on the cluster's nodes" in message, message
    assert "at most 1 on one node" in message and "nodes: " in message, message
    assert "relayllm-spread" not in serve.status().applications, "nothing was started"


def test_a_stop_signal_reaches_a_worker_on_another_node(nodes):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from relayllm.batch.stop import StopCheck, clear_stop, raise_stop

    @ray.remote(num_cpus=0.1)
    class Worker:
        def node(self) -> str:
            return ray.get_runtime_context().get_node_id()

        def stopped(self, check: StopCheck) -> bool:
            return check()

    worker = Worker.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(nodes.node_id("node2"), soft=False)
    ).remote()
    check = StopCheck(flag=None, key="cluster-test.1")
    assert ray.get(worker.node.remote()) == nodes.node_id("node2")
    assert not ray.get(worker.stopped.remote(check)), "no signal yet"
    raise_stop("cluster-test.1")
    try:
        deadline = time.monotonic() + 30
        while not ray.get(worker.stopped.remote(check)):
            assert time.monotonic() < deadline, "the stop never reached node2"
            time.sleep(0.2)
    finally:
        clear_stop("cluster-test.1")
        ray.kill(worker)


def test_a_stop_raised_on_the_head_stops_the_real_stage_on_another_node(nodes, tmp_path):
    """Through the real stage (``run_scanned``, the path of ``relayllm batch`` and the batch
    service's runner): its workers on node2, the signal raised by this process on the head
    before the run. The first run sends and writes no line; under a key not raised, the same
    file runs whole on node2. Where the stage asked is recorded by a ``StopCheck`` that notes
    its node."""
    import io
    from dataclasses import dataclass
    from pathlib import Path

    import ray
    from ray.data import DataContext

    import relayllm
    from relayllm.batch.ray_job import run_scanned
    from relayllm.batch.scan import scan_batch_file
    from relayllm.batch.stop import StopCheck, clear_stop, raise_stop
    from relayllm.blocks import stage_batch
    from relayllm.deployments import handle_for

    @dataclass(frozen=True)
    class Noted(StopCheck):
        notes: str = ""

        def __call__(self) -> bool:
            (Path(self.notes) / ray.get_runtime_context().get_node_id()).touch()
            return super().__call__()

    class Stopped(Exception):
        pass

    blocks: list[tuple[int, int]] = []

    def on_block(completed: int, failed: int) -> None:
        blocks.append((completed, failed))
        raise Stopped  # ends the run, as the runner does once it sees its stop

    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            f'{{"custom_id": "c{i}", "url": "/v1/chat/completions", '
            f'"body": {{"messages": [{{"role": "user", "content": "hi {i}"}}]}}}}\n'
            for i in range(40)
        )
    )
    notes = tmp_path / "notes"
    notes.mkdir()
    relayllm.deploy(
        DeploymentConfig(
            name="stopped",
            backend="echo",
            ray_actor_options={"num_cpus": 0.1, "resources": {"head": 1}},
        )
    )
    context = DataContext.get_current()
    before = context.execution_options.label_selector
    # The stage's workers on node2; the read task keeps its own pin to this (the head) node.
    context.execution_options.label_selector = {"ray.io/node-id": nodes.node_id("node2")}
    key = f"cluster-stage-{tmp_path.name}"
    fields = {"batch_size": 8, "concurrency": 1}
    try:
        raise_stop(key)
        scan = scan_batch_file(str(path), stage_batch(8))
        out, err = io.StringIO(), io.StringIO()
        stop = Noted(key=key, notes=str(notes))
        with pytest.raises(Stopped):
            run_scanned(scan, ["stopped"], "stopped", out, err, fields, None, on_block, stop)
        assert blocks == [(0, 0)] and out.getvalue() == err.getvalue() == "", "no line written"
        assert handle_for("stopped").info.remote().result(timeout_s=30)["rows"] == 0, "none sent"
        assert {p.name for p in notes.iterdir()} == {nodes.node_id("node2")}, "asked on node2"
        # A worker process remembers a raised key (the signal is never lowered mid-run):
        # the same file again under a key never raised.
        fresh = Noted(key=key + "-unraised", notes=str(notes))
        counts = run_scanned(scan, ["stopped"], "stopped", out, err, fields, None, None, fresh)
        assert counts["completed"] == 40 and len(out.getvalue().splitlines()) == 40
    finally:
        context.execution_options.label_selector = before
        clear_stop(key)
        relayllm.shutdown("stopped")
