"""A Serve replica dies mid-job: the job completes, every row exactly once, none failed."""

import os
import signal
import threading
import time

import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor


def test_replica_killed_mid_job_loses_and_duplicates_nothing():
    ref = relayllm.deploy(DeploymentConfig(name="victim", backend="echo", options={"delay_s": 0.1}))
    before = ref.handle().info.remote().result(timeout_s=30)
    rows = [{"id": i, "prompt": f"row {i}"} for i in range(2000)]
    proc = build_processor(ProcessorConfig(deployment="victim", task="completion", batch_size=20,
                                           max_retries=6, timeout_s=30))
    result: dict = {}

    def job():
        result["rows"] = proc(ray.data.from_items(rows, override_num_blocks=20)).take_all()

    worker = threading.Thread(target=job)
    worker.start()
    deadline = time.monotonic() + 60
    while ref.handle().info.remote().result(timeout_s=30)["rows"] < 300:  # well into the job
        assert time.monotonic() < deadline, "the job did not start"
        time.sleep(0.2)
    os.kill(before["pid"], signal.SIGKILL)
    worker.join(timeout=300)
    assert not worker.is_alive(), "the job hung after the replica died"

    out = result["rows"]
    ids = [r["id"] for r in out]
    assert len(ids) == 2000 and set(ids) == set(range(2000)), "every row exactly once"
    assert [r for r in out if r["error"]] == [], "retries outlasted the restart: no row failed"
    assert all(r["generated_text"] == f"row {r['id']}" for r in out), "each answer on its own row"
    after = ref.handle().info.remote().result(timeout_s=30)
    assert after["pid"] != before["pid"], "Serve restarted the replica"
    relayllm.shutdown("victim")
