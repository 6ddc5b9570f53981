"""Question 13: weighted fair share between projects in the Batch API service
(results/fair_share.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, provenance, render, table


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _last(samples: list[list[float]]) -> str:
    """Each project's lines at the round's last sample (the scheduler's own count starts at
    the batches' creation, not once both run)."""
    if not samples:
        return "–"
    _, heavy, light = samples[-1]
    return f"{heavy:,.0f} : {light:,.0f}"


def _measured(data: dict[str, Any]) -> str:
    rounds = data["rounds"]
    stretches = ", ".join(_ratio(r["ratio_stretch"]) for r in rounds)
    if data["ratio_min"] is None:
        return f"no window held both projects' progress; whole stretch {stretches}"
    return (
        f"every window's ratio from {_ratio(data['ratio_min'])} to {_ratio(data['ratio_max'])}; "
        f"whole stretch {stretches} ({len(rounds)} round(s))"
    )


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["fair_share"]
    rounds = table(
        [
            "round",
            "both running (s)",
            "windows",
            "ratio min",
            "ratio median",
            "ratio max",
            "whole stretch",
            "lines at the last sample",
            "within 10%",
        ],
        "rrrrrrrrl",
        (
            (
                number,
                f"{r['both_running_s']:.0f}",
                r["windows"],
                _ratio(r["ratio_min"]),
                _ratio(r["ratio_median"]),
                _ratio(r["ratio_max"]),
                _ratio(r["ratio_stretch"]),
                _last(r["samples"]),
                "yes" if r["within_target"] else "no",
            )
            for number, r in enumerate(data["rounds"], start=1)
        ),
    )
    targets = table(
        ["target", "measured", ""],
        "lll",
        [
            (
                data["target"],
                _measured(data),
                met(data["target_met"]),
            )
        ],
    )
    return render(
        "fair_share",
        lines=f"{data['lines']:,}",
        batch_size=data["batch_size"],
        turn_s=data["turn_s"],
        engine=f"echo sleeping {data['delay_s']} s per call"
        if data.get("delay_s")
        else "echo answering at once",
        window_s=f"{data['window_s']:.0f}",
        provenance=provenance("fair_share", data),
        rounds=rounds,
        targets=targets,
    ) + [""]
