"""What every question's module shares: where results and charts live, reading a results file
once, charts that can be left out, the prose templates, and how a figure and a verdict read."""

from __future__ import annotations

import functools
import json
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path
from string import Template
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
IMG = DOCS / "img"
TEMPLATES = Path(__file__).resolve().parent / "templates"

#: One color per contender, the same in every chart.
COLORS = {
    "relayllm": "#1f77b4",
    "hand-written": "#7f7f7f",
    "relayllm (actor transport)": "#9ecae1",
    "ray.data.llm": "#d62728",
}

#: Whether charts are drawn (into CHARTS["dir"]). The page links them either way, so the page's
#: text does not depend on it: a check of the text needs neither matplotlib nor a write.
CHARTS: dict[str, Any] = {"draw": True, "dir": IMG}


def load_results() -> dict[str, dict[str, Any]]:
    """Every committed result, by file stem: what the page is made of."""
    return {p.stem: run(p) for p in sorted(RESULTS.glob("*.json"))}


@functools.cache
def run(path: Path) -> dict[str, Any]:
    """A results file, read once however many sections show it (they only read it)."""
    return json.loads(path.read_text())


def runs(pattern: str) -> list[tuple[Path, dict[str, Any]]]:
    """Every committed results file whose name matches ``pattern``, in name order."""
    return [(path, run(path)) for path in sorted(RESULTS.glob(pattern))]


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


def chart(name: str, draw: Callable[[Any], Any], *, layout: bool = True) -> str:
    """``draw(plt)`` returns a figure, saved as docs/img/``name``; returns the page's link."""
    if CHARTS["draw"]:
        plt = _plt()
        fig = draw(plt)
        folder = Path(CHARTS["dir"])
        folder.mkdir(parents=True, exist_ok=True)
        if layout:
            fig.tight_layout()
        fig.savefig(folder / name)
        plt.close(fig)
    return f"img/{name}"


def render(name: str, **fields: Any) -> list[str]:
    """templates/``name``.md with its ``$placeholders`` filled; a missing field is an error."""
    text = Template((TEMPLATES / f"{name}.md").read_text()).substitute(
        {key: str(value) for key, value in fields.items()}
    )
    return text.rstrip("\n").split("\n")


def table(head: Iterable[str], align: Iterable[str], rows: Iterable[Iterable[Any]]) -> str:
    """A Markdown table; ``align`` is ``l`` or ``r`` per column."""
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def met(ok: bool | None) -> str:
    return "—" if ok is None else ("**met**" if ok else "**not met**")


def verdict(values: list[float], bound: float, *, at_least: bool) -> str:
    """A target judged on every run of its kind, by the median and the spread: met or not met
    when every run agrees; otherwise the median decides, and the runs on the other side of the
    bound are counted beside it."""
    if not values:
        return "—"
    ok = [v >= bound if at_least else v <= bound for v in values]
    if all(ok) or not any(ok):
        return met(all(ok))
    middle = statistics.median(values)
    if middle >= bound if at_least else middle <= bound:
        return f"**met within the spread** ({sum(ok)} of {len(ok)} runs)"
    return f"**not met** ({sum(ok)} of {len(ok)} runs met it)"


def spread(values: list[float], fmt: Callable[[float], str]) -> str:
    """``median (min–max)`` over runs; one run shows its own figure, none an empty string."""
    if not values:
        return ""
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(statistics.median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def n(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}x"


def rows_label(rows: int) -> str:
    if rows >= 1_000_000:
        return f"{rows // 1_000_000}M"
    return f"{rows // 1000}k" if rows >= 1000 else str(rows)


def plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def machine(data: dict[str, Any]) -> str:
    """The machine a results file recorded, in one phrase."""
    m, host = data.get("machine", {}), data.get("host", {})
    parts = [f"{m.get('cpus', '?')} CPUs"]
    if host.get("cpu_model"):
        parts.append(host["cpu_model"])
    if host.get("memory_gib"):
        parts.append(f"{host['memory_gib']:.0f} GiB RAM")
    parts += ["no GPU", f"Python {m.get('python', '?')}", m.get("platform", "?")]
    return ", ".join(parts)


def load(data: dict[str, Any]) -> str:
    value = data.get("host", {}).get("load_average_at_start")
    return "not recorded" if value is None else f"{value:.1f}"


def provenance(name: str, data: dict[str, Any]) -> str:
    """Which command made a results file, at which commit, on which machine."""
    command = data.get("command", f"python benchmarks/{name}.py")
    return (
        f"Measured by `{command}` (results/{name}.json, commit `{data.get('commit', '?')}`, "
        f"{data.get('machine', {}).get('date', '?')}) on {machine(data)}; 1-minute load "
        f"average at start {load(data)}."
    )
