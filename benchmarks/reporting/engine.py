"""Question 3a: relayllm + vLLM against raw vLLM on the same engine arguments
(results/engine.json), and the same benchmark with the stage as actors
(results/engine-actors.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import COLORS, chart, provenance, render, spread, table, verdict


def _chart(data: dict[str, Any]) -> str:
    rows = data["summary"]

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6.5, 2.8))
        width = 0.38
        for offset, key, name, color in (
            (-width / 2, "raw_tokens_per_s", "raw vLLM (LLM.chat)", "#7f7f7f"),
            (width / 2, "relayllm_tokens_per_s", "relayllm + vllm backend", COLORS["relayllm"]),
        ):
            med = [t[key]["median"] for t in rows]
            err = [
                [m - t[key]["min"] for m, t in zip(med, rows, strict=True)],
                [t[key]["max"] - m for m, t in zip(med, rows, strict=True)],
            ]
            xs = [i + offset for i in range(len(rows))]
            ax.bar(xs, med, width, yerr=err, capsize=3, color=color, label=name)
        ax.set_xticks(range(len(rows)), [str(t["rows"]) for t in rows])
        ax.set_xlabel("rows")
        ax.set_ylabel("output tokens/s")
        ax.legend(fontsize=8, loc="lower right")
        ax.set_title(
            f"relayllm + vLLM vs raw vLLM, demo model on CPU: median of {data['runs']} runs "
            "(bars: min-max)",
            fontsize=9,
        )
        return fig

    return chart("engine.png", draw)


def run_ratios(data: dict[str, Any], index: int) -> list[float]:
    """Each run's relayllm/raw ratio at one row count: its two sides share the run's minute."""
    return [
        run["relayllm"]["passes"][index]["output_tokens_per_s"]
        / run["raw"]["passes"][index]["output_tokens_per_s"]
        for run in data["raw_runs"]
    ]


def _fmt(s: dict[str, float], digits: int = 1, unit: str = "") -> str:
    return f"{s['median']:,.{digits}f}{unit} ({s['min']:,.{digits}f}–{s['max']:,.{digits}f})"


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["engine"]
    rows = data["summary"]
    figures = table(
        [
            "rows",
            "raw vLLM tokens/s",
            "relayllm tokens/s",
            "relayllm / raw",
            "raw: CPU µs/row outside the engine",
            "relayllm: CPU µs/row outside the engine",
            "errors",
        ],
        "rrrrrrr",
        (
            (
                t["rows"],
                _fmt(t["raw_tokens_per_s"]),
                _fmt(t["relayllm_tokens_per_s"]),
                _fmt(t["ratio"], 2, "x"),
                _fmt(t["raw_cpu_us_per_row_outside_engine"], 0),
                _fmt(t["relayllm_cpu_us_per_row_outside_engine"], 0),
                t["errors"],
            )
            for t in rows
        ),
    )
    target = data["target"]
    targets = table(
        ["target", "measured (median, min–max over runs)", ""],
        "lll",
        (
            (
                f"relayllm >= {target}x raw vLLM output tokens/s at {t['rows']} rows",
                spread(run_ratios(data, i), lambda v: f"{v:.2f}x"),
                verdict(run_ratios(data, i), target, at_least=True),
            )
            for i, t in enumerate(rows)
        ),
    )
    actors = results.get("engine-actors")
    as_actors = (
        "Not run with the stage as actors: `python benchmarks/engine.py --runs 3` with "
        '`ProcessorConfig(compute="actors")`.'
        if actors is None
        else 'With the stage as actors (`compute="actors"`): '
        + ", ".join(
            f"{spread(run_ratios(actors, i), lambda v: f'{v:.2f}x')} at {t['rows']}"
            for i, t in enumerate(actors["summary"])
        )
        + " rows. "
        + provenance("engine-actors", actors)
    )
    return render(
        "engine",
        runs=data["runs"],
        sampling=data["sampling_params"],
        compute=data.get("relayllm_compute", "the default"),
        provenance=provenance("engine", data),
        png=_chart(data),
        figures=figures,
        targets=targets,
        as_actors=as_actors,
    ) + [""]
