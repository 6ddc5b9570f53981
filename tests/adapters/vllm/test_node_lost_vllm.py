"""A worker node lost mid-job on the real engine, run as ``benchmarks/nodes.py --backend vllm``
at toy size: a head and two worker nodes on this machine (each a raylet of its own), one
demo-model replica on each, the two-step pipeline ``relayllm run`` runs, and one node SIGKILLed
-- its raylet and every process under it, engine included -- once a fifth of the rows are out,
the node whose replica has calls in flight (only that job: ``--skip-baseline``, no time ratio).
Every row comes back once, none as an error, with no manual step.

Two engines at once: it runs with the faults, after every other engine of this tier stopped."""

import json
import os
import subprocess
import sys

from support import REPO
from vllm_support import stop_others

#: Enough for the job to be under way at a fifth of its rows (about 10 s on the demo model).
ROWS = 160


def test_a_node_lost_mid_job_loses_no_row_on_the_demo_model(ray_session, tmp_path):
    stop_others()  # the two engines below are the machine's only ones
    env = {**os.environ, "BENCHMARK_RESULTS_DIR": str(tmp_path)}
    env.pop("RAY_ADDRESS", None)  # the script starts its own cluster
    done = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "nodes.py"), "--backend", "vllm"]
        + ["--rows", str(ROWS), "--results-name", "nodes-vllm", "--skip-baseline"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    loss = json.loads((tmp_path / "nodes-vllm.json").read_text())["node_loss"]
    assert loss["kill_at_rows"] == ROWS // 5
    lost = loss["node_lost"]
    assert lost["killed_at_s"] is not None, "the node was killed during the job"
    assert lost["calls_in_flight_on_lost_node"] >= 1, "its replica had work when it went"
    assert (lost["rows"], lost["distinct"], lost["error_rows"]) == (ROWS, ROWS, 0), lost
    assert loss["baseline"] is None, "--skip-baseline ran only the job that loses a node"
