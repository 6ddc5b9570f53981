"""Replicas and routing (``DeploymentConfig.routing``) on echo with its simulated prefix cache,
or on the demo model with vLLM's own prefix cache (``--backend vllm``).

Question: with many replicas of one engine, does affinity routing keep a row's steps on the
replica that holds its prefix, without a replica running hot?

Job: the multi-turn pipeline's shape (answer -> critique -> rewrite on one deployment), each
row carrying a document of ``--doc-words`` words that every step repeats, as RAG and
summarisation rows do; each later step repeats the row's earlier turns. The engine is echo
with its simulated prefix cache (``prefix_cache_blocks``: an LRU of ``--block-words``-word
blocks per replica, only whole blocks cached) and ``--delay-s`` per call as engine time, or
with ``--backend vllm`` the demo model with prefix caching on (the skewed job below runs on
echo only: ``--skew-rows 0`` leaves it out).
Contenders, alternating in order, ``--repeats`` times each, a fresh deployment each run:

- ``1 replica``: the figures a single engine gives (every step finds its row's prefix);
- ``N replicas, default``: Serve's default router (power of two choices);
- ``N replicas, affinity``: relayllm's affinity router.

Then a skewed job (a quarter of the rows share one key, ``affinity_column``) on N replicas,
default and affinity: rows per replica. Figures are the engine's own counters (prompt tokens
looked up and found in the prefix cache, prompt tokens prefilled), read from every replica
through ``relayllm.control(name).replicas()``: they do not depend on the machine's speed.

    python benchmarks/routing.py --replicas 8
    python benchmarks/routing.py --backend vllm --replicas 2 --rows 48 --doc-words 150 \
        --skew-rows 0 --repeats 1 --results-name routing-vllm

Writes benchmarks/results/routing.json (``--results-name``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import write_results

DEPLOYMENT = "bench-routing"


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The deployment's options: echo with its simulated cache, or the demo model on vLLM with
    prefix caching on (its own counters, whole 128-token blocks on the CPU build) and a KV
    cache that holds every row's prefix between its steps (the CPU build's default is sized
    for the rows running at once, and evicts them)."""
    if args.backend == "vllm":
        return {
            "model": "demo",
            "enable_prefix_caching": True,
            "max_model_len": 4096,
            "kv_cache_memory_gb": 2,
        }
    return {
        "prefix_cache_blocks": 1_000_000,
        "prefix_block_words": args.block_words,
        "delay_s": args.delay_s,
    }


def pipeline_text(replicas: int, routing: str, args: argparse.Namespace) -> str:
    cache = engine_options(args)
    turns = [
        '{role: user, content: "{doc} {question}"}',
        '{role: assistant, content: "{answer}"}',
        '{role: user, content: "what does the answer leave out"}',
    ]
    rewrite = [*turns[:2], '{role: user, content: "a reviewer said {critique} rewrite it"}']
    steps = [("answer", turns[:1]), ("critique", turns), ("final", rewrite)]
    lines = [
        "deployments:",
        f"  - {{name: {DEPLOYMENT}, backend: {args.backend}, num_replicas: {replicas}, "
        f"routing: {routing}, options: {json.dumps(cache)}}}",
        "input: {path: rows.jsonl}",
        "steps:",
    ]
    for name, messages in steps:
        lines += [
            f"  - name: {name}",
            f"    deployment: {DEPLOYMENT}",
            f"    messages: [{', '.join(messages)}]",
            "    sampling_params: {temperature: 0.0, max_tokens: 8}",
            f"    batch_size: {args.batch_size}",
            f"    output_column: {name}",
        ]
    return "\n".join(lines) + "\n"


def replica_figures() -> list[dict[str, Any]]:
    import relayllm

    figures = []
    for info in relayllm.control(DEPLOYMENT).replicas().values():
        metrics = info["metrics"]
        figures.append(
            {
                "rows": info["rows"],
                "prompt_tokens": metrics["prefix_cache_queries"],
                "cached_tokens": metrics["prefix_cache_hits"],
                "prefilled_tokens": (metrics["engine_step_tokens"] or {}).get("prefilled", 0),
            }
        )
    return figures


def summarise(replicas: list[dict[str, Any]], seconds: float, rows: int) -> dict[str, Any]:
    prompt = sum(r["prompt_tokens"] for r in replicas)
    cached = sum(r["cached_tokens"] for r in replicas)
    per_replica = sorted(r["rows"] for r in replicas)
    mean = sum(per_replica) / len(per_replica)
    return {
        "rows": rows,
        "seconds": seconds,
        "prompt_tokens": prompt,
        "prefilled_tokens": sum(r["prefilled_tokens"] for r in replicas),
        "hit_rate": cached / prompt if prompt else 0.0,
        "rows_per_replica": per_replica,
        "max_over_mean": per_replica[-1] / mean if mean else 0.0,
        "max_over_min": per_replica[-1] / per_replica[0] if per_replica[0] else None,
    }


