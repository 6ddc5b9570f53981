"""benchmarks/engine.py's summary and docs/benchmarks.md's engine and memory sections (#20):
the ratio of each row count is the median of per-run ratios (each run's two sides paired), and
the page shows exactly what the committed result files say. No engine runs here."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import engine  # noqa: E402 (the benchmarks folder is not a package)
import report  # noqa: E402


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


@pytest.mark.parametrize(
    ("name", "section"), [("engine", report.engine_section), ("demo_memory", report.memory_section)]
)
def test_the_page_shows_the_committed_results(name, section, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "IMG", tmp_path)  # charts go to tmp, not docs/img
    data = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text())
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [line for line in section(data) if line and line not in page]
    assert not missing, f"docs/benchmarks.md is stale: run python benchmarks/report.py\n{missing}"
