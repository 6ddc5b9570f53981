"""What one small pass costs before any engine work: a relayllm processor on the echo deployment
against a Ray Data ``map_batches`` with an actor that does nothing, on the same rows, in one
run, alternating order (issue #20's 64-row gap to raw vLLM).

    python benchmarks/pass_cost.py                 # 64 rows, 5 rounds
    python benchmarks/pass_cost.py --rows 512 --rounds 3

Each pass is a fresh Ray Data execution, as each of ``benchmarks/engine.py``'s passes is: the
time from building the transform to the last row, and the stage's own time inside its actor
(Ray Data's per-operator wall time), and what a new stage actor imports beyond Ray Data
(``python -X importtime``). The no-op actor is the floor Ray Data sets for any
actor-based stage on this machine, the no-op task the floor for a task-based one: the processor
runs both ways (``ProcessorConfig.compute``). Writes benchmarks/results/pass_cost.json.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from typing import Any

import ray

from relayllm import ProcessorConfig, build_processor

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import write_results
from overhead import DEPLOYMENT, host_facts, start_cluster


def import_seconds() -> dict[str, float]:
    """Cumulative import time of what a new stage actor imports beyond Ray Data's own modules
    (``python -X importtime`` in a fresh interpreter that has imported ray.data first)."""
    code = "import ray, ray.data, pyarrow; import relayllm.stage.udf; from ray import serve"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    wanted = {"relayllm.stage.udf": "relayllm modules", "ray.serve": "ray.serve"}
    found = {}
    for line in done.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] in wanted:
            found[wanted[parts[2]]] = round(int(parts[1]) / 1e6, 3)
    return found


class NoOp:
    """An actor UDF that returns its batch: Ray Data's own cost of an actor stage."""

    def __call__(self, batch):
        return batch


def relayllm_pass(rows: list[dict[str, Any]], compute: str = "actors") -> list[dict[str, Any]]:
    config = ProcessorConfig(
        deployment=DEPLOYMENT, task="completion", batch_size=64, compute=compute
    )
    return build_processor(config)(ray.data.from_items(rows, override_num_blocks=1)).take_all()


def relayllm_tasks_pass(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return relayllm_pass(rows, compute="tasks")


def noop(batch):
    """A task UDF that returns its batch: Ray Data's own cost of a task stage."""
    return batch


def noop_actor_pass(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return (
        ray.data.from_items(rows, override_num_blocks=1)
        .map_batches(
            NoOp,
            compute=ray.data.ActorPoolStrategy(size=1),
            num_cpus=0.25,
            batch_format="pyarrow",
        )
        .take_all()
    )


def noop_task_pass(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return (
        ray.data.from_items(rows, override_num_blocks=1)
        .map_batches(noop, num_cpus=0.25, batch_format="pyarrow")
        .take_all()
    )


CONTENDERS = {
    "relayllm processor (echo)": relayllm_pass,
    "relayllm processor, compute=tasks (echo)": relayllm_tasks_pass,
    "no-op actor map_batches": noop_actor_pass,
    "no-op task map_batches": noop_task_pass,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    host = host_facts()
    start_cluster()
    rows = [{"id": i, "prompt": f"question number {i} about things"} for i in range(args.rows)]
    for fn in CONTENDERS.values():  # warm-up: worker processes, imports, the handle
        fn(rows)
    seconds: dict[str, list[float]] = {name: [] for name in CONTENDERS}
    names = list(CONTENDERS)
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            start = time.perf_counter()
            CONTENDERS[name](rows)
            seconds[name].append(round(time.perf_counter() - start, 3))
            print(f"round {round_}: {name:28} {seconds[name][-1]:.2f} s", flush=True)
    summary = {
        name: {"median_s": statistics.median(s), "min_s": min(s), "max_s": max(s)}
        for name, s in seconds.items()
    }
    relayllm_s = summary["relayllm processor (echo)"]["median_s"]
    noop_s = summary["no-op actor map_batches"]["median_s"]
    summary["relayllm minus no-op actor, median s"] = round(relayllm_s - noop_s, 3)
    tasks_s = summary["relayllm processor, compute=tasks (echo)"]["median_s"]
    noop_task_s = summary["no-op task map_batches"]["median_s"]
    summary["relayllm tasks minus no-op task, median s"] = round(tasks_s - noop_task_s, 3)
    for name, value in summary.items():
        print(f"{name}: {value}")
    imports = import_seconds()
    print(f"import seconds: {imports}")
    path = write_results(
        "pass_cost",
        {
            "import_s": imports,
            "host": host,
            "rows": args.rows,
            "rounds": args.rounds,
            "seconds": seconds,
            "summary": summary,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