def run_pipeline(replicas: int, routing: str, args: argparse.Namespace) -> dict[str, Any]:
    import relayllm
    from relayllm.pipelines import deployed, parse_pipeline
    from relayllm.pipelines.inputs import open_dataset
    from relayllm.pipelines.run import execute

    with tempfile.TemporaryDirectory() as folder:
        rows = [
            {
                "question": f"question {i}?",
                "doc": " ".join(f"d{i}w{j}" for j in range(args.doc_words)),
            }
            for i in range(args.rows)
        ]
        Path(folder, "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        pipeline = parse_pipeline(pipeline_text(replicas, routing, args), "p.yaml", Path(folder))
        out: list[dict[str, Any]] = []
        with deployed(pipeline, keep=True):
            pass
        try:
            start = time.perf_counter()
            execute(pipeline, open_dataset(pipeline), out.extend)
            seconds = time.perf_counter() - start
            figures = replica_figures()
        finally:
            relayllm.shutdown(DEPLOYMENT)
    errors = sum(1 for r in out if r["error"])
    return {**summarise(figures, seconds, len(out)), "errors": errors}


def run_skewed(routing: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import relayllm
    from relayllm import DeploymentConfig, ProcessorConfig, build_processor

    relayllm.deploy(
        DeploymentConfig(
            name=DEPLOYMENT,
            backend="echo",
            num_replicas=args.replicas,
            routing=routing,
            max_ongoing_requests=64,
            options={"delay_s": args.delay_s, "prefix_cache_blocks": 1_000_000},
        )
    )
    rows = [
        {"session": "hot" if i % 4 == 0 else f"s{i}", "prompt": f"row {i} " + "w " * 20}
        for i in range(args.skew_rows)
    ]
    config = ProcessorConfig(
        deployment=DEPLOYMENT,
        task="completion",
        batch_size=4,
        max_in_flight_batches=16,
        affinity_column="session",
    )
    try:
        start = time.perf_counter()
        out = build_processor(config)(ray.data.from_items(rows)).take_all()
        seconds = time.perf_counter() - start
        figures = replica_figures()
    finally:
        relayllm.shutdown(DEPLOYMENT)
    errors = sum(1 for r in out if r["error"])
    return {**summarise(figures, seconds, len(out)), "errors": errors}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def aggregate(label: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "label": label,
        "runs": len(runs),
        "rows": runs[0]["rows"],
        "errors": sum(r["errors"] for r in runs),
        "prompt_tokens": runs[0]["prompt_tokens"],
        "prefilled_tokens": spread([r["prefilled_tokens"] for r in runs]),
        "hit_rate": spread([r["hit_rate"] for r in runs]),
        "max_over_mean": spread([r["max_over_mean"] for r in runs]),
        "seconds": spread([r["seconds"] for r in runs]),
        "samples": runs,
    }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    n = args.replicas
    contenders = [("1 replica", 1, "affinity"), (f"{n} replicas, default", n, "default")]
    contenders.append((f"{n} replicas, affinity", n, "affinity"))
    pipeline_runs: dict[str, list[dict[str, Any]]] = {c[0]: [] for c in contenders}
    skew_runs: dict[str, list[dict[str, Any]]] = {"default": [], "affinity": []}
    for repeat in range(args.repeats):
        order = contenders if repeat % 2 == 0 else list(reversed(contenders))
        for label, replicas, routing in order:
            run = run_pipeline(replicas, routing, args)
            pipeline_runs[label].append(run)
            print(
                f"  {label}: hit rate {run['hit_rate']:.3f}, prefilled "
                f"{run['prefilled_tokens']:,}, rows per replica {run['rows_per_replica']}, "
                f"{run['seconds']:.1f}s",
                flush=True,
            )
        for routing in ("default", "affinity") if repeat % 2 == 0 else ("affinity", "default"):
            if not args.skew_rows:
                break
            run = run_skewed(routing, args)
            skew_runs[routing].append(run)
            print(f"  skewed, {routing}: rows per replica {run['rows_per_replica']}", flush=True)
    return {
        "pipeline": [aggregate(label, runs) for label, runs in pipeline_runs.items()],
        "skewed": [aggregate(f"{n} replicas, {r}", runs) for r, runs in skew_runs.items() if runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backend",
        choices=("echo", "vllm"),
        default="echo",
        help="echo (simulated prefix cache) or vllm (the demo model, its own prefix cache)",
    )
    parser.add_argument("--replicas", type=int, default=8)
    parser.add_argument("--rows", type=int, default=96)
    parser.add_argument("--doc-words", type=int, default=300)
    parser.add_argument("--block-words", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--delay-s", type=float, default=0.02)
    parser.add_argument(
        "--skew-rows", type=int, default=1024, help="rows of the skewed job (0: no skewed job)"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--results-name", default="routing")
    args = parser.parse_args()

    import ray

    from relayllm.routing import LOAD_BOUND
    from relayllm.testing import enable_echo_backend

    enable_echo_backend()
    for attempt in range(3):  # a loaded machine's raylet can miss Ray's start-up deadline
        try:
            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            break
        except Exception:
            if attempt == 2:
                raise
            time.sleep(5)
    ray.data.DataContext.get_current().enable_progress_bars = False
    load_at_start = os.getloadavg()[0]
    results = measure(args)
    path = write_results(
        args.results_name,
        {
            "settings": {
                **{k: v for k, v in vars(args).items() if k != "results_name"},
                "load_bound": LOAD_BOUND,
            },
            "host": {"load_average_at_start": round(load_at_start, 2)},
            **results,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
