"""Framework overhead: rows/s through the relayllm stage vs a minimal hand-written batched
client vs ray.data.llm's Serve stage, all against the SAME echo deployment, in one run.

    python benchmarks/overhead.py                                # 10k, 100k and 1M rows
    python benchmarks/overhead.py --sizes 20000 --repeats 1     # a quick look

The echo deployment has no model, so the figure is the cost of moving rows Ray Data -> Serve ->
Ray Data. At every size the contenders run in alternating order, ``--repeats`` times each;
ray.data.llm (one Serve call per row, ~100x slower) runs only at ``--llm-sizes`` and
``--llm-repeats`` times. Each run records:

- rows/s, wall clock, from building the processor to the last output block (actor start
  included: that is what a user waits for);
- CPU time per row, summed over every process of this run's Ray cluster (driver, raylet, stage
  actors, the replica): other programs on the machine do not count, so on a busy machine it is
  the steadier figure;
- the driver's peak RSS during the run, sampled every 0.1 s.

The table reports medians and the ratios that matter (this machine is shared: compare ratios
measured side by side, not absolutes across runs). Writes benchmarks/results/overhead.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import pyarrow as pa
import ray
from _common import RunMonitor, host_facts  # the script's folder is on sys.path

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.testing import enable_echo_backend

if __name__ != "__main__":
    # Imported (by the smoke test or another benchmark): Ray workers cannot import this file,
    # so its classes and functions travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

DEPLOYMENT = "bench-echo"
BATCH_SIZE = 64  # the ProcessorConfig default: every contender sends calls of this many rows


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
        return batch.append_column(
            "generated_text", pa.array([r["generated_text"] for r in results])
        )


def dataset(rows: int, blocks: int | None = None, rows_per_block: int = 5000):
    """Prompts in blocks of ``rows_per_block`` rows (or exactly ``blocks`` blocks): the same
    block size at every dataset size, so only the number of rows changes."""
    blocks = blocks or max(1, rows // rows_per_block)
    return (
        ray.data.range(rows, override_num_blocks=blocks)
        .map_batches(
            lambda b: {
                "id": b["id"],
                "prompt": [f"question number {i} about things" for i in b["id"]],
            }
        )
        .materialize()
    )


def run_relayllm(ds, batch_size: int = BATCH_SIZE):
    proc = build_processor(
        ProcessorConfig(deployment=DEPLOYMENT, task="completion", batch_size=batch_size)
    )
    return proc(ds)


def run_relayllm_actor_transport(ds, batch_size: int = BATCH_SIZE):
    """relayllm over Serve's actor calls, the transport the stage falls back to when gRPC
    cannot carry a call: the same stage, so the difference is the transport's alone."""
    proc = build_processor(
        ProcessorConfig(
            deployment=DEPLOYMENT, task="completion", batch_size=batch_size, transport="actor"
        )
    )
    return proc(ds)


def run_hand_written(ds, batch_size: int = BATCH_SIZE):
    return ds.map_batches(
        HandWrittenClient,
        batch_size=batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0.25,
    )


def run_ray_data_llm(ds, batch_size: int = BATCH_SIZE):
    from ray.data.llm import ServeDeploymentProcessorConfig
    from ray.data.llm import build_processor as build_llm

    config = ServeDeploymentProcessorConfig(
        deployment_name=DEPLOYMENT,
        app_name=f"relayllm-{DEPLOYMENT}",
        batch_size=batch_size,
        concurrency=1,
    )
    proc = build_llm(
        config,
        preprocess=lambda row: {
            "id": row["id"],
            "method": "stream_http_row",  # the replica's one-row streaming method
            "request_kwargs": {
                "task": "completion",
                "prompt": row["prompt"],
                "sampling_params": {},
            },
        },
        postprocess=lambda row: {"id": row["id"], "generated_text": row["generated_text"]},
    )
    return proc(ds)


CONTENDERS = {
    "relayllm": run_relayllm,
    "hand-written": run_hand_written,
    "relayllm (actor transport)": run_relayllm_actor_transport,
    "ray.data.llm": run_ray_data_llm,
}


# -- measuring -----------------------------------------------------------------------------


def measure(fn, ds, expected: int, batch_size: int = BATCH_SIZE) -> dict[str, Any]:
    """Run one contender over ``ds``, consuming every output block as it is produced (block
    references only: no rows travel to the driver)."""
    rows, first = 0, None
    with RunMonitor() as monitor:
        start = time.perf_counter()
        for bundle in fn(ds, batch_size).iter_internal_ref_bundles():
            if first is None:
                first, first_rows = time.perf_counter(), bundle.num_rows()
            rows += bundle.num_rows()
        end = time.perf_counter()
    assert rows == expected, f"{fn.__name__} returned {rows} rows, expected {expected}"
    cpu = monitor.cpu_s
    return {
        "rows_per_s": expected / (end - start),
        "seconds": end - start,
        # What the stage sustains once it is up: the first output block marks the end of the
        # fixed start-up (a new actor process, imports, the first handle call).
        "first_output_s": first - start,
        "steady_rows_per_s": (expected - first_rows) / (end - first) if end > first else None,
        "cpu_us_per_row": None if cpu is None else cpu / expected * 1e6,
        "driver_peak_rss_mib": monitor.peak_rss / 2**20,
        "cpu_s_by_process": {k: round(v, 2) for k, v in monitor.cpu_by_role().items() if v >= 0.01},
    }


