"""What the benchmark scripts share: machine facts, result files, and the measuring itself (a
sampler thread, the CPU time and peak RSS of a run's Ray cluster)."""

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
from typing import Any

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


# -- measuring a run's processes ------------------------------------------------------------


def _descendants(root: int) -> list[int]:
    """``root`` and every process below it, from /proc/PID/task/TID/children (cheap: only
    our own tree is read, not every process on the machine)."""
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
            except OSError:
                pass
    return tree


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3 onwards), or None."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:  # not Linux: the lifetime peak is the best we have
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class RunMonitor:
    """While the block runs: the driver's peak RSS, and the CPU time of every process of this
    driver's Ray cluster (its descendants). Ray's raylet ignores SIGCHLD, so an exited worker's
    time is not added to any parent: each process is sampled while it lives (every 0.2 s; the
    process list is rescanned every second). Linux; elsewhere only the RSS peak is kept."""

    def __init__(self, period_s: float = 0.2, rescan_s: float = 1.0) -> None:
        self._linux = os.path.isdir("/proc")
        self._period, self._rescan = period_s, rescan_s
        self._tick = os.sysconf("SC_CLK_TCK") if self._linux else 1
        self._baseline: dict[tuple[int, str], int] = {}
        self._latest: dict[tuple[int, str], int] = {}
        self._names: dict[tuple[int, str], str] = {}
        self._pids: list[int] = []
        self.peak_rss = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _scan(self) -> None:
        self._pids = _descendants(os.getpid())

    def _sample(self) -> None:
        self.peak_rss = max(self.peak_rss, _rss_bytes())
        if not self._linux:
            return
        for pid in self._pids:
            stat = _stat(pid)
            if stat:  # key by start time too: a pid can be reused
                key = (pid, stat[19])
                self._latest[key] = int(stat[11]) + int(stat[12])
                if self._names.get(key, "ray::IDLE") in ("ray::IDLE", "default_worker.py"):
                    self._names[key] = _role(pid)  # a worker is titled once it has a job

    def _run(self) -> None:
        last_scan = 0.0
        while not self._stop.wait(self._period):
            if self._linux and time.monotonic() - last_scan >= self._rescan:
                self._scan()
                last_scan = time.monotonic()
            self._sample()

    def __enter__(self) -> RunMonitor:
        if self._linux:
            self._scan()
            self._sample()
            self._baseline = dict(self._latest)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if self._linux:
            self._scan()
        self._sample()

    @property
    def cpu_s(self) -> float | None:
        return sum(self.cpu_by_role().values()) if self._linux else None

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds per kind of process (driver, raylet, stage actor, replica, ...)."""
        out: dict[str, float] = {}
        for key, ticks in self._latest.items():
            role = self._names.get(key, "?")
            out[role] = out.get(role, 0.0) + (ticks - self._baseline.get(key, 0)) / self._tick
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _role(pid: int) -> str:
    if pid == os.getpid():
        return "driver"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace")
    if first.startswith("ray::"):
        return first.split(".", 1)[0]  # ray::MapWorker(MapBatches(ServeStage)).submit -> actor
    script = next((a.decode(errors="replace") for a in argv[1:] if a.endswith(b".py")), "")
    return os.path.basename(script or first) or "?"


def host_facts() -> dict[str, Any]:
    """What the result files' machine entry lacks: CPU model, memory, and how busy the machine
    was when the benchmark started (it is shared)."""
    facts: dict[str, Any] = {}
    try:
        with open("/proc/cpuinfo") as f:
            facts["cpu_model"] = next(
                (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None
            )
        with open("/proc/meminfo") as f:
            facts["memory_gib"] = int(f.readline().split()[1]) / 2**20
        facts["load_average_at_start"] = os.getloadavg()[0]
    except OSError:
        pass
    return facts
