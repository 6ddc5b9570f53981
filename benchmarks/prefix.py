"""Prefix-aware ordering (``ProcessorConfig(order_by_prefix=True)``) on the vLLM engine.

Question: when rows share long prompt prefixes (a system prompt with a few-shot block, one per
task template) and arrive shuffled, does grouping them into the same calls raise throughput?

Dataset: ``--groups`` templates, each a system message of about ``--prefix-tokens`` tokens,
``--rows`` rows spread evenly over the templates and shuffled; each row adds a short question
and asks for ``--max-tokens`` tokens. Every run uses templates never seen before (fresh words),
so the engine's prefix cache starts cold for each: runs do not help each other. The variants
run in alternating order, ``--repeats`` times each, on one warm deployment per engine setting:

- ``ample KV cache``: the vllm backend's CPU defaults (the cache holds every template);
- ``tight KV cache``: ``engine_kwargs.kv_cache_memory_bytes`` set so the cache holds only a
  few templates' worth of tokens, as on a GPU serving a big model with many templates
  (skip with ``--skip-tight``).

    python benchmarks/prefix.py      # needs relayllm-vllm

Writes benchmarks/results/prefix.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from typing import Any

from overhead import host_facts  # the script's folder is on sys.path

DEPLOYMENT = "bench-prefix"
WORDS = [
    "river",
    "mountain",
    "lantern",
    "orchard",
    "velvet",
    "harbor",
    "meadow",
    "copper",
    "falcon",
    "glacier",
    "thunder",
    "willow",
    "saffron",
    "canyon",
    "ember",
    "marble",
    "prairie",
    "cobalt",
    "juniper",
    "tundra",
    "beacon",
    "quartz",
    "mosaic",
    "pebble",
    "hollow",
    "drift",
    "cinder",
    "ivory",
    "lagoon",
    "nectar",
    "summit",
    "thistle",
    "voyage",
    "walnut",
    "zephyr",
    "amber",
    "basil",
    "cedar",
    "dune",
    "fable",
    "garnet",
    "heron",
    "island",
    "jasmine",
    "kelp",
    "lotus",
    "maple",
    "nimbus",
    "opal",
    "pine",
    "quill",
    "reef",
]


def template(rng: random.Random, tokens: int) -> str:
    """A system prompt with a few-shot block: about ``tokens`` tokens of unique text."""
    lines = ["You label short phrases with one word. Examples follow."]
    while sum(len(line.split()) for line in lines) * 1.8 < tokens:  # ~1.8 demo-model tokens a word
        phrase = " ".join(rng.choice(WORDS) for _ in range(8))
        lines.append(f"Phrase: {phrase}. Label: {rng.choice(WORDS)}.")
    return "\n".join(lines)


def dataset_rows(seed: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    templates = [template(rng, args.prefix_tokens) for _ in range(args.groups)]
    rows = [
        {
            "id": i,
            "group": i % args.groups,
            "messages": [
                {"role": "system", "content": templates[i % args.groups]},
                {
                    "role": "user",
                    "content": f"Phrase: {' '.join(rng.choice(WORDS) for _ in range(6))}.",
                },
            ],
        }
        for i in range(args.rows)
    ]
    rng.shuffle(rows)
    return rows


def run_variant(order_by_prefix: bool, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from relayllm import ProcessorConfig, build_processor

    config = ProcessorConfig(
        deployment=DEPLOYMENT,
        order_by_prefix=order_by_prefix,
        sampling_params={"temperature": 0.0, "max_tokens": args.max_tokens},
    )
    ds = ray.data.from_items(dataset_rows(seed, args), override_num_blocks=1)
    start = time.perf_counter()
    out = build_processor(config)(ds).take_all()
    seconds = time.perf_counter() - start
    prompt = sum(r["num_input_tokens"] or 0 for r in out)
    output = sum(r["num_generated_tokens"] or 0 for r in out)
    return {
        "order_by_prefix": order_by_prefix,
        "seed": seed,
        "rows": len(out),
        "errors": sum(1 for r in out if r["error"]),
        "prompt_tokens": prompt,
        "output_tokens": output,
        "seconds": seconds,
        "prompt_tokens_per_s": prompt / seconds,
        "output_tokens_per_s": output / seconds,
    }


def run_setting(
    label: str, options: dict[str, Any], args: argparse.Namespace, seed0: int
) -> list[dict[str, Any]]:
    import relayllm
    from relayllm import DeploymentConfig

    relayllm.deploy(DeploymentConfig(name=DEPLOYMENT, backend="vllm", options=options))
    run_variant(False, seed0, argparse.Namespace(**{**vars(args), "rows": 8}))  # warm-up
    samples: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    seed = seed0
    for repeat in range(args.repeats):
        for flag in (False, True) if repeat % 2 == 0 else (True, False):
            seed += 1
            samples[flag].append(run_variant(flag, seed, args))
            s = samples[flag][-1]
            print(
                f"  {label}, order_by_prefix={flag}: "
                f"{s['prompt_tokens_per_s']:,.0f} prompt tokens/s, "
                f"{s['output_tokens_per_s']:.1f} output tokens/s "
                f"({s['seconds']:.1f}s, {s['errors']} errors)",
                flush=True,
            )
    relayllm.shutdown(DEPLOYMENT)
    variants = []
    for flag, runs in samples.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        variants.append(
            {
                "label": f"{label}, order_by_prefix={flag}",
                "setting": label,
                "order_by_prefix": flag,
                "rows": runs[0]["rows"],
                "prompt_tokens": runs[0]["prompt_tokens"],
                "output_tokens": runs[0]["output_tokens"],
                "seconds": seconds,
                "prompt_tokens_per_s": statistics.median(r["prompt_tokens_per_s"] for r in runs),
                "output_tokens_per_s": statistics.median(r["output_tokens_per_s"] for r in runs),
                "errors": sum(r["errors"] for r in runs),
                "runs": len(runs),
                "samples": runs,
            }
        )
    return variants


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=500)
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--tight-kv-tokens",
        type=int,
        default=4096,
        help="KV cache size of the tight setting, in tokens of the demo model",
    )
    parser.add_argument("--skip-tight", action="store_true")
    parser.add_argument("--model", default="demo")
    args = parser.parse_args()

    import ray

    host = host_facts()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    base = {"model": args.model, "max_model_len": args.max_model_len}
    variants = run_setting("ample KV cache", base, args, seed0=1000)
    # SmolLM2-135M: 30 layers x 3 KV heads x 64 dims x (K and V) x 2 bytes = 23,040 bytes/token.
    tight_bytes = args.tight_kv_tokens * 23_040
    if not args.skip_tight:
        tight = {**base, "engine_kwargs": {"kv_cache_memory_bytes": tight_bytes}}
        variants += run_setting(
            f"tight KV cache (~{args.tight_kv_tokens} tokens)", tight, args, seed0=2000
        )

    gains = {}
    for setting in dict.fromkeys(v["setting"] for v in variants):
        off, on = (
            next(v for v in variants if v["setting"] == setting and v["order_by_prefix"] is f)
            for f in (False, True)
        )
        gains[setting] = on["prompt_tokens_per_s"] / off["prompt_tokens_per_s"]
        print(f"{setting}: order_by_prefix gives {gains[setting]:.2f}x prompt tokens/s")
    from _common import write_results

    path = write_results(
        "prefix",
        {
            "host": host,
            "model": args.model,
            "groups": args.groups,
            "prefix_tokens": args.prefix_tokens,
            "rows": args.rows,
            "max_tokens": args.max_tokens,
            "repeats": args.repeats,
            "tight_kv_cache_bytes": None if args.skip_tight else tight_bytes,
            "variants": variants,
            "gain_prompt_tokens_per_s": gains,
        },
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
