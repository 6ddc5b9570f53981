"""No behaviour of relayllm rests on two processes' wall clocks agreeing (they may run on nodes
whose clocks differ): the control-state actor tells how long ago it changed as a duration on
its own clock, the stage compares that with how long it waited by its own, and the batch
service's stage workers stop on a signal, not on their clock passing the batch's deadline
(that one: tests/unit/service/test_runner.py)."""

from __future__ import annotations

import ast
import asyncio
import math
from pathlib import Path

import relayllm
from relayllm.serving.control_state import ControlState

SRC = Path(relayllm.__file__).parent
#: Code that runs on any node and reasons about a time another process set.
ANY_NODE = [
    *sorted((SRC / "stage").glob("*.py")),
    SRC / "serving" / "control_state.py",
    SRC / "serving" / "follower.py",
]


def _wall_clock_calls(path: Path) -> list[int]:
    return [
        node.lineno
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "time"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "time"
    ]


def test_the_state_actor_tells_durations_on_its_own_clock():
    async def scenario():
        state = ControlState()
        before = await state.since_change()
        await state.update({"paused": "wait"})
        after = await state.since_change()
        return before, after, await state.get()

    (_, never), (state, ago), (_, shared) = asyncio.run(scenario())
    assert never == math.inf, "no change yet: no pause can have held a call"
    assert 0 <= ago < 60 and state["paused"] == "wait"
    # Nothing in the state a follower reads is a time: nothing to compare with another clock.
    assert set(shared) == {"paused", "adapters", "weights", "weights_pending"}


def test_code_that_runs_on_any_node_reads_no_wall_clock():
    found = {p.name: lines for p in ANY_NODE if (lines := _wall_clock_calls(p))}
    assert not found, f"time.time() where another node's time may be compared: {found}"
