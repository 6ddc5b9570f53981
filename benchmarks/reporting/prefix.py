"""Question 4: what ``order_by_prefix`` buys on the vLLM CPU engine, with an ample and a tight
KV cache (results/prefix.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import chart, provenance, render, table


def _chart(data: dict[str, Any]) -> str:
    variants = data["variants"]
    settings = list(dict.fromkeys(v["setting"] for v in variants))

    def draw(plt):
        fig, ax = plt.subplots(figsize=(7.5, 1.2 + 0.9 * len(settings)))
        height = 0.38
        for k, flag in enumerate((False, True)):
            values = [
                next(
                    v["prompt_tokens_per_s"]
                    for v in variants
                    if v["setting"] == s and v["order_by_prefix"] is flag
                )
                for s in settings
            ]
            ys = [i + (k - 0.5) * height for i in range(len(settings))]
            color = "#1f77b4" if flag else "#7f7f7f"
            bars = ax.barh(ys, values, height, color=color, label=f"order_by_prefix={flag}")
            ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=3)
        ax.set_yticks(range(len(settings)), settings)
        ax.invert_yaxis()
        ax.set_xlabel("prompt tokens/s (prompt tokens of all rows / wall time)")
        ax.set_xlim(right=max(v["prompt_tokens_per_s"] for v in variants) * 1.12)
        ax.legend(
            fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False
        )
        ax.set_title(
            f"{data['groups']} templates of ~{data['prefix_tokens']} tokens, {data['rows']} "
            "shuffled rows, vLLM CPU engine",
            fontsize=10,
        )
        return fig

    return chart("prefix.png", draw)


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["prefix"]
    variants = table(
        [
            "engine setting",
            "order_by_prefix",
            "rows",
            "prompt tokens",
            "seconds (median)",
            "prompt tokens/s",
            "output tokens/s",
            "errors",
            "runs",
        ],
        "llrrrrrrr",
        (
            (
                v["setting"],
                v["order_by_prefix"],
                v["rows"],
                f"{v['prompt_tokens']:,}",
                f"{v['seconds']:.1f}",
                f"{v['prompt_tokens_per_s']:,.0f}",
                f"{v['output_tokens_per_s']:.1f}",
                v["errors"],
                v["runs"],
            )
            for v in data["variants"]
        ),
    )
    gains = table(
        ["engine setting", "order_by_prefix=True vs False (prompt tokens/s)"],
        "lr",
        ((k, f"{g:.2f}x") for k, g in data["gain_prompt_tokens_per_s"].items()),
    )
    tight = data.get("tight_kv_cache_bytes")
    return render(
        "prefix",
        groups=data["groups"],
        prefix_tokens=data["prefix_tokens"],
        rows=data["rows"],
        max_tokens=data["max_tokens"],
        repeats=data["repeats"],
        tight=f"{tight / 2**20:.0f} MiB" if tight else "—",
        provenance=provenance("prefix", data),
        png=_chart(data),
        variants=variants,
        gains=gains,
    ) + [""]
