"""Question 7: relayllm against ray.data.llm's own vLLM stage, one step and two steps
(results/vs_ray_data_llm.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, n, provenance, ratio, render, table


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["vs_ray_data_llm"]
    variants = table(
        ["variant", "engines", "rows/s (median)", "rows/s per engine", "wall s", "runs"],
        "lrrrrr",
        (
            (name, "—", "failed", "—", "—", 0)
            if row.get("failed")
            else (
                name,
                row["engines"],
                n(row["rows_per_s"], 2),
                n(row["rows_per_s_per_engine"], 2),
                n(row.get("wall_s"), 0),
                row["runs"],
            )
            for name, row in data["summary"].items()
        ),
    )
    ratios = data.get("ratios_relayllm_vs_raydata", {})
    one = ratios.get("1_step", {}).get("throughput")
    two = ratios.get("2_step", {}).get("throughput_per_engine")
    comparisons = table(
        ["comparison", "relayllm / ray.data.llm (medians)", "target", ""],
        "lrrl",
        [
            (
                "one step, throughput",
                ratio(one),
                ">= 1.0x",
                met(None if one is None else one >= 1.0),
            ),
            (
                "two steps, throughput per engine",
                ratio(two),
                ">= 1.5x",
                met(None if two is None else two >= 1.5),
            ),
        ],
    )
    return render(
        "vs_ray_data_llm",
        first=data["max_tokens"][0],
        second=data["max_tokens"][1],
        batch_size=data["batch_size"],
        rows=data["rows"],
        provenance=provenance("vs_ray_data_llm", data),
        variants=variants,
        comparisons=comparisons,
    ) + [""]
