"""A driver of ``relayllm.run_pipeline`` killed with SIGKILL mid-job, then run again with
``resume=True`` on the same output: every row exactly once, and what the kill cost measured.

The one resume mechanism (``relayllm.pipelines.resume``) is the library's and ``relayllm run
--resume``'s alike; the command line's own kill test is in tests/core/test_cli.py.
"""

import json
import os
import signal
import subprocess
import sys
import time

import relayllm
from relayllm import DeploymentConfig, run_pipeline
from relayllm.pipelines import load_pipeline
from relayllm.pipelines.resume import RowIds, content_id, jsonl_ids
from relayllm.pipelines.transforms import input_block_rows
from relayllm.processor import stage_workers

N = 3000
BATCH_SIZE, IN_FLIGHT = 25, 2
PIPELINE = f"""\
deployments:
  - name: resumable
    backend: echo
    options: {{delay_s: 0.05}}
input:
  path: rows.jsonl
  id_column: id
steps:
  - name: echo
    deployment: resumable
    prompt: "{{prompt}}"
    output_column: answer
    batch_size: {BATCH_SIZE}
    max_in_flight_batches: {IN_FLIGHT}
"""
JOB = """
import json, sys
import ray
from relayllm import run_pipeline
ray.data.DataContext.get_current().enable_progress_bars = False
summary = run_pipeline(sys.argv[2], output=sys.argv[3], resume=True, address=sys.argv[1])
print(json.dumps({"already_done": summary.already_done, "written": summary.rows}))
"""


def _job(address, pipeline, out):
    log = open(out.with_suffix(".log"), "a")  # noqa: SIM115 (the child's; read on failure)
    return subprocess.Popen(
        [sys.executable, "-c", JOB, address, str(pipeline), str(out)],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, "RELAYLLM_ECHO_BACKEND": "1"},  # the pipeline file names it
    )


def _settled_rows(ref, quiet_s: float = 3.0, timeout_s: float = 120.0) -> int:
    """The echo engine's count of rows computed, once it has not moved for ``quiet_s``."""
    deadline = time.monotonic() + timeout_s
    last, since = None, time.monotonic()
    while True:
        rows = ref.handle().info.remote().result(timeout_s=30)["rows"]
        if rows != last:
            last, since = rows, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return rows
        assert time.monotonic() < deadline, f"the killed job's rows still computing: {rows}"
        time.sleep(0.2)


def _lines(path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_killed_driver_resumes_where_it_stopped(ray_session, tmp_path, record_result):
    ref = relayllm.deploy(
        DeploymentConfig(name="resumable", backend="echo", options={"delay_s": 0.05})
    )
    address = ray_session.get_runtime_context().gcs_address
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"id": i, "prompt": f"row {i}"}) + "\n" for i in range(N))
    )
    pipeline = tmp_path / "resumable.yaml"
    pipeline.write_text(PIPELINE)
    out = tmp_path / "out.jsonl"

    first = _job(address, pipeline, out)
    deadline = time.monotonic() + 300
    while _lines(out) < 4 * BATCH_SIZE * IN_FLIGHT:  # a few blocks on disk: kill it now
        assert first.poll() is None, out.with_suffix(".log").read_text()[-3000:]
        assert time.monotonic() < deadline, "no output appeared"
        time.sleep(0.1)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    done_at_kill = len(jsonl_ids(out, RowIds("id")))  # also trims a line cut by the kill
    assert 0 < done_at_kill < N
    # The killed driver's stage tasks may finish the blocks they hold before Ray ends them:
    # count the engine's rows once they have stopped, so the second run is measured alone.
    computed_at_kill = _settled_rows(ref)

    second = _job(address, pipeline, out)
    stdout, _ = second.communicate(timeout=300)
    assert second.returncode == 0, out.with_suffix(".log").read_text()[-3000:]
    # The report is the job's last JSON line; Ray's raylet may print a warning after it (the
    # count of worker processes started) on the driver's stdout.
    report = json.loads(next(x for x in reversed(stdout.splitlines()) if x.startswith("{")))
    total_computed = ref.handle().info.remote().result(timeout_s=30)["rows"]

    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ids = [r["id"] for r in rows]
    assert len(ids) == N and set(ids) == set(range(N)), "every row exactly once"
    assert all(r["error"] is None and r["answer"] == f"row {r['id']}" for r in rows)
    assert report["already_done"] == done_at_kill
    assert report["already_done"] + report["written"] == N
    # Where it stopped: the second run computes the rows the file lacks, no more.
    again = total_computed - computed_at_kill - (N - done_at_kill)
    assert again == 0, f"{again} rows the file held computed again"
    lost = computed_at_kill - done_at_kill  # what the kill cost: rows computed, never saved
    # The rows between the engine and the file when the driver died: a block in each stage
    # task, which may finish it before Ray ends the dead driver's tasks, and finished blocks
    # on their way to the driver (docs/reliability.md). A block is 1/16 of this input (188
    # rows), and the reader's block count rounds down: 15 blocks of 200 rows.
    pipeline_spec = load_pipeline(pipeline)
    blocks = max(1, N // input_block_rows(pipeline_spec, N))
    block = -(-N // blocks)
    tasks, _, _ = stage_workers(pipeline_spec.spec.steps[0].processor_config())
    bound = (tasks + 2) * block
    assert lost <= bound, f"{lost} rows computed and never saved"
    print(f"\nresume: {done_at_kill} rows saved at the kill, {lost} rows recomputed")
    record_result(
        "driver_killed",
        {
            "rows": len(ids),
            "saved_at_kill": done_at_kill,
            "rows_recomputed": lost,
            "block_rows": block,
            "bound": bound,
        },
    )
    relayllm.shutdown("resumable")


def test_without_an_id_column_rows_are_known_by_their_content(ray_session, tmp_path):
    relayllm.deploy(DeploymentConfig(name="content-ids", backend="echo"))
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": f"text {i}", "n": i}) + "\n" for i in range(50))
    )
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        PIPELINE.replace("resumable", "content-ids")
        .replace("    options: {delay_s: 0.05}\n", "")
        .replace("  id_column: id\n", "")
    )
    out = tmp_path / "out.jsonl"
    try:
        first = run_pipeline(pipeline, output=str(out), limit=30)  # a plain run, stopped early
        second = run_pipeline(pipeline, output=str(out), resume=True)
    finally:
        relayllm.shutdown("content-ids")
    assert (first.rows, second.already_done, second.rows) == (30, 30, 20)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted(r["n"] for r in rows) == list(range(50)), "every row exactly once"
    assert all(r["answer"] == r["prompt"] for r in rows)
    assert content_id({"b": 1, "a": 2}) == content_id({"a": 2, "b": 1})
