"""The benchmarks' echo contenders at a small size, in the default gate: the scripts still
run, relayllm's stage moves rows faster than ray.data.llm's Serve stage on the same echo
deployment, the README's pattern gives the rows a hand-written client gives, and its row
functions run inside the stage (one Ray Data operator, not a map operator each, which would
cost a task and an Arrow round trip per row). No timing figure is asserted beyond the
comparison; the figures come from the full benchmarks."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import overhead  # the benchmarks folder is not a package: its scripts import as modules
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
