"""Question 14: the usage ledger's overhead in the Batch API service, with and without it
side by side (results/ledger.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, n, provenance, render, table

SIDES = (("ledger-on", "with the ledger"), ("ledger-off", "without (--no-record-usage)"))


def _spread(figure: dict[str, float], digits: int = 0) -> str:
    return f"{n(figure['median'], digits)} ({n(figure['min'], digits)}–{n(figure['max'], digits)})"


def _charged(counts: list[int]) -> str:
    """The lines each run's ledger charged: one figure when every run charged as many."""
    if len(set(counts)) == 1:
        return f"{counts[0]:,} in each run"
    return ", ".join(f"{c:,}" for c in counts)


def _alone(data: dict[str, Any]) -> str:
    """The ledger's own work, measured alone, against the service's CPU per line."""
    alone = data.get("charge_alone")
    if alone is None:
        return "not measured in this run"
    service = data["summary"]["ledger-on"]["cpu_us_per_line"]["median"]
    return (
        f"{alone['cpu_us_per_line']:.1f} µs of CPU per line ({alone['wall_us_per_line']:.1f} µs "
        f"wall), blocks of {alone['block']} lines: "
        f"{alone['cpu_us_per_line'] / service * 100:.1f}% of the {service:.0f} µs of CPU the "
        f"service spent per line with the ledger"
    )


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["ledger"]
    summary = data["summary"]
    sides = table(
        ["gateway", "batch lines/s", "driver lines/s", "CPU µs per line", "lines charged"],
        "lrrrr",
        (
            (
                label,
                _spread(summary[side]["batch_lines_per_s"]),
                _spread(summary[side]["lines_per_s"]),
                _spread(summary[side]["cpu_us_per_line"]),
                _charged([r[side]["charged"] for r in data["rounds"]]),
            )
            for side, label in SIDES
        ),
    )
    rounds = table(
        ["round", "order", "with (batch lines/s)", "without", "with / without"],
        "rlrrr",
        (
            (
                number,
                " then ".join("with" if s == "ledger-on" else "without" for s in r["order"]),
                n(r["ledger-on"]["batch_lines_per_s"]),
                n(r["ledger-off"]["batch_lines_per_s"]),
                f"{ratio:.3f}",
            )
            for number, (r, ratio) in enumerate(
                zip(data["rounds"], summary["ratios_by_round"], strict=True), start=1
            )
        ),
    )
    off = summary["ledger-off"]["batch_lines_per_s"]
    targets = table(
        ["target", "measured", ""],
        "lll",
        [
            (
                "throughput with the ledger within the spread of without",
                f"median with {n(summary['ledger-on']['batch_lines_per_s']['median'])} "
                f"lines/s; without {n(off['min'])}–{n(off['max'])} (spread "
                f"{summary['spread_without'] * 100:.1f}% of its median); ratio of the "
                f"medians {summary['ratio']:.3f}",
                met(summary["within_spread"]),
            )
        ],
    )
    return render(
        "ledger",
        lines=f"{data['lines']:,}",
        rounds_count=len(data["rounds"]),
        batch_size=data["batch_size"],
        concurrency=data["concurrency"],
        provenance=provenance("ledger", data),
        load_end=f"{data['load_average_at_end']:.1f}",
        sides=sides,
        rounds=rounds,
        targets=targets,
        alone=_alone(data),
    ) + [""]
