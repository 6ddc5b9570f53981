"""Peak memory of ``relayllm demo``: the whole process tree (driver, Ray, the replica, vLLM's
engine core), sampled every half second.

    python benchmarks/demo_memory.py [--label NAME]

RSS counts a page shared by several processes (torch's libraries) once per process, so the
sum over-states; PSS splits shared pages among their users and is what the machine pays. Both
are recorded; the target (under 3 GiB) is on PSS and RSS alike. Writes
``results/demo_memory[-LABEL].json``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

import psutil

from _common import Sampler, write_results

GIB = 1024**3


class TreeMemory(Sampler):
    """Peak RSS and PSS summed over a process and all its descendants."""

    def __init__(self, pid: int) -> None:
        super().__init__(period_s=0.5)
        self.root = psutil.Process(pid)
        self.peak_rss = self.peak_pss = 0
        self.processes = 0

    def sample(self) -> None:
        rss = pss = 0
        try:
            tree = [self.root, *self.root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        for proc in tree:
            try:
                info = proc.memory_full_info()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            rss += info.rss
            pss += getattr(info, "pss", info.rss)
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.processes = max(self.processes, len(tree))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    command = [sys.executable, "-m", "relayllm.cli", "demo"]
    started = time.monotonic()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with TreeMemory(proc.pid) as memory:
        output, _ = proc.communicate()
    if proc.returncode != 0:
        sys.exit(f"relayllm demo failed ({proc.returncode}):\n{output[-3000:]}")
    result = {
        "peak_rss_gib": round(memory.peak_rss / GIB, 2),
        "peak_pss_gib": round(memory.peak_pss / GIB, 2),
        "max_processes": memory.processes,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(result)
    write_results("demo_memory" + (f"-{args.label}" if args.label else ""), result)


if __name__ == "__main__":
    main()
