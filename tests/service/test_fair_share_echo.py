"""Weighted fair share on the echo backend, in turns of equal lines per weight (issue 47's
2:1 target): two projects of weights 2 and 1 (set in the quotas file), each with a large
batch waiting, on a runner that runs one batch at a time; while the other waits a turn runs
its project's weight x ``--turn-lines`` lines and gives the slot up (``--turn-s`` far
longer: the lines end the turns). Every snapshot's counts are whole turns (a turn ends at
its lines, not at a block's end), and over the stretch where both batches run the lines
completed by the weight-2 project are twice the other's, within the turns the snapshots'
edges can cut; read with the real ``openai`` client, no clock compared. (The turn logic
without a cluster: tests/unit/service/test_fair_share.py.)

One service for the module."""

import time

import pytest
from batch_api import chat_lines, client, serve_echo, submit
from support import cli

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
"""
BATCH_SIZE = 2
#: Lines the runner writes per block (batch size x the stage's calls in flight, 4).
BLOCK = 4 * BATCH_SIZE
#: A weight-1 turn's lines (--turn-lines): half a block, so a turn ends within a block.
TURN = BLOCK // 2
LINES = 32 * TURN  # per project: many turns each


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("fair-share")
    (root / "quotas.yaml").write_text("alpha: {weight: 2}\nbeta: {weight: 1}\n")
    url, address, _ = serve_echo(
        ray_session, root, DEPLOYMENTS,
        "--batch-size", BATCH_SIZE, "--max-batches", 1, "--turn-s", 600,
        "--turn-lines", TURN,
        "--quotas", root / "quotas.yaml",
    )  # fmt: skip
    from batch_api import PROJECT_KEYS

    yield {name: client(url, key) for name, key in PROJECT_KEYS.items()}
    cli("unserve", "--address", address, check=0)


def test_weights_two_to_one_complete_lines_two_to_one_while_both_wait(service):
    heavy, light = service["alpha"], service["beta"]
    batches = {
        "alpha": submit(heavy, chat_lines(LINES, prefix="h")),
        "beta": submit(light, chat_lines(LINES, prefix="l")),
    }
    snapshots = []  # (alpha's completed lines, beta's), while both are unfinished
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        a = heavy.batches.retrieve(batches["alpha"].id)
        b = light.batches.retrieve(batches["beta"].id)
        if a.status != "in_progress" and a.request_counts.completed:
            break
        if b.status != "in_progress" and b.request_counts.completed:
            break
        snapshots.append((a.request_counts.completed, b.request_counts.completed))
        time.sleep(0.2)
    both = [(a, b) for a, b in snapshots if a and b]  # once both have had a turn
    assert len(both) >= 2, f"the two batches never ran side by side: {snapshots}"
    # Turns end at their lines, not at a block's end: every count is whole turns of
    # weight-1 lines (alpha's turn is two of them; a turn begun alone ends at its first
    # block, two of them as well), and beta's turns end mid-block.
    assert all(a % TURN == 0 and b % TURN == 0 for a, b in snapshots), snapshots
    assert any(b % BLOCK for _, b in both), both
    (a0, b0), (a1, b1) = both[0], both[-1]
    gained_a, gained_b = a1 - a0, b1 - b0
    print(f"lines gained while both ran: alpha (weight 2) {gained_a}, beta {gained_b}")
    assert gained_b >= 10 * TURN, f"too short a stretch to count: {both}"
    # Stride scheduling lags its ideal by at most a turn (alpha's: 2 x TURN) either way at
    # each edge, and each snapshot reads the two batches one after the other (a turn may
    # end in between).
    assert abs(gained_a - 2 * gained_b) <= 6 * TURN, (gained_a, gained_b, both)
