"""Lose the node that hosts the engine replica mid-job (SIGKILL of its raylet and every process
under it), on a three-node cluster of CPU-less engine nodes: no row lost, and no stage call
spends more than three attempts (the retries wait out the move). Its own cluster, in its own
process: its workers count their attempts (a worker set-up hook of that driver)."""

from pathlib import Path

import pytest
from support import job_result, run_cluster_job


# Three nodes on one machine, started and stopped inside the script: more than pytest.ini's
# default per-test timeout allows; the script's own timeout comes first.
@pytest.mark.timeout(1200)
def test_losing_the_engine_node_mid_job_loses_no_rows(record_result):
    script = Path(__file__).with_name("engine_node_lost_job.py")
    out = run_cluster_job(script, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = job_result(out.stdout)
    print(f"\nmulti-node: {result}")
    assert not result["replica_was_on_head"], "the replica ran on an engine node"
    assert result["replica_node_after"] != result["replica_node_before"], "Serve moved the replica"
    assert result["rows"] == 2000 and result["distinct_ids"] == 2000, "every row exactly once"
    assert result["errors"] == 0, ("retries outlasted the move", result["error_messages"])
    # The stage's retries wait out the move: the calls in flight on the lost node fail once and
    # their retry waits for the new replica. A call that kept failing and backing off (8 retries
    # are ~95 s of backoff) would take more attempts, whatever the time it took.
    attempts = result["attempts_per_call"]
    assert len(attempts) >= 2000 // 20, "every call of the job reported its attempts"
    assert max(attempts) <= 3, attempts
    record_result(
        "engine_node_lost",
        {k: result[k] for k in ("rows", "distinct_ids", "errors", "seconds_to_finish_after_kill")},
    )
