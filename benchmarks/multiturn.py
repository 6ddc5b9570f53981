"""Multi-turn: a two-step pipeline on one shared engine vs each step on its own engine.

Question: what does sharing one named vLLM deployment between sequential processors save,
compared with giving every step its own engine (what ``ray.data.llm`` does: each processor
starts its own)? Steps: answer a question, then "make it shorter" on the answer.

- shared:   one ``vllm`` deployment; both processors use it.
- separate: two identical deployments (one per step, started one after the other), each step
  on its own.

Measured end to end, engine start included (that is where a second model load costs):
wall time, rows/s, peak memory (RSS summed over every process of the run's Ray cluster,
sampled every 0.5 s, so other programs on the machine do not count), and model loads (the
engines' own start counters). Each variant runs in a fresh subprocess with a fresh cluster.
Ray is started with 4 logical CPUs in both: each engine replica reserves one, and the
separate variant's two engines must leave room for the stage actors on a 2-core machine.

    python benchmarks/multiturn.py             # 64 rows, the bundled demo model

Writes benchmarks/results/multiturn.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

from _common import Sampler, write_results  # the script's folder is on sys.path

QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "What color is the sky on a clear day?",
    "What is the largest planet in our solar system?",
    "Who wrote Romeo and Juliet?",
    "What do bees make?",
    "What is the boiling point of water in Celsius?",
    "How many legs does a spider have?",
]


class PeakMemory(Sampler):
    """Peak RSS of this process and all its descendants (the local Ray cluster it started)."""

    def __init__(self, period_s: float = 0.5) -> None:
        import psutil

        super().__init__(period_s)
        self._root = psutil.Process()
        self.peak = 0

    def sample(self) -> None:
        import psutil

        total = 0
        for proc in [self._root, *self._root.children(recursive=True)]:
            try:
                total += proc.memory_info().rss
            except psutil.Error:  # exited between listing and reading
                pass
        self.peak = max(self.peak, total)


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import relayllm

    options = {"model": args.model, "max_model_len": args.max_model_len}
    names = ["shared"] if variant == "shared" else ["answer-engine", "shorter-engine"]
    rows = [{"id": i, "question": QUESTIONS[i % len(QUESTIONS)]} for i in range(args.rows)]

    def ask(row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "messages": [{"role": "user", "content": row["question"]}]}

    def shorten(row: dict[str, Any]) -> dict[str, Any]:
        prompt = f"Make this answer shorter, ten words at most: {row['generated_text']}"
        return {
            "id": row["id"],
            "answer": row["generated_text"],
            "messages": [{"role": "user", "content": prompt}],
        }

    with PeakMemory() as memory:
        started = time.perf_counter()
        ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
        configs = [
            relayllm.DeploymentConfig(name=n, backend="vllm", options=options) for n in names
        ]
        # One after the other: Serve's deploy is not safe to call from several threads at once.
        for config in configs:
            relayllm.deploy(config)
        ready = time.perf_counter()
        first = relayllm.build_processor(
            relayllm.ProcessorConfig(
                deployment=names[0],
                batch_size=args.batch_size,
                sampling_params={"temperature": 0.0, "max_tokens": args.max_tokens},
            )
        )
        second = relayllm.build_processor(
            relayllm.ProcessorConfig(
                deployment=names[-1],
                batch_size=args.batch_size,
                sampling_params={"temperature": 0.0, "max_tokens": args.max_tokens // 2},
            )
        )
        out = second(first(ray.data.from_items(rows).map(ask)).map(shorten)).take_all()
        finished = time.perf_counter()
        infos = [relayllm.get_deployment(n).handle().info.remote().result() for n in names]
    relayllm.shutdown()
    ray.shutdown()
    wall = finished - started
    return {
        "variant": variant,
        "engines": len(names),
        "model_loads": sum(i["engine_starts"] for i in infos),
        "rows": len(out),
        "errors": sum(1 for r in out if r["error"]),
        "wall_s": wall,
        "engine_ready_s": ready - started,
        "pipeline_s": finished - ready,
        "rows_per_s": len(out) / wall,
        "peak_rss_gib": memory.peak / 2**30,
    }


def child(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    command = [
        sys.executable,
        __file__,
        "--variant",
        variant,
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
        raise SystemExit(f"the {variant} run failed (exit {done.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48, help="step 1; step 2 gets half")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--variant", choices=["shared", "separate"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.variant:
        print("RESULT " + json.dumps(run_variant(args.variant, args)), flush=True)
        return

    from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model

    if args.model == DEMO_MODEL:
        ensure_demo_model()  # built once, outside both timings
    load_at_start = os.getloadavg()[0]
    results = []
    for variant in ("shared", "separate"):
        results.append(child(variant, args))
        print(f"{variant}: " + json.dumps(results[-1]), flush=True)  # kept even if the next fails
    shared, separate = results
    report = {
        "model": args.model,
        "rows": args.rows,
        "max_tokens": [args.max_tokens, args.max_tokens // 2],
        "batch_size": args.batch_size,
        "results": results,
        "speedup_shared_vs_separate": round(separate["wall_s"] / shared["wall_s"], 3),
        "target": "one model load instead of two, and no slower end to end",
        # The machine is shared: the 1-minute load average says how busy it was.
        "host": {"load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0]},
        "target_met": shared["model_loads"] == 1
        and separate["model_loads"] == 2
        and shared["wall_s"] <= separate["wall_s"],
    }
    write_results("multiturn", report)

    print(
        f"\n{'variant':<9} {'loads':>5} {'rows':>5} {'errors':>6} {'wall s':>7} {'start s':>7} "
        f"{'run s':>6} {'rows/s':>7} {'peak GiB':>8}"
    )
    for r in results:
        print(
            f"{r['variant']:<9} {r['model_loads']:>5} {r['rows']:>5} {r['errors']:>6} "
            f"{r['wall_s']:>7.1f} {r['engine_ready_s']:>7.1f} {r['pipeline_s']:>6.1f} "
            f"{r['rows_per_s']:>7.2f} {r['peak_rss_gib']:>8.2f}"
        )
    print(
        f"\nshared is {report['speedup_shared_vs_separate']:.2f}x faster end to end; "
        f"target {'met' if report['target_met'] else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
