"""The path users write: rows/s of the README's Python pattern (a ``preprocess`` that builds
``messages`` from a column, a ``postprocess`` that keeps the answer) against a hand-written
batched client that produces the same output columns, and of ``relayllm run`` on a YAML
pipeline with a template against the hand-written client reading and writing the same JSONL
files, on the same echo deployment, in one run.

    python benchmarks/userpath.py                          # 100k and 1M rows, 3 rounds each
    python benchmarks/userpath.py --sizes 20000 --repeats 1   # a quick look
    python benchmarks/userpath.py --with-tasks --yaml-sizes "" --results-name userpath-tasks

The in-memory pair starts from the same materialized dataset (``id``, ``question``) and ends
with the same columns (``id``, ``question``, ``answer``); output blocks are consumed as they are
produced (no rows gathered in the driver). The file pair reads the same JSONL file and writes
JSONL (the pipeline keeps ``id``, ``question``, ``answer``); ``--yaml-sizes`` sets where it
runs. Runs alternate order round by round. Measured as in
``benchmarks/overhead.py``: rows/s from building the transform to the last output block, CPU
time per row over every process of this run's cluster, the driver's peak RSS. Writes
benchmarks/results/userpath.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import ray

from relayllm import ProcessorConfig, build_processor

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import RunMonitor, host_facts, write_results
from overhead import (
    BATCH_SIZE,
    DEPLOYMENT,
    measure,
    print_sample,
    start_cluster,
    summarize,
)

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


def run_readme_pattern(ds, batch_size: int = BATCH_SIZE, compute: str = "actors"):
    config = ProcessorConfig(deployment=DEPLOYMENT, batch_size=batch_size, compute=compute)
    return build_processor(config, preprocess=ask, postprocess=keep_answer)(ds)


def run_readme_pattern_as_tasks(ds, batch_size: int = BATCH_SIZE):
    return run_readme_pattern(ds, batch_size, compute="tasks")


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


# -- files: a YAML pipeline and the hand-written client around the same JSONL ---------------

PIPELINE = """
deployments:
  - {{name: {deployment}, backend: echo, max_ongoing_requests: 256}}
input: {{path: {input}, id_column: id}}
steps:
  - name: answer
    deployment: {deployment}
    messages: [{{role: user, content: "{{question}}"}}]
    output_column: answer
output: {{path: {output}, columns: [id, question, answer]}}
"""


def write_input(rows: int, directory: Path) -> Path:
    path = directory / f"questions-{rows}.jsonl"
    with path.open("w") as f:
        for i in range(rows):
            f.write(json.dumps({"id": i, "question": f"What is {i} plus one?"}) + "\n")
    return path


def run_yaml_pipeline(source: Path, out: Path) -> int:
    import relayllm

    spec = out.parent / "pipeline.yaml"
    spec.write_text(PIPELINE.format(deployment=DEPLOYMENT, input=source, output=out / "out.jsonl"))
    summary = relayllm.run_pipeline(spec, keep_deployments=True)
    return summary.rows


def run_hand_written_files(source: Path, out: Path) -> int:
    ds = ray.data.read_json(str(source))
    run_hand_written(ds).write_json(str(out))
    return sum(1 for f in out.iterdir() for _ in f.open())


FILE_CONTENDERS = {
    "relayllm run (YAML pipeline)": run_yaml_pipeline,
    "hand-written (files)": run_hand_written_files,
}


def measure_files(fn, source: Path, expected: int, workdir: Path) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp(dir=workdir))
    (out / "data").mkdir()
    with RunMonitor() as monitor:
        start = time.perf_counter()
        rows = fn(source, out / "data")
        end = time.perf_counter()
    assert rows == expected, f"{fn.__name__} wrote {rows} rows, expected {expected}"
    cpu = monitor.cpu_s
    return {
        "rows_per_s": expected / (end - start),
        "seconds": end - start,
        "cpu_us_per_row": None if cpu is None else cpu / expected * 1e6,
        "driver_peak_rss_mib": monitor.peak_rss / 2**20,
        "cpu_s_by_process": {k: round(v, 2) for k, v in monitor.cpu_by_role().items() if v >= 0.01},
    }


def run_size(
    rows: int, repeats: int, rows_per_block: int, files: bool, workdir: Path
) -> dict[str, list[dict[str, Any]]]:
    ds = dataset(rows, rows_per_block)
    source = write_input(rows, workdir) if files else None
    names = list(CONTENDERS) + (list(FILE_CONTENDERS) if files else [])
    samples: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for round_ in range(repeats):
        for name in names if round_ % 2 == 0 else names[::-1]:
            if name in CONTENDERS:
                sample = measure(CONTENDERS[name], ds, rows)
            else:
                sample = measure_files(FILE_CONTENDERS[name], source, rows, workdir)
            samples[name].append(sample)
            print_sample(rows, round_, name, sample)
    return samples


def with_ratios(summary: dict[str, Any]) -> dict[str, Any]:
    """overhead.summarize's medians, plus each relayllm contender over its baseline."""
    for ours, theirs in BASELINES.items():
        if ours in summary and theirs in summary:
            ratio = summary[ours]["rows_per_s"] / summary[theirs]["rows_per_s"]
            summary[f"ratio {ours} / {theirs}"] = ratio
    return summary


TASKS_CONTENDER = "relayllm (README pattern, compute=tasks)"

BASELINES = {
    "relayllm (README pattern)": "hand-written",
    TASKS_CONTENDER: "hand-written",
    "relayllm run (YAML pipeline)": "hand-written (files)",
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--sizes",
        type=lambda s: [int(float(x)) for x in s.split(",")],
        default=[100_000, 1_000_000],
    )
    parser.add_argument(
        "--yaml-sizes",
        type=lambda s: [int(float(x)) for x in s.split(",") if x],
        default=[100_000, 1_000_000],
        help="sizes at which the file pair (YAML pipeline, hand-written with files) runs too",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows-per-block", type=int, default=5000)
    parser.add_argument(
        "--with-tasks",
        action="store_true",
        help="also the README pattern with ProcessorConfig(compute='tasks')",
    )
    parser.add_argument("--results-name", default="userpath", help="benchmarks/results/NAME.json")
    args = parser.parse_args()
    if args.with_tasks:
        CONTENDERS[TASKS_CONTENDER] = run_readme_pattern_as_tasks

    host = host_facts()
    start_cluster()
    measure(run_readme_pattern, dataset(2000, 500), 2000)  # warm-up: workers, imports, handles
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for rows in args.sizes:
            files = rows in args.yaml_sizes
            samples = run_size(rows, args.repeats, args.rows_per_block, files, Path(tmp))
            summary = with_ratios(summarize(samples))
            for key, value in summary.items():
                if key.startswith("ratio"):
                    print(f"{rows:,} rows: {key} = {value:.2f}x", flush=True)
            results.append({"rows": rows, "summary": summary, "samples": samples})
    path = write_results(args.results_name, {"host": host, "sizes": results})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
