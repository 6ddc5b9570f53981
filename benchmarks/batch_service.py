"""The Batch API service at scale: the same OpenAI Batch API chat file through ``relayllm
batch`` and through ``relayllm serve`` with an unmodified ``openai`` client, on one echo
deployment, with the memory of the service's processes as the file grows.

    python benchmarks/batch_service.py --sizes 100000,1000000 --repeats 2   # the documented run
    python benchmarks/batch_service.py --sizes 20000 --repeats 1            # a quick look

One cluster (``ray start --head``, 2 CPUs, token auth, the echo backend; benchmarks/batch_file.py's
helpers) runs ``relayllm serve`` (the echo deployment, one gateway, its runner, with the same
``--batch-size`` and ``--concurrency`` the command is given), then each contender as a driver
process of its own:

- ``relayllm batch``: ``relayllm batch IN.jsonl --deployment bench-echo --output OUT.jsonl
  --batch-size B --concurrency C``.
- the service: a driver with the ``openai`` client on the gateway's base URL:
  ``files.create(purpose="batch")`` -> ``batches.create`` -> ``batches.retrieve`` every 0.5 s
  until it ends -> the output file streamed to disk (``files.with_streaming_response.content``).

Reported per contender: lines/s over the driver's whole life (the service's upload and
download included), CPU µs per line over every process of the cluster, and peak RSS (MiB) per
process, sampled by process title from /proc every 0.2 s while the driver runs: the gateway's
Serve replica, the batch runner's actor, the stage workers, the echo replica, and the
driver's own (the kernel's ``ru_maxrss``). Every ``custom_id`` is checked to be in the output
exactly once. One warm-up run of each (2,000 lines) first; the order alternates round by
round. Writes benchmarks/results/batch_service.json.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import RunMonitor, host_facts, write_results
from batch_file import (
    DEPLOY_YAML,
    DEPLOYMENT,
    _free_port,
    run_child,
    start_cluster,
    stop_cluster,
    write_inputs,
)

PAGE = os.sysconf("SC_PAGE_SIZE")
#: The project key the service is started with and its driver sends (made per run).
KEY = secrets.token_hex(24)

#: The service's driver (run with ``python -c``): upload, create, poll, download to disk.
SERVICE_DRIVER = """
import json, sys, time
from openai import OpenAI

base, source, out, phases, key = sys.argv[1:6]
client = OpenAI(base_url=base, api_key=key, timeout=600, max_retries=0)
began = time.perf_counter()
with open(source, "rb") as f:
    upload = client.files.create(file=f, purpose="batch")
uploaded = time.perf_counter()
batch = client.batches.create(
    input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
)
while batch.status not in ("completed", "failed", "expired", "cancelled"):
    time.sleep(0.5)
    batch = client.batches.retrieve(batch.id)
ran = time.perf_counter()
if batch.status != "completed" or not batch.output_file_id:
    sys.exit(f"batch ended {batch.status}: {batch.errors}")
with client.files.with_streaming_response.content(batch.output_file_id) as response:
    with open(out, "wb") as f:
        for piece in response.iter_bytes(1 << 20):
            f.write(piece)
done = time.perf_counter()
with open(phases, "w") as f:
    json.dump(
        {
            "upload_s": uploaded - began,
            "batch_s": ran - uploaded,
            "download_s": done - ran,
            "files": [upload.id, batch.output_file_id, batch.error_file_id],
            "request_counts": batch.request_counts.model_dump(),
        },
        f,
    )
"""


class MemoryMonitor(RunMonitor):
    """RunMonitor, and the peak RSS of each kind of process (by its title) while it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.peak_by_role: dict[str, int] = {}

    def _sample(self) -> None:
        super()._sample()
        for pid in self._pids:
            stat_ok = _rss(pid)
            if stat_ok is None:
                continue
            start, rss = stat_ok
            role = self._names.get((pid, start), "?")
            self.peak_by_role[role] = max(self.peak_by_role.get(role, 0), rss)


