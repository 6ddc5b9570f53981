"""The usage ledger's overhead (issue 47's target: the Batch API service's throughput with the
ledger within its spread of without).

    python benchmarks/ledger.py --lines 20000 --repeats 6   # the documented run
    python benchmarks/ledger.py --lines 4000 --repeats 1    # a quick look

One cluster (``ray start --head``, 2 CPUs, token auth, the echo backend; the helpers of
benchmarks/batch_service.py) runs one echo deployment and two gateways side by side, each
with its own state directory and runner, the same ``--batch-size`` and ``--concurrency``:
``ledger-on`` records usage (the default) and ``ledger-off`` does not
(``ServiceSettings.record_usage=False``, what ``relayllm serve --no-record-usage`` sets). Each
round, the same chat file of ``--lines`` lines goes through each gateway in turn, the order
alternating round by round, with benchmarks/batch_service.py's driver (the ``openai`` client:
upload, create, retrieve every 0.5 s until it ends, the output file streamed to disk; every
``custom_id`` checked once).

Reported per run: lines/s of the batch (create to completed, as the driver polls it) and over
the driver's whole life, and CPU µs per line over every process of the cluster; per side the
median and the spread (min-max); the ratio of the medians (with / without) and each round's.
The ledger is read after each run: the side that records must have charged every line, the
other none. Then the ledger's own work alone: the last run's output lines charged into a fresh
ledger block by block, as the runner charges them (CPU and wall time per line). One warm-up
run through each gateway first (2,000 lines). Writes benchmarks/results/ledger.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import write_results
from batch_file import DEPLOY_YAML, _free_port, stop_cluster, write_inputs
from batch_service import KEY, cluster, delete_files, measure, service_driver
from overhead import host_facts

SIDES = ("ledger-on", "ledger-off")

#: Both gateways, through the Python API (``relayllm serve`` starts one per name: both are
#: named here), on Serve's one proxy under their own prefixes, each with its own server.
SERVE = """
import json, sys
from relayllm_service.deploy import serve_file
from relayllm_service.tenancy.projects import service_keys
from relayllm_service.settings import ServiceSettings

config, state, port, batch_size, concurrency = sys.argv[1:6]
urls = {}
for name in ("ledger-on", "ledger-off"):
    settings = ServiceSettings(
        name=name, state_dir=f"{state}/{name}", port=int(port), direct_port=0,
        route_prefix=f"/{name}", batch_size=int(batch_size), concurrency=int(concurrency),
        record_usage=name == "ledger-on",
    )
    urls[name] = serve_file(config, settings, service_keys(), address="auto").url
print("URLS " + json.dumps(urls))
"""


def serve(temp: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, str]:
    config = Path(temp, "deploy.yaml")
    config.write_text(DEPLOY_YAML)
    argv = [sys.executable, "-c", SERVE, str(config), str(Path(temp, "state")), str(_free_port())]
    done = subprocess.run(
        [*argv, str(args.batch_size), str(args.concurrency)],
        env={**env, "RELAYLLM_API_KEYS": f"bench={KEY}"},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the gateways did not start: {done.stderr[-3000:]}")
    line = next(line for line in done.stdout.splitlines() if line.startswith("URLS "))
    return json.loads(line[len("URLS ") :])


def charged(temp: str, side: str) -> int:
    """The requests the side's ledger holds, every batch and minute summed."""
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.usage import UsageLedger

    ledger = UsageLedger(ServiceSettings(state_dir=f"{temp}/state/{side}").store_path)
    try:
        return sum(row["requests"] for row in ledger.rows(0, 1 << 40))
    finally:
        ledger.close()


def run_once(temp: str, base: str, side: str, source: Path, rows: int, env: dict[str, str]):
    out, phases = Path(temp, "work", "out.jsonl"), Path(temp, "work", "phases.json")
    out.unlink(missing_ok=True)
    before = charged(temp, side)
    sample = measure(service_driver(base, source, out, phases), out, rows, env, phases)
    delete_files(base, sample.pop("files"))
    sample["batch_lines_per_s"] = rows / sample["phases_s"]["batch_s"]
    sample["charged"] = charged(temp, side) - before
    expected = rows if side == "ledger-on" else 0
    if sample["charged"] != expected:
        raise RuntimeError(f"{side} charged {sample['charged']} lines, not {expected}")
    return sample


