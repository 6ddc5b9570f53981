"""The measures the benchmarks compute from what they record, on hand-made samples: the
report shows these figures, so a wrong measure would show a wrong figure without failing a run.

benchmarks/online_batch.py spreads a step's tokens over the time the step ran, not where it
ended (a prefill step runs for seconds on CPU, and a window it ends just after would lose all of
its work). Its timelines are the benchmark's rows: [seconds, rows answered, limit, batch rows in
engine, tokens generated, tokens prefilled, preemptions]. benchmarks/engine.py pairs the two
sides of each run before it takes a median, so a slow minute that slows both sides cancels.

The scripts that need the vLLM engine (engine, online_batch) cannot run here; their toy run is
every part that needs no engine (or no cluster): the workload each builds, and
each committed run's recorded samples summarised again by the script's own code, which must
give the figures the run recorded (what docs/benchmarks.md reads). A refactor that changes a
summary, or the shape of the samples it reads, fails here."""

import json
import sys
from pathlib import Path

import pytest
from support import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import engine  # the benchmarks folder is not a package: its scripts import as modules
import online_batch

RESULTS = REPO / "benchmarks" / "results"


def committed(pattern: str) -> list[Path]:
    found = sorted(RESULTS.glob(pattern))
    assert found, pattern
    return found


def sample(t: float, in_engine: int, generated: int, prefilled: int) -> list:
    return [t, 0, 256, in_engine, generated, prefilled, 0]


# An idle engine until 1 s (the last sample without rows: the step starts there, to within a
# sample), then one step prefilling 3,000 tokens that ends at 4 s, then one step generating 600
# tokens that ends at 5 s.
TIMELINE = [
    sample(0.0, 0, 0, 0),
    sample(0.5, 0, 0, 0),
    sample(1.0, 0, 0, 0),
    sample(1.5, 64, 0, 0),
    sample(2.0, 64, 0, 0),
    sample(3.0, 64, 0, 0),
    sample(4.0, 64, 0, 3000),
    sample(5.0, 64, 600, 3000),
]


def test_a_long_steps_tokens_are_spread_over_the_time_it_ran():
    # The prefill step ran from 1 s (rows entered an idle engine) to 4 s: 1,000 tokens/s.
    assert online_batch.spread_per_s(TIMELINE, [(1.0, 2.5)]) == pytest.approx(1000)
    assert online_batch.spread_per_s(TIMELINE, [(2.5, 4.0)]) == pytest.approx(1000)
    # Counted where it ended, the first window would hold nothing and the second all of it.


def test_an_idle_engine_is_not_credited_with_the_next_steps_work():
    assert online_batch.spread_per_s(TIMELINE, [(0.0, 1.0)]) == 0
    assert online_batch.spread_per_s(TIMELINE, [(4.0, 5.0)]) == pytest.approx(600)


def test_windows_add_up_to_the_whole():
    whole = online_batch.spread_per_s(TIMELINE, [(0.0, 5.0)])
    assert whole == pytest.approx(3600 / 5)
    halves = online_batch.spread_per_s(TIMELINE, [(0.0, 2.5), (2.5, 5.0)])
    assert halves == pytest.approx(whole)


def test_idle_windows_follow_the_bursts_and_stop_at_the_jobs_end():
    # Bursts from 2 s, 5 s on and 10 s off; the job ends 3 s into its third idle window.
    assert online_batch.idle_windows(2.0, 5.0, 10.0, 40.0) == [
        (7.0, 17.0),
        (22.0, 32.0),
        (37.0, 40.0),
    ]
    assert online_batch.idle_windows(2.0, 5.0, 10.0, 7.0) == []  # ended in the first burst


def _pass(tokens_per_s: float, cpu_us: int = 500) -> dict:
    return {
        "output_tokens_per_s": tokens_per_s,
        "cpu_us_per_row_outside_engine": cpu_us,
        "errors": 0,
    }


def test_ratio_pairs_the_sides_of_each_run_and_takes_the_median():
    # Run 2 is slow on both sides (a noisy minute): its pair still reads 1.0x.
    runs = [
        {"raw": {"passes": [_pass(400)]}, "relayllm": {"passes": [_pass(380)]}},
        {"raw": {"passes": [_pass(200)]}, "relayllm": {"passes": [_pass(200)]}},
        {"raw": {"passes": [_pass(410)]}, "relayllm": {"passes": [_pass(369)]}},
    ]
    (row,) = engine.summarize(runs, [64])
    assert row["ratio"] == {"median": 0.95, "min": 0.9, "max": 1.0}
    assert row["raw_tokens_per_s"] == {"median": 400, "min": 200, "max": 410}
    assert row["target_met"] is True
    runs[0]["relayllm"]["passes"][0]["output_tokens_per_s"] = 300  # 0.75x
    assert engine.summarize(runs, [64])[0]["target_met"] is False


def test_cpu_by_kind_counts_only_what_was_spent_between_snapshots():
    before = {1: ("driver", 2.0), 2: ("engine", 10.0)}
    after = {1: ("driver", 2.5), 2: ("engine", 14.0), 3: ("replica", 0.75)}
    assert engine.cpu_by_kind(before, after) == {"driver": 0.5, "engine": 4.0, "replica": 0.75}


@pytest.mark.parametrize("path", committed("engine*.json"), ids=lambda p: p.stem)
def test_engines_summary_of_each_committed_run_is_what_the_run_recorded(path):
    run = json.loads(path.read_text())
    assert engine.summarize(run["raw_runs"], run["rows"]) == run["summary"]


@pytest.mark.parametrize("path", committed("online_batch-*.json"), ids=lambda p: p.stem)
def test_online_batchs_summary_of_each_committed_run_is_what_the_run_recorded(path):
    run = json.loads(path.read_text())
    summary = online_batch.summarise(run["variants"], run["settings"]["idle_s"])
    for variant, recorded in run["summary"].items():
        # A figure added since the run was summarised is new, never a changed one.
        assert {k: summary[variant][k] for k in recorded} == recorded, variant


def test_the_engine_scripts_workloads_are_what_their_engines_are_sent():
    chats = engine.prompts(5)
    assert len(chats) == 5 and all(c[-1]["role"] == "user" for c in chats)
