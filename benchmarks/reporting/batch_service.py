"""Question 11: the Batch API service (``relayllm serve`` and the ``openai`` client) against
``relayllm batch`` on the same file and deployment, and the memory of the service's processes
as the file grows (results/batch_service.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import n, provenance, ratio, render, rows_label, spread, table, verdict

#: The processes whose peak RSS the section shows, in its columns' order.
PROCESSES = (
    "driver",
    "gateway replica",
    "batch runner",
    "read task",
    "stage worker",
    "echo replica",
)
CONTENDERS = ("relayllm batch", "service")
#: The service's processes that should stay flat as the file grows.
FLAT = ("gateway replica", "batch runner")


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["batch_service"]
    targets = data["targets"]
    sizes = data["sizes"]
    shown = [
        p
        for p in PROCESSES
        if any(p in size["summary"][c]["peak_rss_mib"] for size in sizes for c in CONTENDERS)
    ]
    rows = []
    for size in sizes:
        summary = size["summary"]
        for name in CONTENDERS:
            m = summary[name]
            runs = size["samples"][name]
            rss = m["peak_rss_mib"]
            rows.append(
                (
                    rows_label(size["rows"]),
                    name,
                    spread([s["lines_per_s"] for s in runs], n),
                    n(m["cpu_us_per_line"]),
                    *(n(rss[p]) if p in rss else "—" for p in shown),
                    m["runs"],
                )
            )
    verdicts = []
    for size in sizes:
        by_round = size["summary"]["ratios by round"]
        verdicts.append(
            f"{rows_label(size['rows'])} lines: the service at "
            f"{spread(by_round, ratio)} `relayllm batch`'s lines/s (round by round): "
            f"{verdict(by_round, targets['ratio_at_least'], at_least=True)}."
        )
    smallest, largest = sizes[0], sizes[-1]
    growth = []
    for process in FLAT if largest["rows"] > smallest["rows"] else ():
        small = smallest["summary"]["service"]["peak_rss_mib"].get(process)
        large = largest["summary"]["service"]["peak_rss_mib"].get(process)
        if small and large:
            factor = large / small
            growth.append(
                f"{process}: {n(small)} → {n(large)} MiB ({factor:.2f}x, "
                f"{verdict([factor], targets['memory_growth_at_most'], at_least=False)})"
            )
    phases = [s["phases_s"] for s in largest["samples"]["service"] if "phases_s" in s]
    return render(
        "batch_service",
        concurrency=data["concurrency"],
        batch_size=data["batch_size"],
        ratio_at_least=targets["ratio_at_least"],
        growth_at_most=targets["memory_growth_at_most"],
        small=rows_label(smallest["rows"]),
        large=rows_label(largest["rows"]),
        provenance=provenance("batch_service", data),
        note=data.get("note", ""),
        contenders=table(
            ["lines", "contender", "lines/s", "CPU µs/line"]
            + [f"{p} peak RSS (MiB)" for p in shown]
            + ["runs"],
            "rl" + "r" * (len(shown) + 3),
            rows,
        ),
        verdicts="\n".join(f"- {v}" for v in verdicts),
        growth="; ".join(growth) or "not measured: one size only",
        phases=_phases(rows_label(largest["rows"]), phases),
    ) + [""]


def _phases(label: str, phases: list[dict[str, float]]) -> str:
    if not phases:
        return f"The service's upload, batch and download times at {label} lines were not recorded."
    each = "; ".join(
        f"upload {p['upload_s']:.1f} s, batch {p['batch_s']:.0f} s, "
        f"download {p['download_s']:.1f} s"
        for p in phases
    )
    return f"Where the service's time went at {label} lines, run by run: {each}."