def _rss(pid: int) -> tuple[str, int] | None:
    """(the process's start time as RunMonitor keys it, its resident bytes)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as f:
            resident = int(f.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return stat[19], resident * PAGE  # stat[19]: field 22, starttime (as RunMonitor's key)


def check_once(out: Path, rows: int) -> None:
    """Every ``custom_id`` r0..r{rows-1} in the output exactly once, each a success."""
    seen = bytearray(rows)
    with out.open("rb") as lines:
        for raw in lines:
            line = json.loads(raw)
            index = int(line["custom_id"][1:])
            if seen[index]:
                raise RuntimeError(f"{line['custom_id']} twice in {out.name}")
            if line.get("error") or line["response"]["status_code"] != 200:
                raise RuntimeError(f"{line['custom_id']} failed: {raw[:300]!r}")
            seen[index] = 1
    missing = rows - sum(seen)
    if missing:
        raise RuntimeError(f"{missing} custom_ids missing from {out.name}")


def role_of(title: str) -> str | None:
    """The processes the memory figures name, by title (the rest are Ray's own)."""
    if title == "driver":
        return None  # this process: the driver's own is ru_maxrss
    if title.startswith("ray::ServeReplica:") and "gateway" in title:
        return "gateway replica"
    if title.startswith("ray::ServeReplica:") and DEPLOYMENT in title:
        return "echo replica"
    if title.startswith("ray::BatchRunner"):
        return "batch runner"
    if "ServeStage" in title or "serve_stage" in title:  # an actor, or a task's worker
        return "stage worker"
    if "ReadChunk" in title:
        return "read task"
    return None


def measure(
    argv: list[str], out: Path, rows: int, env: dict[str, str], phases: Path | None = None
) -> dict[str, Any]:
    with MemoryMonitor() as monitor:
        seconds, rss, tail = run_child(argv, env)
    check_once(out, rows)
    cpu = monitor.cpu_s
    peaks: dict[str, float] = {}
    titles: dict[str, float] = {}
    for title, peak in monitor.peak_by_role.items():
        mib = peak / (1 << 20)
        role = role_of(title)
        if role is not None:
            peaks[role] = max(peaks.get(role, 0.0), mib)
            titles[title] = round(mib, 1)
    sample: dict[str, Any] = {
        "lines_per_s": rows / seconds,
        "seconds": seconds,
        "cpu_us_per_line": None if cpu is None else cpu / rows * 1e6,
        "peak_rss_mib": {"driver": rss, **dict(sorted(peaks.items()))},
        "peak_rss_mib_by_title": titles,
        "cpu_s_by_process": {k: round(v, 2) for k, v in monitor.cpu_by_role().items() if v >= 0.01},
    }
    if phases is not None:
        facts = json.loads(phases.read_text())
        sample["phases_s"] = {k: facts[k] for k in ("upload_s", "batch_s", "download_s")}
        sample["files"] = facts["files"]
    return sample


def batch_cli(source: Path, out: Path, args: argparse.Namespace) -> list[str]:
    return [
        sys.executable,
        "-m",
        "relayllm.cli",
        "batch",
        str(source),
        "--deployment",
        DEPLOYMENT,
        "--output",
        str(out),
        "--batch-size",
        str(args.batch_size),
        "--concurrency",
        str(args.concurrency),
    ]


def service_driver(base: str, source: Path, out: Path, phases: Path) -> list[str]:
    return [sys.executable, "-c", SERVICE_DRIVER, base, str(source), str(out), str(phases), KEY]


def delete_files(base: str, ids: list[str | None]) -> None:
    """The run's upload and output files, deleted from the service (not timed)."""
    from openai import OpenAI

    client = OpenAI(base_url=base, api_key=KEY)
    for file_id in ids:
        if file_id:
            client.files.delete(file_id)


def serve(temp: str, env: dict[str, str], args: argparse.Namespace) -> str:
    """``relayllm serve`` on the cluster: the echo deployment and a gateway; its base URL."""
    config = Path(temp, "deploy.yaml")
    config.write_text(DEPLOY_YAML)
    port = _free_port()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "relayllm.cli",
            "serve",
            str(config),
            "--port",
            str(port),
            "--direct-port",
            str(_free_port()),
            "--state-dir",
            str(Path(temp, "state")),
            "--batch-size",
            str(args.batch_size),
            "--concurrency",
            str(args.concurrency),
        ],
        env={**env, "RELAYLLM_API_KEYS": f"bench={KEY}"},
        check=True,
        capture_output=True,
        text=True,
    )
    return next(
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("base URL: ")
    )


