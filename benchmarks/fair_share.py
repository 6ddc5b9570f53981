"""Weighted fair share between projects in the Batch API service (issue 47's target: two
projects of weights 2 and 1, each with a large batch waiting, complete lines 2:1, within 10%,
over any 60-second window once both run).

    python benchmarks/fair_share.py --lines 16000 --repeats 2   # the documented run
    python benchmarks/fair_share.py --lines 4000 --repeats 1 --window-s 20   # a quick look

One cluster (``ray start --head``, 2 CPUs, the echo backend; benchmarks/batch_service.py's
helpers) runs ``relayllm serve`` with one echo deployment, two project keys, a quotas file
giving ``heavy`` weight 2 and ``light`` weight 1, and a runner that runs one batch at a time
(``--max-batches 1``) in turns of weight x ``--turn-lines`` lines while the other waits
(``--turn-s``: the longest a turn may take; ``--delay-s``: echo's sleep per call, so that
the stretch both run lasts longer than a window). Each round, both projects upload a batch of
``--lines`` chat lines and create it at once; the ``openai`` client reads both batches'
completed lines every 0.5 s. Once both have completed a line and until the first ends,
every window of ``--window-s`` seconds between two samples gives a ratio (heavy's lines
gained / light's). Reported per round: the windows' ratios (min, median, max), the whole
stretch's ratio, and the samples. Writes benchmarks/results/fair_share.json.
"""

from __future__ import annotations

import argparse
import json
import secrets
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import write_results
from batch_file import DEPLOY_YAML, DEPLOYMENT, _free_port, stop_cluster
from batch_service import cluster
from overhead import host_facts

KEYS = {"heavy": secrets.token_hex(24), "light": secrets.token_hex(24)}
WEIGHTS = {"heavy": 2, "light": 1}
TARGET = 2.0
TOLERANCE = 0.10  # the issue's: within 10% of 2:1


