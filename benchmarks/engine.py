"""relayllm + vLLM vs raw vLLM: output tokens/s on the same model, prompts and sampling params.

Question: what does the relayllm path (Ray Data -> batched Serve calls -> the vllm backend's
AsyncLLM engine) cost compared with vLLM's own offline API (``vllm.LLM.chat``)? Target: at
least 0.85x raw vLLM's output tokens/s.

Each side runs in its own subprocess, one after the other, so they never share the CPU or
memory: start the engine, warm it up, then time one pass over the prompts. Both use the
same engine settings (the vllm backend's CPU defaults when on the CPU build).

    python benchmarks/engine.py                  # the bundled demo model, 64 prompts
    python benchmarks/engine.py --rows 128 --max-tokens 64 --model /path/to/model

Writes benchmarks/results/engine.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from _common import write_results  # the script's folder is on sys.path

TOPICS = [
    "the capital of France",
    "how bees make honey",
    "why the sky is blue",
    "the water cycle",
    "photosynthesis",
    "how a bicycle works",
    "the moon's phases",
    "why leaves change color",
    "how rain forms",
    "what a volcano is",
    "how magnets work",
    "why we need sleep",
    "how bread rises",
    "what an atom is",
    "how birds fly",
    "why the sea is salty",
]


def prompts(n: int) -> list[list[dict[str, str]]]:
    return [
        [{"role": "user", "content": f"In two sentences, explain {TOPICS[i % len(TOPICS)]}. ({i})"}]
        for i in range(n)
    ]


def engine_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Engine arguments both sides use: the vllm backend's own, from the same options."""
    from relayllm_vllm.backend import cpu_build
    from relayllm_vllm.options import VLLMOptions, engine_args

    options = VLLMOptions(model=args.model, max_model_len=args.max_model_len)
    return engine_args(options, cpu=cpu_build(), model_path=model_path(args.model))


def model_path(model: str) -> str:
    from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model

    return str(ensure_demo_model()) if model == DEMO_MODEL else model


def sampling(args: argparse.Namespace) -> dict[str, Any]:
    return {"temperature": 0.0, "max_tokens": args.max_tokens}


def run_raw(args: argparse.Namespace) -> dict[str, Any]:
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions()
    from vllm import LLM, SamplingParams

    settings = engine_settings(args)
    settings.pop("enable_log_requests", None)  # an AsyncLLM-only argument
    started = time.perf_counter()
    llm = LLM(**settings)
    start_s = time.perf_counter() - started
    params = SamplingParams(**sampling(args))
    llm.chat(prompts(4), params, use_tqdm=False)  # warm-up
    started = time.perf_counter()
    outputs = llm.chat(prompts(args.rows), params, use_tqdm=False)
    elapsed = time.perf_counter() - started
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {
        "side": "raw vLLM (LLM.chat)",
        "engine_start_s": start_s,
        "seconds": elapsed,
        "rows": len(outputs),
        "output_tokens": tokens,
        "errors": 0,
    }


def run_relayllm(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import relayllm

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    options = {"model": args.model, "max_model_len": args.max_model_len}
    started = time.perf_counter()
    relayllm.deploy(relayllm.DeploymentConfig(name="bench-engine", backend="vllm", options=options))
    start_s = time.perf_counter() - started
    config = relayllm.ProcessorConfig(
        deployment="bench-engine", batch_size=args.batch_size, sampling_params=sampling(args)
    )
    processor = relayllm.build_processor(config)

    def dataset(n: int):
        return ray.data.from_items([{"id": i, "messages": m} for i, m in enumerate(prompts(n))])

    processor(dataset(4)).take_all()  # warm-up (and the stage's first actor start)
    started = time.perf_counter()
    out = processor(dataset(args.rows)).take_all()
    elapsed = time.perf_counter() - started
    relayllm.shutdown("bench-engine")
    ray.shutdown()
    return {
        "side": "relayllm + vllm backend",
        "engine_start_s": start_s,
        "seconds": elapsed,
        "rows": len(out),
        "output_tokens": sum(r["num_generated_tokens"] or 0 for r in out),
        "errors": sum(1 for r in out if r["error"]),
    }


def child(side: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--rows",
        str(args.rows),
        "--max-tokens",
        str(args.max_tokens),
        "--max-model-len",
        str(args.max_model_len),
        "--batch-size",
        str(args.batch_size),
        "--model",
        args.model,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {side} run failed (exit {done.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--side", choices=["raw", "relayllm"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        result = run_raw(args) if args.side == "raw" else run_relayllm(args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    model_path(args.model)  # build the demo model once, outside both timings
    load_at_start = os.getloadavg()[0]
    results = [child("raw", args), child("relayllm", args)]
    for r in results:
        r["output_tokens_per_s"] = r["output_tokens"] / r["seconds"]
        r["rows_per_s"] = r["rows"] / r["seconds"]
    ratio = results[1]["output_tokens_per_s"] / results[0]["output_tokens_per_s"]
    report = {
        "model": args.model,
        "rows": args.rows,
        "sampling_params": sampling(args),
        "max_model_len": args.max_model_len,
        "batch_size": args.batch_size,
        "results": results,
        "relayllm_vs_raw": round(ratio, 3),
        "target": 0.85,
        # The machine is shared: the 1-minute load average says how busy it was.
        "host": {"load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0]},
        "target_met": ratio >= 0.85,
    }
    write_results("engine", report)

    print(
        f"\n{'side':<26} {'rows':>5} {'out tokens':>10} {'seconds':>8} "
        f"{'tokens/s':>9} {'errors':>6}"
    )
    for r in results:
        print(
            f"{r['side']:<26} {r['rows']:>5} {r['output_tokens']:>10} {r['seconds']:>8.1f} "
            f"{r['output_tokens_per_s']:>9.1f} {r['errors']:>6}"
        )
    print(
        f"\nrelayllm / raw vLLM = {ratio:.2f}x "
        f"(target >= 0.85x: {'met' if ratio >= 0.85 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
