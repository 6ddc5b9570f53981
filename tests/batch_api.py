"""A client's side of the Batch API service, shared by the tests that drive it (the echo
suite's and the vLLM suite's): the real ``openai`` client, batch lines, submit, wait, read."""

from __future__ import annotations

import json
import time
from typing import Any

CHAT = "/v1/chat/completions"


def client(url: str, key: str) -> Any:
    import openai

    return openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=60)


def chat_lines(n, model="echo", prefix="r"):
    return [
        {
            "custom_id": f"{prefix}{i}",
            "method": "POST",
            "url": CHAT,
            "body": {
                "model": model,
                "messages": [{"role": "user", "content": f"line {i} words"}],
            },
        }
        for i in range(n)
    ]


def jsonl(lines):
    return ("\n".join(json.dumps(line) for line in lines) + "\n").encode()


def submit(api, lines, **extra):
    uploaded = api.files.create(file=("input.jsonl", jsonl(lines)), purpose="batch")
    return api.batches.create(
        input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h", **extra
    )


TERMINAL = ("completed", "failed", "expired", "cancelled")


def wait(api, batch_id, until=None, timeout=60):
    """The batch once ``until(batch)`` (default: a final status), or as it is at the timeout."""
    deadline = time.monotonic() + timeout
    while True:
        batch = api.batches.retrieve(batch_id)
        if (until(batch) if until else batch.status in TERMINAL) or time.monotonic() > deadline:
            return batch
        time.sleep(0.2)


def finished_lines(n):
    """``wait``'s condition: at least ``n`` lines finished, or the batch is."""
    return lambda b: b.request_counts.completed >= n or b.status in TERMINAL


def lines_of(api, file_id):
    if file_id is None:
        return []
    return [json.loads(text) for text in api.files.content(file_id).text.splitlines() if text]


ADMIN_KEY = "admin-key-" + "z" * 24
PROJECT_KEYS = {"alpha": "alpha-key-" + "a" * 24, "beta": "beta-key-" + "b" * 24}


def serve_on_free_ports(*args, env, tries=3):
    """``relayllm serve *args`` with Serve's proxy and the gateway's own server on free ports,
    tried again on new ones when a port was taken meanwhile: a free port is free only until
    someone binds it, and the other suites running beside this one bind ports too."""
    from ray import serve
    from support import cli, free_port

    for attempt in range(1, tries + 1):
        served = cli("serve", *args, "--port", free_port(), "--direct-port", free_port(), env=env)
        taken = "is the port in use" in served.stdout + served.stderr
        if served.returncode == 0 or not taken or attempt == tries:
            break
        serve.shutdown()  # what the failed start left, before Serve takes a proxy again
    assert served.returncode == 0, (
        f"exit {served.returncode}\n{served.stdout[-3000:]}\n{served.stderr[-5000:]}"
    )
    return served


def serve_echo(ray, root, deployments, *extra):
    """``relayllm serve`` (a subprocess, as a user runs it) on the session's cluster with the
    echo backend, two projects' keys and the admin key (:data:`ADMIN_KEY`), Serve's proxy and
    the gateway's own server on free ports. Returns (base URL, the cluster's address, the
    command's stdout). Serve is shut down first: it takes an HTTP proxy only while no
    application runs."""
    import os

    from ray import serve

    import relayllm

    relayllm.shutdown()
    serve.shutdown()
    (root / "deployments.yaml").write_text(deployments)
    address = ray.get_runtime_context().gcs_address
    env = {
        **os.environ,
        "RELAYLLM_ECHO_BACKEND": "1",
        "RELAYLLM_API_KEYS": ",".join(f"{p}={k}" for p, k in PROJECT_KEYS.items()),
        "RELAYLLM_ADMIN_KEY": ADMIN_KEY,
    }
    served = serve_on_free_ports(
        root / "deployments.yaml",
        "--state-dir",
        root / "state",
        "--address",
        address,
        *extra,
        env=env,
    )
    if "--json" in map(str, extra):  # one object: what started, and where
        import json

        return json.loads(served.stdout)["base_url"], address, served.stdout
    return served.stdout.split("base URL: ")[1].split()[0], address, served.stdout
