"""Question 9: interactive traffic on the HTTP front and a batch job on one engine, judged on
every committed run of the current controller (kinds: online_batch_runs.py).

The section opens with where the targets stand, then the full runs of the first host side by
side, what the idle windows measure (online_batch_idle.py), and the step budget and the second
host (online_batch_hosts.py)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from reporting import online_batch_hosts, online_batch_idle
from reporting import online_batch_runs as kinds
from reporting.common import load, machine, plural, ratio, render, spread, table, verdict

#: (summary key, label, bound, at least) of each measure a run's summary carries.
RUN_KEYS = (
    ("ttft_p99_ratio_with_batch", "p99 TTFT with batch ÷ alone", 1.5, False),
    ("ttft_p50_ratio_with_batch", "p50 TTFT with batch ÷ alone", None, False),
    (
        "idle_engine_work_ratio",
        "idle-period tokens processed/s ÷ alone (prefilled and generated, each engine step's "
        "spread over the time it ran: the work as it is done)",
        0.9,
        True,
    ),
    (
        "idle_batch_rows_per_s_ratio",
        "idle-period batch rows/s ÷ alone, rows counted as they leave the engine",
        0.9,
        True,
    ),
    (
        "idle_engine_tokens_per_s_ratio",
        "idle-period tokens generated/s ÷ alone, counted per engine step",
        None,
        True,
    ),
    (
        "quiet_engine_tokens_per_s_ratio",
        "the same from the end of each burst's last request (no interactive request in flight)",
        None,
        True,
    ),
    (
        "idle_batch_rows_per_s_ratio_driver_blocks",
        "the same counted as output blocks reach the driver",
        None,
        True,
    ),
    (
        "batch_rows_per_s_ratio_with_interactive",
        "batch rows/s with the interactive user throughout ÷ alone",
        None,
        True,
    ),
)


def _x(value: float) -> str:
    return f"{value:.2f}x"


def targets() -> list[tuple[str, str, str]]:
    """Each target over every run of the kind it is judged on."""
    first = kinds.first_host()
    rows = []
    by_budget: dict[str, list[tuple[Path, dict[str, Any]]]] = {}
    for path, run in kinds.full(first):
        by_budget.setdefault(kinds.step_budget(run), []).append((path, run))
    for budget, found in sorted(by_budget.items(), key=lambda kv: kv[0] != "default"):
        p99 = kinds.values(found, "ttft_p99_ratio_with_batch")
        within = sum(1 for r in p99 if r <= 1.5)
        rows.append(
            (
                "interactive p99 TTFT with batch running <= 1.5x interactive alone (first "
                f"host, full runs, step budget {budget})",
                f"{within} of {plural(len(p99), 'run')} within: {spread(p99, _x)}",
                verdict(p99, 1.5, at_least=False),
            )
        )
    second = kinds.values(kinds.full(kinds.second_host()), "ttft_p99_ratio_with_batch")
    if second:
        rows.append(
            (
                "the same on the second host (a faster engine; targets and step budgets vary: "
                "its table below)",
                f"{sum(1 for r in second if r <= 1.5)} of {plural(len(second), 'run')} within ("
                + ", ".join(_x(r) for r in second)
                + ")",
                verdict(second, 1.5, at_least=False),
            )
        )
    ten = kinds.windows(first, 10.0)
    for key, label in (
        ("idle_engine_work_ratio", "as the engine's work (tokens processed)"),
        ("idle_batch_rows_per_s_ratio", "as rows finishing inside the windows"),
    ):
        found = kinds.values(ten, key)
        rows.append(
            (
                f"batch throughput in 10 s interactive idle periods >= 0.9x batch alone, {label}",
                f"{spread(found, _x)} over {plural(len(found), 'run')}",
                verdict(found, 0.9, at_least=True),
            )
        )
    for idle_s in sorted({r["settings"]["idle_s"] for _, r in first} - {10.0}):
        found = kinds.values(kinds.windows(first, idle_s), "idle_batch_rows_per_s_ratio")
        rows.append(
            (
                f"the same as rows finishing inside {idle_s:g} s idle windows (bursts-only runs)",
                f"{spread(found, _x)} over {plural(len(found), 'run')}",
                verdict(found, 0.9, at_least=True),
            )
        )
    every = kinds.every_run()
    errors = sum(kinds.summary(r)["batch_errors"] for _, r in every)
    rows.append(
        (
            "no batch row failed",
            f"{errors} errors in {plural(len(every), 'run')} (both hosts)",
            verdict([errors], 0, at_least=False),
        )
    )
    return rows


def runs_table(found: list[tuple[Path, dict[str, Any]]]) -> str:
    """Each run's summary measures side by side, with their median and the verdict."""
    summaries = [kinds.summary(r) for _, r in found]
    rows = []
    for key, label, bound, at_least in RUN_KEYS:
        values = [m.get(key) for m in summaries]
        known = [v for v in values if v is not None]
        judged = "" if bound is None else verdict(known, bound, at_least=at_least)
        rows.append([label, *(ratio(v) for v in values), ratio(kinds.median(known)), judged])
    errors = [m.get("batch_errors", 0) for m in summaries]
    rows.append(
        [
            "batch errors",
            *errors,
            f"{sum(errors)} in all",
            verdict([sum(errors)], 0, at_least=False),
        ]
    )
    variants = [kinds.managed(r) for _, r in found]
    # The bursts phase has ~20 interactive requests: its p99 is its slowest one.
    bursts = [
        v["bursts"]["interactive"]["ttft_p99_s"] / v["interactive_alone"]["ttft_p99_s"]
        for v in variants
    ]
    whole = [v["bursts"]["batch"]["rows_per_s"] / v["batch_alone"]["rows_per_s"] for v in variants]
    at_end = [kinds.rows_in_engine_at_burst_ends(r) for _, r in found]
    rows += [
        [
            "bursts phase p99 TTFT ÷ alone (~20 requests: its slowest)",
            *(ratio(b) for b in bursts),
            ratio(statistics.median(bursts)),
            "",
        ],
        [
            "bursts phase: the whole job's rows/s ÷ alone (bursts included)",
            *(ratio(w) for w in whole),
            ratio(statistics.median(whole)),
            "",
        ],
        [
            "batch rows in the engine at a burst's end (median over the bursts)",
            *("—" if v is None else f"{v:g}" for v in at_end),
            "",
            "",
        ],
        ["step budget", *(kinds.step_budget(r) for _, r in found), "", ""],
        ["1-minute load at start", *(load(r) for _, r in found), "", ""],
        ["commit", *(f"`{r.get('commit', '?')}`" for _, r in found), "", ""],
    ]
    head = [
        "measure",
        *(p.stem.removeprefix("online_batch-") for p, _ in found),
        "median",
        "target",
    ]
    return table(head, "l" + "r" * (len(found) + 1) + "l", rows)


