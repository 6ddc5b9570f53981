"""`relayllm run` (a two-step echo pipeline, one replica per worker node) loses a worker node
mid-job: every row comes out once, with no error. Then a node is lost while a new one joins:
the lost replica's replacement starts on the new node and the job finishes the same way.

The pipeline (support.two_step_echo_pipeline, shared with the hosts tier) calls the replicas
as actors with retries; its docstring says why the actor transport.

The two tests share the module's cluster and run in order: the first leaves node1 lost (its
replica's replacement waits for an ``engine`` slot), the second loses node2 as node3 joins.
"""

from __future__ import annotations

import threading
import time
import traceback

import pytest
from support import check_two_step_rows, two_step_echo_pipeline, wait_for

ROWS = 1000
#: The job's progress (rows out of both steps) at which a node is lost.
KILL_AT = ROWS // 5


class PipelineJob:
    """``run_pipeline`` (what `relayllm run` calls) in a thread; its rows as blocks arrive."""

    def __init__(self, spec) -> None:
        from relayllm.pipelines import run_pipeline

        self.rows: list[dict] = []
        self.summary = None
        self.failure: BaseException | None = None

        def run() -> None:
            try:
                self.summary = run_pipeline(spec, sink=self.rows.extend, keep_deployments=True)
            except BaseException as exc:  # reported by finish()
                self.failure = exc

        self.thread = threading.Thread(target=run)
        self.began = time.monotonic()
        self.thread.start()

    def wait_for_rows(self, n: int) -> None:
        wait_for(lambda: len(self.rows) >= n or not self.thread.is_alive(), f"{n} rows out")
        assert self.thread.is_alive(), f"the job ended before {n} rows: {self.failure!r}"

    def finish(self, timeout_s: float = 400) -> list[dict]:
        self.thread.join(timeout_s)
        assert not self.thread.is_alive(), "the job hung"
        # The whole chain: Ray Data wraps a stage's error in "UDF failed to process a data block".
        assert self.failure is None, "".join(traceback.format_exception(self.failure))
        self.seconds = time.monotonic() - self.began
        return self.rows


def replica_nodes(nodes) -> dict[str, str]:
    """Each running replica of ``spread``: its actor name -> the name of its node."""
    return nodes.replicas("spread")


def check_rows(rows: list[dict]) -> None:
    check_two_step_rows(rows, ROWS)


@pytest.mark.timeout(600)
def test_a_node_lost_mid_job_loses_no_row(nodes, tmp_path, record_result):
    job = PipelineJob(two_step_echo_pipeline(tmp_path, ROWS))
    job.wait_for_rows(KILL_AT)
    killed = nodes.kill("node1")
    rows = job.finish()
    check_rows(rows)
    print(f"\nnode1 lost at {KILL_AT}/{ROWS} rows ({killed} processes): {job.seconds:.1f} s")
    record_result(
        "run_node_lost",
        {"rows": len(rows), "errors": 0, "processes_killed": killed, "job_s": round(job.seconds)},
    )


@pytest.mark.timeout(600)
def test_a_node_lost_as_a_new_one_joins(nodes, tmp_path):
    job = PipelineJob(two_step_echo_pipeline(tmp_path, ROWS))
    job.wait_for_rows(KILL_AT)
    nodes.kill("node2")  # node1 is gone too: no replica runs until node3 joins
    nodes.add("node3")
    rows = job.finish()
    check_rows(rows)
    on = set(replica_nodes(nodes).values())
    assert on == {"node3"}, f"the replacement runs on the new node: {on}"
