"""Question 1c: the path users write (the README's preprocess/postprocess pattern and a YAML
pipeline) against hand-written clients from the same rows to the same columns
(results/userpath.json), and the stage as actors and as tasks (results/userpath-tasks-*.json).
"""

from __future__ import annotations

import statistics
from typing import Any

from reporting.common import (
    n,
    provenance,
    ratio,
    render,
    rows_label,
    spread,
    table,
    verdict,
)

#: each relayllm contender of benchmarks/userpath.py and the hand-written client it is held to
BASELINES = {
    "relayllm (README pattern)": "hand-written",
    "relayllm (README pattern, compute=tasks)": "hand-written",
    "relayllm run (YAML pipeline)": "hand-written (files)",
}


def _per_run(ours: list[dict], theirs: list[dict], key: str, invert: bool = False) -> list[float]:
    """One ratio per run: the contenders alternate within a run, so each pair shares its
    minute of the machine's load."""
    pairs = zip(ours, theirs, strict=False)
    if invert:
        return [b[key] / a[key] for a, b in pairs if a[key]]
    return [a[key] / b[key] for a, b in pairs if b[key]]


def _figures(data: dict[str, Any]) -> str:
    rows = []
    for size in data["sizes"]:
        samples = size["samples"]
        for name, runs in samples.items():
            base = samples.get(BASELINES.get(name, ""))
            speed = _per_run(runs, base, "rows_per_s") if base else []
            cpu = _per_run(runs, base, "cpu_us_per_row", invert=True) if base else []
            rows.append(
                (
                    rows_label(size["rows"]),
                    name,
                    n(statistics.median(r["rows_per_s"] for r in runs)),
                    n(statistics.median(r["cpu_us_per_row"] or 0 for r in runs)),
                    f"{n(max(r['driver_peak_rss_mib'] for r in runs))} MiB",
                    spread(speed, ratio) if speed else "",
                    spread(cpu, ratio) if cpu else "",
                    verdict(speed, 0.9, at_least=True) if speed else "",
                )
            )
    head = [
        "rows",
        "contender",
        "rows/s",
        "CPU µs/row",
        "driver peak RSS",
        "rows/s ratio",
        "CPU ratio",
        ">= 0.9x",
    ]
    return table(head, "rlrrrrrl", rows)


def _profile(data: dict[str, Any]) -> str:
    """Where the file pair's CPU goes, per process kind (median over runs, µs per row)."""
    lines = []
    for size in data["sizes"]:
        for name in ("relayllm run (YAML pipeline)", "hand-written (files)"):
            runs = size["samples"].get(name)
            if not runs:
                continue
            roles: dict[str, list[float]] = {}
            for one in runs:
                for role, seconds in one["cpu_s_by_process"].items():
                    roles.setdefault(role, []).append(seconds / size["rows"] * 1e6)
            top = sorted(((statistics.median(v), r) for r, v in roles.items()), reverse=True)[:4]
            parts = ", ".join(f"{r.removeprefix('ray::')} {us:.0f}" for us, r in top)
            lines.append(f"- {name}, {rows_label(size['rows'])} rows, CPU µs/row: {parts}")
    return "\n".join(lines)


def _actors_and_tasks(results: dict[str, dict[str, Any]]) -> str:
    """Every --with-tasks run: "N rows: Ax as actors, Bx as tasks", from its own summary."""
    lines = []
    for name, data in results.items():
        if not name.startswith("userpath-tasks"):
            continue
        found = []
        for size in data["sizes"]:
            summary = size["summary"]
            pair = [
                summary.get(f"ratio relayllm (README pattern{suffix}) / hand-written")
                for suffix in ("", ", compute=tasks")
            ]
            if None not in pair:
                found.append(
                    f"{rows_label(size['rows'])} rows: {pair[0]:.2f}x as actors, "
                    f"{pair[1]:.2f}x as tasks"
                )
        lines.append(f"- {'; '.join(found)}. {provenance(name, data)}")
    return "\n".join(lines) or "- not run yet: `python benchmarks/userpath.py --with-tasks`"


#: The day ``ProcessorConfig.compute`` began to default to tasks; userpath.json does not
#: record the compute its README-pattern contender ran with, only its date.
TASKS_DEFAULT_SINCE = "2026-11-24"


def _compute(data: dict[str, Any]) -> str:
    date = data.get("machine", {}).get("date", "")
    compute = "actors" if date and date < TASKS_DEFAULT_SINCE else "tasks"
    return f"The README pattern's stage ran as {compute} (the default on {date or 'that day'})."


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["userpath"]
    repeats = max(len(r) for s in data["sizes"] for r in s["samples"].values())
    return render(
        "userpath",
        repeats=repeats,
        provenance=provenance("userpath", data),
        compute=_compute(data),
        figures=_figures(data),
        profile=_profile(data),
        actors_and_tasks=_actors_and_tasks(results),
    ) + [""]
