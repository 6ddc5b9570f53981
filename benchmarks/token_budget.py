"""Token-budget batching (``ProcessorConfig(token_budget=...)``) against count-based calls on
the vLLM engine, on a mixed-length dataset.

Question: when a few rows are long (a long document to summarise, a long answer) among many
short ones, do calls closed by estimated tokens finish the job sooner than calls of
``batch_size`` rows? A count-based call holds its in-flight slot until its slowest row is done,
so short rows that share a call with a long one wait for it.

Dataset: ``--rows`` rows, shuffled with a fixed seed; one in ``--long-every`` asks for a
summary of a ~``--long-chars``-character text with ``--long-max-tokens``, the others ask a short
question with ``--short-max-tokens``. Both variants run on one warm deployment, in alternating
order, ``--repeats`` times each.

    python benchmarks/token_budget.py      # needs relayllm-vllm

Writes benchmarks/results/token_budget.json.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from _common import write_results  # the script's folder is on sys.path

DEPLOYMENT = "bench-token-budget"
FACTS = [
    "The river flows north through the valley before it reaches the sea.",
    "Bees visit thousands of flowers to make a single spoonful of honey.",
    "The old lighthouse was rebuilt twice after storms damaged its tower.",
    "Copper turns green over the years as it reacts with air and water.",
    "Glaciers carve wide valleys as they slowly move down the mountains.",
]


def dataset_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(7)
    rows = []
    for i in range(args.rows):
        if i % args.long_every == 0:
            text = " ".join(rng.choice(FACTS) for _ in range(args.long_chars // 66))
            content = f"Summarise this text in a few sentences:\n{text}"
            max_tokens = args.long_max_tokens
        else:
            content = f"Name a colour. ({i})"
            max_tokens = args.short_max_tokens
        rows.append(
            {
                "id": i,
                "messages": [{"role": "user", "content": content}],
                "sampling_params": {"temperature": 0.0, "max_tokens": max_tokens},
            }
        )
    rng.shuffle(rows)
    return rows


def run_variant(budget: int | None, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from relayllm import ProcessorConfig, build_processor

    config = ProcessorConfig(
        deployment=DEPLOYMENT,
        batch_size=args.batch_size,
        max_in_flight_batches=args.in_flight,
        token_budget=budget,
    )
    ds = ray.data.from_items(dataset_rows(args), override_num_blocks=1)
    start = time.perf_counter()
    out = build_processor(config)(ds).take_all()
    seconds = time.perf_counter() - start
    tokens = sum(r["num_generated_tokens"] or 0 for r in out)
    return {
        "token_budget": budget,
        "rows": len(out),
        "errors": sum(1 for r in out if r["error"]),
        "output_tokens": tokens,
        "seconds": seconds,
        "rows_per_s": len(out) / seconds,
        "output_tokens_per_s": tokens / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--long-every", type=int, default=8)
    parser.add_argument("--long-chars", type=int, default=2000)
    parser.add_argument("--long-max-tokens", type=int, default=96)
    parser.add_argument("--short-max-tokens", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--in-flight", type=int, default=4)
    parser.add_argument("--token-budget", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--max-model-len", type=int, default=2048)
    args = parser.parse_args()

    import ray

    import relayllm
    from relayllm import DeploymentConfig

    ray.init(include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    options = {"model": args.model, "max_model_len": args.max_model_len}
    relayllm.deploy(DeploymentConfig(name=DEPLOYMENT, backend="vllm", options=options))
    run_variant(None, argparse.Namespace(**{**vars(args), "rows": 16}))  # warm-up
    samples: dict[str, list[dict[str, Any]]] = {"count": [], "budget": []}
    for repeat in range(args.repeats):
        order = ("count", "budget") if repeat % 2 == 0 else ("budget", "count")
        for name in order:
            budget = args.token_budget if name == "budget" else None
            samples[name].append(run_variant(budget, args))
            s = samples[name][-1]
            print(
                f"  {name}: {s['rows_per_s']:.2f} rows/s, {s['output_tokens_per_s']:.1f} "
                f"output tokens/s ({s['seconds']:.1f} s, {s['errors']} errors)",
                flush=True,
            )
    relayllm.shutdown(DEPLOYMENT)
    ray.shutdown()
    summary = {
        name: {
            "seconds": statistics.median(r["seconds"] for r in runs),
            "rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
            "output_tokens_per_s": statistics.median(r["output_tokens_per_s"] for r in runs),
            "spread_s": [min(r["seconds"] for r in runs), max(r["seconds"] for r in runs)],
            "errors": sum(r["errors"] for r in runs),
        }
        for name, runs in samples.items()
    }
    ratio = summary["budget"]["rows_per_s"] / summary["count"]["rows_per_s"]
    path = write_results(
        "token_budget",
        {
            "settings": {k: v for k, v in vars(args).items()},
            "summary": summary,
            "ratio_budget_vs_count_rows_per_s": ratio,
            "samples": samples,
        },
    )
    print(f"token_budget={args.token_budget} vs batch_size={args.batch_size}: {ratio:.2f}x rows/s")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
