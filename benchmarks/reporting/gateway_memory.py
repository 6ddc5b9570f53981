"""Question 11b: the batch service gateway's memory on a large upload and download, through its
own HTTP server and through Serve's proxy (results/gateway_memory.json)."""

from __future__ import annotations

from typing import Any

from reporting.common import provenance, render, table

DOORS = {"direct": "the gateway's own server", "proxy": "Serve's proxy"}


def section(results: dict[str, dict[str, Any]]) -> list[str]:
    data = results["gateway_memory"]
    rows = data["rows"]
    by = {(r["door"], round(r["mb"]), r["phase"], r["role"]): r for r in rows}
    keys = sorted({(r["door"], round(r["mb"]), r["phase"]) for r in rows}, key=_order)
    cells = []
    for door, mb, phase in keys:
        replica = by.get((door, mb, phase, "gateway replica"), {})
        proxy = by.get((door, mb, phase, "proxy"), {})
        cells.append(
            (
                DOORS.get(door, door),
                mb,
                phase,
                f"{replica.get('s', float('nan')):.1f}",
                _mib(replica.get("+VmRSS")),
                _mib(proxy.get("+VmRSS")),
                _mib(replica.get("peak VmHWM")),
            )
        )
    head = [
        "door",
        "MB",
        "phase",
        "seconds",
        "gateway replica growth (MiB)",
        "proxy growth (MiB)",
        "gateway replica peak (MiB)",
    ]
    largest = max(round(r["mb"]) for r in rows)
    growth = {
        door: max(
            (
                r["+VmRSS"]
                for r in rows
                if (r["door"], r["role"]) == (door, "gateway replica") and round(r["mb"]) == largest
            ),
            default=float("nan"),
        )
        for door in DOORS
    }
    return render(
        "gateway_memory",
        provenance=provenance("gateway_memory", data),
        contenders=table(head, "lrlrrrr", cells),
        largest=largest,
        direct=_mib(growth["direct"]),
        proxy=_mib(growth["proxy"]),
    ) + [""]


def _order(key: tuple[str, int, str]) -> tuple[int, int, int]:
    door, mb, phase = key
    return (list(DOORS).index(door) if door in DOORS else 9, mb, phase != "upload")


def _mib(value: float | None) -> str:
    return "—" if value is None else f"{value:,.1f}"