def charge_alone(temp: str, out: Path, rows: int, block: int) -> dict[str, Any]:
    """The ledger's own work, alone: a run's output lines charged into a fresh ledger block
    by block, as the runner charges them after each block it writes; CPU and wall time per
    line of the charges only (the writes not counted)."""
    from relayllm_service.store.sqlite import SQLiteJobStore
    from relayllm_service.tenancy.usage import UsageLedger

    state = Path(temp, "charge-alone")
    state.mkdir()
    path = str(state / "jobs.sqlite")
    store = SQLiteJobStore(path)
    upload = store.add_file("bench", filename="in.jsonl", purpose="batch", bytes=1)
    batch = store.create_batch("bench", input_file_id=upload.id, endpoint="/v1/chat/completions")
    claim = store.claim(batch.id, "bench")
    ledger = UsageLedger(path)
    lines = out.read_bytes().splitlines(keepends=True)
    work, cpu, wall, charged = state / "out.jsonl", 0.0, 0.0, 0
    with work.open("ab") as written:
        for start in range(0, len(lines), block):
            written.write(b"".join(lines[start : start + block]))
            written.flush()
            cpu0, wall0 = time.process_time(), time.perf_counter()
            charged += ledger.charge_lines(batch.id, claim, str(work))
            cpu += time.process_time() - cpu0
            wall += time.perf_counter() - wall0
    ledger.close()
    store.close()
    if charged != rows:
        raise RuntimeError(f"charged {charged} lines alone, not {rows}")
    return {
        "block": block,
        "cpu_us_per_line": cpu / rows * 1e6,
        "wall_us_per_line": wall / rows * 1e6,
    }


def summarise(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side the median and spread of each figure; the ratio of the batch lines/s medians
    (with / without), each round's, and the judgement: with the ledger, the median is within
    (or above) the spread of the runs without it."""
    found: dict[str, Any] = {}
    for side in SIDES:
        for figure in ("batch_lines_per_s", "lines_per_s", "cpu_us_per_line"):
            values = [r[side][figure] or 0.0 for r in rounds]
            found.setdefault(side, {})[figure] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
    on, off = found["ledger-on"]["batch_lines_per_s"], found["ledger-off"]["batch_lines_per_s"]
    found["ratio"] = on["median"] / off["median"]
    found["ratios_by_round"] = [
        r["ledger-on"]["batch_lines_per_s"] / r["ledger-off"]["batch_lines_per_s"] for r in rounds
    ]
    found["spread_without"] = (off["max"] - off["min"]) / off["median"]
    found["within_spread"] = on["median"] >= off["min"]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=lambda s: int(float(s)), default=20_000)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--warmup-lines", type=int, default=2000)
    args = parser.parse_args()

    host = host_facts()
    temp, head, env = cluster()
    try:
        urls = serve(temp, env, args)
        work = Path(temp, "work")
        work.mkdir()
        warm, plain = write_inputs(args.warmup_lines, work)
        plain.unlink()
        for side in SIDES:  # not measured: each runner's first Ray Data job
            run_once(temp, urls[side], side, warm, args.warmup_lines, env)
        source, plain = write_inputs(args.lines, work)
        plain.unlink()
        rounds: list[dict[str, Any]] = []
        for number in range(args.repeats):
            order = SIDES if number % 2 == 0 else SIDES[::-1]
            found: dict[str, Any] = {"order": list(order)}
            for side in order:
                found[side] = sample = run_once(temp, urls[side], side, source, args.lines, env)
                print(
                    f"round {number}: {side:>10} {sample['batch_lines_per_s']:>8,.0f} lines/s "
                    f"(batch), {sample['lines_per_s']:>8,.0f} (driver), "
                    f"{sample['cpu_us_per_line'] or 0:>6.0f} CPU us/line",
                    flush=True,
                )
            rounds.append(found)
        summary = summarise(rounds)
        alone = charge_alone(temp, work / "out.jsonl", args.lines, args.batch_size)
        print(
            f"the ledger alone: {alone['cpu_us_per_line']:.1f} CPU us per line "
            f"({alone['wall_us_per_line']:.1f} us wall), blocks of {alone['block']}",
            flush=True,
        )
        print(
            f"with / without the ledger: {summary['ratio']:.3f} (rounds "
            f"{', '.join(f'{r:.3f}' for r in summary['ratios_by_round'])}); spread without "
            f"{summary['spread_without'] * 100:.1f}%",
            flush=True,
        )
        path = write_results(
            "ledger",
            {
                "host": host,
                "lines": args.lines,
                "batch_size": args.batch_size,
                "concurrency": args.concurrency,
                "target": "throughput with the ledger within the spread of without",
                "load_average_at_end": os.getloadavg()[0],
                "summary": summary,
                "charge_alone": alone,
                "rounds": rounds,
            },
        )
        print(f"wrote {path}", flush=True)
    finally:
        stop_cluster(head)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
