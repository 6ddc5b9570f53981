"""Question 6: the demo pipeline's peak memory and its engine's start (results/demo_memory.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import met, n, provenance, render, table


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["demo_memory"]
    variants = {v["variant"]: v for v in data["variants"]}
    sized = variants["sized"]
    start = data["engine_start"]
    phases = start.get("engine_start_phases") or {}
    by_process = sorted(
        (sized.get("pss_gib_at_peak_by_process") or {}).items(), key=lambda kv: -kv[1]
    )
    kv = start.get("kv_cache_memory_bytes")
    peak = sized.get("peak_cgroup_anon_gib")
    measured = (
        f"sized {peak:.2f} GiB (cgroup anon; PSS {sized['peak_pss_gib']:.2f}; one run)"
        if peak is not None
        else f"sized {sized['peak_pss_gib']:.2f} GiB PSS (one run)"
    )
    return render(
        "memory",
        provenance=provenance("demo_memory", data),
        variants=table(
            [
                "variant",
                "commit",
                "peak cgroup anon GiB",
                "peak PSS GiB",
                "peak RSS GiB",
                "wall (s)",
            ],
            "llrrrr",
            (
                (
                    v["variant"],
                    v.get("commit") or data.get("commit", "?"),
                    n(v.get("peak_cgroup_anon_gib"), 2),
                    f"{v['peak_pss_gib']:.2f}",
                    f"{v['peak_rss_gib']:.2f}",
                    f"{v['seconds']:.1f}",
                )
                for v in variants.values()
            ),
        ),
        by_process=", ".join(f"{name} {gib:.2f}" for name, gib in by_process) or "not recorded",
        ready=n(start.get("engine_ready_s"), 1),
        phases=", ".join(f"{k[:-2].replace('_', ' ')} {v:.1f} s" for k, v in phases.items()),
        kv=f"; KV cache {kv / 2**20:.0f} MiB ({start.get('kv_cache_blocks')} blocks)" if kv else "",
        targets=table(
            ["target", "measured", ""], "lll", [(data["target"], measured, met(data["target_met"]))]
        ),
    ) + [""]
