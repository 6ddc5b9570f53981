"""A Serve replica dies mid-job: the job completes, every row exactly once, none failed."""

import os
import signal
import time

import pytest
from support import actor_death_reason

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor

pytestmark = pytest.mark.usefixtures("ray_session")


def test_replica_killed_mid_job_loses_and_duplicates_nothing(background_job, record_result):
    ref = relayllm.deploy(DeploymentConfig(name="victim", backend="echo", options={"delay_s": 0.1}))
    before = ref.handle().info.remote().result(timeout_s=30)
    rows = [{"id": i, "prompt": f"row {i}"} for i in range(2000)]
    proc = build_processor(
        ProcessorConfig(
            deployment="victim", task="completion", batch_size=20, max_retries=6, timeout_s=30
        )
    )
    job = background_job(proc, rows, blocks=20)
    job.wait_until_replica_computed(ref.handle(), 300)  # well into the job
    os.kill(before["pid"], signal.SIGKILL)
    out = job.finish(timeout_s=300)
    ids = [r["id"] for r in out]
    assert len(ids) == 2000 and set(ids) == set(range(2000)), "every row exactly once"
    assert [r for r in out if r["error"]] == [], "retries outlasted the restart: no row failed"
    assert all(r["generated_text"] == f"row {r['id']}" for r in out), "each answer on its own row"
    after = ref.handle().info.remote().result(timeout_s=30)
    assert after["pid"] != before["pid"], "Serve restarted the replica"
    record_result(
        "replica_killed",
        {
            "rows": len(ids),
            "distinct": len(set(ids)),
            "error_rows": sum(1 for r in out if r["error"]),
        },
    )
    relayllm.shutdown("victim")


def test_an_engine_that_dies_fails_its_calls_not_its_rows(background_job):
    """The replica's engine dies (EngineFailedError, what vLLM's EngineDeadError becomes):
    the replica retires, Serve starts another, the stage retries there. Before, every row in
    the dead engine got the engine's error."""
    ref = relayllm.deploy(
        DeploymentConfig(
            name="engine-dies",
            backend="echo",
            options={"delay_s": 0.05, "engine_dies_after_rows": 400},
        )
    )
    first = ref.handle().info.remote().result(timeout_s=30)
    proc = build_processor(
        ProcessorConfig(
            deployment="engine-dies", task="completion", batch_size=20, max_retries=6, timeout_s=60
        )
    )
    out = background_job(
        proc, [{"id": i, "prompt": f"row {i}"} for i in range(1000)], blocks=10
    ).finish(300)
    ids = [r["id"] for r in out]
    assert sorted(ids) == list(range(1000)), "every row exactly once"
    assert [r["error"] for r in out if r["error"]] == [], "no row got the engine's failure"
    assert all(r["generated_text"] == f"row {r['id']}" for r in out)
    last = ref.handle().info.remote().result(timeout_s=30)
    assert last["pid"] != first["pid"], "the replica retired and Serve started another"
    # It ended its own process when its engine died, rather than waiting for Serve to kill it
    # after three failed health checks (RAY_KILL).
    assert actor_death_reason(first["pid"]) == "WORKER_DIED"
    relayllm.shutdown("engine-dies")


def test_an_engine_that_hangs_is_found_by_the_health_check_and_loses_no_row(background_job):
    """The replica's engine stops answering (calls wait forever, as on a SIGSTOPped vLLM
    EngineCore): the health check finds it, the calls waiting on it fail at once (they would
    otherwise wait for timeout_s), the replica retires and the stage retries elsewhere."""
    ref = relayllm.deploy(
        DeploymentConfig(
            name="engine-hangs",
            backend="echo",
            options={"delay_s": 0.05, "engine_hangs_after_rows": 400},
            health_check_period_s=1,
            health_check_timeout_s=10,
        )
    )
    first = ref.handle().info.remote().result(timeout_s=30)
    proc = build_processor(
        ProcessorConfig(
            # timeout_s far above the bound below: the calls must not be freed by timing out
            deployment="engine-hangs",
            task="completion",
            batch_size=20,
            max_retries=6,
            timeout_s=600,
        )
    )
    started = time.monotonic()
    out = background_job(
        proc, [{"id": i, "prompt": f"row {i}"} for i in range(1000)], blocks=10
    ).finish(300)
    elapsed = time.monotonic() - started
    ids = [r["id"] for r in out]
    assert sorted(ids) == list(range(1000)), "every row exactly once"
    assert [r["error"] for r in out if r["error"]] == [], "no row got the hang as its error"
    last = ref.handle().info.remote().result(timeout_s=30)
    assert last["pid"] != first["pid"], "the replica retired and Serve started another"
    assert actor_death_reason(first["pid"]) == "WORKER_DIED", "it retired on the first check"
    assert elapsed < 300, "the hung calls were freed by the health check, not by timeout_s"
    relayllm.shutdown("engine-hangs")
