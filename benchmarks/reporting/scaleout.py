"""Question 2: throughput against replicas and stage actors on an engine of fixed capacity,
and an autoscaling deployment fed by one stage actor (results/scaleout.json)."""

from __future__ import annotations

import json
from typing import Any

from reporting.common import chart, n, provenance, render, table


def _grid_chart(data: dict[str, Any], per_replica: float) -> str:
    grid = data["grid"]

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        actors = sorted({g["stage_actors"] for g in grid})
        for a, color in zip(actors, ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"], strict=False):
            pts = sorted(
                (g["replicas"], g["steady_rows_per_s"], g["ideal_rows_per_s"])
                for g in grid
                if g["stage_actors"] == a
            )
            label = f"{a} stage actor{'s' if a > 1 else ''}"
            xs = [p[0] for p in pts]
            ax.plot(xs, [p[1] for p in pts], marker="o", color=color, label=f"{label}: measured")
            ax.plot(
                xs,
                [p[2] for p in pts],
                linestyle="--",
                color=color,
                alpha=0.6,
                label=f"{label}: ideal",
            )
        ax.set_xticks(sorted({g["replicas"] for g in grid}))
        ax.set_xlabel("replicas of the deployment")
        ax.set_ylabel("rows/s (steady state)")
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=7, ncol=2)
        ax.set_title(
            f"Scale-out: each replica {data['slots']} calls at once, "
            f"{data['delay_s'] * 1000:.0f} ms each (max {per_replica:,.0f} rows/s)",
            fontsize=10,
        )
        return fig

    return chart("scaleout.png", draw)


def _autoscaling_chart(data: dict[str, Any]) -> str:
    def draw(plt):
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for one, color in zip(data["autoscaling"], ["#1f77b4", "#d62728"], strict=False):
            ax.step(
                [p[0] for p in one["replicas_over_time"]],
                [p[1] for p in one["replicas_over_time"]],
                where="post",
                color=color,
                label=f"max_in_flight_batches={one['max_in_flight_batches']}: "
                f"{one['end_to_end_rows_per_s']:,.0f} rows/s",
            )
        ax.set_xlabel("seconds since the job started")
        ax.set_ylabel("running replicas")
        ax.set_yticks(range(0, 5))
        ax.legend(fontsize=8)
        ax.set_title(
            f"Autoscaling 1..4 replicas (target_ongoing_requests="
            f"{data['autoscaling_config']['target_ongoing_requests']}), one stage actor",
            fontsize=10,
        )
        return fig

    return chart("autoscaling.png", draw)


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["scaleout"]
    per_replica = data["slots"] * data["batch_size"] / data["delay_s"]
    grid = table(
        [
            "replicas",
            "stage actors",
            "rows",
            "rows/s steady",
            "ideal",
            "of ideal",
            "rows/s end to end",
        ],
        "rrrrrrr",
        (
            (
                g["replicas"],
                g["stage_actors"],
                f"{g['rows']:,}",
                n(g["steady_rows_per_s"]),
                n(g["ideal_rows_per_s"]),
                f"{(g['steady_rows_per_s'] or 0) / g['ideal_rows_per_s']:.0%}",
                n(g["end_to_end_rows_per_s"]),
            )
            for g in data["grid"]
        ),
    )
    lines = render(
        "scaleout",
        delay_ms=f"{data['delay_s'] * 1000:.0f}",
        delay_s=f"{data['delay_s']:g}",
        slots=data["slots"],
        per_replica=f"{per_replica:,.0f}",
        in_flight=data["max_in_flight_batches"],
        batch_size=data["batch_size"],
        rows_per_block=data.get("rows_per_block", "?"),
        provenance=provenance("scaleout", data),
        png=_grid_chart(data, per_replica),
        grid=grid,
    )
    if data.get("autoscaling"):
        runs = table(
            [
                "stage max_in_flight_batches",
                "peak replicas",
                "rows",
                "rows/s end to end",
                "seconds",
            ],
            "rrrrr",
            (
                (
                    one["max_in_flight_batches"],
                    f"{one['peak_replicas']} of {one['max_replicas']}",
                    f"{one['rows']:,}",
                    n(one["end_to_end_rows_per_s"]),
                    f"{one['seconds']:.0f}",
                )
                for one in data["autoscaling"]
            ),
        )
        lines += [""] + render(
            "autoscaling",
            config=json.dumps(data["autoscaling_config"]),
            png=_autoscaling_chart(data),
            runs=runs,
        )
    return lines + [""]