def cluster(attempts: int = 3) -> tuple[str, subprocess.Popen, dict[str, str]]:
    """``start_cluster`` in a temp dir of its own, tried again on a machine so busy that Ray's
    node start times out (what a failed start left running is ended first)."""
    # The raylet waits this long for its agents (Python processes, slow to start when busy).
    os.environ.setdefault("RAY_agent_register_timeout_ms", "120000")
    for attempt in range(attempts):
        temp = tempfile.mkdtemp(prefix="rlsvc-")  # short: Ray's socket paths live under it
        try:
            head, env = start_cluster(temp)
            return temp, head, env
        except Exception:
            if attempt == attempts - 1:
                raise
            _end_leftovers(temp)
            shutil.rmtree(temp, ignore_errors=True)
            time.sleep(10)
    raise AssertionError("unreachable")


def _end_leftovers(temp: str) -> None:
    """The processes a failed start left (Ray's agents), found by their temp dir."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if temp.encode() in f.read():
                    os.kill(int(name), 15)
        except OSError:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(float(x)) for x in s.split(",")],
        default=[100_000, 1_000_000],
    )
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--warmup-lines", type=int, default=2000, help="the unmeasured first run of each; 0: none"
    )
    args = parser.parse_args()

    host = host_facts()
    temp, head, env = cluster()
    results = []
    try:
        base = serve(temp, env, args)
        work = Path(temp, "work")
        work.mkdir()
        out, phases = work / "out.jsonl", work / "phases.json"
        # Warm-up, not measured: the cluster's first Ray Data jobs start its singleton actors.
        # 0 skips it (a toy run, where no figure is read).
        if lines := args.warmup_lines:
            batch_in, plain_in = write_inputs(lines, work)
            plain_in.unlink()
            measure(batch_cli(batch_in, out, args), out, lines, env)
            warm = measure(service_driver(base, batch_in, out, phases), out, lines, env, phases)
            delete_files(base, warm["files"])
        for rows in args.sizes:
            batch_in, plain_in = write_inputs(rows, work)
            plain_in.unlink()
            names = ["relayllm batch", "service"]
            samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for round_ in range(args.repeats):
                for name in names if round_ % 2 == 0 else names[::-1]:
                    out.unlink(missing_ok=True)
                    out.with_name("out.errors.jsonl").unlink(missing_ok=True)
                    if name == "service":
                        argv = service_driver(base, batch_in, out, phases)
                        sample = measure(argv, out, rows, env, phases)
                        delete_files(base, sample.pop("files"))
                    else:
                        sample = measure(batch_cli(batch_in, out, args), out, rows, env)
                    samples[name].append(sample)
                    peaks = " ".join(f"{k} {v:.0f}" for k, v in sample["peak_rss_mib"].items())
                    print(
                        f"  {rows:>9,} lines, round {round_}: {name:>14} "
                        f"{sample['lines_per_s']:>8,.0f} lines/s "
                        f"{sample['cpu_us_per_line'] or 0:>6.0f} CPU us/line; "
                        f"peak RSS MiB: {peaks}",
                        flush=True,
                    )
            summary: dict[str, Any] = {}
            for name, runs in samples.items():
                roles = sorted({role for s in runs for role in s["peak_rss_mib"]})
                summary[name] = {
                    "lines_per_s": statistics.median(s["lines_per_s"] for s in runs),
                    "cpu_us_per_line": statistics.median(s["cpu_us_per_line"] or 0 for s in runs),
                    "peak_rss_mib": {
                        role: max(s["peak_rss_mib"].get(role, 0.0) for s in runs) for role in roles
                    },
                    "runs": len(runs),
                }
            ratio = summary["service"]["lines_per_s"] / summary["relayllm batch"]["lines_per_s"]
            summary["ratio service / relayllm batch"] = ratio
            summary["ratios by round"] = [
                s["lines_per_s"] / b["lines_per_s"]
                for s, b in zip(samples["service"], samples["relayllm batch"], strict=True)
            ]
            print(f"{rows:,} lines: service / relayllm batch = {ratio:.2f}x", flush=True)
            results.append({"rows": rows, "summary": summary, "samples": samples})
            batch_in.unlink()
            path = write_results(  # after each size: a later failure keeps the earlier ones
                "batch_service",
                {
                    "host": host,
                    "concurrency": args.concurrency,
                    "batch_size": args.batch_size,
                    "targets": {"ratio_at_least": 0.9, "memory_growth_at_most": 1.25},
                    "sizes": results,
                },
            )
            print(f"wrote {path}", flush=True)
    finally:
        stop_cluster(head)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
