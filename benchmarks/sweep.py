"""Defaults check: output tokens/s for batch_size x max_in_flight_batches on the vLLM engine.

Question: does a user who sets neither get within 10% of the best setting? One vllm deployment
(the bundled demo model unless ``--model``) stays warm for the whole sweep; every setting runs
the same chat rows once per round, ``--rounds`` rounds, each round in a new shuffled order, and
the table keeps each setting's median (the machine is shared: rounds spread its noise).

    python benchmarks/sweep.py        # needs relayllm-vllm
    python benchmarks/sweep.py --batch-sizes 16,64 --in-flight 1,4 --rows 64

Writes benchmarks/results/sweep.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from overhead import host_facts  # the script's folder is on sys.path

DEPLOYMENT = "bench-sweep"

QUESTIONS = [
    "Why is the sky blue?",
    "How do bees make honey?",
    "What is photosynthesis?",
    "How does a bicycle stay upright?",
    "Why do leaves change color?",
    "What is a volcano?",
    "How do magnets work?",
    "Why do we need sleep?",
    "How does bread rise?",
    "What is an atom?",
    "How do birds fly?",
    "Why is the sea salty?",
    "What causes rain?",
    "How do tides work?",
    "What is gravity?",
    "Why do cats purr?",
]


def rows(n: int) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "messages": [{"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} ({i})"}],
        }
        for i in range(n)
    ]


def run_setting(batch_size: int, in_flight: int, n: int, max_tokens: int) -> dict[str, Any]:
    import ray

    from relayllm import ProcessorConfig, build_processor

    config = ProcessorConfig(
        deployment=DEPLOYMENT,
        batch_size=batch_size,
        max_in_flight_batches=in_flight,
        sampling_params={"temperature": 0.0, "max_tokens": max_tokens},
    )
    ds = ray.data.from_items(rows(n), override_num_blocks=1)
    start = time.perf_counter()
    out = build_processor(config)(ds).take_all()
    seconds = time.perf_counter() - start
    tokens = sum(r["num_generated_tokens"] or 0 for r in out)
    errors = sum(1 for r in out if r["error"])
    return {
        "batch_size": batch_size,
        "max_in_flight_batches": in_flight,
        "rows": len(out),
        "errors": errors,
        "output_tokens": tokens,
        "seconds": seconds,
        "output_tokens_per_s": tokens / seconds,
        "rows_per_s": len(out) / seconds,
    }


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch-sizes", type=_ints, default=[16, 32, 64])
    parser.add_argument("--in-flight", type=_ints, default=[1, 4])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import ray

    import relayllm
    from relayllm import DeploymentConfig, ProcessorConfig

    host = host_facts()
    defaults = ProcessorConfig(deployment=DEPLOYMENT)
    default = {
        "batch_size": defaults.batch_size,
        "max_in_flight_batches": defaults.max_in_flight_batches,
    }
    settings = [(b, f) for b in args.batch_sizes for f in args.in_flight]
    if (default["batch_size"], default["max_in_flight_batches"]) not in settings:
        settings.append((default["batch_size"], default["max_in_flight_batches"]))

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    options = {"model": args.model, "max_model_len": args.max_model_len}
    started = time.perf_counter()
    relayllm.deploy(DeploymentConfig(name=DEPLOYMENT, backend="vllm", options=options))
    engine_start_s = time.perf_counter() - started
    run_setting(8, 1, 8, args.max_tokens)  # warm-up: the engine's first steps, the stage's imports
    samples: dict[tuple[int, int], list[dict[str, Any]]] = {s: [] for s in settings}
    orders = []
    for round_ in range(args.rounds):
        order = list(settings)
        random.Random(args.seed + round_).shuffle(order)
        orders.append(order)
        for batch_size, in_flight in order:
            r = run_setting(batch_size, in_flight, args.rows, args.max_tokens)
            samples[(batch_size, in_flight)].append(r)
            print(
                f"  round {round_}: batch_size {batch_size:>4}, max_in_flight_batches {in_flight}: "
                f"{r['output_tokens_per_s']:6.1f} output tokens/s "
                f"({r['seconds']:.1f}s, {r['errors']} errors)",
                flush=True,
            )
    relayllm.shutdown(DEPLOYMENT)
    runs = []
    for (batch_size, in_flight), rs in samples.items():
        runs.append(
            {
                "batch_size": batch_size,
                "max_in_flight_batches": in_flight,
                "rows": rs[0]["rows"],
                "errors": sum(r["errors"] for r in rs),
                **{
                    key: statistics.median(r[key] for r in rs)
                    for key in ("output_tokens", "seconds", "output_tokens_per_s", "rows_per_s")
                },
                "samples": rs,
            }
        )

    best = max(runs, key=lambda r: r["output_tokens_per_s"])
    mine = next(
        r for r in runs if (r["batch_size"], r["max_in_flight_batches"]) == tuple(default.values())
    )
    share = mine["output_tokens_per_s"] / best["output_tokens_per_s"]
    from _common import write_results

    path = write_results(
        "sweep",
        {
            "host": host,
            "model": args.model,
            "rows": args.rows,
            "max_tokens": args.max_tokens,
            "max_model_len": args.max_model_len,
            "engine_start_s": engine_start_s,
            "rounds": args.rounds,
            "orders": orders,
            "default": default,
            "runs": runs,
            "best": {
                "batch_size": best["batch_size"],
                "max_in_flight_batches": best["max_in_flight_batches"],
            },
            "default_share_of_best": share,
            "target": "defaults within 10% of the best setting",
            "target_met": share >= 0.9,
        },
    )
    print(
        f"\ndefaults ({default['batch_size']} x {default['max_in_flight_batches']}) "
        f"reach {share:.0%} of the "
        f"best ({best['batch_size']} x {best['max_in_flight_batches']}); results: {path}"
    )


if __name__ == "__main__":
    main()
