"""Helpers shared by the benchmark scripts: machine facts and result files."""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

#: Where results are written: the committed folder, or (a trial run, or a test at toy size that
#: must not touch tracked files) the folder ``BENCHMARK_RESULTS_DIR`` names.
RESULTS = Path(
    os.environ.get("BENCHMARK_RESULTS_DIR") or Path(__file__).resolve().parent / "results"
)


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
        "date": time.strftime("%Y-%m-%d"),
    }


def git_commit() -> str | None:
    """The commit the benchmark ran at, "-dirty" when the code it runs (the benchmarks and
    the packages) differed from it."""
    root = Path(__file__).resolve().parents[1]  # both commands ask this checkout, wherever run
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=root
        )
        changed = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "benchmarks/*.py", "packages"],
            capture_output=True,
            cwd=root,
        )
    except OSError:
        return None
    commit = out.stdout.strip()
    return None if not commit else commit + ("-dirty" if changed.returncode == 1 else "")


#: Options that coordinate a run with other work on its machine (a lock file's path) and say
#: nothing about what was measured: left out of the recorded command.
LOCAL_OPTIONS = ("--lock",)


def recorded_command(argv: list[str]) -> str:
    """The command as the results page gives it: the script and its options, without
    :data:`LOCAL_OPTIONS` (and their values)."""
    kept, skip = [], False
    for arg in argv[1:]:
        if skip:
            skip = False
        elif arg in LOCAL_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(option + "=" for option in LOCAL_OPTIONS)):
            kept.append(arg)
    return "python " + shlex.join([f"benchmarks/{Path(argv[0]).name}", *kept])


def write_results(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    payload = {
        "benchmark": name,
        "command": recorded_command(sys.argv),
        "machine": machine(),
        "commit": git_commit(),
        **payload,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


class Sampler:
    """A context manager that calls ``sample()`` every ``period_s`` on a thread while its block
    runs. Subclasses define ``sample`` and keep what it measures."""

    def __init__(self, period_s: float = 0.5) -> None:
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self._period)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