# -- the run -------------------------------------------------------------------------------


def start_cluster() -> None:
    # address="local": a new cluster of our own, even if `ray start` left one on this machine.
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    deploy_echo()


def deploy_echo() -> None:
    enable_echo_backend()
    # ray.data.llm sends one call per row: let the replica take many at once, so it is not
    # throttled by an admission limit that batched callers never reach.
    relayllm.deploy(DeploymentConfig(name=DEPLOYMENT, backend="echo", max_ongoing_requests=256))


def run_size(
    rows: int, contenders: dict[str, int], rows_per_block: int
) -> dict[str, list[dict[str, Any]]]:
    """``contenders`` maps a name to its repeats; runs alternate order, round by round."""
    ds = dataset(rows, rows_per_block=rows_per_block)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in contenders}
    names = list(contenders)
    for round_ in range(max(contenders.values())):
        order = names if round_ % 2 == 0 else names[::-1]
        for name in order:
            if len(samples[name]) >= contenders[name]:
                continue
            sample = measure(CONTENDERS[name], ds, rows)
            samples[name].append(sample)
            print_sample(rows, round_, name, sample)
    return samples


def print_sample(rows: int, round_: int, name: str, sample: dict[str, Any]) -> None:
    print(
        f"  {rows:>9,} rows, round {round_}: {name:>26} "
        f"{sample['rows_per_s']:>9,.0f} rows/s "
        f"{sample['cpu_us_per_row'] or 0:>7.0f} CPU us/row "
        f"{sample['driver_peak_rss_mib']:>6.0f} MiB driver",
        flush=True,
    )


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    summary = {}
    for name, runs in samples.items():
        summary[name] = {
            "rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
            "cpu_us_per_row": statistics.median(r["cpu_us_per_row"] or 0 for r in runs),
            "driver_peak_rss_mib": max(r["driver_peak_rss_mib"] for r in runs),
            "runs": len(runs),
        }
    return summary


def ratios(summary: dict[str, dict[str, float]]) -> dict[str, float]:
    out = {}
    ours = summary["relayllm"]["rows_per_s"]
    for other, label in [
        ("hand-written", "relayllm / hand-written"),
        ("ray.data.llm", "relayllm / ray.data.llm"),
        ("relayllm (actor transport)", "relayllm / relayllm (actor transport)"),
    ]:
        if other in summary:
            out[label] = ours / summary[other]["rows_per_s"]
    return out


def _sizes(text: str) -> list[int]:
    return [int(float(s)) for s in text.split(",") if s]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=_sizes, default=[10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--llm-sizes",
        type=_sizes,
        default=[10_000, 100_000],
        help="sizes at which ray.data.llm runs too",
    )
    parser.add_argument(
        "--actor-transport-sizes",
        type=_sizes,
        default=[10_000, 100_000],
        help="sizes at which relayllm also runs with Serve's actor-call transport",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--llm-repeats", type=int, default=1)
    parser.add_argument("--rows-per-block", type=int, default=5000)
    parser.add_argument(
        "--name", default="overhead", help="results file name (benchmarks/results/NAME.json)"
    )
    args = parser.parse_args()

    host = host_facts()
    start_cluster()
    measure(run_relayllm, dataset(2000, 4), 2000)  # warm-up: worker processes, imports, handles
    results = []
    for rows in args.sizes:
        contenders = {"relayllm": args.repeats, "hand-written": args.repeats}
        if rows in args.actor_transport_sizes:
            contenders["relayllm (actor transport)"] = args.repeats
        if rows in args.llm_sizes:
            contenders["ray.data.llm"] = args.llm_repeats
        samples = run_size(rows, contenders, args.rows_per_block)
        summary = summarize(samples)
        results.append(
            {"rows": rows, "samples": samples, "median": summary, "ratios": ratios(summary)}
        )
        for label, value in results[-1]["ratios"].items():
            print(f"  {rows:>9,} rows: {label} = {value:.2f}x", flush=True)

    report = {
        "host": host,
        "batch_size": BATCH_SIZE,
        "rows_per_block": args.rows_per_block,
        "repeats": args.repeats,
        "llm_repeats": args.llm_repeats,
        "sizes": results,
    }
    print_table(report)
    from _common import write_results  # the script's folder is on sys.path

    print(f"\nresults: {write_results(args.name, report)}")
    relayllm.shutdown(DEPLOYMENT)


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{'rows':>9} {'contender':>26} {'rows/s':>9} {'CPU us/row':>10} {'driver MiB':>10}")
    for size in report["sizes"]:
        for name, m in size["median"].items():
            print(
                f"{size['rows']:>9,} {name:>26} {m['rows_per_s']:>9,.0f} "
                f"{m['cpu_us_per_row']:>10.0f} "
                f"{m['driver_peak_rss_mib']:>10.0f}"
            )


if __name__ == "__main__":
    main()
