"""Where the batch service's gateway holds memory on a large upload and download: the memory of
the gateway's Serve replica and of Serve's HTTP proxy while the real ``openai`` client uploads a
file (``files.create(purpose="batch")``) and streams it back (``files.content``), at each size.

    python benchmarks/gateway_memory.py --mb 20,190            # the two sizes, one run each
    python benchmarks/gateway_memory.py --mb 190 --slow-mb-s 50  # a reader slower than the disk
    python benchmarks/gateway_memory.py --through proxy         # one door only

Each size goes through both doors of the gateway in one run: its own HTTP server (the base
URL ``relayllm serve`` prints, ``direct``) and Serve's HTTP proxy (``proxy``).

A local cluster of its own (``ray.init(address="local")``, 2 CPUs, no dashboard) runs only the
gateway (no deployment: files need none). Per phase, every 50 ms, from /proc/PID/status of
each process (found by title among this process's descendants): the peak VmRSS and its parts
(RssAnon: the heap; RssShmem: pages of Ray's shared object store the process touched;
RssFile), and VmHWM, reset before the phase (``clear_refs``, when allowed). Figures in MiB,
as growth over the process's size before the phase and as the peak. Prints a table and,
writes them to benchmarks/results/gateway_memory.json (section 11b of docs/benchmarks.md;
``--json`` names another file). Nothing here is a pass or fail: it locates.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import write_results
from overhead import _descendants, host_facts

FIELDS = ("VmRSS", "RssAnon", "RssShmem", "RssFile", "VmHWM")
MIB = 1 << 20


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def role_of(title: str) -> str | None:
    if title.startswith("ray::ServeReplica:") and "gateway" in title:
        return "gateway replica"
    if title.startswith("ray::ProxyActor"):
        return "proxy"
    return None


def find_roles() -> dict[str, int]:
    found: dict[str, int] = {}
    for pid in _descendants(os.getpid()):
        role = role_of(_title(pid))
        if role:
            found[role] = pid
    return found


def status_kib(pid: int) -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in FIELDS:
                    out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


class Sampler:
    """The peak of each field of each role's process while the block runs."""

    def __init__(self, roles: dict[str, int], period_s: float = 0.05) -> None:
        self.roles = roles
        self.period = period_s
        for pid in roles.values():  # VmHWM back to the current RSS (root, or our own)
            try:
                with open(f"/proc/{pid}/clear_refs", "w") as f:
                    f.write("5")
            except OSError:
                pass
        self.before = {role: status_kib(pid) for role, pid in roles.items()}
        self.peak = {role: dict(s) for role, s in self.before.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._sample()

    def _sample(self) -> None:
        for role, pid in self.roles.items():
            for key, value in status_kib(pid).items():
                self.peak[role][key] = max(self.peak[role].get(key, 0), value)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def figures(self) -> dict[str, dict[str, float]]:
        out = {}
        for role in self.roles:
            before, peak = self.before[role], self.peak[role]
            row = {f"peak {k}": round(peak.get(k, 0) / 1024, 1) for k in FIELDS}
            row.update(
                {f"+{k}": round((peak.get(k, 0) - before.get(k, 0)) / 1024, 1) for k in FIELDS}
            )
            out[role] = row
        return out


def write_input(path: Path, megabytes: int) -> int:
    """Batch API chat lines (about 190 bytes each, as benchmarks/batch_file.py writes them)
    up to ``megabytes`` MB."""
    target, i = megabytes * 1_000_000, 0
    with path.open("w") as f:
        while f.tell() < target:
            messages = [{"role": "user", "content": f"What is {i} plus one?"}]
            body = {"model": "bench-echo", "messages": messages, "max_tokens": 16}
            line = {"custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions"}
            f.write(json.dumps({**line, "body": body}) + "\n")
            i += 1
    return path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--mb", type=lambda s: [int(x) for x in s.split(",")], default=[20, 190])
    parser.add_argument("--slow-mb-s", type=float, default=0.0, help="the download's reader pace")
    parser.add_argument("--json", help="write the figures here instead of benchmarks/results")
    parser.add_argument(
        "--through",
        choices=["both", "direct", "proxy"],
        default="both",
        help="the gateway's own server, Serve's proxy, or each in turn",
    )
    args = parser.parse_args()

    os.environ["RELAYLLM_ECHO_BACKEND"] = "1"
    import ray
    from openai import OpenAI

    from relayllm_service.deploy import deploy_gateway
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.keys import KeyMap

    host = host_facts()  # the load average before anything starts
    key = secrets.token_hex(24)
    temp = tempfile.mkdtemp(prefix="gwmem-")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    results: list[dict[str, Any]] = []
    try:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ref = deploy_gateway(
            ServiceSettings(state_dir=os.path.join(temp, "state"), port=port, direct_port=0),
            KeyMap([("bench", key)]),
        )
        doors = {"direct": ref.url, "proxy": ref.proxy_url}
        if args.through != "both":
            doors = {args.through: doors[args.through]}
        roles = find_roles()
        code = ray.get(ray.remote(lambda: __import__("relayllm").__file__).remote())
        print(f"gateway at {doors}; processes: {roles}; workers' relayllm: {code}", flush=True)
        for (door, url), mb in ((door, mb) for door in doors.items() for mb in args.mb):
            client = OpenAI(base_url=url, api_key=key, timeout=600, max_retries=0)
            source = Path(temp, f"in-{mb}.jsonl")
            size = write_input(source, mb)
            began = time.perf_counter()
            with Sampler(roles) as up, source.open("rb") as f:
                uploaded = client.files.create(file=f, purpose="batch")
            up_s = time.perf_counter() - began
            out = Path(temp, "out.jsonl")
            began = time.perf_counter()
            with Sampler(roles) as down:
                content = client.files.with_streaming_response.content(uploaded.id)
                with content as response, out.open("wb") as f:
                    for piece in response.iter_bytes(1 << 20):
                        f.write(piece)
                        if args.slow_mb_s:
                            time.sleep(len(piece) / MIB / args.slow_mb_s)
            down_s = time.perf_counter() - began
            if out.stat().st_size != size or out.read_bytes() != source.read_bytes():
                raise SystemExit("the download differs from the upload")
            client.files.delete(uploaded.id)
            for phase, sampler, seconds in (("upload", up, up_s), ("download", down, down_s)):
                for role, row in sampler.figures().items():
                    results.append(
                        {
                            "mb": size / 1e6,
                            "door": door,
                            "phase": phase,
                            "role": role,
                            "s": seconds,
                            **row,
                        }
                    )
            source.unlink()
            out.unlink()
        header = ("MB", "door", "phase", "role", "s")
        header += ("+VmRSS", "+RssAnon", "+RssShmem", "peak VmHWM")
        print(" ".join(f"{h:>16}" for h in header))
        for r in results:
            cells = (
                f"{r['mb']:.0f}",
                r["door"],
                r["phase"],
                r["role"],
                f"{r['s']:.1f}",
                *(str(r[k]) for k in ("+VmRSS", "+RssAnon", "+RssShmem", "peak VmHWM")),
            )
            print(" ".join(f"{c:>16}" for c in cells))
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1) + "\n")
        else:
            payload = {"host": host, "sizes_mb": args.mb, "slow_mb_s": args.slow_mb_s}
            payload["rows"] = results
            print(f"wrote {write_results('gateway_memory', payload)}")
    finally:
        from ray import serve

        serve.shutdown()
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
