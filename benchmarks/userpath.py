"""The path users write: rows/s of the README's Python pattern (a ``preprocess`` that builds
``messages`` from a column, a ``postprocess`` that keeps the answer) against a hand-written
batched client that produces the same output columns, on the same echo deployment, in one run.

    python benchmarks/userpath.py                          # 100k and 1M rows, 3 rounds each
    python benchmarks/userpath.py --sizes 20000 --repeats 1   # a quick look

Both contenders start from the same materialized dataset (``id``, ``question``) and end with
the same columns (``id``, ``question``, ``answer``); output blocks are consumed as they are
produced (no rows gathered in the driver). Runs alternate order round by round. Measured as in
``benchmarks/overhead.py``: rows/s from building the transform to the last output block, CPU
time per row over every process of this run's cluster, the driver's peak RSS. Writes
benchmarks/results/userpath.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

import pyarrow as pa
import ray

from relayllm import ProcessorConfig, build_processor

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import write_results
from overhead import BATCH_SIZE, DEPLOYMENT, host_facts, measure, start_cluster

if __name__ != "__main__":
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


def dataset(rows: int, rows_per_block: int = 5000):
    return (
        ray.data.range(rows, override_num_blocks=max(1, rows // rows_per_block))
        .map_batches(
            lambda b: {"id": b["id"], "question": [f"What is {i} plus one?" for i in b["id"]]}
        )
        .materialize()
    )


# -- the README's pattern ------------------------------------------------------------------


def ask(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "messages": [{"role": "user", "content": row["question"]}]}


def keep_answer(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "question": row["question"], "answer": row["generated_text"]}


def run_readme_pattern(ds, batch_size: int = BATCH_SIZE):
    config = ProcessorConfig(deployment=DEPLOYMENT, batch_size=batch_size)
    return build_processor(config, preprocess=ask, postprocess=keep_answer)(ds)


# -- what a user could write by hand ---------------------------------------------------------


class HandWrittenChatClient:
    """One Serve call per Ray Data batch of ``batch_size`` rows, building the same requests the
    README's preprocess does and keeping the same columns its postprocess keeps."""

    def __init__(self) -> None:
        from ray import serve

        self.handle = serve.get_deployment_handle(DEPLOYMENT, f"relayllm-{DEPLOYMENT}")
        self.calls = 0

    async def __call__(self, batch: pa.Table) -> pa.Table:
        questions = batch.column("question").to_pylist()
        self.calls += 1
        requests = [
            {
                "request_id": f"{id(self)}-{self.calls}-{i}",
                "task": "chat",
                "messages": [{"role": "user", "content": q}],
                "sampling_params": {},
            }
            for i, q in enumerate(questions)
        ]
        results = await self.handle.process_batch.remote(requests)
        return pa.table(
            {
                "id": batch.column("id"),
                "question": batch.column("question"),
                "answer": pa.array([r["generated_text"] for r in results], pa.string()),
            }
        )


def run_hand_written(ds, batch_size: int = BATCH_SIZE):
    return ds.map_batches(
        HandWrittenChatClient,
        batch_size=batch_size,
        batch_format="pyarrow",
        zero_copy_batch=True,
        compute=ray.data.ActorPoolStrategy(size=1),
        num_cpus=0.25,
    )


CONTENDERS = {"relayllm (README pattern)": run_readme_pattern, "hand-written": run_hand_written}


def run_size(rows: int, repeats: int, rows_per_block: int) -> dict[str, list[dict[str, Any]]]:
    ds = dataset(rows, rows_per_block)
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            sample = measure(CONTENDERS[name], ds, rows)
            samples[name].append(sample)
            print(
                f"  {rows:>9,} rows, round {round_}: {name:>26} "
                f"{sample['rows_per_s']:>9,.0f} rows/s "
                f"{sample['cpu_us_per_row'] or 0:>7.0f} CPU us/row "
                f"{sample['driver_peak_rss_mib']:>6.0f} MiB driver",
                flush=True,
            )
    return samples


def summarize(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for name, runs in samples.items():
        summary[name] = {
            "rows_per_s": statistics.median(r["rows_per_s"] for r in runs),
            "cpu_us_per_row": statistics.median(r["cpu_us_per_row"] or 0 for r in runs),
            "driver_peak_rss_mib": max(r["driver_peak_rss_mib"] for r in runs),
            "runs": len(runs),
        }
    ours, theirs = summary["relayllm (README pattern)"], summary["hand-written"]
    summary["ratio relayllm / hand-written"] = ours["rows_per_s"] / theirs["rows_per_s"]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(float(x)) for x in s.split(",")],
        default=[100_000, 1_000_000],
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows-per-block", type=int, default=5000)
    args = parser.parse_args()

    host = host_facts()
    start_cluster()
    measure(run_readme_pattern, dataset(2000, 500), 2000)  # warm-up: workers, imports, handles
    results = []
    for rows in args.sizes:
        samples = run_size(rows, args.repeats, args.rows_per_block)
        summary = summarize(samples)
        print(f"{rows:,} rows: relayllm / hand-written = "
              f"{summary['ratio relayllm / hand-written']:.2f}x", flush=True)  # fmt: skip
        results.append({"rows": rows, "summary": summary, "samples": samples})
    path = write_results("userpath", {"host": host, "sizes": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
