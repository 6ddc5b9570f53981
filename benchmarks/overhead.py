"""Framework overhead: rows/s through the relayllm stage vs ray.data.llm's Serve stage vs a
minimal hand-written batched client, all against the SAME echo deployment, in one run.

    python benchmarks/overhead.py --rows 20000

The echo deployment has no model, so the figure is the cost of moving rows Ray Data -> Serve ->
Ray Data. Contenders run in alternating order, ``--repeats`` times each; the table reports the
median and the ratios that matter (this machine is noisy: compare ratios, not absolutes).
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyarrow as pa
import ray

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.testing import enable_echo_backend

DEPLOYMENT = "bench-echo"


class HandWrittenClient:
    """The least a user could write: one Serve call per Ray Data batch, async like ours."""

    def __init__(self) -> None:
        from ray import serve

        self.handle = serve.get_deployment_handle(DEPLOYMENT, f"relayllm-{DEPLOYMENT}")

    async def __call__(self, batch: pa.Table) -> pa.Table:
        prompts = batch.column("prompt").to_pylist()
        requests = [
            {"request_id": str(i), "task": "completion", "prompt": p, "sampling_params": {}}
            for i, p in enumerate(prompts)
        ]
        results = await self.handle.process_batch.remote(requests)
        return batch.append_column("generated_text", pa.array([r["generated_text"] for r in results]))


def dataset(rows: int, blocks: int):
    return ray.data.range(rows, override_num_blocks=blocks).map_batches(
        lambda b: {"id": b["id"], "prompt": [f"question number {i} about things" for i in b["id"]]}
    ).materialize()


def run_relayllm(ds, batch_size: int):
    proc = build_processor(ProcessorConfig(deployment=DEPLOYMENT, task="completion", batch_size=batch_size))
    return proc(ds)


def run_hand_written(ds, batch_size: int):
    return ds.map_batches(HandWrittenClient, batch_size=batch_size, batch_format="pyarrow",
                          zero_copy_batch=True, concurrency=1, num_cpus=0.25)


def run_ray_data_llm(ds, batch_size: int):
    from ray.data.llm import ServeDeploymentProcessorConfig, build_processor as build_llm

    config = ServeDeploymentProcessorConfig(
        deployment_name=DEPLOYMENT, app_name=f"relayllm-{DEPLOYMENT}", batch_size=batch_size, concurrency=1
    )
    proc = build_llm(
        config,
        preprocess=lambda row: {"id": row["id"], "method": "chat_stream",
                                "request_kwargs": {"task": "completion", "prompt": row["prompt"], "sampling_params": {}}},
        postprocess=lambda row: {"id": row["id"], "generated_text": row["generated_text"]},
    )
    return proc(ds)


CONTENDERS = {"relayllm": run_relayllm, "hand-written": run_hand_written, "ray.data.llm": run_ray_data_llm}


def timed(fn, ds, batch_size: int, expected: int) -> float:
    start = time.perf_counter()
    out = fn(ds, batch_size).materialize()
    elapsed = time.perf_counter() - start
    count = out.count()
    assert count == expected, f"{fn.__name__} returned {count} rows, expected {expected}"
    return expected / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--llm-rows", type=int, default=None,
                        help="rows for ray.data.llm (it is ~20x slower); default: --rows / 4")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--skip", action="append", default=[], choices=list(CONTENDERS))
    parser.add_argument("--name", default="overhead", help="results file name (benchmarks/results/NAME.json)")
    args = parser.parse_args()

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    enable_echo_backend()
    # ray.data.llm sends one call per row: let the replica take many at once, so it is not
    # throttled by an admission limit that batched callers never reach.
    relayllm.deploy(DeploymentConfig(name=DEPLOYMENT, backend="echo", max_ongoing_requests=256))
    llm_rows = args.llm_rows or max(1, args.rows // 4)
    data = {"main": dataset(args.rows, args.blocks), "llm": dataset(llm_rows, max(1, args.blocks // 4))}

    timed(run_relayllm, data["llm"], args.batch_size, llm_rows)  # warm-up: actors, handles, imports
    samples: dict[str, list[float]] = {name: [] for name in CONTENDERS if name not in args.skip}
    for repeat in range(args.repeats):
        order = list(samples) if repeat % 2 == 0 else list(reversed(samples))
        for name in order:
            ds, n = (data["llm"], llm_rows) if name == "ray.data.llm" else (data["main"], args.rows)
            samples[name].append(timed(CONTENDERS[name], ds, args.batch_size, n))
            print(f"  repeat {repeat}: {name:>13} {samples[name][-1]:>9,.0f} rows/s", flush=True)

    median = {name: statistics.median(values) for name, values in samples.items()}
    ratios = {}
    if "relayllm" in median and "ray.data.llm" in median:
        ratios["relayllm / ray.data.llm"] = median["relayllm"] / median["ray.data.llm"]
    if "relayllm" in median and "hand-written" in median:
        ratios["relayllm / hand-written"] = median["relayllm"] / median["hand-written"]
    print(f"\n{'contender':>14} {'rows/s (median)':>16}")
    for name, value in median.items():
        print(f"{name:>14} {value:>16,.0f}")
    for name, value in ratios.items():
        print(f"{name:>26}: {value:.2f}x")
    path = relayllm_results(args, llm_rows, samples, median, ratios)
    print(f"\nresults: {path}")
    relayllm.shutdown(DEPLOYMENT)


def relayllm_results(args, llm_rows, samples, median, ratios):
    from _common import write_results

    return write_results(args.name, {
        "rows": args.rows, "ray_data_llm_rows": llm_rows, "batch_size": args.batch_size,
        "repeats": args.repeats, "samples_rows_per_s": samples, "median_rows_per_s": median,
        "ratios": ratios,
    })


if __name__ == "__main__":
    main()
