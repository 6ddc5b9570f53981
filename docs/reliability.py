"""Write the measured figures of docs/reliability.md from docs/results/reliability.json.

    export RELAYLLM_RESULTS_FILE=docs/results/reliability.json   # else a temporary file
    pytest tests/reliability tests/cluster tests/adapters/vllm/test_engine_faults.py  # records
    python docs/reliability.py                                           # rewrites the table
    python docs/reliability.py --check   # exit 1 if the page differs from its source

Every figure in the generated table was asserted by the test that recorded it (the bound is
in the last column); a fault with no recorded run says so instead of showing an old number.
Tests record into a temporary file unless told otherwise, so the committed source changes only
when someone means to record, and the page is regenerated in the same change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
RESULTS = HERE / "results" / "reliability.json"
PAGE = HERE / "reliability.md"
START, END = "<!-- figures:start -->", "<!-- figures:end -->"

VLLM_FAULT_BOUND = (
    "0 lost, 0 error rows, <= 64 recomputed; the old replica ended its own process (Serve did "
    "not have to kill it); job done within a cap shorter than one call's timeout"
)

#: key -> (fault, how a result reads, the bound its test asserts)
ROWS = {
    "vllm_engine_killed": (
        "vLLM EngineCore killed (SIGKILL) once 32 of the 128 engine rows of a 2-step job of "
        "64 rows are done",
        "killed after {rows_before_fault} engine rows; {rows} rows, {error_rows} error rows, "
        "{rows_recomputed} rows computed twice; new "
        "replica started {replica_replaced_s} s and its engine ready {new_engine_ready_s} s "
        "after the kill; job done {job_end_after_fault_s} s after it",
        VLLM_FAULT_BOUND,
    ),
    "vllm_engine_hung": (
        "vLLM EngineCore stopped (SIGSTOP) the same way",
        "stopped after {rows_before_fault} engine rows; {rows} rows, {error_rows} error rows, "
        "{rows_recomputed} rows computed twice; new "
        "replica started {replica_replaced_s} s and its engine ready {new_engine_ready_s} s "
        "after the stop; job done {job_end_after_fault_s} s after it",
        VLLM_FAULT_BOUND,
    ),
    "replica_killed": (
        "Serve replica killed (SIGKILL), echo, 2,000 rows",
        "{rows} rows, {distinct} distinct, {error_rows} error rows",
        "every row once, 0 errors",
    ),
    "engine_node_lost": (
        "Engine node lost (SIGKILL), 3-node cluster, echo, 2,000 rows",
        "{rows} rows, {distinct_ids} distinct, {errors} errors; job done "
        "{seconds_to_finish_after_kill} s after the node died",
        "every row once, 0 errors, each call within 3 attempts",
    ),
    "driver_killed": (
        "Driver of run_pipeline killed (SIGKILL) and run again with resume, 3,000 rows",
        "{rows} rows; {saved_at_kill} on disk at the kill; {rows_recomputed} computed twice",
        "every row once; the second run computes only the rows the file lacks; "
        "<= a block per stage task + 2 blocks recomputed (800)",
    ),
    "overload": (
        "4 pipelines, 100,000 rows, one echo deployment with max_ongoing_requests=2",
        "{seconds} s, peak concurrent calls {peak_ongoing}, driver peak RSS "
        "{driver_peak_mib} MiB, stage process peak RSS {stage_actor_peak_mib} MiB",
        "0 errors, peak <= 2, stage < 1 GiB, driver < 2 GiB",
    ),
    "shutdown_mid_job": (
        "Deployment shut down mid-job, 1,500 rows",
        "{done} rows done, {failed} with the fail-fast error; job ended "
        "{job_end_after_shutdown_s} s after the shutdown",
        "< 30 s (92 s before the fail-fast check)",
    ),
    "vllm_engine_too_big_s": (
        "vLLM engine asked for a KV cache of 4x the node's memory",
        "DeploymentStartError (asked vs available GiB) after {value} s, before any engine "
        "process started; no actor left",
        "< 300 s, nothing left",
    ),
    "engine_start_failure_s": (
        "Engine fails to start (constructor raises; a placement group reserved)",
        "DeploymentStartError after {value} s; no actor, no placement group left",
        "the start's own failure, not the 60 s startup deadline; nothing left",
    ),
}


def render(results: dict) -> str:
    lines = ["| fault | measured (last recorded run) | asserted |", "|---|---|---|"]
    for key, (fault, measured, bound) in ROWS.items():
        value = results.get(key)
        if value is None:
            lines.append(f"| {fault} | not recorded yet | {bound} |")
            continue
        fields = value if isinstance(value, dict) else {"value": value}
        lines.append(f"| {fault} | {measured.format(**fields)} | {bound} |")
    return "\n".join(lines)


def page(results_path: Path = RESULTS, page_path: Path = PAGE) -> str:
    """The page as the results file makes it: the text around the markers kept as written."""
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    head, rest = page_path.read_text().split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{render(results)}\n{END}{tail}"


def main(argv: list[str]) -> int:
    expected = page()
    if "--check" in argv:
        if PAGE.read_text() != expected:
            print(f"{PAGE} differs from {RESULTS}: run python docs/reliability.py")
            return 1
        return 0
    PAGE.write_text(expected)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
