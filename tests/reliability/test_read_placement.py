"""A batch file is read on the node whose disk holds it: on a two-node cluster, where Ray Data
would spread the read tasks (most of them to the other node, without the placement), every
read runs on the driver's node (for the batch service: the runner's, on the head node)."""

from pathlib import Path

import pytest
from support import job_result, run_cluster_job


# Two nodes on one machine, started and stopped inside the script (its own process: a second
# cluster cannot share a process with the session's).
@pytest.mark.timeout(900)
def test_every_read_of_a_batch_file_runs_on_the_drivers_node():
    script = Path(__file__).with_name("read_placement_job.py")
    out = run_cluster_job(script, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = job_result(out.stdout)
    assert (result["completed"], result["failed"]) == (120, 0)
    reads = result["read_nodes"]
    assert len(reads) >= 10, "the file was read in several chunks"
    assert set(reads) == {result["driver_node"]}, (
        f"{sum(n == result['other_node'] for n in reads)} of {len(reads)} reads ran on the "
        f"other node, whose disk need not hold the file"
    )
