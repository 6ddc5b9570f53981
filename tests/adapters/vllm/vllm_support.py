"""What the vLLM test modules share: the engines, and the rule of one engine at a time.

Engine starts are what cost time here (half a minute to a minute and a half each on 2 cores),
and two engines at once do not fit the machine. So:

- the examples' ``smollm`` deployment (examples/questions.yaml, started with ``relayllm
  deploy``) is the one demo-model engine of the examples, end-to-end, kit, CLI and user-path
  tests (the ``demo_deployment`` fixture);
- one demo-model deployment with an HTTP front and LoRA on (``HTTP_CONFIG``) serves every test
  that talks to an HTTP front (the ``http_deployment`` fixture) and the runtime-LoRA tests;
- every fixture that needs an engine starts it through :func:`exclusive`, which first stops
  any other relayllm deployment: a test run in any order or alone still has one engine at a
  time; conftest's ordering makes each engine start once.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

import support
from support import REPO, free_port

EXAMPLES = REPO / "examples"


def _example_deployment(name: str) -> dict[str, Any]:
    import yaml

    data = yaml.safe_load((EXAMPLES / name).read_text())
    (deployment,) = data["deployments"]
    return deployment


#: The examples' deployment, read from the file users run (so the tests cannot drift from it):
#: ``relayllm demo``, ``relayllm run examples/questions.yaml`` and the others reuse it by name.
DEMO_FIELDS: dict[str, Any] = _example_deployment("questions.yaml")
DEPLOYMENT_NAME: str = DEMO_FIELDS["name"]
OPTIONS: dict[str, Any] = DEMO_FIELDS["options"]
#: The demo model's context (its config's max_position_embeddings): a longer prompt is refused.
CONTEXT_LENGTH = 8192

#: Serve's HTTP proxy for the run (conftest starts Serve with it).
HTTP_PORT = free_port()
#: The API key the HTTP deployment requires (an environment variable, as a user's would be);
#: conftest sets it before Ray starts, so the replicas inherit it.
KEY_ENV = "RELAYLLM_TEST_HTTP_KEY"
HTTP_NAME = "vllm-http"
#: max_num_seqs 1: one sequence at a time, so the priority tests see the engine's order and
#: the two front doors compute the same bodies the same way. LoRA on (adapters loaded at runtime
#: only): the control tests' adapters load into this engine, not one of their own.
HTTP_CONFIG: dict[str, Any] = {
    "name": HTTP_NAME,
    "backend": "vllm",
    "options": {"model": "demo", "max_model_len": 512, "max_num_seqs": 1, "lora": {}},
    "startup_timeout_s": 1200,
    # Serve's health check replaces a replica whose engine died; a minute between checks
    # leaves the front of a replica with a dead engine answering long enough to be tested.
    "health_check_period_s": 60,
    "http": {"route_prefix": f"/{HTTP_NAME}", "port": HTTP_PORT, "api_key_env": KEY_ENV},
}


def http_key() -> str:
    return os.environ[KEY_ENV]


def demo_config():
    import relayllm

    return relayllm.DeploymentConfig(**DEMO_FIELDS)


def http_config():
    import relayllm

    return relayllm.DeploymentConfig(**HTTP_CONFIG)


def stop_others(keep: str | None = None) -> None:
    """Stop every relayllm deployment but ``keep``: the machine runs one engine at a time."""
    import relayllm

    for ref in relayllm.list_deployments():
        if ref.name != keep:
            stop(ref.name)


def stop(name: str) -> None:
    """Shut ``name`` down if it runs (a fixture's teardown after another test stopped it)."""
    import relayllm

    try:
        relayllm.shutdown(name)
    except relayllm.DeploymentNotFoundError:
        pass


def exclusive(config):
    """``relayllm.deploy(config)`` with nothing else running: reuses it when it runs."""
    import relayllm

    stop_others(keep=config.name)
    return relayllm.deploy(config)


def only_replica_info(controller) -> dict[str, Any]:
    """``info()`` of the one replica of a controlled deployment (the tests run one)."""
    (info,) = controller.replicas().values()
    return info


def is_quiet(info: dict[str, Any]) -> bool:
    """Whether a replica has no call in progress and no row left to compute (a cancelled
    caller's rows are computed on, and counted, after it left)."""
    return info["ongoing"] == 0 and info["computing_rows"] == 0


def prefix_hits(controller) -> tuple[int, float]:
    """(prefix-cache queries, hits) of the one replica, in tokens (the engine's step stats)."""
    metrics = only_replica_info(controller)["metrics"]
    queries = metrics["prefix_cache_queries"]
    return queries, (metrics["prefix_cache_hit_rate"] or 0.0) * queries


def hits_of_one_prompt(controller, name: str, prompt: str, task: str = "completion") -> float:
    """Send ``prompt`` once (one token back; ``task`` "chat": as one user message) and return
    the prefix-cache hits it got (tokens). The CPU build caches whole blocks of 128 tokens: a
    prompt of a few hundred tokens that no other test sends."""
    import ray
    from support import wait_for

    from relayllm import ProcessorConfig, build_processor

    proc = build_processor(
        ProcessorConfig(deployment=name, task=task, sampling_params={"max_tokens": 1}, batch_size=1)
    )
    item = {"messages": [{"role": "user", "content": prompt}]} if task == "chat" else None
    queries, hits = prefix_hits(controller)
    (row,) = proc(ray.data.from_items([item or {"prompt": prompt}])).take_all()
    assert not row["error"], row["error"]
    wait_for(
        lambda: prefix_hits(controller)[0] > queries,
        "the engine's step stats arrived",
        timeout_s=300,
    )
    return prefix_hits(controller)[1] - hits


def cli_env(address: str, *, with_address: bool = True) -> dict[str, str]:
    """The environment of a ``relayllm`` command joining the tests' cluster: through
    RAY_ADDRESS, or (``with_address=False``) with no RAY_ADDRESS, for ``--address``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    if with_address:
        env["RAY_ADDRESS"] = address
    return env


def cli(*args, env, cwd=None, check=0, timeout=1500) -> subprocess.CompletedProcess:
    """A ``relayllm`` command in its own process, as a user runs it; asserts its exit code
    (an engine start inside it may take most of its timeout)."""
    return support.cli(*args, env=env, cwd=cwd, check=check, timeout=timeout)
