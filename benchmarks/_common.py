"""Helpers shared by the benchmark scripts: machine facts and result files."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "date": time.strftime("%Y-%m-%d"),
    }


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return out.stdout.strip() or None
    except OSError:
        return None


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "command": "python " + shlex.join([f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]]),
        "machine": machine(),
        "commit": git_commit(),
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path
