"""What the vLLM engine's metrics cost the batch path: engine_metrics on vs off.

Question: with the vllm backend's ``engine_metrics`` on (vLLM's per-step stats, its Ray
Prometheus stat logger and relayllm's summary), how much output throughput and CPU does a
batch job lose compared with the engine keeping no stats? The option's default is on only if
the median ratio is at least 0.98x.

Each setting runs ``benchmarks/engine.py``'s relayllm side in its own process (engine start,
warm-up, one timed pass per row count), the settings alternating over ``--runs`` (off first in
even runs) so a noisy minute on a shared machine hits both.

    python benchmarks/engine_metrics.py                 # demo model, 128 and 512 rows, 2 runs

Writes benchmarks/results/engine_metrics.json and prints a table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

from _common import write_results  # the script's folder is on sys.path
from engine import child, model_path, sampling, spread

#: The ratio (on / off, output tokens/s) at or above which metrics default to on.
DEFAULT_ON_IF = 0.98


def summarize(runs: list[dict[str, Any]], rows: list[int]) -> list[dict[str, Any]]:
    table = []
    for i, n in enumerate(rows):
        off = [r["off"]["passes"][i] for r in runs]
        on = [r["on"]["passes"][i] for r in runs]
        ratios = [
            a["output_tokens_per_s"] / b["output_tokens_per_s"]
            for a, b in zip(on, off, strict=True)
        ]
        table.append(
            {
                "rows": n,
                "off_tokens_per_s": spread([p["output_tokens_per_s"] for p in off]),
                "on_tokens_per_s": spread([p["output_tokens_per_s"] for p in on]),
                "ratio": spread(ratios),
                "off_cpu_s": spread([sum(p["cpu_s_by_process"].values()) for p in off]),
                "on_cpu_s": spread([sum(p["cpu_s_by_process"].values()) for p in on]),
                "errors": sum(p["errors"] for p in on + off),
            }
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[128, 512],
        help="row counts, comma-separated; each run times one pass per count",
    )
    parser.add_argument("--runs", type=int, default=2, help="alternating runs of both settings")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="demo")
    args = parser.parse_args()

    model_path(args.model)  # build the demo model once, outside every timing
    load_at_start = os.getloadavg()[0]
    runs = []
    for i in range(args.runs):
        order = ["off", "on"] if i % 2 == 0 else ["on", "off"]
        run: dict[str, Any] = {"order": order}
        for setting in order:
            run[setting] = child("relayllm", args, "--engine-metrics", setting)
            assert run[setting]["engine_metrics"] == (setting == "on"), run[setting]
            print(f"run {i + 1}/{args.runs}: {setting} done", file=sys.stderr, flush=True)
        runs.append(run)
    table = summarize(runs, args.rows)
    median = statistics.median([t["ratio"]["median"] for t in table])
    write_results(
        "engine_metrics",
        {
            "model": args.model,
            "rows": args.rows,
            "runs": args.runs,
            "sampling_params": sampling(args),
            "max_model_len": args.max_model_len,
            "batch_size": args.batch_size,
            "summary": table,
            "median_ratio": round(median, 3),
            "default_on_if": DEFAULT_ON_IF,
            "default_on": median >= DEFAULT_ON_IF,
            "raw_runs": runs,
            "host": {
                "load_average_at_start": load_at_start,
                "load_average_at_end": os.getloadavg()[0],
            },
        },
    )
    heads = ("off tok/s", "on tok/s", "ratio (min-max)", "CPU s off/on")
    print(f"\n{'rows':>5} {heads[0]:>10} {heads[1]:>10} {heads[2]:>20} {heads[3]:>14}")
    for t in table:
        r = t["ratio"]
        print(
            f"{t['rows']:>5} {t['off_tokens_per_s']['median']:>10.1f} "
            f"{t['on_tokens_per_s']['median']:>10.1f} "
            f"{r['median']:>8.3f}x ({r['min']:.3f}-{r['max']:.3f}) "
            f"{t['off_cpu_s']['median']:>6.1f}/{t['on_cpu_s']['median']:.1f}"
        )


if __name__ == "__main__":
    main()
