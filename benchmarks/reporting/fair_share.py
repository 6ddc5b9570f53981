"""Question 13: weighted fair share between projects in the Batch API service
(results/fair_share.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, provenance, render, table


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def _last(samples: list[list[float]]) -> str:
    """Each project's lines at the round's last sample (the scheduler's own count starts at
    the batches' creation, not once both run)."""
    if not samples:
        return "–"
    _, heavy, light = samples[-1]
    return f"{heavy:,.0f} : {light:,.0f}"


#: Shorter windows than the target's, read from the same samples: how even the shares are
#: over less time (and the only windows there are when both run for less than the target's).
SHORT_WINDOWS_S = (20.0, 10.0)


def short_windows(samples: list[list[float]], window_s: float) -> tuple[float, float] | None:
    """The lowest and highest ratio (heavy's lines gained / light's) over every window of at
    least ``window_s`` between two samples once both have completed a line, as the benchmark
    reads its own windows (benchmarks/fair_share.py, ``windows``)."""
    both = [s for s in samples if s[1] and s[2]]
    ratios = []
    for i, (t0, h0, l0) in enumerate(both):
        for t1, h1, l1 in both[i + 1 :]:
            if t1 - t0 >= window_s:
                if l1 > l0:
                    ratios.append((h1 - h0) / (l1 - l0))
                break
    return (min(ratios), max(ratios)) if ratios else None


def _span(data: dict[str, Any], window_s: float) -> str:
    found = [short_windows(r["samples"], window_s) for r in data["rounds"]]
    spans = [f for f in found if f is not None]
    if not spans:
        return f"no {window_s:.0f}-second window"
    low, high = min(f[0] for f in spans), max(f[1] for f in spans)
    return f"every {window_s:.0f}-second window {_ratio(low)} to {_ratio(high)}"


def _short(samples: list[list[float]]) -> str:
    found = short_windows(samples, SHORT_WINDOWS_S[0])
    return "–" if found is None else f"{_ratio(found[0])}–{_ratio(found[1])}"


def _measured(data: dict[str, Any]) -> str:
    rounds = data["rounds"]
    stretches = ", ".join(_ratio(r["ratio_stretch"]) for r in rounds)
    if data["ratio_min"] is None:
        ran = " and ".join(f"{r['both_running_s']:.0f} s" for r in rounds)
        shorter = "; ".join(_span(data, w) for w in SHORT_WINDOWS_S)
        return (
            f"no {data['window_s']:.0f}-second window: both ran {ran}; whole stretch "
            f"{stretches}; {shorter}"
        )
    return (
        f"every window's ratio from {_ratio(data['ratio_min'])} to {_ratio(data['ratio_max'])}; "
        f"whole stretch {stretches} ({len(rounds)} round(s))"
    )


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["fair_share"]
    rounds = table(
        [
            "round",
            "both running (s)",
            "windows",
            "ratio min",
            "ratio median",
            "ratio max",
            "whole stretch",
            f"{SHORT_WINDOWS_S[0]:.0f} s windows",
            "lines at the last sample",
            "within 10%",
        ],
        "rrrrrrrrrl",
        (
            (
                number,
                f"{r['both_running_s']:.0f}",
                r["windows"],
                _ratio(r["ratio_min"]),
                _ratio(r["ratio_median"]),
                _ratio(r["ratio_max"]),
                _ratio(r["ratio_stretch"]),
                _short(r["samples"]),
                _last(r["samples"]),
                ("yes" if r["within_target"] else "no") if r["windows"] else "–",
            )
            for number, r in enumerate(data["rounds"], start=1)
        ),
    )
    targets = table(
        ["target", "measured", ""],
        "lll",
        [
            (
                data["target"],
                _measured(data),
                met(data["target_met"]) if data["ratio_min"] is not None else "not measured",
            )
        ],
    )
    return render(
        "fair_share",
        lines=f"{data['lines']:,}",
        batch_size=data["batch_size"],
        turn_s=data["turn_s"],
        turn_lines=f"{data.get('turn_lines', 0):,}",
        engine=f"echo sleeping {data['delay_s']} s per call"
        if data.get("delay_s")
        else "echo answering at once",
        window_s=f"{data['window_s']:.0f}",
        provenance=provenance("fair_share", data),
        rounds=rounds,
        targets=targets,
    ) + [""]
