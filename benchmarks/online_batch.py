"""One engine for online and batch traffic: interactive latency with a batch job beside it.

Question: when a batch job runs on the deployment that also answers interactive requests
(its OpenAI-compatible HTTP front), how much does the interactive user's time to first token
(TTFT) grow, with and without relayllm's traffic management (batch rows at a lower priority in
the engine's scheduler, and the admission controller that shrinks how many batch rows are in
the engine while interactive requests are slow)? And does the batch job get the engine back
when the interactive user goes quiet?

The interactive user is the real ``openai`` client, streaming chat completions one after the
other with ``--think-s`` between them. The batch job is a processor written as the README
shows (``preprocess`` building ``messages``). Each variant has its own deployment (one engine
start each), run one after the other:

- ``managed``: the defaults: batch rows at priority 10, HTTP requests at 0, vLLM's priority
  scheduling, admission control (``target_ttft_s`` = ``--target-ttft-s``).
- ``unmanaged``: the same engine with the processor's rows at the interactive priority and the
  admission limit pinned at its maximum: what sharing a deployment gives without the two.
- ``floor`` (not by default): batch rows at their priority and the admission limit pinned at
  one row, the least the controller ever admits: the TTFT left there is not the controller's
  to remove (it comes from outside the engine's batch, e.g. CPU shared with the job).

Phases on each deployment: ``interactive alone``; ``batch alone``; ``batch + interactive``
(the interactive user for the whole job); on ``managed`` also ``bursts`` (the interactive user
on for ``--burst-s``, off for ``--idle-s``, for the whole job: batch rows/s in the idle windows,
counted as rows leave the engine and as the engine's steps generate tokens, against batch alone
in the same windows of its own run). ``--phases`` runs some of them (batch alone always runs).

    python benchmarks/online_batch.py        # needs relayllm-vllm and openai

Writes benchmarks/results/online_batch.json.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _common import (
    RESULTS,
    Sampler,
    git_commit,
    write_results,
)  # the script's folder is on sys.path

QUESTIONS = [
    "What is the capital of France?",
    "Name a primary colour.",
    "How many days are in a week?",
    "What do bees make?",
    "Which planet is the largest?",
]


PHASES = ("interactive-alone", "together", "bursts")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class InteractiveUser(Sampler):
    """Streams chat completions one after another on a thread until stopped; ``on()`` decides,
    before each request, whether the user is active now (bursts)."""

    def __init__(self, url: str, model: str, args: argparse.Namespace, on=None) -> None:
        import openai

        self.client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=600)
        self.model, self.args, self.on = model, args, on or (lambda: True)
        self.samples: list[dict[str, Any]] = []
        super().__init__(period_s=args.think_s)

    def ask(self, i: int) -> dict[str, Any]:
        start = time.perf_counter()
        first = None
        tokens = 0
        error = None
        try:
            stream = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
                temperature=0.0,
                max_tokens=self.args.interactive_max_tokens,
                stream=True,
            )
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    if first is None:
                        first = time.perf_counter()
                    tokens += 1
        except Exception as exc:  # a failed request is a result here
            error = f"{type(exc).__name__}: {exc}"
        end = time.perf_counter()
        return {
            "at": start,
            "ttft_s": (first - start) if first is not None else None,
            "e2e_s": end - start,
            "chunks": tokens,
            "error": error,
        }

    def sample(self) -> None:  # on the Sampler's thread, every think_s
        if self.on():
            self.samples.append(self.ask(len(self.samples)))

    def run_for(self, count: int) -> None:
        for i in range(count):
            self.samples.append(self.ask(i))
            time.sleep(self.args.think_s)


def latency_summary(samples: list[dict[str, Any]]) -> dict[str, Any]:
    ttft = [s["ttft_s"] for s in samples if s["ttft_s"] is not None]
    e2e = [s["e2e_s"] for s in samples if s["error"] is None]
    return {
        "requests": len(samples),
        "errors": sum(1 for s in samples if s["error"]),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
        "e2e_p50_s": percentile(e2e, 50),
        "e2e_p99_s": percentile(e2e, 99),
    }


def batch_job(name: str, args: argparse.Namespace, priority: int | None) -> dict[str, Any]:
    """The README's pattern; returns rows/s and when each output block reached the driver."""
    import ray

    import relayllm

    fields: dict[str, Any] = {"priority": priority} if priority is not None else {}
    processor = relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment=name,
            batch_size=args.batch_size,
            sampling_params={"temperature": 0.0, "max_tokens": args.batch_max_tokens},
            **fields,
        ),
        preprocess=lambda row: {"messages": [{"role": "user", "content": row["question"]}]},
        postprocess=lambda row: {"answer": row["generated_text"], "error": row["error"]},
    )
    rows = [{"question": f"Write one sentence about the number {i}."} for i in range(args.rows)]
    ds = ray.data.from_items(rows, override_num_blocks=max(1, args.rows // args.batch_size))
    start = time.perf_counter()
    arrivals: list[tuple[float, int]] = []
    errors = 0
    for batch in processor(ds).iter_batches(batch_size=None, batch_format="pandas"):
        arrivals.append((time.perf_counter(), len(batch)))
        errors += int(batch["error"].notna().sum())
    seconds = time.perf_counter() - start
    total = sum(n for _, n in arrivals)
    return {
        "start": start,
        "seconds": seconds,
        "rows": total,
        "errors": errors,
        "rows_per_s": total / seconds,
        "arrivals": arrivals,
    }


def rows_per_s_in(arrivals: list[tuple[float, int]], windows: list[tuple[float, float]]) -> float:
    """Rows that reached the driver inside ``windows`` per second of those windows."""
    rows = sum(n for at, n in arrivals for lo, hi in windows if lo <= at < hi)
    seconds = sum(hi - lo for lo, hi in windows)
    return rows / seconds if seconds else 0.0


class EngineRows(Sampler):
    """The deployment's count of batch rows answered (``info()["rows_by_class"]``), sampled
    every 0.25 s: when rows left the engine, to the call (``--batch-size`` rows). The driver
    sees rows only per output block (``batch_size * max_in_flight_batches`` rows, one every
    ~6 s at this engine's ~11 rows/s), too coarse for 10 s windows.

    Rows count when they leave the engine, a whole call's time after they entered it, and the
    stage's calls leave together (64 rows at once), so a 10 s window's count moves by a wave as
    one lands just in or out of it. The tokens the engine's steps generate
    (``metrics.engine_step_tokens``, every class) count as the work is done: the other
    measure of the same windows."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        # (when, batch rows answered, admission limit, batch rows in the engine,
        #  tokens generated by the engine's steps, prompt tokens prefilled, preemptions)
        self.samples: list[tuple[Any, ...]] = []
        super().__init__(period_s=0.25)

    def sample(self) -> None:
        info = self.handle.info.remote().result(timeout_s=60)
        admission = info.get("admission") or {}
        steps = (info.get("metrics") or {}).get("engine_step_tokens") or {}
        self.samples.append(
            (
                time.perf_counter(),
                info["rows_by_class"]["batch"],
                admission.get("limit"),
                admission.get("batch_rows_in_engine"),
                steps.get("generated"),
                steps.get("prefilled"),
                (info.get("metrics") or {}).get("engine_preemptions"),
            )
        )

    def at(self, t: float, column: int = 1) -> int:
        """A column's value at ``t`` (1: rows answered; 4: tokens generated): the last sample
        taken at or before it."""
        before = [s[column] for s in self.samples if s[0] <= t]
        return before[-1] if before else self.samples[0][column]

    def timeline(self, start: float) -> list[list[Any]]:
        """The samples as [seconds after ``start``, rows answered, limit, rows in engine,
        tokens generated, tokens prefilled, preemptions]."""
        return [[round(at - start, 2), *rest] for at, *rest in self.samples]

    def rows_per_s_in(self, windows: list[tuple[float, float]]) -> float:
        return self._per_s_in(windows, column=1)

    def tokens_per_s_in(self, windows: list[tuple[float, float]]) -> float | None:
        if not self.samples or self.samples[0][4] is None:
            return None  # the engine does not count its steps' tokens
        return self._per_s_in(windows, column=4)

    def engine_work(self) -> dict[str, Any] | None:
        """The engine's steps over the whole sampled span: prompt tokens prefilled per row
        answered (above one prompt per row: preempted rows computed again) and preemptions."""
        if not self.samples or self.samples[0][5] is None:
            return None  # the engine does not count its steps
        first, last = self.samples[0], self.samples[-1]
        rows = last[1] - first[1]
        return {
            "rows": rows,
            "prefilled_per_row": (last[5] - first[5]) / rows if rows else None,
            "generated_per_row": (last[4] - first[4]) / rows if rows else None,
            "preemptions": last[6] - first[6],
        }

    def _per_s_in(self, windows: list[tuple[float, float]], column: int) -> float:
        done = sum(self.at(hi, column) - self.at(lo, column) for lo, hi in windows)
        seconds = sum(hi - lo for lo, hi in windows)
        return done / seconds if seconds else 0.0


def spread_per_s(
    timeline: list[list[Any]], windows: list[tuple[float, float]], columns: tuple[int, ...] = (4, 5)
) -> float:
    """Tokens the engine's steps processed (prompt tokens prefilled and tokens generated) per
    second in ``windows``, each step's tokens spread evenly over the time the step ran
    (``columns``: the timeline's counters to add, 4 generated and 5 prefilled).

    A step's counters move when it ends, and on CPU a step that prefills a wave of rows runs
    for seconds: counted at its end, its work would land in whichever window it ended in. A
    step ran from the counters' previous move (or from the last sample with no batch rows in
    the engine, which was idle until then) to its own move, to within a sample."""
    steps: list[tuple[float, float, int]] = []  # (began, ended, tokens)
    began, done = timeline[0][0], sum(timeline[0][c] for c in columns)
    for sample in timeline[1:]:
        now = sum(sample[c] for c in columns)
        if now != done:
            steps.append((began, sample[0], now - done))
            began, done = sample[0], now
        elif not sample[3]:  # no batch rows in the engine: idle until the next sample
            began = sample[0]
    work = sum(
        tokens * max(0.0, min(hi, end) - max(lo, start)) / (end - start)
        for lo, hi in windows
        for start, end, tokens in steps
    )
    return work / sum(hi - lo for lo, hi in windows)


def idle_windows(
    began: float, burst_s: float, idle_s: float, end: float
) -> list[tuple[float, float]]:
    """The idle windows of bursts that began at ``began`` (``burst_s`` on, ``idle_s`` off),
    cut at ``end``, in ``began``'s time base."""
    windows = []
    t = began + burst_s
    while t < end:
        windows.append((t, min(t + idle_s, end)))
        t += burst_s + idle_s
    return windows


def recorded_idle_windows(bursts: dict[str, Any], idle_s: float) -> list[tuple[float, float]]:
    """A recorded bursts phase's idle windows, in its timeline's time base (seconds after
    the job's start)."""
    return idle_windows(
        bursts["bursts_began_s"], bursts["burst_s"], idle_s, bursts["batch"]["seconds"]
    )


def idle_work_ratio(
    variant: dict[str, Any], idle_s: float, columns: tuple[int, ...] = (4, 5)
) -> float | None:
    """The engine's work in the bursts phase's idle windows (:func:`spread_per_s`) over its
    work in the same windows of the batch-alone job; None without both timelines and the
    engine's step counts."""
    bursts, alone = variant["bursts"], variant["batch_alone"]
    if not alone.get("timeline") or bursts["timeline"][0][5] is None:
        return None
    windows = recorded_idle_windows(bursts, idle_s)
    alone_windows = shifted(windows, 0.0, alone["seconds"])
    return _ratio(
        spread_per_s(bursts["timeline"], windows, columns),
        spread_per_s(alone["timeline"], alone_windows, columns),
    )


def quiet_parts(
    windows: list[tuple[float, float]], samples: list[dict[str, Any]]
) -> list[tuple[float, float]]:
    """Each window from the end of the last request that began before it (a burst's last)."""
    out = []
    for lo, hi in windows:
        ends = [s["at"] + s["e2e_s"] for s in samples if s["at"] < lo]
        start = max([lo, *ends])
        if start < hi:
            out.append((start, hi))
    return out


def shifted(windows: list[tuple[float, float]], by: float, end: float) -> list[tuple[float, float]]:
    """``windows`` moved by ``by`` seconds, cut at ``end``."""
    moved = [(lo + by, min(hi + by, end)) for lo, hi in windows]
    return [(lo, hi) for lo, hi in moved if hi > lo]


def with_user(name, args, url, priority, on=None) -> tuple[dict[str, Any], InteractiveUser]:
    user = InteractiveUser(url, name, args, on=on)
    with user:
        job = batch_job(name, args, priority)
    return job, user


def together(name, args, url, priority, handle) -> dict[str, Any]:
    """The interactive user for the whole of a batch job."""
    with EngineRows(handle) as together_rows:
        job, user = with_user(name, args, url, priority)
    return {
        "batch": {k: v for k, v in job.items() if k != "arrivals"},
        "interactive": latency_summary(user.samples),
        # Each request's start (seconds after the batch job's) and TTFT: where the p99 comes
        # from (the job's start, its end, or throughout).
        "ttft_by_start_s": [
            [round(s["at"] - job["start"], 3), s["ttft_s"] and round(s["ttft_s"], 4)]
            for s in user.samples
        ],
        # The controller at the job's start, where a stall was seen.
        "engine_work": together_rows.engine_work(),
        "timeline_first_30_s": [
            sample for sample in together_rows.timeline(job["start"]) if sample[0] < 30
        ],
    }


def run_variant(variant: str, args: argparse.Namespace) -> dict[str, Any]:
    import relayllm

    name = f"bench-online-{variant}"
    admission: dict[str, Any] = {"target_ttft_s": args.target_ttft_s}
    if args.target_tpot_s is not None:
        admission["target_tpot_s"] = args.target_tpot_s
    if variant == "unmanaged":
        admission = {"min_batch_rows": 256, "max_batch_rows": 256}
    elif variant == "floor":
        admission = {"min_batch_rows": 1, "max_batch_rows": 1}
    engine_kwargs = {}
    if args.max_num_batched_tokens is not None:
        engine_kwargs["max_num_batched_tokens"] = args.max_num_batched_tokens
    ref = relayllm.deploy(
        relayllm.DeploymentConfig(
            name=name,
            backend="vllm",
            options={
                "model": args.model,
                "max_model_len": args.max_model_len,
                "engine_kwargs": engine_kwargs,
            },
            http={"route_prefix": f"/{name}", "port": args.port},
            admission=admission,
            startup_timeout_s=1200,
        )
    )
    info = ref.handle().info.remote().result(timeout_s=600)
    url = info["http"]["url"]
    print(f"[{variant}] admission in force: {info.get('admission')}", flush=True)
    # The unmanaged variant's rows run at the interactive priority: no ordering by class.
    priority = 0 if variant == "unmanaged" else None
    InteractiveUser(url, name, args).run_for(3)  # warm-up
    batch_job(name, argparse.Namespace(**{**vars(args), "rows": args.batch_size}), priority)
    out: dict[str, Any] = {"variant": variant}

    if "interactive-alone" in args.phases:
        alone = InteractiveUser(url, name, args)
        alone.run_for(args.interactive_requests)
        out["interactive_alone"] = latency_summary(alone.samples)
        print(f"[{variant}] interactive alone: {out['interactive_alone']}", flush=True)

    with EngineRows(ref.handle()) as alone_rows:
        job = batch_job(name, args, priority)
    alone_job = job
    out["batch_alone"] = {k: v for k, v in job.items() if k != "arrivals"}
    out["batch_alone"]["engine_work"] = alone_rows.engine_work()
    out["batch_alone"]["timeline"] = alone_rows.timeline(job["start"])
    print(f"[{variant}] batch alone: {job['rows_per_s']:.2f} rows/s", flush=True)

    if "together" in args.phases:
        out["batch_with_interactive"] = together(name, args, url, priority, ref.handle())
        print(f"[{variant}] together: {out['batch_with_interactive']['interactive']}", flush=True)

    if variant == "managed" and "bursts" in args.phases:
        began = time.perf_counter()
        period = args.burst_s + args.idle_s

        def active() -> bool:
            return (time.perf_counter() - began) % period < args.burst_s

        with EngineRows(ref.handle()) as burst_rows:
            job, user = with_user(name, args, url, priority, on=active)
        end = job["start"] + job["seconds"]
        idle = idle_windows(began, args.burst_s, args.idle_s, end)
        # The same windows, at the same offsets from its start, in the batch-alone job.
        alone_end = alone_job["start"] + alone_job["seconds"]
        alone_windows = shifted(idle, alone_job["start"] - job["start"], alone_end)
        # Each idle window from the end of the burst's last request: no request in flight.
        quiet = quiet_parts(idle, user.samples)
        alone_quiet = shifted(quiet, alone_job["start"] - job["start"], alone_end)
        out["bursts"] = {
            "batch": {k: v for k, v in job.items() if k != "arrivals"},
            "interactive": latency_summary(user.samples),
            "ttft_by_start_s": [
                [round(s["at"] - job["start"], 3), s["ttft_s"] and round(s["ttft_s"], 4)]
                for s in user.samples
            ],
            "idle_windows": len(idle),
            # Rows as they left the engine (the deployment's counter): the measure.
            "engine_batch_rows_per_s_idle": burst_rows.rows_per_s_in(idle),
            "engine_batch_rows_per_s_alone_same_windows": alone_rows.rows_per_s_in(alone_windows),
            # Tokens as the engine's steps generated them: the same windows' work as it is done
            # (every class; in an idle window, the burst's last request at most).
            "engine_tokens_per_s_idle": burst_rows.tokens_per_s_in(idle),
            "engine_tokens_per_s_alone_same_windows": alone_rows.tokens_per_s_in(alone_windows),
            # The same from each window's first moment with no interactive request in flight
            # (the burst's last request ends up to a second or so into the window).
            "quiet_seconds": sum(hi - lo for lo, hi in quiet),
            "idle_seconds": sum(hi - lo for lo, hi in idle),
            "engine_tokens_per_s_quiet": burst_rows.tokens_per_s_in(quiet),
            "engine_tokens_per_s_alone_same_quiet": alone_rows.tokens_per_s_in(alone_quiet),
            # Rows as their output blocks reached the driver: the measure before, kept to
            # compare (it moves by a whole block, 64 rows, as a block lands in or out).
            "batch_rows_per_s_idle": rows_per_s_in(job["arrivals"], idle),
            # The controller through the phase: where each burst left the job's rows.
            "timeline": burst_rows.timeline(job["start"]),
            "engine_work": burst_rows.engine_work(),
            "burst_s": args.burst_s,
            "bursts_began_s": round(began - job["start"], 3),
        }
        shown = {k: v for k, v in out["bursts"].items() if k not in ("timeline", "ttft_by_start_s")}
        print(f"[{variant}] bursts: {shown}", flush=True)
    out["admission"] = ref.handle().info.remote().result(timeout_s=120).get("admission")
    relayllm.shutdown(name)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=384, help="batch job rows")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--batch-max-tokens", type=int, default=16)
    parser.add_argument("--interactive-requests", type=int, default=20)
    parser.add_argument("--interactive-max-tokens", type=int, default=8)
    parser.add_argument("--think-s", type=float, default=0.5, help="pause between requests")
    parser.add_argument("--burst-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--target-ttft-s", type=float, default=0.5)
    parser.add_argument(
        "--target-tpot-s", type=float, default=None, help="default: the controller's"
    )
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--model", default="demo")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="the engine's token budget per step (default: the vllm backend's)",
    )
    parser.add_argument(
        "--variants",
        nargs="*",
        default=["managed", "unmanaged"],
        choices=["managed", "unmanaged", "floor"],
    )
    parser.add_argument(
        "--phases",
        nargs="*",
        default=list(PHASES),
        choices=PHASES,
        help="phases to run beside batch alone (the baseline, always run); bursts on managed",
    )
    parser.add_argument(
        "--results-name",
        default="online_batch",
        help="benchmarks/results/NAME.json (another name keeps the main results)",
    )
    parser.add_argument(
        "--summarise",
        nargs="+",
        metavar="NAME",
        help="no run: recompute the summary of benchmarks/results/NAME.json from what it "
        "recorded (its timelines), and write it back",
    )
    args = parser.parse_args()
    if args.summarise:
        for name in args.summarise:
            resummarise(name)
        return

    import os

    import ray

    load_at_start = os.getloadavg()[0]
    ray.init(include_dashboard=False, log_to_driver=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    variants = [run_variant(v, args) for v in args.variants]
    ray.shutdown()

    summary = summarise(variants, args.idle_s)
    path = write_results(
        args.results_name,
        {
            "settings": vars(args),
            "host": {
                "load_average_at_start": load_at_start,
                "load_average_at_end": os.getloadavg()[0],
            },
            "summary": summary,
            "variants": variants,
        },
    )
    for name, s in summary.items():
        print(f"{name}: {s}")
    print(f"wrote {path}")


def summarise(variants: list[dict[str, Any]], idle_s: float) -> dict[str, Any]:
    """Each variant's ratios against its own batch-alone job and interactive-alone user."""
    summary: dict[str, Any] = {}
    for v in variants:
        name = v["variant"]
        summary[name] = {
            "batch_errors": sum(
                v[phase]["batch"]["errors"]
                for phase in ("batch_with_interactive", "bursts")
                if phase in v
            )
            + v["batch_alone"]["errors"]
        }
        if "interactive_alone" in v and "batch_with_interactive" in v:
            alone, with_batch = v["interactive_alone"], v["batch_with_interactive"]
            latency = with_batch["interactive"]
            summary[name] |= {
                "ttft_p99_ratio_with_batch": _ratio(latency["ttft_p99_s"], alone["ttft_p99_s"]),
                "ttft_p50_ratio_with_batch": _ratio(latency["ttft_p50_s"], alone["ttft_p50_s"]),
            }
        if "batch_with_interactive" in v:
            summary[name]["batch_rows_per_s_ratio_with_interactive"] = _ratio(
                v["batch_with_interactive"]["batch"]["rows_per_s"], v["batch_alone"]["rows_per_s"]
            )
        if "bursts" in v:
            bursts = v["bursts"]
            summary[name]["idle_batch_rows_per_s_ratio"] = _ratio(
                bursts["engine_batch_rows_per_s_idle"],
                bursts["engine_batch_rows_per_s_alone_same_windows"],
            )
            summary[name]["idle_engine_tokens_per_s_ratio"] = _ratio(
                bursts.get("engine_tokens_per_s_idle"),
                bursts.get("engine_tokens_per_s_alone_same_windows"),
            )
            summary[name]["idle_engine_work_ratio"] = idle_work_ratio(v, idle_s)
            summary[name]["quiet_engine_tokens_per_s_ratio"] = _ratio(
                bursts.get("engine_tokens_per_s_quiet"),
                bursts.get("engine_tokens_per_s_alone_same_quiet"),
            )
            summary[name]["idle_batch_rows_per_s_ratio_driver_blocks"] = _ratio(
                bursts["batch_rows_per_s_idle"], v["batch_alone"]["rows_per_s"]
            )
    return summary


def resummarise(name: str) -> None:
    """The summary of a recorded run computed again by this version of :func:`summarise`."""
    path = RESULTS / f"{name}.json"
    run = json.loads(path.read_text())
    for variant in run["variants"]:  # the step-end count an earlier version kept
        variant.get("bursts", {}).pop("engine_work_per_s_idle", None)
        variant.get("bursts", {}).pop("engine_work_per_s_alone_same_windows", None)
    run["summary"] = summarise(run["variants"], run["settings"]["idle_s"])
    run["summarised_by"] = {
        "command": f"python benchmarks/online_batch.py --summarise {name}",
        "commit": git_commit(),
    }
    path.write_text(json.dumps(run, indent=2) + "\n")
    print(f"{name}: {run['summary']}")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


if __name__ == "__main__":
    main()
