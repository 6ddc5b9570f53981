"""``relayllm batch`` at scale: an OpenAI Batch API chat file through the command, against the
processor path on the same echo deployment, reading and writing the same amount of JSONL.

    python benchmarks/batch_file.py --sizes 1000000           # the documented figure
    python benchmarks/batch_file.py --sizes 100000 --repeats 1  # a quick look

Each contender runs as its own driver process on one cluster (``ray start --head`` started
here, 2 CPUs, token auth, the echo backend):

- ``relayllm batch``: the command itself, ``relayllm batch IN.jsonl --deployment bench-echo
  --output OUT.jsonl --concurrency C``; every output line is an OpenAI batch response line.
- processor path: a driver that reads a JSONL file of the same requests in the row protocol's
  shape (``custom_id``, ``messages``, ``sampling_params``) with ``ray.data.read_json``, runs
  ``build_processor(ProcessorConfig(deployment, concurrency=C))`` and writes one JSON line
  (``custom_id``, ``generated_text``) per row as the blocks arrive.

Reported per contender: rows/s over the driver process's whole life (start-up included),
the driver's peak RSS (the kernel's own high-water mark of that process, ``ru_maxrss``), and
CPU µs per row over every process of the cluster; then the ratio of the rows/s. One
warm-up run of each (2,000 lines) first; runs alternate order round by round. Writes
benchmarks/results/batch_file.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import RunMonitor, host_facts, write_results

DEPLOYMENT = "bench-echo"
BIN = Path(sys.executable).parent

DEPLOY_YAML = f"""\
deployments:
  - {{name: {DEPLOYMENT}, backend: echo, max_ongoing_requests: 256}}
