"""Question 9, the engine's step budget and the second host: runs with a smaller token budget
per engine step beside the default's, and the same commands on a host whose engine is faster,
shown beside the first host's medians and kept out of them."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from reporting import online_batch_runs as kinds
from reporting.common import machine, plural, ratio, render, table

Runs = list[tuple[Path, dict[str, Any]]]


def _first_host_reference() -> Runs:
    """The first host's 10 s runs at the default step budget that kept the batch-alone job's
    timeline: what step lengths and waves are read from."""
    ten = kinds.windows(kinds.first_host(), 10.0)
    return kinds.with_alone_timeline([(p, r) for p, r in ten if kinds.step_budget(r) == "default"])


def _number(value: float | None, digits: int) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _budget_row(path: Path, run: dict[str, Any]) -> list[str]:
    v, m = kinds.managed(run), kinds.summary(run)
    return [
        kinds.step_budget(run),
        path.stem,
        ratio(m.get("ttft_p99_ratio_with_batch")),
        f"{kinds.longest_step(v['batch_alone']['timeline']):.1f}",
        f"{v['bursts']['interactive']['ttft_p99_s']:.2f}",
        f"{v['bursts']['interactive']['ttft_p50_s']:.2f}",
        f"{v['batch_alone']['rows_per_s']:.2f}",
        ratio(m.get("idle_engine_work_ratio")),
        ratio(m["idle_batch_rows_per_s_ratio"]),
    ]


def step_budget() -> list[str]:
    first = kinds.with_alone_timeline(kinds.windows(kinds.first_host(), 10.0))
    smaller = [(p, r) for p, r in first if kinds.step_budget(r) != "default"]
    if not smaller:
        return []
    default = [(p, r) for p, r in first if kinds.step_budget(r) == "default"]
    head = [
        "budget per step",
        "run",
        "p99 TTFT with batch ÷ alone",
        "batch alone: longest step, s",
        "bursts p99 TTFT s",
        "bursts p50 TTFT s",
        "batch alone rows/s",
        "idle windows, tokens processed ÷ alone",
        "idle windows, rows ÷ alone",
    ]
    return render(
        "online_batch_budget",
        runs=table(head, "llrrrrrrr", (_budget_row(p, r) for p, r in default + smaller)),
        smaller=plural(len(smaller), "run"),
    )


def _kind(settings: list[dict[str, Any]], summaries: list[dict[str, Any]]) -> str:
    def each(values: set[str]) -> str:
        return " or ".join(sorted(values))

    full = sum(1 for m in summaries if "ttft_p99_ratio_with_batch" in m)
    phases = "full" if full == len(summaries) else "bursts only" if not full else "both"
    windows = each({f"{s['idle_s']:g}" for s in settings})
    rows = each({str(s["rows"]) for s in settings})
    targets = each({f"{s['target_ttft_s']:g}/{s['target_tpot_s']:g} s" for s in settings})
    budgets = each({str(s.get("max_num_batched_tokens") or "default") for s in settings})
    return (
        f"{phases}, {windows} s windows, {rows} rows, TTFT/TPOT targets {targets}, "
        f"step budget {budgets}"
    )


def _host_row(name: str, found: Runs) -> list[str]:
    """The median of each measure over ``found`` (one run: its own figures)."""
    loaded = [r for _, r in found]
    alone = [kinds.managed(r)["batch_alone"] for r in loaded]
    summaries = [kinds.summary(r) for r in loaded]
    waves = [kinds.waves(r) for r in loaded]
    med = kinds.median
    alone_p99 = med([kinds.p99(r, "interactive_alone") for r in loaded])
    with_p99 = med([kinds.p99(r, "batch_with_interactive") for r in loaded])
    return [
        name,
        _kind([r["settings"] for r in loaded], summaries),
        f"{med([a['rows_per_s'] for a in alone]):.1f}",
        f"{med([kinds.longest_step(a['timeline']) for a in alone]):.1f}",
        _number(med([w[1] if w else None for w in waves]), 1),
        f"{med([kinds.managed(r)['bursts']['idle_windows'] for r in loaded]):g}",
        f"{_number(alone_p99, 3)} / {_number(with_p99, 3)}",
        *(
            ratio(med([m.get(key) for m in summaries]))
            for key in (
                "ttft_p99_ratio_with_batch",
                "batch_rows_per_s_ratio_with_interactive",
                "idle_engine_work_ratio",
                "idle_batch_rows_per_s_ratio",
            )
        ),
        str(sum(m["batch_errors"] for m in summaries)),
    ]


def second_host() -> list[str]:
    there = kinds.second_host()
    if not there:
        return []
    first = _first_host_reference()

    def alone_rows_per_s(found: Runs) -> float:
        return statistics.median(kinds.managed(r)["batch_alone"]["rows_per_s"] for _, r in found)

    head = [
        "runs",
        "kind",
        "batch alone rows/s",
        "batch alone: longest step, s",
        "seconds between waves of rows leaving",
        "idle windows",
        "interactive p99 TTFT alone / with batch, s",
        "p99 TTFT with batch ÷ alone",
        "batch rows/s beside the continuous user ÷ alone",
        "idle windows, tokens processed ÷ alone",
        "idle windows, rows ÷ alone",
        "batch errors",
    ]
    rows = [_host_row(f"first host, {len(first)} runs", first)]
    rows += [_host_row(f"results/{p.name}", [(p, r)]) for p, r in there]
    full = kinds.full(there)
    p99 = kinds.values(full, "ttft_p99_ratio_with_batch")
    closest_path, closest = min(
        full, key=lambda pr: kinds.summary(pr[1])["ttft_p99_ratio_with_batch"]
    )
    first_beside = kinds.values(
        kinds.full(kinds.first_host()), "batch_rows_per_s_ratio_with_interactive"
    )
    return render(
        "online_batch_host2",
        speed=f"{alone_rows_per_s(there) / alone_rows_per_s(first):.1f}",
        machine=", ".join(sorted({machine(r) for _, r in there})),
        runs=table(head, "ll" + "r" * (len(head) - 2), rows),
        within=sum(1 for r in p99 if r <= 1.5),
        full=plural(len(p99), "full run"),
        p99=", ".join(ratio(r) for r in p99),
        closest=closest_path.stem,
        closest_p99=ratio(kinds.summary(closest)["ttft_p99_ratio_with_batch"]),
        closest_targets="{target_ttft_s:g}/{target_tpot_s:g} s".format(**closest["settings"]),
        closest_budget=kinds.step_budget(closest),
        beside=", ".join(
            ratio(kinds.summary(r)["batch_rows_per_s_ratio_with_interactive"]) for _, r in full
        ),
        first_beside=ratio(statistics.median(first_beside)),
    )


def lines() -> list[str]:
    budget, host = step_budget(), second_host()
    return ([""] + budget if budget else []) + ([""] + host if host else [])
