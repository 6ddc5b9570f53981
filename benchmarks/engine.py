"""relayllm + vLLM vs raw vLLM: output tokens/s on the same model, prompts and sampling params.

Question: what does the relayllm path (Ray Data -> batched Serve calls -> the vllm backend's
AsyncLLM engine) cost compared with vLLM's own offline API (``vllm.LLM.chat``)? Target: at
least 0.95x raw vLLM's output tokens/s at 64, 128 and 512 rows.

Each side runs in its own subprocess, never both at once: start the engine, warm it up, then
time one pass over the prompts for each row count, one after the other on the same engine.
Both use the same engine settings (the vllm backend's CPU defaults when on the CPU build).
``--runs N`` alternates the sides N times (raw first in even runs, relayllm first in odd
ones), so a noisy minute on a shared machine hits both; the figures are the median over the
runs and their spread (min-max), and each run's ratio pairs the two sides of that run.

During each timed pass the CPU time of every process of the run is read from the kernel:
the engine's own processes (EngineCore and its worker, titled ``VLLM::``) against the rest
(the driver, Ray Data's stage actors, the Serve replica that feeds the engine, Ray's own
processes). The rest, per row, is what the path costs outside the engine.

    python benchmarks/engine.py                  # the bundled demo model, 64/128/512 rows, 3 runs
    python benchmarks/engine.py --rows 64 --runs 1 --model /path/to/model

Writes benchmarks/results/engine.json and prints a table; docs/benchmarks.md's section 3a
shows its figures.
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

TARGET = 0.95

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


def _kind(title: str) -> str:
    """Which part of the run a process is, from its title or command line."""
    if title.startswith("VLLM::"):
        return "engine"
    for kind, needle in (
        ("replica", "ServeReplica"),
        ("stage actors", "MapWorker"),
        ("serve controller", "ServeController"),
    ):
        if needle in title:
            return kind
    return "other Ray processes"


def cpu_snapshot() -> dict[int, tuple[str, float]]:
    """CPU seconds (user + system) of this process and all its descendants, by pid."""
    import psutil

    me = psutil.Process()
    out = {me.pid: ("driver", sum(me.cpu_times()[:2]))}
    for proc in me.children(recursive=True):
        try:
            title = " ".join(proc.cmdline()) or proc.name()
            out[proc.pid] = (_kind(title), sum(proc.cpu_times()[:2]))
        except Exception:  # gone between listing and reading
            continue
    return out


def cpu_by_kind(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]):
    """CPU seconds each kind of process spent between two snapshots (a process started in
    between counts from zero; one that ended in between is lost, which undercounts)."""
    spent: dict[str, float] = {}
    for pid, (kind, seconds) in after.items():
        spent[kind] = spent.get(kind, 0.0) + seconds - before.get(pid, (kind, 0.0))[1]
    return {k: round(v, 3) for k, v in sorted(spent.items())}


def timed(run_pass, rows: int) -> dict[str, Any]:
    """One timed pass over ``rows`` prompts: wall time, tokens, CPU by kind of process."""
    before = cpu_snapshot()
    started = time.perf_counter()
    tokens, errors = run_pass(rows)
    elapsed = time.perf_counter() - started
    cpu = cpu_by_kind(before, cpu_snapshot())
    outside = sum(v for k, v in cpu.items() if k != "engine")
    return {
        "rows": rows,
        "seconds": round(elapsed, 3),
        "output_tokens": tokens,
        "output_tokens_per_s": round(tokens / elapsed, 2),
        "errors": errors,
        "cpu_s_by_process": cpu,
        "cpu_us_per_row_outside_engine": round(outside / rows * 1e6),
    }


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

    def run_pass(n: int) -> tuple[int, int]:
        outputs = llm.chat(prompts(n), params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outputs), 0

    return {
        "side": "raw",
        "engine_start_s": round(start_s, 1),
        "passes": [timed(run_pass, n) for n in args.rows],
    }


def run_relayllm(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    import relayllm

    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    options = {"model": args.model, "max_model_len": args.max_model_len, **args.options}
    started = time.perf_counter()
    ref = relayllm.deploy(
        relayllm.DeploymentConfig(name="bench-engine", backend="vllm", options=options)
    )
    start_s = time.perf_counter() - started
    info = ref.handle().info.remote().result(timeout_s=60)
    config = relayllm.ProcessorConfig(
        deployment="bench-engine",
        batch_size=args.batch_size,
        sampling_params=sampling(args),
        **({"max_in_flight_batches": args.in_flight} if args.in_flight else {}),
        **({"compute": args.compute} if args.compute else {}),
    )
    processor = relayllm.build_processor(config)

    def dataset(n: int):
        return ray.data.from_items([{"id": i, "messages": m} for i, m in enumerate(prompts(n))])

    processor(dataset(4)).take_all()  # warm-up (and the stage's first worker start)

    def run_pass(n: int) -> tuple[int, int]:
        out = processor(dataset(n)).take_all()
        assert len(out) == n, f"{len(out)} rows came back of {n}"
        return (
            sum(r["num_generated_tokens"] or 0 for r in out),
            sum(1 for r in out if r["error"]),
        )

    passes = [timed(run_pass, n) for n in args.rows]
    relayllm.shutdown("bench-engine")
    ray.shutdown()
    return {
        "side": "relayllm",
        "engine_start_s": round(start_s, 1),
        "engine_ready_s": info.get("engine_ready_s"),
        "engine_start_phases": info.get("engine_start_phases"),
        "engine_metrics": info.get("engine_metrics"),
        "passes": passes,
    }


def child(side: str, args: argparse.Namespace, *extra: str) -> dict[str, Any]:
    """One side's run in its own process; ``extra``: more arguments for it."""
    command = [
        sys.executable,
        __file__,
        "--side",
        side,
        "--rows",
        ",".join(map(str, args.rows)),
        "--max-tokens",
        str(args.max_tokens),
        "--max-model-len",
        str(args.max_model_len),
        "--batch-size",
        str(args.batch_size),
        "--model",
        args.model,
        *(["--in-flight", str(args.in_flight)] if getattr(args, "in_flight", None) else []),
        *(["--compute", args.compute] if getattr(args, "compute", None) else []),
        "--options",
        json.dumps(args.options),
        *extra,
    ]
    done = subprocess.run(command, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"the {side} run failed (exit {done.returncode})")
    return json.loads(lines[-1][len("RESULT ") :])


