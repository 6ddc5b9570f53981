"""Kill the node that hosts the engine replica mid-job, on a three-node cluster: no row lost."""

import json
import subprocess
import sys
from pathlib import Path


def test_losing_the_engine_node_mid_job_loses_no_rows(record_result):
    script = Path(__file__).with_name("multinode_job.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"\nmulti-node: {result}")
    assert not result["replica_was_on_head"], "the replica ran on an engine node"
    assert result["replica_node_after"] != result["replica_node_before"], "Serve moved the replica"
    assert result["rows"] == 2000 and result["distinct_ids"] == 2000, "every row exactly once"
    assert result["errors"] == 0, "retries outlasted the move"
    # The stage's retries wait out the move; minutes would mean they kept failing and backing off.
    assert result["seconds_to_finish_after_kill"] < 120
    record_result(
        "engine_node_lost",
        {k: result[k] for k in ("rows", "distinct_ids", "errors", "seconds_to_finish_after_kill")},
    )
