"""Scale-out: rows/s with 1, 2 and 4 replicas of one deployment x 1, 2 and 4 stage actors,
and autoscaling driven by the stage's in-flight calls.

    python benchmarks/scaleout.py                    # 3 x 3 grid, then the autoscaling runs
    python benchmarks/scaleout.py --delay-s 0.02    # shorter engine time: the stage shows sooner

The deployment is echo with a fixed sleep per call (``--delay-s``) and ``max_ongoing_requests=1``:
each replica works on one batch at a time, like an engine at its capacity, so a replica serves
at most ``batch_size / delay_s`` rows/s and the figure reflects scheduling, not this machine's
two cores. The ideal is ``replicas * batch_size / delay_s``; the stage keeps at most
``concurrency * max_in_flight_batches`` calls outstanding, so it caps the useful replica count
too. Rows/s is measured after the first output block (start-up of the stage actors excluded;
the end-to-end figure is kept in the JSON).

Autoscaling: the same deployment with ``autoscaling_config`` (1 to 4 replicas, one ongoing
call per replica as the target), fed once by a stage allowed 4 calls in flight and once by a
stage allowed 1. Serve scales on the calls its handles report, so only the first can reach 4
replicas: ``concurrency * max_in_flight_batches >= max_replicas * target_ongoing_requests``.
Writes benchmarks/results/scaleout.json.
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import ray

import relayllm
from overhead import dataset, measure  # the script's folder is on sys.path
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.testing import enable_echo_backend

DEPLOYMENT = "bench-scale"
BATCH_SIZE = 64


def autoscaling_config(max_replicas: int) -> dict[str, Any]:
    """Quick to react, so a run of seconds shows it; production keeps Serve's slower defaults
    for downscaling (an engine is expensive to restart)."""
    return {
        "min_replicas": 1,
        "max_replicas": max_replicas,
        "target_ongoing_requests": 1,
        "metrics_interval_s": 0.5,
        "look_back_period_s": 2.0,
        "upscale_delay_s": 1.0,
        "downscale_delay_s": 600.0,
    }


def deploy(delay_s: float, *, replicas: int = 1, autoscale_to: int | None = None) -> None:
    if DEPLOYMENT in {d.name for d in relayllm.list_deployments()}:
        relayllm.shutdown(DEPLOYMENT)  # a new replica count: start afresh
    relayllm.deploy(DeploymentConfig(
        name=DEPLOYMENT, backend="echo", options={"delay_s": delay_s}, max_ongoing_requests=1,
        num_replicas=replicas,
        autoscaling_config=autoscaling_config(autoscale_to) if autoscale_to else None,
    ))  # fmt: skip


def processor(actors: int, in_flight: int = 4):
    config = ProcessorConfig(deployment=DEPLOYMENT, task="completion", batch_size=BATCH_SIZE,
                             concurrency=actors, max_in_flight_batches=in_flight)  # fmt: skip
    proc = build_processor(config)
    return lambda ds, _batch_size: proc(ds)


class ReplicaTimeline:
    """Running replicas of the deployment, sampled every ``period_s`` while the block runs."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.samples: list[tuple[float, int]] = []
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from ray import serve

        start = time.perf_counter()
        while not self._stop.is_set():
            app = serve.status().applications.get(f"relayllm-{DEPLOYMENT}")
            running = 0
            if app and DEPLOYMENT in app.deployments:
                states = app.deployments[DEPLOYMENT].replica_states
                running = sum(n for state, n in states.items() if str(state).endswith("RUNNING"))
            self.samples.append((round(time.perf_counter() - start, 2), running))
            self._stop.wait(self._period)

    def __enter__(self) -> ReplicaTimeline:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def grid(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for replicas in args.replicas:
        deploy(args.delay_s, replicas=replicas)
        rows = args.rows_per_replica * replicas
        ds = dataset(rows)
        for actors in args.actors:
            runs = [measure(processor(actors), ds, rows) for _ in range(args.repeats)]
            best = max(runs, key=lambda r: r["steady_rows_per_s"] or 0)
            ideal = replicas * BATCH_SIZE / args.delay_s
            results.append({"replicas": replicas, "stage_actors": actors, "rows": rows,
                            "steady_rows_per_s": best["steady_rows_per_s"],
                            "end_to_end_rows_per_s": best["rows_per_s"], "ideal_rows_per_s": ideal,
                            "runs": runs})  # fmt: skip
            print(f"  {replicas} replicas, {actors} stage actors: {best['steady_rows_per_s']:>7,.0f} rows/s "
                  f"(ideal {ideal:,.0f}; end to end {best['rows_per_s']:,.0f})", flush=True)  # fmt: skip
    return results


def autoscaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    results = []
    for in_flight in (4, 1):
        deploy(args.delay_s, autoscale_to=4)
        rows = args.autoscale_rows
        with ReplicaTimeline() as timeline:
            run = measure(processor(1, in_flight), dataset(rows), rows)
        peak = max((n for _, n in timeline.samples), default=0)
        results.append({"stage_actors": 1, "max_in_flight_batches": in_flight, "rows": rows,
                        "max_replicas": 4, "peak_replicas": peak, "replicas_over_time": timeline.samples,
                        "steady_rows_per_s": run["steady_rows_per_s"], "end_to_end_rows_per_s": run["rows_per_s"],
                        "seconds": run["seconds"]})  # fmt: skip
        print(f"  autoscaling 1..4, max_in_flight_batches={in_flight}: reached {peak} replicas, "
              f"{run['rows_per_s']:,.0f} rows/s end to end over {run['seconds']:.0f}s", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--delay-s", type=float, default=0.05, help="engine time per call")
    parser.add_argument("--replicas", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--actors", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4])
    parser.add_argument("--rows-per-replica", type=int, default=6000)
    parser.add_argument("--autoscale-rows", type=int, default=40000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--skip-autoscaling", action="store_true")
    args = parser.parse_args()

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    enable_echo_backend()
    report = {"delay_s": args.delay_s, "batch_size": BATCH_SIZE, "max_ongoing_requests": 1,
              "max_in_flight_batches": 4, "grid": grid(args)}  # fmt: skip
    if not args.skip_autoscaling:
        report["autoscaling_config"] = autoscaling_config(4)
        report["autoscaling"] = autoscaling(args)
    relayllm.shutdown(DEPLOYMENT)

    from _common import write_results

    print(f"\nresults: {write_results('scaleout', report)}")


if __name__ == "__main__":
    main()
