"""Question 5: one engine shared by two steps against one engine per step
(results/multiturn.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import chart, met, provenance, render, table


def _chart(data: dict[str, Any]) -> str:
    results = data["results"]

    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
        names = [r["variant"] for r in results]
        for ax, key, label in [
            (axes[0], "wall_s", "wall time, engine start included (s)"),
            (axes[1], "peak_rss_gib", "peak memory of the run's cluster (GiB)"),
        ]:
            values = [r[key] for r in results]
            bars = ax.barh(names, values, color=["#1f77b4", "#7f7f7f"])
            ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=8, padding=3)
            ax.invert_yaxis()
            ax.set_xlabel(label)
        fig.suptitle(
            f"Two-step pipeline, {data['rows']} rows: one shared engine vs one engine per step",
            fontsize=10,
        )
        return fig

    return chart("multiturn.png", draw)


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["multiturn"]
    rows = data["results"]
    variants = table(
        [
            "variant",
            "engines",
            "model loads",
            "rows",
            "errors",
            "wall (s)",
            "rows/s",
            "engine ready (s)",
            "pipeline (s)",
            "peak GiB",
        ],
        "lrrrrrrrrr",
        (
            (
                r["variant"],
                r["engines"],
                r["model_loads"],
                r["rows"],
                r["errors"],
                f"{r['wall_s']:.1f}",
                f"{r['rows_per_s']:.2f}",
                f"{r['engine_ready_s']:.1f}",
                f"{r['pipeline_s']:.1f}",
                f"{r['peak_rss_gib']:.2f}",
            )
            for r in rows
        ),
    )
    targets = table(
        ["target", "measured", ""],
        "lll",
        [
            (
                data["target"],
                f"model loads {rows[0]['model_loads']} vs {rows[1]['model_loads']}; shared "
                f"{data['speedup_shared_vs_separate']:.2f}x as fast end to end (one run)",
                met(data["target_met"]),
            )
        ],
    )
    return render(
        "multiturn",
        first=data["max_tokens"][0],
        second=data["max_tokens"][1],
        batch_size=data["batch_size"],
        provenance=provenance("multiturn", data),
        png=_chart(data),
        variants=variants,
        targets=targets,
    ) + [""]
