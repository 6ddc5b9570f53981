"""Question 9, the idle windows: why rows finishing inside them fall short where the engine's
work does not, how that depends on the windows' length, and the bursts phase second by second.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from online_batch import idle_work_ratio, recorded_idle_windows, spread_per_s

from reporting import online_batch_runs as kinds
from reporting.common import COLORS, chart, ratio, render, spread, table

Runs = list[tuple[Path, dict[str, Any]]]

#: What each idle-period row shows: (summary key, label).
IDLE_KEYS = (
    ("idle_batch_rows_per_s_ratio", "rows leaving the engine"),
    (
        "idle_engine_work_ratio",
        "tokens the engine's steps process (prefilled and generated, spread over each step)",
    ),
    ("idle_engine_tokens_per_s_ratio", "tokens the engine's steps generate"),
    ("quiet_engine_tokens_per_s_ratio", "the same from each burst's last request's end"),
)


def default_budget(found: Runs) -> Runs:
    return [(p, r) for p, r in found if kinds.step_budget(r) == "default"]


def _whole_phase_check(counted: Runs) -> str:
    """Whether the bursts phase's whole-job rows/s agrees with the idle windows' row count: if
    the windows ran at that rate and the bursts no faster than batch alone, the whole job
    could go no faster than their time-weighted mean."""
    whole, bound = [], []
    for _, run in counted:
        v, st = kinds.managed(run), run["settings"]
        rows = kinds.summary(run)["idle_batch_rows_per_s_ratio"]
        whole.append(v["bursts"]["batch"]["rows_per_s"] / v["batch_alone"]["rows_per_s"])
        bound.append((st["idle_s"] * rows + st["burst_s"]) / (st["idle_s"] + st["burst_s"]))
    above = sum(1 for w, b in zip(whole, bound, strict=True) if w > b)
    return (
        f"{', '.join(ratio(w) for w in whole)} of batch alone's rate; had the idle windows run "
        "at their row count's rate and the bursts as fast as batch alone, it could have "
        f"reached at most {', '.join(ratio(b) for b in bound)}. {above} of {len(whole)} runs "
        "went above that"
    )


def _verdict(ten_s: Runs) -> list[str]:
    counted = [(p, r) for p, r in ten_s if kinds.summary(r).get("idle_engine_work_ratio")]
    if not counted:
        return []
    work = kinds.values(counted, "idle_engine_work_ratio")
    rows = kinds.values(counted, "idle_batch_rows_per_s_ratio")
    generated = kinds.values(counted, "idle_engine_tokens_per_s_ratio")
    prefill = [idle_work_ratio(kinds.managed(r), r["settings"]["idle_s"], (5,)) for _, r in counted]
    decode = [idle_work_ratio(kinds.managed(r), r["settings"]["idle_s"], (4,)) for _, r in counted]
    path, run = counted[0]
    waves = kinds.waves(run)
    alone = kinds.managed(run)["batch_alone"]["engine_work"]
    return render(
        "online_batch_idle",
        wave=(
            f"in the batch-alone job of results/{path.name}, the deployment's row count moved by "
            f"a median {waves[0]:g} rows every {waves[1]:.1f} s"
            if waves
            else "rows leave the engine in waves"
        ),
        prefilled=f"{alone['prefilled_per_row']:.0f}",
        generated=f"{alone['generated_per_row']:.0f}",
        names=kinds.names(counted),
        work=", ".join(ratio(w) for w in work),
        work_median=ratio(statistics.median(work)),
        rows=", ".join(ratio(r) for r in rows),
        rows_median=ratio(statistics.median(rows)),
        tokens=", ".join(ratio(g) for g in generated),
        whole=_whole_phase_check(counted),
        prefill=ratio(statistics.median(prefill)),
        decode=ratio(statistics.median(decode)),
    )


def _bursts_plot(full: Runs) -> list[str]:
    """The bursts phase of the latest full run at the default step budget that kept both jobs'
    timelines, second by second."""
    kept = kinds.with_alone_timeline(default_budget(full))
    if not kept:
        return []
    path, run = kept[-1]
    v, idle_s = kinds.managed(run), run["settings"]["idle_s"]
    bursts, alone = v["bursts"], v["batch_alone"]
    timeline = bursts["timeline"]

    def draw(plt):
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 4.2), sharex=True)
        for ax in (top, bottom):
            for lo, hi in recorded_idle_windows(bursts, idle_s):
                ax.axvspan(lo, hi, color="#2ca02c", alpha=0.08, lw=0)
        ts = [s[0] for s in timeline]
        top.step(
            ts, [s[2] for s in timeline], where="post", label="admission limit", color="#7f7f7f"
        )
        top.step(
            ts,
            [s[3] for s in timeline],
            where="post",
            label="batch rows in the engine",
            color=COLORS["relayllm"],
        )
        top.set_yscale("log", base=2)
        top.set_ylabel("rows")
        top.legend(fontsize=7, loc="lower right")
        seconds = [float(t) for t in range(int(bursts["batch"]["seconds"]))]
        bottom.plot(
            seconds,
            [spread_per_s(timeline, [(t, t + 1)]) for t in seconds],
            label="bursts phase",
            color=COLORS["relayllm"],
            lw=1,
        )
        within = [t for t in seconds if t + 1 <= alone["seconds"]]
        bottom.plot(
            within,
            [spread_per_s(alone["timeline"], [(t, t + 1)]) for t in within],
            label="batch alone (same offsets)",
            color="#7f7f7f",
            lw=1,
        )
        bottom.set_ylabel("tokens processed/s")
        bottom.set_xlabel("seconds after the batch job's start (green: idle windows)")
        bottom.legend(fontsize=7, loc="lower right")
        top.set_title(f"The bursts phase of results/{path.name}", fontsize=9)
        return fig

    png = chart("online_batch-bursts.png", draw)
    return [
        "",
        f"![the bursts phase]({png})",
        "",
        f"The bursts phase of results/{path.name}, second by second. Top: the admission "
        "limit falls at each burst and returns to the maximum `idle_s` after its last "
        "request; the batch rows in the engine follow it in whole calls. Bottom: the tokens "
        "the engine's steps processed each second (each step's spread over the time it ran), "
        "beside the batch-alone job's at the same offsets.",
    ]


def _lengths(first: Runs) -> list[str]:
    """The idle-period measures by the idle windows' length, over every run at the default
    step budget, and whether the bursts phase made the engine compute rows again."""
    found = default_budget(first)
    lengths = sorted({r["settings"]["idle_s"] for _, r in found})
    columns = [kinds.windows(found, idle_s) for idle_s in lengths]
    head = ["measured by"] + [
        f"{idle_s:g} s windows ({len(col)} runs)"
        for idle_s, col in zip(lengths, columns, strict=True)
    ]
    rows = []
    for key, label in IDLE_KEYS:
        cells = [spread(kinds.values(col, key), ratio) or "—" for col in columns]
        rows.append([label, *cells])
    recomputed = []
    for path, run in found:
        v = kinds.managed(run)
        alone, bursts = v["batch_alone"].get("engine_work"), v["bursts"].get("engine_work")
        if alone and bursts and alone["prefilled_per_row"]:
            recomputed.append(
                f"{path.stem}: {bursts['prefilled_per_row']:.1f} against "
                f"{alone['prefilled_per_row']:.1f}, {bursts['preemptions']} preemptions against "
                f"{alone['preemptions']}"
            )
    return render(
        "online_batch_lengths",
        lengths=table(head, "l" + "r" * len(columns), rows),
        recomputed="; ".join(recomputed) or "not recorded",
    )


def lines(full: Runs) -> list[str]:
    first = kinds.first_host()
    return (
        [""]
        + _verdict(kinds.windows(default_budget(first), 10.0))
        + _bursts_plot(full)
        + [""]
        + _lengths(first)
    )
