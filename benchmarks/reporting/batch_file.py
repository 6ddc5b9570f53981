"""Question 10: ``relayllm batch`` on an OpenAI Batch API chat file against the processor path
on the same deployment (results/batch_file.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, n, provenance, ratio, render, rows_label, table


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["batch_file"]
    targets = data["targets"]
    rows, verdicts = [], []
    for size in data["sizes"]:
        summary = size["summary"]
        for name in ("relayllm batch", "processor path"):
            m = summary[name]
            rows.append(
                (
                    rows_label(size["rows"]),
                    name,
                    n(m["rows_per_s"]),
                    n(m["cpu_us_per_row"]),
                    n(m["driver_peak_rss_mib"]),
                    m["runs"],
                )
            )
        speed = summary["ratio relayllm batch / processor path"]
        rss = summary["relayllm batch"]["driver_peak_rss_mib"]
        verdicts.append(
            f"{rows_label(size['rows'])} lines: {ratio(speed)} the processor path's rows/s "
            f"({met(speed >= targets['ratio_at_least'])}), driver peak {n(rss)} MiB "
            f"({met(rss < targets['driver_peak_rss_mib_below'])})."
        )
    return render(
        "batch_file",
        concurrency=data["concurrency"],
        rss_below=targets["driver_peak_rss_mib_below"],
        ratio_at_least=targets["ratio_at_least"],
        provenance=provenance("batch_file", data),
        contenders=table(
            ["rows", "contender", "rows/s", "CPU µs/row", "driver peak RSS (MiB)", "runs"],
            "rlrrrr",
            rows,
        ),
        verdicts="\n".join(verdicts),
    ) + [""]
