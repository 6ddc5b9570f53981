"""Question 3b: whether the defaults batch_size x max_in_flight_batches are near the best
setting on the vLLM CPU engine (results/sweep.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import chart, met, provenance, render, table


def _chart(data: dict[str, Any]) -> str:
    runs = data["runs"]
    sizes = sorted({r["batch_size"] for r in runs})
    flights = sorted({r["max_in_flight_batches"] for r in runs})
    cells = {(r["batch_size"], r["max_in_flight_batches"]): r["output_tokens_per_s"] for r in runs}
    default = (data["default"]["batch_size"], data["default"]["max_in_flight_batches"])

    def draw(plt):
        fig, ax = plt.subplots(figsize=(6.5, 4))
        matrix = [[cells.get((b, f), float("nan")) for b in sizes] for f in flights]
        top = max(cells.values())
        # The scale starts at zero: cells that differ by a few percent look alike, as they are.
        image = ax.imshow(matrix, cmap="viridis", origin="lower", aspect="auto", vmin=0, vmax=top)
        for i, f in enumerate(flights):
            for j, b in enumerate(sizes):
                value = cells.get((b, f))
                if value is not None:
                    ax.text(
                        j,
                        i,
                        f"{value:.1f}" + ("\n(default)" if (b, f) == default else ""),
                        ha="center",
                        va="center",
                        fontsize=8,
                        color="white" if value < top * 0.7 else "black",
                    )
        ax.set_xticks(range(len(sizes)), sizes)
        ax.set_yticks(range(len(flights)), flights)
        ax.set_xlabel("batch_size (rows per call)")
        ax.set_ylabel("max_in_flight_batches")
        ax.grid(False)
        fig.colorbar(image, label="output tokens/s")
        ax.set_title("vLLM CPU engine, demo model: output tokens/s", fontsize=10)
        return fig

    return chart("sweep.png", draw)


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["sweep"]
    runs = data["runs"]
    best = max(runs, key=lambda r: r["output_tokens_per_s"])
    default = data["default"]
    at_default = [
        r
        for r in runs
        if (r["batch_size"], r["max_in_flight_batches"])
        == (default["batch_size"], default["max_in_flight_batches"])
    ]
    settings = table(
        ["batch_size", "max_in_flight_batches", "output tokens/s", "rows/s", "seconds"],
        "rrrrr",
        (
            (
                r["batch_size"],
                r["max_in_flight_batches"],
                f"{r['output_tokens_per_s']:.1f}",
                f"{r['rows_per_s']:.2f}",
                f"{r['seconds']:.1f}",
            )
            for r in sorted(runs, key=lambda r: (r["batch_size"], r["max_in_flight_batches"]))
        ),
    )
    targets = ""
    if at_default:
        share = at_default[0]["output_tokens_per_s"] / best["output_tokens_per_s"]
        targets = table(
            ["target", "measured", ""],
            "lll",
            [
                (
                    f"defaults (batch_size={default['batch_size']}, max_in_flight_batches="
                    f"{default['max_in_flight_batches']}) within 10% of the best setting",
                    f"{share:.0%} of the best (best: batch_size={best['batch_size']}, "
                    f"max_in_flight_batches={best['max_in_flight_batches']})",
                    met(share >= 0.9),
                )
            ],
        )
    return render(
        "sweep",
        rows=data["rows"],
        max_tokens=data["max_tokens"],
        provenance=provenance("sweep", data),
        png=_chart(data),
        settings=settings,
        targets=targets,
    ) + [""]