input: {{rows: [{{q: x}}]}}
steps: [{{name: s, deployment: {DEPLOYMENT}, prompt: "{{q}}", output_column: a}}]
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cluster(
    temp: str, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, dict[str, str]]:
    """``ray start --head`` (as tests/core/test_cli.py does) and the env of its drivers."""
    port = _free_port()
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "token",
        "RELAYLLM_ECHO_BACKEND": "1",
        # Ray 2.60's head drains for up to 30 s on SIGTERM (Serve's replicas never finish
        # theirs): a cluster started for one run has nothing to hand over, so it stops at once.
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        **(extra_env or {}),
    }
    subprocess.run(  # the token stays in Ray's file: not printed
        [str(BIN / "ray"), "get-auth-token", "--generate"],
        env=env,
        check=False,
        stdout=subprocess.DEVNULL,
    )
    log = open(os.path.join(temp, "head.log"), "w")  # noqa: SIM115 (open while it runs)
    head = subprocess.Popen(
        [
            str(BIN / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp}",
            f"--ray-client-server-port={_free_port()}",
            f"--dashboard-agent-listen-port={_free_port()}",
            f"--dashboard-agent-grpc-port={_free_port()}",
            f"--runtime-env-agent-port={_free_port()}",
            f"--metrics-export-port={_free_port()}",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + 300
    try:
        while "Ray runtime started" not in Path(temp, "head.log").read_text():
            if head.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(Path(temp, "head.log").read_text()[-3000:])
            time.sleep(0.5)
    except BaseException:  # interrupted or failed: stop what was started
        stop_cluster(head)
        raise
    return head, {**env, "RAY_ADDRESS": f"127.0.0.1:{port}"}


def stop_cluster(head: subprocess.Popen) -> None:
    head.send_signal(signal.SIGTERM)
    try:
        head.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, signal.SIGKILL)
        head.wait(timeout=60)


def write_inputs(rows: int, directory: Path) -> tuple[Path, Path]:
    """The same requests twice: as Batch API lines, and as rows of the processor's shape."""
    batch, plain = directory / f"batch-{rows}.jsonl", directory / f"rows-{rows}.jsonl"
    with batch.open("w") as b, plain.open("w") as p:
        for i in range(rows):
            messages = [{"role": "user", "content": f"What is {i} plus one?"}]
            body = {"model": DEPLOYMENT, "messages": messages, "max_tokens": 16}
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            b.write(json.dumps({**line, "body": body}) + "\n")
            row = {
                "custom_id": f"r{i}",
                "messages": messages,
                "sampling_params": {"max_tokens": 16},
            }
            p.write(json.dumps(row) + "\n")
    return batch, plain


#: The processor path's driver (run with ``python -c``): read, process, write as blocks arrive.
PROCESSOR_DRIVER = """
import json, sys
import ray
from relayllm import ProcessorConfig, build_processor
from relayllm.data_context import keep_input_order

source, out, concurrency = sys.argv[1], sys.argv[2], int(sys.argv[3])
ray.init(log_to_driver=False)
ray.data.DataContext.get_current().enable_progress_bars = False
keep_input_order()
config = ProcessorConfig(deployment=%r, concurrency=concurrency)
ds = build_processor(config)(ray.data.read_json(source, override_num_blocks=%d))
with open(out, "w") as f:
    for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
        rows = batch.select(["custom_id", "generated_text"]).to_pylist()
        f.write("".join(json.dumps(r) + "\\n" for r in rows))
        f.flush()
"""


def run_child(argv: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """Run a driver process; its wall time, its peak RSS (MiB) and its stderr's tail."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stderr = process.stderr.read() if process.stderr else b""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if process.returncode != 0:
        raise RuntimeError(f"{argv[:3]} exited {process.returncode}: {stderr[-3000:]!r}")
    return seconds, usage.ru_maxrss / 1024, stderr.decode(errors="replace")[-500:]


def run_batch_cli(source: Path, out: Path, concurrency: int, env: dict[str, str]) -> list[str]:
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
        "--concurrency",
        str(concurrency),
    ]


def run_processor(source: Path, out: Path, concurrency: int, rows: int) -> list[str]:
    # The same block size as the command's chunks (relayllm.blocks), so both split the work
    # the same way.
    from relayllm.blocks import block_rows, stage_batch

    blocks = max(1, -(-rows // block_rows(rows, stage_batch(64))))
    code = PROCESSOR_DRIVER % (DEPLOYMENT, blocks)
    return [sys.executable, "-c", code, str(source), str(out), str(concurrency)]


def measure(argv: list[str], out: Path, rows: int, env: dict[str, str]) -> dict[str, Any]:
    with RunMonitor() as monitor:
        seconds, rss, tail = run_child(argv, env)
    written = sum(1 for _ in out.open())
    if written != rows:
        raise RuntimeError(f"{argv[:4]} wrote {written} lines, expected {rows}: {tail}")
    cpu = monitor.cpu_s
    return {
        "rows_per_s": rows / seconds,
        "seconds": seconds,
        "driver_peak_rss_mib": rss,
        "cpu_us_per_row": None if cpu is None else cpu / rows * 1e6,
        "cpu_s_by_process": {k: round(v, 2) for k, v in monitor.cpu_by_role().items() if v >= 0.01},
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes", type=lambda s: [int(float(x)) for x in s.split(",")], default=[1_000_000]
    )
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--warmup-lines", type=int, default=2000, help="the unmeasured first run of each; 0: none"
    )
    args = parser.parse_args()

    host = host_facts()
    temp = tempfile.mkdtemp(prefix="rlbatch-")  # short: Ray's socket paths live under it
    head, env = start_cluster(temp)
    results = []
    try:
        deploy = Path(temp, "deploy.yaml")
        deploy.write_text(DEPLOY_YAML)
        subprocess.run(
            [sys.executable, "-m", "relayllm.cli", "deploy", str(deploy)], env=env, check=True
        )
        work = Path(temp, "work")
        work.mkdir()
        # Warm-up, not measured: the cluster's first Ray Data job starts its singleton actors
        # (stats, autoscaling coordinator), whose start-up would land on whoever runs first.
        # 0 skips it (a toy run, where no figure is read).
        if warm := args.warmup_lines:
            batch_in, plain_in = write_inputs(warm, work)
            out = work / "out.jsonl"
            measure(run_batch_cli(batch_in, out, args.concurrency, env), out, warm, env)
            out.unlink()
            measure(run_processor(plain_in, out, args.concurrency, warm), out, warm, env)
        for rows in args.sizes:
            batch_in, plain_in = write_inputs(rows, work)
            out = work / "out.jsonl"
            contenders = {
                "relayllm batch": run_batch_cli(batch_in, out, args.concurrency, env),
                "processor path": run_processor(plain_in, out, args.concurrency, rows),
            }
            names = list(contenders)
            samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
            for round_ in range(args.repeats):
                for name in names if round_ % 2 == 0 else names[::-1]:
                    out.unlink(missing_ok=True)
                    out.with_name("out.errors.jsonl").unlink(missing_ok=True)
                    sample = measure(contenders[name], out, rows, env)
                    samples[name].append(sample)
                    print(
                        f"  {rows:>9,} rows, round {round_}: {name:>15} "
                        f"{sample['rows_per_s']:>8,.0f} rows/s "
                        f"{sample['cpu_us_per_row'] or 0:>6.0f} CPU us/row "
                        f"{sample['driver_peak_rss_mib']:>6.0f} MiB driver peak",
                        flush=True,
                    )
            summary: dict[str, Any] = {
                name: {
                    "rows_per_s": statistics.median(s["rows_per_s"] for s in runs),
                    "cpu_us_per_row": statistics.median(s["cpu_us_per_row"] or 0 for s in runs),
                    "driver_peak_rss_mib": max(s["driver_peak_rss_mib"] for s in runs),
                    "runs": len(runs),
                }
                for name, runs in samples.items()
            }
            ratio = (
                summary["relayllm batch"]["rows_per_s"] / summary["processor path"]["rows_per_s"]
            )
            summary["ratio relayllm batch / processor path"] = ratio
            print(f"{rows:,} rows: relayllm batch / processor path = {ratio:.2f}x", flush=True)
            results.append({"rows": rows, "summary": summary, "samples": samples})
            batch_in.unlink()
            plain_in.unlink()
    finally:
        stop_cluster(head)
        shutil.rmtree(temp, ignore_errors=True)
    path = write_results(
        "batch_file",
        {
            "host": host,
            "concurrency": args.concurrency,
            "targets": {"driver_peak_rss_mib_below": 1024, "ratio_at_least": 0.9},
            "sizes": results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
