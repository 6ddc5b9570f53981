"""Question 8: calls closed by estimated tokens against calls of batch_size rows on a
mixed-length dataset (results/token_budget.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import provenance, ratio, render, table


def _reading(count: list[float], budget: list[float]) -> str:
    """Whether the runs tell the two apart: seconds that overlap between them do not."""
    if budget[0] > count[1]:
        return "The budget's runs were all slower than the count's: it was slower here."
    if budget[1] < count[0]:
        return "The budget's runs were all faster than the count's: it was faster here."
    return "The two spreads overlap: these runs do not tell the two apart."


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["token_budget"]
    st, summary = data["settings"], data["summary"]
    calls = table(
        ["calls", "seconds (median)", "spread", "rows/s", "output tokens/s", "errors"],
        "lrlrrr",
        (
            (
                label,
                f"{m['seconds']:.1f}",
                f"{m['spread_s'][0]:.1f}–{m['spread_s'][1]:.1f}",
                f"{m['rows_per_s']:.2f}",
                f"{m['output_tokens_per_s']:.1f}",
                m["errors"],
            )
            for name, label in (
                ("count", f"batch_size={st['batch_size']}"),
                ("budget", f"token_budget={st['token_budget']}"),
            )
            for m in [summary[name]]
        ),
    )
    return render(
        "token_budget",
        rows=st["rows"],
        long_every=st["long_every"],
        long_chars=f"{st['long_chars']:,}",
        long_max_tokens=st["long_max_tokens"],
        short_max_tokens=st["short_max_tokens"],
        batch_size=st["batch_size"],
        in_flight=st["in_flight"],
        token_budget=st["token_budget"],
        repeats=st["repeats"],
        provenance=provenance("token_budget", data),
        calls=calls,
        ratio=ratio(data["ratio_budget_vs_count_rows_per_s"]),
        reading=_reading(summary["count"]["spread_s"], summary["budget"]["spread_s"]),
    ) + [""]
