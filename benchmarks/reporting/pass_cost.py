"""Question 3c: what a small pass costs before any engine work, relayllm's processor as actors
and as tasks against no-op Ray Data stages of both kinds (results/pass_cost.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import provenance, render, table


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["pass_cost"]
    summary = data["summary"]
    imports = data.get("import_s", {})
    contenders = table(
        ["contender", "median s", "min s", "max s"],
        "lrrr",
        (
            (name, f"{s['median_s']:.2f}", f"{s['min_s']:.2f}", f"{s['max_s']:.2f}")
            for name, s in summary.items()
            if isinstance(s, dict)
        ),
    )
    tasks = summary.get("relayllm processor, compute=tasks (echo)")
    actors = summary["relayllm processor (echo)"]
    as_tasks = (
        ""
        if tasks is None
        else f"As tasks, a pass takes {tasks['median_s']:.2f} s "
        f"({summary['relayllm tasks minus no-op task, median s']:.2f} s over a no-op task, "
        f"{actors['median_s'] - tasks['median_s']:.2f} s less than as actors): no actor starts, "
        "and the worker processes keep `ray.serve` imported and the deployment handle between "
        "executions."
    )
    return render(
        "pass_cost",
        rows=data["rows"],
        rounds=data["rounds"],
        provenance=provenance("pass_cost", data),
        contenders=contenders,
        extra=f"{summary['relayllm minus no-op actor, median s']:.2f}",
        serve_s=f"{imports.get('ray.serve', float('nan')):.2f}",
        relayllm_s=f"{imports.get('relayllm modules', float('nan')):.2f}",
        as_tasks=as_tasks,
    ) + [""]
