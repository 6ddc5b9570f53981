"""The embedding task: a ``task="embed"`` deployment of the demo model on the real engine.

Its own engine (vLLM serves one task per engine), started with nothing else running.
"""

from __future__ import annotations

import math

import pytest
from vllm_support import stop, stop_others

import relayllm

NAME = "vllm-embed"


@pytest.fixture(scope="module")
def deployment():
    stop_others()  # one engine at a time
    ref = relayllm.deploy(
        relayllm.DeploymentConfig(
            name=NAME,
            backend="vllm",
            options={"task": "embed", "max_model_len": 128},
            startup_timeout_s=1200,
        )
    )
    yield ref
    stop(NAME)


def run(task: str, rows: list[dict]) -> list[dict]:
    import ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(deployment=NAME, task=task, batch_size=8)
    return relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()


def test_embeddings_per_row(deployment):
    texts = [
        "The cat sat on the mat.",
        "The cat sat on the mat.",
        "Stock markets fell sharply.",
        "word " * 200,
    ]
    out = run("embedding", [{"id": i, "input": t} for i, t in enumerate(texts)])

    assert [r["id"] for r in out] == [0, 1, 2, 3]
    assert out[3]["error"] and "maximum context length" in out[3]["error"]
    vectors = [r["embedding"] for r in out[:3]]
    assert all(r["error"] is None and r["num_input_tokens"] > 0 for r in out[:3])
    assert len({len(v) for v in vectors}) == 1 and len(vectors[0]) > 0
    assert all(math.isfinite(x) for v in vectors for x in v)
    assert vectors[0] == pytest.approx(vectors[1], abs=1e-4)  # same text, same vector
    assert vectors[0] != pytest.approx(vectors[2], abs=1e-3)


def test_chat_on_an_embedding_deployment_is_refused_before_any_row_is_sent(deployment):
    # Backend.tasks_for: a deployment started with task=embed serves no chat, and the stage
    # says so when it starts, naming the deployment, the backend and what it does serve.
    with pytest.raises(
        Exception,
        match=r"deployment 'vllm-embed' \(backend 'vllm'\) does not "
        r"serve task 'chat' with its options; it serves embedding",
    ):
        run("chat", [{"id": 0, "messages": [{"role": "user", "content": "hi"}]}])
