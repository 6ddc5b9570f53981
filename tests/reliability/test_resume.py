"""A driver killed with SIGKILL mid-job; run again on the same output: every row exactly once."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import relayllm
from relayllm import DeploymentConfig
from relayllm.resume import completed_ids, content_id, read_output

N = 3000
JOB = """
import json, sys, ray, relayllm
from relayllm import ProcessorConfig, build_processor
from relayllm.resume import run_resumable
ray.init(address=sys.argv[1], log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
rows = [{"id": i, "prompt": f"row {i}"} for i in range(int(sys.argv[3]))]
proc = build_processor(ProcessorConfig(deployment="resumable", task="completion", batch_size=25,
                                       max_in_flight_batches=2))
report = run_resumable(ray.data.from_items(rows, override_num_blocks=60), proc, sys.argv[2], "id")
print(json.dumps({"already_done": report.already_done, "written": report.written}))
"""


def _job(address, out, n=N):
    return subprocess.Popen(
        [sys.executable, "-c", JOB, address, str(out), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_killed_driver_resumes_where_it_stopped(ray_session, tmp_path, record_result):
    ref = relayllm.deploy(
        DeploymentConfig(name="resumable", backend="echo", options={"delay_s": 0.05})
    )
    address = ray_session.get_runtime_context().gcs_address
    out = tmp_path / "out"

    first = _job(address, out)
    deadline = time.monotonic() + 120
    while len(list(out.glob("part-*.jsonl"))) < 10:
        assert first.poll() is None, "the first run ended before it could be killed"
        assert time.monotonic() < deadline, "no output appeared"
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    done_at_kill = len(completed_ids(out, "id"))
    assert 0 < done_at_kill < N

    second = _job(address, out)
    stdout, _ = second.communicate(timeout=300)
    assert second.returncode == 0
    report = json.loads(stdout.strip().splitlines()[-1])
    total_computed = ref.handle().info.remote().result(timeout_s=30)["rows"]

    rows = read_output(out)
    ids = [r["id"] for r in rows]
    assert len(ids) == N and set(ids) == set(range(N)), "every row exactly once"
    assert all(r["error"] is None and r["generated_text"] == f"row {r['id']}" for r in rows)
    assert report["already_done"] >= done_at_kill
    assert report["already_done"] + report["written"] == N
    assert list(Path(out).glob("*.tmp")) == []
    lost = total_computed - N  # rows the engine computed twice because of the crash
    # At most the rows inside the stage when it died: up to 4 Ray Data batches per actor
    # (Ray Data's async limit), each batch_size * max_in_flight_batches = 50 rows.
    assert lost <= 4 * 50, f"{lost} rows recomputed"
    print(f"\nresume: {done_at_kill} rows saved at the kill, {lost} rows recomputed")
    record_result(
        "driver_killed",
        {"rows": len(ids), "saved_at_kill": done_at_kill, "rows_recomputed": lost, "bound": 4 * 50},
    )
    relayllm.shutdown("resumable")


def test_content_ids_are_stable_and_used_without_an_id_column(ray_session, tmp_path):
    import ray

    from relayllm import ProcessorConfig, build_processor
    from relayllm.resume import ROW_ID_COLUMN, run_resumable

    relayllm.deploy(DeploymentConfig(name="content-ids", backend="echo"))
    rows = [{"prompt": f"text {i}"} for i in range(50)]
    proc = build_processor(ProcessorConfig(deployment="content-ids", task="completion"))
    first = run_resumable(ray.data.from_items(rows[:30]), proc, tmp_path, None)
    second = run_resumable(ray.data.from_items(rows), proc, tmp_path, None)
    relayllm.shutdown("content-ids")
    assert (first.written, second.already_done, second.written) == (30, 30, 20)
    out = read_output(tmp_path)
    assert sorted(r[ROW_ID_COLUMN] for r in out) == sorted(content_id(r) for r in rows)
    assert content_id({"b": 1, "a": 2}) == content_id({"a": 2, "b": 1})
