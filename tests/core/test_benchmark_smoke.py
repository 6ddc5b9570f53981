"""The benchmarks' echo contenders at a small size, in the default gate: the scripts still
run, relayllm's stage moves rows faster than ray.data.llm's Serve stage on the same echo
deployment, the README's pattern gives the rows a hand-written client gives, and its row
functions run inside the stage (one Ray Data operator, not a map operator each, which would
cost a task and an Arrow round trip per row). The scale-out grid and the routing contenders run
at toy size too, their output read back. No timing figure is
asserted beyond the comparison and the scale-out's ceiling; the figures come from the full
benchmarks. What the engine scripts accept is checked in
tests/unit/core/test_benchmark_commands.py."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import overhead  # the benchmarks folder is not a package: its scripts import as modules
import routing
import scaleout
import userpath

pytestmark = pytest.mark.usefixtures("ray_session")

ROWS = 2000
USERPATH_ROWS = 1000


@pytest.fixture(scope="module")
def echo(ray_session):
    ray_session.data.DataContext.get_current().enable_progress_bars = False
    overhead.deploy_echo()
    yield
    import relayllm

    relayllm.shutdown(overhead.DEPLOYMENT)


def test_relayllm_stage_is_faster_than_ray_data_llm_on_the_same_deployment(echo):
    ds = overhead.dataset(ROWS, blocks=4)
    ours = overhead.measure(overhead.run_relayllm, ds, ROWS)
    theirs = overhead.measure(overhead.run_ray_data_llm, ds, ROWS)
    assert ours["rows_per_s"] > theirs["rows_per_s"]


# "tasks" is ProcessorConfig's default: the pattern exactly as the README writes it.
COMPUTE = pytest.mark.parametrize("compute", ["tasks", "actors"])


@COMPUTE
def test_readme_pattern_and_hand_written_client_give_the_same_rows(echo, compute):
    ds = userpath.dataset(USERPATH_ROWS, rows_per_block=250)
    ours = sorted(
        userpath.run_readme_pattern(ds, compute=compute).take_all(), key=lambda r: r["id"]
    )
    theirs = sorted(userpath.run_hand_written(ds).take_all(), key=lambda r: r["id"])
    assert len(ours) == USERPATH_ROWS
    assert [set(r) for r in ours[:1]] == [{"id", "question", "answer"}]
    assert ours == theirs


@COMPUTE
def test_row_functions_run_inside_the_stage_not_as_separate_map_operators(echo, compute):
    ds = userpath.dataset(USERPATH_ROWS, rows_per_block=250)
    stats = userpath.run_readme_pattern(ds, compute=compute).materialize().stats()
    assert {"tasks": "serve_stage", "actors": "ServeStage"}[compute] in stats
    assert "Map(ask)" not in stats and "Map(keep_answer)" not in stats, stats


def test_scaleout_grid_reports_each_setting_within_the_deployments_ceiling(echo):
    # Echo sleeping 50 ms per call with 2 calls at once: one replica serves at most
    # 2 x 64 / 0.05 = 2,560 rows/s however fast the machine, and one stage actor keeps 4 calls
    # out, so both settings here are capped by the replica.
    args = argparse.Namespace(
        delay_s=0.05,
        slots=2,
        replicas=[1],
        actors=[1, 2],
        rows_per_replica=512,
        rows_per_block=256,
        repeats=1,
    )
    try:
        grid = scaleout.grid(args)
    finally:
        import relayllm

        relayllm.shutdown(scaleout.DEPLOYMENT)
    settings = [(g["replicas"], g["stage_actors"], g["rows"]) for g in grid]
    assert settings == [(1, 1, 512), (1, 2, 512)]
    for g in grid:
        assert g["ideal_rows_per_s"] == 2 * 64 / 0.05
        assert 0 < g["end_to_end_rows_per_s"] <= g["ideal_rows_per_s"] * 1.05, g


def test_routing_contenders_answer_every_row_and_read_every_replicas_counters(echo):
    args = argparse.Namespace(
        backend="echo",
        replicas=2,
        rows=16,
        doc_words=40,
        block_words=8,
        batch_size=4,
        delay_s=0.0,
        skew_rows=32,
        repeats=1,
    )
    results = routing.measure(args)
    one, default, affinity = results["pipeline"]
    assert [e["label"] for e in results["pipeline"]] == [
        "1 replica",
        "2 replicas, default",
        "2 replicas, affinity",
    ]
    for entry in results["pipeline"] + results["skewed"]:
        run = entry["samples"][0]
        assert entry["errors"] == 0 and sum(run["rows_per_replica"]) == run["rows"] * (
            3 if entry in results["pipeline"] else 1
        ), entry
    assert len(one["samples"][0]["rows_per_replica"]) == 1
    assert len(affinity["samples"][0]["rows_per_replica"]) == 2
    # The same prompts everywhere; one replica finds every later step's prefix.
    assert one["prompt_tokens"] == default["prompt_tokens"] == affinity["prompt_tokens"]
    assert one["hit_rate"]["median"] > 0.3
    assert affinity["hit_rate"]["median"] >= 0.9 * one["hit_rate"]["median"]
