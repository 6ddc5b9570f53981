"""Smoke version of benchmarks/userpath.py for CI: both contenders give the same rows, and the
README's pattern runs as one Ray Data operator (its row functions inside the stage actor, the
change that took it from 0.6x the hand-written client to par). No timing is asserted here; the
figures come from the full benchmark."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import userpath

ROWS = 1000


# "tasks" is ProcessorConfig's default: the pattern exactly as the README writes it.
COMPUTE = pytest.mark.parametrize("compute", ["tasks", "actors"])


@COMPUTE
def test_readme_pattern_and_hand_written_client_give_the_same_rows(echo, compute):
    ds = userpath.dataset(ROWS, rows_per_block=250)
    ours = sorted(
        userpath.run_readme_pattern(ds, compute=compute).take_all(), key=lambda r: r["id"]
    )
    theirs = sorted(userpath.run_hand_written(ds).take_all(), key=lambda r: r["id"])
    assert len(ours) == ROWS
    assert [set(r) for r in ours[:1]] == [{"id", "question", "answer"}]
    assert ours == theirs


@COMPUTE
def test_row_functions_run_inside_the_stage_not_as_separate_map_operators(echo, compute):
    ds = userpath.dataset(ROWS, rows_per_block=250)
    stats = userpath.run_readme_pattern(ds, compute=compute).materialize().stats()
    assert {"tasks": "serve_stage", "actors": "ServeStage"}[compute] in stats
    assert "Map(ask)" not in stats and "Map(keep_answer)" not in stats, stats
