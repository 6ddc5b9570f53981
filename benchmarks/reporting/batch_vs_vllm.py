"""Question 10b: ``relayllm batch`` against vLLM's own batch runner on the same file and
engine arguments, each a cold process, and on a running deployment
(results/batch_vs_vllm.json)."""

from __future__ import annotations

import statistics
from typing import Any

from reporting.common import n, provenance, ratio, render, spread, table, verdict

RELAYLLM, VLLM = "relayllm batch", "vLLM run_batch"
DEPLOYED = "relayllm batch on a running deployment"


def _phase_rows(runs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Each phase's median seconds (min–max) over the runs, in the order the runs report."""
    names = [k for k, v in runs[0]["phases"].items() if not isinstance(v, dict)]
    rows = []
    for name in names:
        values = [r["phases"][name] for r in runs if r["phases"].get(name) is not None]
        rows.append((name, spread(values, lambda v: n(v, 1)) if values else "—"))
    return rows


def _engine_phases(runs: list[dict[str, Any]]) -> str:
    found = [r["phases"].get("engine start phases") for r in runs]
    found = [p for p in found if p]
    if not found:
        return "—"
    return ", ".join(
        f"{name} {n(statistics.median(p[name] for p in found), 1)} s" for name in found[0]
    )


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["batch_vs_vllm"]
    samples = data["samples"]
    runs = []
    for name in (RELAYLLM, VLLM):
        for s in samples[name]:
            runs.append((s["round"], name, n(s["seconds"], 1), s["ok_lines"], s["load_average"]))
    for i, s in enumerate(samples[DEPLOYED]):
        runs.append((i, DEPLOYED, n(s["seconds"], 1), s["ok_lines"], n(s["load_average"], 2)))
    runs.sort(key=lambda r: (r[0], r[1]))
    summary = data["summary"]
    cold = summary["cold ratios (run_batch seconds / relayllm seconds)"]
    warm = summary["deployed ratios (cold run_batch seconds / relayllm on a running deployment)"]
    target = data["targets"]["cold_ratio_at_least"]
    phases = [(f"relayllm: {k}", v) for k, v in _phase_rows(samples[RELAYLLM])] + [
        (f"run_batch: {k}", v) for k, v in _phase_rows(samples[VLLM])
    ]
    return render(
        "batch_vs_vllm",
        lines=data["lines"],
        max_tokens=data["max_tokens"],
        run_batch_arguments=" ".join(
            "IN.jsonl" if a == "IN.jsonl" else a for a in data["run_batch_arguments"]
        ),
        provenance=provenance("batch_vs_vllm", data),
        runs=table(
            ["round", "contender", "seconds", "lines answered", "load average at start"],
            "rlrrr",
            runs,
        ),
        cold=", ".join(ratio(x) for x in cold),
        cold_spread=spread(cold, ratio),
        cold_verdict=verdict(cold, target, at_least=True),
        target=f"{target:.1f}",
        warm=", ".join(ratio(x) for x in warm) or "not measured in this run",
        warm_spread=spread(warm, ratio) or "no runs",
        phases=table(["phase", "seconds, median (min–max)"], "lr", phases),
        engine_phases=_engine_phases(samples[RELAYLLM]),
    ) + [""]
