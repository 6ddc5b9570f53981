"""Scale-out: rows/s with 1, 2 and 4 replicas of one deployment x 1, 2 and 4 stage actors,
and autoscaling driven by the stage's in-flight calls.

    python benchmarks/scaleout.py                    # 3 x 3 grid, then the autoscaling runs

The deployment models an engine with a fixed capacity: echo sleeping ``--delay-s`` per call,
with ``--slots`` calls at once per replica (``max_ongoing_requests``), so a replica serves at
most ``slots * batch_size / delay_s`` rows/s and the figure reflects scheduling, not this
machine's two cores. Each stage actor keeps at most ``max_in_flight_batches`` (default 4) calls
outstanding, so the ideal is ``min(replicas * slots, actors * max_in_flight_batches) *
batch_size / delay_s``: throughput grows with replicas until the stage's outstanding calls are
the limit, and then with stage actors. Rows/s is measured after the first output block
(start-up of the stage actors excluded; the end-to-end figure is kept too).

Autoscaling: the same deployment with ``autoscaling_config`` (1 to 4 replicas, target
``slots`` ongoing calls per replica), fed by one stage actor allowed ``4 * slots`` calls in
flight, then by one allowed ``slots``. Serve scales on the calls its handles report, so only
the first can reach 4 replicas: ``concurrency * max_in_flight_batches >= max_replicas *
target_ongoing_requests``. Writes benchmarks/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import ray
from _common import Sampler, host_facts  # the script's folder is on sys.path
from overhead import dataset, measure  # the script's folder is on sys.path

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.testing import enable_echo_backend

DEPLOYMENT = "bench-scale"
BATCH_SIZE = 64
IN_FLIGHT = 4  # the ProcessorConfig default


def autoscaling_config(max_replicas: int, target: int) -> dict[str, Any]:
    """Quick to react, so a run of seconds shows it; production keeps Serve's slower defaults
    for downscaling (an engine is expensive to restart)."""
    return {
        "min_replicas": 1,
        "max_replicas": max_replicas,
        "target_ongoing_requests": target,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2.0,
        "upscale_delay_s": 1.0,
        "downscale_delay_s": 600.0,
    }


def deploy(args: argparse.Namespace, *, replicas: int = 1, autoscale_to: int | None = None) -> None:
    if DEPLOYMENT in {d.name for d in relayllm.list_deployments()}:
        relayllm.shutdown(DEPLOYMENT)  # a new replica count: start afresh
    relayllm.deploy(
        DeploymentConfig(
            name=DEPLOYMENT,
            backend="echo",
            options={"delay_s": args.delay_s},
            max_ongoing_requests=args.slots,
            num_replicas=replicas,
            autoscaling_config=autoscaling_config(autoscale_to, args.slots)
            if autoscale_to
            else None,
        )
    )


def processor(actors: int, in_flight: int = IN_FLIGHT):
    config = ProcessorConfig(
        deployment=DEPLOYMENT,
        task="completion",
        batch_size=BATCH_SIZE,
        concurrency=actors,
        max_in_flight_batches=in_flight,
        compute="actors",  # the question is replicas x stage actors
    )
    proc = build_processor(config)
    return lambda ds, _batch_size: proc(ds)


class ReplicaTimeline(Sampler):
    """Running replicas of the deployment, sampled every ``period_s`` while the block runs."""

    def __init__(self, period_s: float = 0.5) -> None:
        super().__init__(period_s)
        self.samples: list[tuple[float, int]] = []
        self._start = time.perf_counter()

    def sample(self) -> None:
        from ray import serve

        app = serve.status().applications.get(f"relayllm-{DEPLOYMENT}")
        running = 0
        if app and DEPLOYMENT in app.deployments:
            states = app.deployments[DEPLOYMENT].replica_states
            running = sum(n for state, n in states.items() if str(state).endswith("RUNNING"))
        self.samples.append((round(time.perf_counter() - self._start, 2), running))


def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for replicas in args.replicas:
        deploy(args, replicas=replicas)
        rows = args.rows_per_replica * replicas
        ds = dataset(rows, rows_per_block=args.rows_per_block)
        for actors in args.actors:
            runs = [measure(processor(actors), ds, rows) for _ in range(args.repeats)]
            best = max(runs, key=lambda r: r["steady_rows_per_s"] or 0)
            ideal = min(replicas * args.slots, actors * IN_FLIGHT) * BATCH_SIZE / args.delay_s
            results.append(
                {
                    "replicas": replicas,
                    "stage_actors": actors,
                    "rows": rows,
                    "steady_rows_per_s": best["steady_rows_per_s"],
                    "end_to_end_rows_per_s": best["rows_per_s"],
                    "ideal_rows_per_s": ideal,
                    "runs": runs,
                }
            )
            print(
                f"  {replicas} replicas, {actors} stage actors: "
                f"{best['steady_rows_per_s']:>7,.0f} rows/s "
                f"(ideal {ideal:,.0f}; end to end {best['rows_per_s']:,.0f})",
                flush=True,
            )
    return results


def autoscaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for in_flight in (4 * args.slots, args.slots):
        deploy(args, autoscale_to=4)
        rows = args.autoscale_rows
        ds = dataset(rows, rows_per_block=args.rows_per_block)
        with ReplicaTimeline() as timeline:
            run = measure(processor(1, in_flight), ds, rows)
        peak = max((n for _, n in timeline.samples), default=0)
        results.append(
            {
                "stage_actors": 1,
                "max_in_flight_batches": in_flight,
                "rows": rows,
                "max_replicas": 4,
                "peak_replicas": peak,
                "replicas_over_time": timeline.samples,
                "steady_rows_per_s": run["steady_rows_per_s"],
                "end_to_end_rows_per_s": run["rows_per_s"],
                "seconds": run["seconds"],
            }
        )
        print(
            f"  autoscaling 1..4, max_in_flight_batches={in_flight}: reached {peak} replicas, "
            f"{run['rows_per_s']:,.0f} rows/s end to end over {run['seconds']:.0f}s",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--delay-s", type=float, default=0.2, help="engine time per call")
    parser.add_argument("--slots", type=int, default=4, help="calls one replica works on at once")
    parser.add_argument(
        "--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument(
        "--actors", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--rows-per-replica", type=int, default=8000)
    parser.add_argument(
        "--rows-per-block",
        type=int,
        default=2048,
        help="a stage actor works on one block at a time: its calls drain at the end "
        "of each block, so blocks of several stage batches keep the slots full",
    )
    parser.add_argument("--autoscale-rows", type=int, default=40000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-autoscaling", action="store_true")
    args = parser.parse_args()

    host = host_facts()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    enable_echo_backend()
    report = {
        "host": host,
        "delay_s": args.delay_s,
        "batch_size": BATCH_SIZE,
        "slots": args.slots,
        "max_in_flight_batches": IN_FLIGHT,
        "rows_per_block": args.rows_per_block,
        "grid": grid(args),
    }
    if not args.skip_autoscaling:
        report["autoscaling_config"] = autoscaling_config(4, args.slots)
        report["autoscaling"] = autoscaling(args)
    relayllm.shutdown(DEPLOYMENT)

    from _common import write_results

    print(f"\nresults: {write_results('scaleout', report)}")


if __name__ == "__main__":
    main()
