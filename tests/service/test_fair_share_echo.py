"""Weighted fair share on the echo backend, counted in lines (issue 47's 2:1 target): two
projects of weights 2 and 1 (set in the quotas file), each with a large batch waiting, on a
runner that runs one batch at a time and ends a turn at its second block while the other
waits (``--turn-s`` far shorter than a block, counted from the turn's first block). Over the
stretch where both batches run, the lines completed by the weight-2 project are twice the
other's, within the few blocks the snapshots' edges can cut; read with the real ``openai``
client, no clock compared. (Turns of unequal lines: tests/unit/core/test_fair_share.py.)

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
LINES = 24 * BLOCK  # per project: many turns each


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("fair-share")
    (root / "quotas.yaml").write_text("alpha: {weight: 2}\nbeta: {weight: 1}\n")
    url, address, _ = serve_echo(
        ray_session, root, DEPLOYMENTS,
        "--batch-size", BATCH_SIZE, "--max-batches", 1, "--turn-s", 0.01,
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
    (a0, b0), (a1, b1) = both[0], both[-1]
    gained_a, gained_b = a1 - a0, b1 - b0
    print(f"lines gained while both ran: alpha (weight 2) {gained_a}, beta {gained_b}")
    assert gained_b >= 6 * BLOCK, f"too short a stretch to count: {both}"
    # Stride scheduling lags its ideal by at most a turn either way at each edge, and each
    # snapshot reads the two batches one after the other (a block may land in between).
    assert abs(gained_a - 2 * gained_b) <= 3 * BLOCK, (gained_a, gained_b, both)