def serve(temp: str, env: dict[str, str], args: argparse.Namespace) -> str:
    """``relayllm serve``: the echo deployment, a gateway and a one-batch-at-a-time runner."""
    config, quotas = Path(temp, "deploy.yaml"), Path(temp, "quotas.yaml")
    deploy = DEPLOY_YAML
    if args.delay_s:  # echo's engine time per call: a stretch long enough for the windows
        entry = "backend: echo, max_ongoing_requests: 256"
        deploy = deploy.replace(entry, f"{entry}, options: {{delay_s: {args.delay_s}}}")
        assert "delay_s" in deploy, deploy
    config.write_text(deploy)
    quotas.write_text("".join(f"{p}: {{weight: {w}}}\n" for p, w in WEIGHTS.items()))
    done = subprocess.run(
        [
            sys.executable, "-m", "relayllm.cli", "serve", str(config),
            "--port", str(_free_port()), "--direct-port", str(_free_port()),
            "--state-dir", str(Path(temp, "state")), "--quotas", str(quotas),
            "--batch-size", str(args.batch_size), "--max-batches", "1",
            "--turn-s", str(args.turn_s), "--turn-lines", str(args.turn_lines),
        ],
        env={**env, "RELAYLLM_API_KEYS": ",".join(f"{p}={k}" for p, k in KEYS.items())},
        check=True,
        capture_output=True,
        text=True,
    )  # fmt: skip
    return next(
        line.split(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("base URL: ")
    )


def batch_file(lines: int, prefix: str) -> bytes:
    return b"".join(
        json.dumps(
            {
                "custom_id": f"{prefix}{i}",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {
                    "model": DEPLOYMENT,
                    "messages": [{"role": "user", "content": f"line {i} of {prefix}"}],
                },
            }
        ).encode()
        + b"\n"
        for i in range(lines)
    )


def one_round(base: str, lines: int) -> list[tuple[float, int, int]]:
    """Both batches created at once; (seconds, heavy's completed, light's) every 0.5 s while
    both still have lines to answer."""
    from openai import OpenAI

    clients = {
        p: OpenAI(base_url=base, api_key=k, max_retries=2, timeout=120) for p, k in KEYS.items()
    }
    uploads = {
        p: c.files.create(file=(f"{p}.jsonl", batch_file(lines, p)), purpose="batch")
        for p, c in clients.items()
    }
    batches = {
        p: clients[p].batches.create(
            input_file_id=uploads[p].id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        for p in clients
    }
    began, samples = time.monotonic(), []
    while True:
        now = {p: clients[p].batches.retrieve(b.id) for p, b in batches.items()}
        # A batch whose every line has an answer no longer competes, though its status may
        # still be in_progress or finalizing while its output is written.
        if any(
            b.status in ("completed", "failed", "expired", "cancelled")
            or bool((n := b.request_counts) and n.total and n.completed + n.failed >= n.total)
            for b in now.values()
        ):
            break
        counts = [now[p].request_counts.completed for p in ("heavy", "light")]
        samples.append((round(time.monotonic() - began, 2), *counts))
        time.sleep(0.5)
    for p, b in now.items():  # the rest is not measured: cancel it, free the runner
        if b.status not in ("completed", "failed", "expired", "cancelled"):
            try:
                clients[p].batches.cancel(b.id)
            except Exception:  # it ended meanwhile
                pass
    return samples


def windows(samples: list[tuple[float, int, int]], window_s: float) -> dict[str, Any]:
    """Heavy's lines over light's in every window of ``window_s`` between two samples, once
    both have completed a line."""
    both = [s for s in samples if s[1] and s[2]]
    ratios = []
    for i, (t0, h0, l0) in enumerate(both):
        for t1, h1, l1 in both[i + 1 :]:
            if t1 - t0 >= window_s:
                if l1 > l0:
                    ratios.append((h1 - h0) / (l1 - l0))
                break
    stretch = None
    if len(both) >= 2 and both[-1][2] > both[0][2]:
        stretch = (both[-1][1] - both[0][1]) / (both[-1][2] - both[0][2])
    return {
        "both_running_s": round(both[-1][0] - both[0][0], 1) if both else 0.0,
        "windows": len(ratios),
        "ratio_min": round(min(ratios), 3) if ratios else None,
        "ratio_median": round(statistics.median(ratios), 3) if ratios else None,
        "ratio_max": round(max(ratios), 3) if ratios else None,
        "ratio_stretch": round(stretch, 3) if stretch else None,
        "within_target": bool(ratios)
        and all(abs(r - TARGET) <= TOLERANCE * TARGET for r in ratios),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--lines", type=int, default=16_000, help="lines per project's batch")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--turn-lines",
        type=int,
        default=250,
        help="a turn's lines per unit of weight (the service's --turn-lines)",
    )
    parser.add_argument(
        "--turn-s", type=float, default=30.0, help="the longest a turn may take (the service's)"
    )
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument(
        "--delay-s",
        type=float,
        default=0.0,
        help="echo's sleep per call (engine time); 0: as fast as echo answers",
    )
    parser.add_argument("--results-name", default="fair_share")
    args = parser.parse_args()

    host = host_facts()  # how busy the shared machine was when it started
    temp, head, env = cluster()
    rounds = []
    try:
        base = serve(temp, env, args)
        for number in range(args.repeats):
            samples = one_round(base, args.lines)
            found = windows(samples, args.window_s)
            print(f"round {number + 1}: {json.dumps(found)}", flush=True)
            rounds.append({**found, "samples": samples})
            if number + 1 < args.repeats:
                time.sleep(5)  # the cancelled batches' ends written before the next round
    finally:  # the cluster was started for this run: everything on it goes with it
        stop_cluster(head)
        shutil.rmtree(temp, ignore_errors=True)
    ratios = [r[k] for r in rounds for k in ("ratio_min", "ratio_max") if r[k] is not None]
    path = write_results(
        args.results_name,
        {
            "host": host,
            "lines": args.lines,
            "batch_size": args.batch_size,
            "turn_s": args.turn_s,
            "turn_lines": args.turn_lines,
            "delay_s": args.delay_s,
            "window_s": args.window_s,
            "weights": WEIGHTS,
            "target": f"lines completed {TARGET:.0f}:1 within {TOLERANCE:.0%} over any "
            f"{args.window_s:.0f}-second window once both run",
            "target_met": bool(rounds) and all(r["within_target"] for r in rounds),
            "ratio_min": min(ratios) if ratios else None,
            "ratio_max": max(ratios) if ratios else None,
            "rounds": rounds,
        },
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
