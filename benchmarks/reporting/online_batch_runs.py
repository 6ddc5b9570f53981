"""The committed runs of question 9 by kind, and the measures read from a run's record.

Every ``online_batch-*.json`` in benchmarks/results/ is a run of the current controller (runs
of earlier controllers are in results/history/, for the frozen page that cites them). A kind is
read from what a run recorded, never from a chosen list of names: the host (runs of the second
host are named ``online_batch-host2-*``, and no median pools them with the first host's),
whether it ran the continuous phase (full) or the bursts only, the idle windows' length and the
engine's step budget. The claim tests read the same kinds, so a new run joins every figure and
claim of its kind.
"""

from __future__ import annotations

import itertools
import statistics
from pathlib import Path
from typing import Any

from reporting.common import runs

SECOND_HOST = "online_batch-host2-"


def every_run() -> list[tuple[Path, dict[str, Any]]]:
    return runs("online_batch-*.json")


def first_host() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, r) for p, r in every_run() if not p.name.startswith(SECOND_HOST)]


def second_host() -> list[tuple[Path, dict[str, Any]]]:
    return [(p, r) for p, r in every_run() if p.name.startswith(SECOND_HOST)]


def is_full(run: dict[str, Any]) -> bool:
    """A full run measured interactive traffic alone and beside batch (the p99 target)."""
    return "together" in (run["settings"].get("phases") or [])


def step_budget(run: dict[str, Any]) -> str:
    return str(run["settings"].get("max_num_batched_tokens") or "default")


def full(found: list[tuple[Path, dict[str, Any]]]) -> list[tuple[Path, dict[str, Any]]]:
    return [(p, r) for p, r in found if is_full(r)]


def windows(
    found: list[tuple[Path, dict[str, Any]]], idle_s: float
) -> list[tuple[Path, dict[str, Any]]]:
    """The runs whose idle windows between bursts last ``idle_s``."""
    return [(p, r) for p, r in found if r["settings"]["idle_s"] == idle_s]


def with_alone_timeline(
    found: list[tuple[Path, dict[str, Any]]],
) -> list[tuple[Path, dict[str, Any]]]:
    """Runs that kept the batch-alone job's timeline (what step lengths and waves are read
    from, and what the idle windows' engine work is measured against)."""
    return [(p, r) for p, r in found if managed(r)["batch_alone"].get("timeline")]


def summary(run: dict[str, Any]) -> dict[str, Any]:
    return run["summary"]["managed"]


def managed(run: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in run["variants"] if v["variant"] == "managed")


def values(found: list[tuple[Path, dict[str, Any]]], key: str) -> list[float]:
    """One summary measure over runs, leaving out the runs that did not record it."""
    return [summary(r)[key] for _, r in found if summary(r).get(key) is not None]


def median(known: list[Any]) -> float | None:
    known = [v for v in known if v is not None]
    return statistics.median(known) if known else None


def waves(run: dict[str, Any]) -> tuple[float, float] | None:
    """How rows leave the engine in a batch-alone job: the median rows per move of the
    deployment's row count, and the median seconds between moves (from its timeline)."""
    timeline = managed(run)["batch_alone"].get("timeline")
    if not timeline:
        return None
    moves = [(b[0], b[1] - a[1]) for a, b in itertools.pairwise(timeline) if b[1] > a[1]]
    if len(moves) < 3:
        return None
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(moves)]
    return statistics.median(rows for _, rows in moves), statistics.median(gaps)


def longest_step(timeline: list[list[Any]]) -> float:
    """The longest time the engine's step counters (tokens generated and prefilled) stood
    still while batch rows were in the engine: one step's length, to within a sample."""
    longest, since = 0.0, None
    for before, sample in itertools.pairwise(timeline):
        if sample[4] != before[4] or sample[5] != before[5] or not sample[3]:
            since = None
            continue
        since = before[0] if since is None else since
        longest = max(longest, sample[0] - since)
    return longest


def p99(run: dict[str, Any], phase: str) -> float | None:
    """A full run's interactive p99 TTFT in one phase (None in a bursts-only run)."""
    found = managed(run).get(phase)
    return found.get("interactive", found)["ttft_p99_s"] if found else None


def rows_in_engine_at_burst_ends(run: dict[str, Any]) -> float | None:
    """From the bursts phase's timeline: the batch rows the engine held as each burst ended,
    which the idle window after it starts with."""
    bursts = managed(run)["bursts"]
    timeline = bursts.get("timeline")
    if not timeline:
        return None
    period = bursts["burst_s"] + run["settings"]["idle_s"]
    end, ends = bursts["bursts_began_s"] + bursts["burst_s"], []
    while end < timeline[-1][0]:
        held = [sample[3] for sample in timeline if sample[0] <= end]
        if held and held[-1] is not None:
            ends.append(held[-1])
        end += period
    return statistics.median(ends) if ends else None


def slowest(phase: dict[str, Any]) -> str:
    samples = phase.get("ttft_by_start_s")
    if not samples:
        return "not recorded"
    at, ttft = max(samples, key=lambda s: s[1] or 0)
    return f"{ttft:.1f} s at {at:.1f} s"


def slowest_e2e(run: dict[str, Any]) -> str:
    """The continuous phase's user asks again ``think_s`` after each answer, so the gap
    between two starts is the first request's end-to-end time plus ``think_s``."""
    starts = [at for at, _ in managed(run)["batch_with_interactive"]["ttft_by_start_s"]]
    think_s = run["settings"]["think_s"]
    gaps = [(b - a - think_s, a) for a, b in zip(starts, starts[1:], strict=False)]
    e2e, at = max(gaps)
    return f"{e2e:.1f} s at {at:.1f} s"


def names(found: list[tuple[Path, dict[str, Any]]]) -> str:
    return ", ".join(f"results/{p.name}" for p, _ in found)
