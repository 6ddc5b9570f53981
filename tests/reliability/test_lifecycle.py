"""Deployment lifecycle faults: each gives a clear error in bounded time and leaves nothing."""

import time

import pytest
import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor


def _relayllm_actors(name: str) -> list[str]:
    """Live Serve replica actors of a relayllm app (from Ray's own view of the cluster)."""
    from ray.util import list_named_actors

    return [a["name"] for a in list_named_actors(all_namespaces=True) if f"relayllm-{name}" in a["name"]]


def _placement_groups(name: str) -> list[dict]:
    table = ray.util.placement_group_table()
    return [pg for pg in table.values() if f"relayllm-{name}" in (pg.get("name") or "")
            and pg.get("state") != "REMOVED"]


def test_shutting_down_a_deployment_mid_job_fails_its_rows_in_bounded_time(background_job):
    ref = relayllm.deploy(DeploymentConfig(name="going-away", backend="echo", options={"delay_s": 0.2}))
    proc = build_processor(ProcessorConfig(deployment="going-away", task="completion", batch_size=10,
                                           timeout_s=5, max_retries=2))
    job = background_job(proc, [{"id": i, "prompt": f"r {i}"} for i in range(1500)], blocks=10)
    job.wait_until_replica_computed(ref.handle(), 200)  # well into the job
    start = time.monotonic()
    relayllm.shutdown("going-away")
    out = job.finish(timeout_s=180)
    assert len(out) == 1500 and {r["id"] for r in out} == set(range(1500))
    failed = [r for r in out if r["error"]]
    done = [r for r in out if not r["error"]]
    assert failed and done, "some rows finished before the shutdown, the rest failed"
    assert all("going-away" in r["error"] for r in failed)
    print(f"\nshutdown mid-job: {len(done)} rows done, {len(failed)} failed, "
          f"job ended {time.monotonic() - start:.1f}s after the shutdown")
    assert _relayllm_actors("going-away") == []


def test_engine_start_failure_is_bounded_and_leaves_no_actor_or_placement_group():
    start = time.monotonic()
    with pytest.raises(relayllm.DeploymentStartError):
        relayllm.deploy(DeploymentConfig(name="never-starts", backend="echo",
                                         options={"fail_start": True}, startup_timeout_s=60))
    assert time.monotonic() - start < 60
    deadline = time.monotonic() + 30
    while _relayllm_actors("never-starts") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert _relayllm_actors("never-starts") == []
    assert _placement_groups("never-starts") == []


def test_slow_start_hits_the_startup_timeout_and_is_cleaned_up():
    start = time.monotonic()
    with pytest.raises(relayllm.DeploymentStartError, match="did not start within 3s"):
        relayllm.deploy(DeploymentConfig(name="too-slow", backend="echo", startup_timeout_s=3,
                                         options={"start_delay_s": 60}))
    assert time.monotonic() - start < 30
    assert "too-slow" not in [r.name for r in relayllm.list_deployments()]
