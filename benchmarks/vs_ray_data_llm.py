"""Head-to-head with ray.data.llm (Ray 2.60) on the same engine, model and sampling parameters.

Question: on one step, is relayllm's shared deployment at least as fast as ray.data.llm's own
vLLM stage (``vLLMEngineProcessorConfig``: an engine inside each Ray Data actor)? On two
sequential steps (answer, then "make it shorter"), how does one shared engine compare with
ray.data.llm's one engine per step, in throughput and throughput per engine (the comparison of
Ray PR #55179)?

Variants, each in a fresh subprocess with a fresh local cluster. ray.data.llm starts its engines
inside each dataset execution, so every variant runs once with engine start included; reported
are rows / wall time (one engine start per engine on both sides) and, where the output has
several blocks, the rate between the first and the last of them (warm engines):

- ``relayllm-1``: one ``vllm`` deployment, one processor.
- ``raydata-1``: ``vLLMEngineProcessorConfig``, one engine actor.
- ``relayllm-2``: one ``vllm`` deployment shared by two processors.
- ``raydata-2``: two ``vLLMEngineProcessorConfig`` processors: one engine each.

Both sides get the same engine arguments (the vllm backend's CPU defaults: eager mode,
``max_model_len``, the KV-cache size relayllm derives) and ``batch_size``. ray.data.llm's stage
asks for a GPU bundle by default; here it gets CPU-only bundles through
``placement_group_config`` and the same hiding of the broken torchvision/torchaudio/torchcodec
wheels the vllm backend uses (``RELAYLLM_HIDE_MODULES`` + the boot ``sitecustomize``).

    python benchmarks/vs_ray_data_llm.py           # 256 rows, 2 repeats, alternating order

Writes benchmarks/results/vs_ray_data_llm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

from _common import write_results  # the script's folder is on sys.path

VARIANTS = ("relayllm-1", "raydata-1", "relayllm-2", "raydata-2")
TOPICS = [
    "why the sky is blue",
    "how a rainbow forms",
    "what makes a volcano erupt",
    "how plants make food",
    "why leaves change color",
    "how magnets work",
    "why we need sleep",
    "how bread rises",
]


def questions(n: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "question": f"In two sentences, explain {TOPICS[i % len(TOPICS)]}. ({i})"}
        for i in range(n)
    ]


def ask(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "messages": [{"role": "user", "content": row["question"]}]}


def shorten(row: dict[str, Any]) -> dict[str, Any]:
    prompt = f"Make this answer shorter, ten words at most: {row['generated_text']}"
    return {"id": row["id"], "messages": [{"role": "user", "content": prompt}]}


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    from relayllm_vllm.backend import cpu_build
    from relayllm_vllm.demo import ensure_demo_model
    from relayllm_vllm.options import VLLMOptions, engine_args

    options = VLLMOptions(model=args.model, max_model_len=args.max_model_len)
    path = str(ensure_demo_model()) if args.model == "demo" else args.model
    return engine_args(options, cpu=cpu_build(), model_path=path)


def sampling(args: argparse.Namespace, step: int) -> dict[str, Any]:
    return {
        "temperature": 0.0,
        "max_tokens": args.max_tokens if step == 0 else args.max_tokens // 2,
    }


def relayllm_steps(args: argparse.Namespace, steps: int):
    import relayllm

    options = {"model": args.model, "max_model_len": args.max_model_len}
    relayllm.deploy(relayllm.DeploymentConfig(name="h2h", backend="vllm", options=options))
    processors = [
        relayllm.build_processor(
            relayllm.ProcessorConfig(
                deployment="h2h", batch_size=args.batch_size, sampling_params=sampling(args, s)
            )
        )
        for s in range(steps)
    ]

    def run(ds):
        ds = processors[0](ds.map(ask))
        if steps == 2:
            ds = processors[1](ds.map(shorten))
        return ds

    return run, 1


def raydata_steps(args: argparse.Namespace, steps: int):
    from ray.data.llm import build_processor, vLLMEngineProcessorConfig

    settings = engine_kwargs(args)
    model = settings.pop("model")
    for key in ("enable_log_requests", "disable_log_stats"):
        settings.pop(key, None)  # AsyncLLM-server arguments the stage sets itself
    processors = []
    for s in range(steps):
        config = vLLMEngineProcessorConfig(
            model_source=model,
            engine_kwargs=settings,
            batch_size=args.batch_size,
            concurrency=1,
            accelerator_type=None,
            placement_group_config={"bundles": [{"CPU": 1}], "strategy": "PACK"},
        )
        params = sampling(args, s)
        processors.append(
            build_processor(
                config,
                preprocess=lambda row, p=params: {
                    "id": row["id"],
                    "messages": row["messages"],
                    "sampling_params": p,
                },
                postprocess=lambda row: {
                    "id": row["id"],
                    "generated_text": row.get("generated_text"),
                    "num_generated_tokens": row.get("num_generated_tokens"),
                },
            )
        )

    def run(ds):
        ds = processors[0](ds.map(ask))
        if steps == 2:
            ds = processors[1](ds.map(shorten))
        return ds

    return run, steps


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions()  # before Ray starts: its workers inherit the environment
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    side, steps = variant.split("-")
    build = relayllm_steps if side == "relayllm" else raydata_steps
    started = time.perf_counter()
    run, engines = build(args, int(steps))
    # ray.data.llm starts its engines inside each dataset execution (a warm-up run would not
    # keep them), so both sides run once, engine start included: rows / wall time is the
    # figure compared. The rate between the first and the last output block (warm engines)
    # is recorded too, when the output has more than one block.
    rows = tokens = empty = 0
    first = last = None
    for batch in run(ray.data.from_items(questions(args.rows))).iter_batches(
        batch_size=None, batch_format="pyarrow"
    ):
        now = time.perf_counter()
        if first is None:
            first, first_rows = now, batch.num_rows
        last = now
        rows += batch.num_rows
        answers = batch.column("generated_text").to_pylist()
        empty += sum(1 for a in answers if not a)
        tokens += sum(n or 0 for n in batch.column("num_generated_tokens").to_pylist())
    wall = time.perf_counter() - started
    ray.shutdown()
    assert first is not None and last is not None
    steady = (rows - first_rows) / (last - first) if last > first else None
    return {
        "variant": variant,
        "engines": engines,
        "steps": int(steps),
        "rows": rows,
        "empty_answers": empty,
        "wall_s": wall,
        "first_output_s": first - started,
        "rows_per_s": rows / wall,
        "rows_per_s_per_engine": rows / wall / engines,
        "rows_per_s_warm": steady,
        "final_step_output_tokens": tokens,
    }


def child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [sys.executable, __file__, "--variant", variant]
    for key in ("rows", "max_tokens", "max_model_len", "batch_size", "model"):
        command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout)[-3000:]
        return {"variant": variant, "failed": True, "exit": done.returncode, "error_tail": tail}
    return json.loads(lines[-1][len("RESULT ") :])


def summarise(
    samples: dict[str, list[dict[str, Any]]],
) -> tuple[dict[str, Any], dict[str, dict[str, float]]]:
    """Each variant's medians over its good runs, and relayllm's ratios to ray.data.llm by
    number of steps: what docs/benchmarks.md reads."""
    summary: dict[str, Any] = {}
    for variant, runs in samples.items():
        good = [r for r in runs if not r.get("failed")]
        if not good:
            summary[variant] = {"failed": True, "error_tail": runs[-1].get("error_tail")}
            continue
        summary[variant] = {
            "engines": good[0]["engines"],
            "wall_s": statistics.median(r["wall_s"] for r in good),
            "rows_per_s": statistics.median(r["rows_per_s"] for r in good),
            "rows_per_s_per_engine": statistics.median(r["rows_per_s_per_engine"] for r in good),
            "spread": [min(r["rows_per_s"] for r in good), max(r["rows_per_s"] for r in good)],
            "runs": len(good),
        }
    ratios: dict[str, dict[str, float]] = {}
    for steps in ("1", "2"):
        ours, theirs = summary.get(f"relayllm-{steps}"), summary.get(f"raydata-{steps}")
        if ours and theirs and not ours.get("failed") and not theirs.get("failed"):
            ratios[f"{steps}_step"] = {
                "throughput": ours["rows_per_s"] / theirs["rows_per_s"],
                "throughput_per_engine": ours["rows_per_s_per_engine"]
                / theirs["rows_per_s_per_engine"],
            }
    return summary, ratios


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=48, help="step 1; step 2 gets half")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--only", nargs="*", choices=VARIANTS, help="run these variants only")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.variant:
        print("RESULT " + json.dumps(run_variant(args.variant, args)), flush=True)
        return

    variants = args.only or list(VARIANTS)
    samples: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    load_at_start = os.getloadavg()[0]
    for repeat in range(args.repeats):
        for variant in variants if repeat % 2 == 0 else reversed(variants):
            result = child(variant, args)
            samples[variant].append(result)
            print(json.dumps({k: v for k, v in result.items() if k != "error_tail"}), flush=True)
            if result.get("failed"):
                print(result["error_tail"], file=sys.stderr)
    summary, ratios = summarise(samples)
    report = {
        "model": args.model,
        "rows": args.rows,
        "batch_size": args.batch_size,
        "max_tokens": [args.max_tokens, args.max_tokens // 2],
        "summary": summary,
        "ratios_relayllm_vs_raydata": ratios,
        "targets": {"1_step_throughput": 1.0, "2_step_throughput_per_engine": 1.5},
        "host": {"load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0]},
        "samples": samples,
    }
    path = write_results("vs_ray_data_llm", report)
    print(json.dumps({"summary": summary, "ratios": ratios}, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