def _slowest(found: list[tuple[Path, dict[str, Any]]]) -> str:
    variants = [kinds.managed(r) for _, r in found]
    return (
        "Each run's slowest interactive request by time to first token, as (TTFT, when it "
        "started after the batch job's start): continuous phase "
        + ", ".join(kinds.slowest(v["batch_with_interactive"]) for v in variants)
        + "; bursts phase "
        + ", ".join(kinds.slowest(v["bursts"]) for v in variants)
        + ". The continuous phase's slowest request end to end (the gap to the next request's "
        "start, less the user's pause): " + ", ".join(kinds.slowest_e2e(r) for _, r in found) + "."
    )


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    first = kinds.first_host()
    full = kinds.full(first)
    if not full:
        return ["## 9. Online and batch traffic on one engine", "", "Not run yet.", ""]
    # The setup as the latest full run at the engine's default step budget recorded it.
    latest = next(r for _, r in reversed(full) if kinds.step_budget(r) == "default")
    st = latest["settings"]
    controller = kinds.managed(latest).get("admission") or {}
    admission = ", ".join(
        f"{key} {controller.get(key, st.get(key))}"
        for key in ("target_ttft_s", "target_tpot_s", "idle_s")
        if controller.get(key, st.get(key)) is not None
    )
    tails = [
        (b["idle_seconds"] - b["quiet_seconds"]) / b["idle_windows"]
        for b in (kinds.managed(r)["bursts"] for _, r in full)
    ]
    machines = sorted({machine(r) for _, r in first})
    return (
        render(
            "online_batch",
            interactive_max_tokens=st["interactive_max_tokens"],
            think_s=st["think_s"],
            rows=st["rows"],
            batch_size=st["batch_size"],
            batch_max_tokens=st["batch_max_tokens"],
            burst_s=f"{st['burst_s']:g}",
            admission=admission,
            command=latest["command"].replace(latest["settings"]["results_name"], "NAME"),
            machines="; ".join(machines),
            first_runs=len(first),
            second_runs=len(kinds.second_host()),
            targets=table(
                ["target", "measured: median (min–max) over the runs", ""], "lll", targets()
            ),
            full_runs=plural(len(full), "full run"),
            runs_table=runs_table(full),
            slowest=_slowest(full),
            tail_s=f"{statistics.mean(tails):.1f}",
            idle_s=controller.get("idle_s", "?"),
            max_rows=controller.get("max_batch_rows", "?"),
        )
        + online_batch_idle.lines(full)
        + online_batch_hosts.lines()
        + [""]
    )
