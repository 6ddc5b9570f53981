"""The charts of the framework-overhead question: rows/s per contender and size, where the CPU
goes per row, and the driver's peak memory against the dataset's size."""

from __future__ import annotations

from typing import Any

from reporting.common import COLORS, chart, rows_label

#: Roles a process of the run's Ray cluster is counted under in the CPU chart.
ROLES = ["stage actor", "replica", "driver", "rest of Ray"]


def cpu_role(process: str) -> str:
    if process.startswith("ray::MapWorker"):
        return "stage actor"
    if process.startswith("ray::ServeReplica"):
        return "replica"
    if process == "driver":
        return "driver"
    return "rest of Ray"


def rows_per_s_chart(med: list[tuple[int, dict[str, Any]]], names: list[str]) -> str:
    def draw(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, key, title in [
            (axes[0], "rows_per_s", "end to end (stage start-up included)"),
            (axes[1], "steady_rows_per_s", "steady state (after the first output block)"),
        ]:
            width = 0.8 / len(names)
            for name in names:
                xs, ys = [], []
                for i, (_, m) in enumerate(med):
                    if name in m and m[name][key] is not None:
                        # centre each size's group on the contenders shown
                        present = [c for c in names if c in m and m[c][key] is not None]
                        xs.append(i + (present.index(name) - (len(present) - 1) / 2) * width)
                        ys.append(m[name][key])
                bars = ax.bar(xs, ys, width, label=name, color=COLORS[name])
                ax.bar_label(
                    bars, labels=[f"{y:,.0f}" for y in ys], fontsize=7, rotation=90, padding=2
                )
            ax.set_xticks(range(len(med)), [f"{rows_label(r)} rows" for r, _ in med])
            ax.set_xlim(-0.5, len(med) - 0.5)
            for i, (_, m) in enumerate(med):
                if all(v[key] is None for v in m.values()):
                    label = "too few input\nblocks to tell"
                    ax.text(i, 150, label, ha="center", fontsize=8, color="#555555")
            ax.set_yscale("log")
            top = max(
                m[c][k] or 0
                for _, m in med
                for c in names
                if c in m
                for k in ("rows_per_s", "steady_rows_per_s")
            )
            ax.set_ylim(100, top * 4)  # room for the labels above the bars
            ax.set_title(title, fontsize=10)
        axes[0].set_ylabel("rows/s (log scale)")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=len(names), frameon=False)
        fig.suptitle(
            "Framework overhead: echo deployment, batch_size 64, same deployment for all",
            fontsize=11,
        )
        fig.tight_layout(rect=(0, 0.07, 1, 1))
        return fig

    return chart("overhead_rows_per_s.png", draw, layout=False)


def cpu_chart(sizes: list[dict[str, Any]], names: list[str]) -> str:
    """Where the CPU goes, per row, at the largest size each contender ran at. ray.data.llm
    costs many times the others: it gets a figure in the title, not a bar that flattens the
    rest."""
    shown, off_scale = [], []
    for name in names:
        size = max((s for s in sizes if name in s["samples"]), key=lambda s: s["rows"])
        runs = size["samples"][name]
        shares = {role: 0.0 for role in ROLES}
        for one in runs:
            for proc, seconds in one.get("cpu_s_by_process", {}).items():
                shares[cpu_role(proc)] += seconds / size["rows"] * 1e6 / len(runs)
        if name == "ray.data.llm":
            off_scale.append(
                f"ray.data.llm: {sum(shares.values()):,.0f} µs/row at "
                f"{rows_label(size['rows'])} rows, {shares['stage actor']:,.0f} of them in its "
                "stage"
            )
        else:
            shown.append((f"{name}\n({rows_label(size['rows'])} rows)", shares))

    def draw(plt):
        fig, ax = plt.subplots(figsize=(8, 1.3 + 0.75 * len(shown)))
        left = [0.0] * len(shown)
        palette = ["#1f77b4", "#ff7f0e", "#2ca02c", "#c7c7c7"]
        for role, color in zip(ROLES, palette, strict=True):
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
        return fig

    return chart("overhead_cpu_per_row.png", draw)


def rss_chart(med: list[tuple[int, dict[str, Any]]], names: list[str]) -> str:
    def draw(plt):
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
        return fig

    return chart("overhead_driver_rss.png", draw)