def spread(values: list[float]) -> dict[str, float]:
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
    }


def summarize(runs: list[dict[str, Any]], rows: list[int]) -> list[dict[str, Any]]:
    """Per row count: each side's median tokens/s and spread, the ratio of each run (its two
    sides paired) with their median and spread, CPU per row outside the engine."""
    table = []
    for i, n in enumerate(rows):
        raw = [r["raw"]["passes"][i] for r in runs]
        ours = [r["relayllm"]["passes"][i] for r in runs]
        ratios = [
            o["output_tokens_per_s"] / w["output_tokens_per_s"]
            for o, w in zip(ours, raw, strict=True)
        ]
        table.append(
            {
                "rows": n,
                "raw_tokens_per_s": spread([p["output_tokens_per_s"] for p in raw]),
                "relayllm_tokens_per_s": spread([p["output_tokens_per_s"] for p in ours]),
                "ratio": spread(ratios),
                "raw_cpu_us_per_row_outside_engine": spread(
                    [p["cpu_us_per_row_outside_engine"] for p in raw]
                ),
                "relayllm_cpu_us_per_row_outside_engine": spread(
                    [p["cpu_us_per_row_outside_engine"] for p in ours]
                ),
                "errors": sum(p["errors"] for p in ours),
                "target_met": statistics.median(ratios) >= TARGET,
            }
        )
    return table


def _default_compute() -> str:
    from relayllm import ProcessorConfig

    return ProcessorConfig.model_fields["compute"].default


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--rows",
        type=lambda text: [int(x) for x in text.split(",")],
        default=[64, 128, 512],
        help="row counts, comma-separated; each side times one pass per count",
    )
    parser.add_argument("--runs", type=int, default=3, help="alternating runs of both sides")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--model", default="demo")
    parser.add_argument(
        "--in-flight",
        type=int,
        help="the relayllm side's max_in_flight_batches (default: the processor's own)",
    )
    parser.add_argument(
        "--compute",
        choices=["actors", "tasks"],
        help="the relayllm side's ProcessorConfig.compute (default: the processor's own)",
    )
    parser.add_argument(
        "--options",
        type=json.loads,
        default={},
        help="more vllm backend options for the relayllm side, as JSON (e.g. "
        '\'{"engine_kwargs": {"distributed_executor_backend": "mp"}}\')',
    )
    parser.add_argument("--side", choices=["raw", "relayllm"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.side:
        result = run_raw(args) if args.side == "raw" else run_relayllm(args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    model_path(args.model)  # build the demo model once, outside every timing
    load_at_start = os.getloadavg()[0]
    runs = []
    for i in range(args.runs):
        order = ["raw", "relayllm"] if i % 2 == 0 else ["relayllm", "raw"]
        run = {"order": order}
        for side in order:
            run[side] = child(side, args)
            print(f"run {i + 1}/{args.runs}: {side} done", file=sys.stderr, flush=True)
        runs.append(run)
    table = summarize(runs, args.rows)
    report = {
        "model": args.model,
        "rows": args.rows,
        "runs": args.runs,
        "sampling_params": sampling(args),
        "max_model_len": args.max_model_len,
        "batch_size": args.batch_size,
        "relayllm_options": args.options,
        "relayllm_in_flight": args.in_flight,
        # The processor's default when --compute is not given (it changed once).
        "relayllm_compute": args.compute or _default_compute(),
        "target": TARGET,
        "summary": table,
        "target_met": all(t["target_met"] for t in table),
        "raw_runs": runs,
        # The machine is shared: the 1-minute load average says how busy it was.
        "host": {"load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg()[0]},
    }
    write_results("engine", report)

    print(
        f"\n{'rows':>5} {'raw tok/s':>10} {'relayllm tok/s':>15} {'ratio (min-max)':>20} "
        f"{'CPU us/row outside engine (raw / relayllm)':>44}"
    )
    for t in table:
        r = t["ratio"]
        print(
            f"{t['rows']:>5} {t['raw_tokens_per_s']['median']:>10.1f} "
            f"{t['relayllm_tokens_per_s']['median']:>15.1f} "
            f"{r['median']:>8.2f}x ({r['min']:.2f}-{r['max']:.2f}) "
            f"{t['raw_cpu_us_per_row_outside_engine']['median']:>20,.0f} / "
            f"{t['relayllm_cpu_us_per_row_outside_engine']['median']:,.0f}"
        )


if __name__ == "__main__":
    main()
