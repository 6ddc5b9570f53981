"""What the README and docs/benchmarks.md say about online and batch traffic on one engine (#16)
holds for the committed runs of the current controller: full runs (online_batch-jobid-N.json)
and bursts-only runs (online_batch-idleS-N.json, S the idle windows' length), and the runs on a
second host (online_batch-host2-*.json), which no median pools with the first's. A new run that
breaks a claim fails here until the words are changed. No engine runs here."""

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT / "benchmarks"))
import report  # noqa: E402 (the benchmarks folder is not a package)


def _summaries(pattern: str) -> list[tuple[str, dict]]:
    found = []
    for path in sorted(RESULTS.glob(pattern)):
        run = report._run(path)
        found.append((path.stem, run["settings"], run["summary"]["managed"]))
    assert found, f"no committed results match {pattern}"
    return found


def test_interactive_p99_with_batch_stayed_within_1_5x_alone_in_every_full_run():
    over = {
        name: s["ttft_p99_ratio_with_batch"]
        for name, _, s in _summaries("online_batch-jobid-*.json")
        if s["ttft_p99_ratio_with_batch"] > 1.5
    }
    assert not over


def test_the_engine_did_at_least_0_9x_of_batch_alones_work_in_each_10_s_run_that_measured_it():
    runs = _summaries("online_batch-jobid-*.json") + _summaries("online_batch-idle10-*.json")
    work = {
        name: s["idle_engine_work_ratio"] for name, _, s in runs if s.get("idle_engine_work_ratio")
    }
    assert len(work) >= 3
    assert min(work.values()) >= 0.9, work


def test_rows_finishing_fall_short_in_10_s_windows_and_come_closer_in_30_s_windows():
    ten = _summaries("online_batch-jobid-*.json") + _summaries("online_batch-idle10-*.json")
    thirty = [
        s for _, settings, s in _summaries("online_batch-idle*-*.json") if settings["idle_s"] == 30
    ]
    assert thirty
    ten_median = statistics.median(s["idle_batch_rows_per_s_ratio"] for _, _, s in ten)
    thirty_median = statistics.median(s["idle_batch_rows_per_s_ratio"] for s in thirty)
    assert ten_median < 0.9
    assert thirty_median > ten_median


def test_no_batch_row_failed_in_any_run():
    runs = (
        _summaries("online_batch-jobid-*.json")
        + _summaries("online_batch-idle*-*.json")
        + _summaries("online_batch-host2-*.json")
    )
    assert all(s["batch_errors"] == 0 for _, _, s in runs)


def test_on_the_second_host_no_full_run_kept_p99_within_1_5x_and_the_scaled_targets_came_closest():
    # The README says the 1.5x target was not met there, and that targets scaled to the host
    # with the 512-token step budget came closest; a run that says otherwise changes the words.
    full = [
        (s["ttft_p99_ratio_with_batch"], settings)
        for _, settings, s in _summaries("online_batch-host2-*.json")
        if "ttft_p99_ratio_with_batch" in s
    ]
    assert full and min(ratio for ratio, _ in full) > 1.5, full
    _, closest = min(full, key=lambda run: run[0])
    assert closest["target_ttft_s"] < 0.15 and closest["max_num_batched_tokens"] == 512, closest


def test_the_page_shows_where_the_targets_stand_from_the_committed_runs():
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    lines = report._targets_now() + report.second_host_runs()
    missing = [line for line in lines if line and line not in page]
    assert not missing, f"docs/benchmarks.md is stale: run python benchmarks/report.py\n{missing}"
