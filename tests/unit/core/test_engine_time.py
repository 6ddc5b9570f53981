"""Engine time (issue 47): a replica's engine counts the seconds it had work, calls at once
counted once, by a clock the test sets; a run's figures give it per deployment, and a cost
only when a price per engine hour is set (no default price)."""

from __future__ import annotations

import pytest

from relayllm.env import ENGINE_HOUR_COST
from relayllm.errors import ConfigError
from relayllm.pipelines import engine_figures
from relayllm.serving import metrics as metrics_module
from relayllm.serving.metrics import ReplicaMetrics


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_overlapping_calls_count_once_and_idle_time_not_at_all(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(metrics_module.time, "monotonic", clock)
    m = ReplicaMetrics("d", "echo")
    first, second = m.engine_busy(), m.engine_busy()
    first.__enter__()  # t=100
    clock.now = 101
    second.__enter__()
    clock.now = 102
    first.__exit__(None, None, None)
    clock.now = 103
    assert m.busy_s() == 3.0  # a call still in the engine counts up to now
    second.__exit__(None, None, None)
    clock.now = 110  # idle
    with m.engine_busy():
        clock.now = 111.5
    assert m.engine_busy_s == 4.5 and m.summary()["engine_busy_s"] == 4.5


def test_a_call_that_raises_still_ends_its_busy_time(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(metrics_module.time, "monotonic", clock)
    m = ReplicaMetrics("d", "echo")
    with pytest.raises(RuntimeError), m.engine_busy():
        clock.now = 102
        raise RuntimeError("the engine failed")
    clock.now = 200
    assert m.busy_s() == 2.0


def snap(**replicas):
    return {"d": {name: (0, 0, 0, busy) for name, busy in replicas.items()}}


def test_engine_time_is_summed_over_replicas_and_priced_only_when_told():
    before, after = snap(r1=10.0, r2=5.0), snap(r1=70.0, r2=5.0, r3=1800.0)  # r3: new
    figures = engine_figures.delta(before, after)
    assert figures["d"]["engine_s"] == 1860.0 and "cost_estimate" not in figures["d"]
    priced = engine_figures.delta(before, after, {"d": 2.0})
    assert priced["d"]["cost_estimate"] == pytest.approx(1860 / 3600 * 2.0)
    assert engine_figures.delta(before, after, {"other": 9.0})["d"].keys() == figures["d"].keys()
    line = engine_figures.summary_lines(priced, {"d": ["answer"]})
    assert line.startswith("d (steps answer): engine time 1860.0 s, estimated cost 1.0333")
    assert "3 replica(s)" in line


def test_the_price_setting_is_one_price_or_one_per_deployment():
    env = ENGINE_HOUR_COST.name
    assert engine_figures.hour_costs({}) == {}
    assert engine_figures.hour_costs({env: "2.5"}) == {"*": 2.5}
    assert engine_figures.hour_costs({env: "qwen=3, echo=0"}) == {"qwen": 3.0, "echo": 0.0}
    for bad in ("cheap", "qwen=-1", "qwen="):
        with pytest.raises(ConfigError, match=env):
            engine_figures.hour_costs({env: bad})
