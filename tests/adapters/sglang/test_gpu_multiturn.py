"""End to end on a real SGLang engine: a multi-turn pipeline of sequential processors sharing
one deployment, a too-long row failing alone, and JSON-schema output. Needs a CUDA GPU: run
``tox -e sglang-gpu``; elsewhere these tests skip with that instruction. One engine per module.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from sglang_support import engine_skip_reason, engine_test_model

import relayllm

pytestmark = pytest.mark.gpu

NAME = "e2e-sglang"
CONTEXT = 1024
QUESTIONS = [
    "What is the capital of France? Answer in one word.",
    "What is the capital of Japan? Answer in one word.",
    "What is the capital of Italy? Answer in one word.",
    "What is the capital of Spain? Answer in one word.",
    "What is the capital of Egypt? Answer in one word.",
    "What is the capital of Canada? Answer in one word.",
]
FOLLOW_UPS = ["In which country is that city?", "Name one famous landmark there, briefly."]


@pytest.fixture(scope="module")
def engine():
    reason = engine_skip_reason()
    if reason:
        pytest.skip(reason)
    import ray
    from support import ray_cluster

    options = {
        "model_path": engine_test_model(),
        "mem_fraction_static": 0.5,
        "context_length": CONTEXT,
    }
    with ray_cluster(num_cpus=None):  # every CPU and GPU the machine has
        ray.data.DataContext.get_current().execution_options.preserve_order = True
        ref = relayllm.deploy(
            relayllm.DeploymentConfig(
                name=NAME, backend="sglang", options=options, startup_timeout_s=1800
            )
        )
        yield ref
        relayllm.shutdown(NAME)


def processor(**sampling: Any) -> relayllm.Processor:
    return relayllm.build_processor(
        relayllm.ProcessorConfig(
            deployment=NAME,
            task="chat",
            batch_size=4,
            sampling_params={"max_tokens": 32, "temperature": 0.0, **sampling},
        )
    )


def next_turn(follow_up: str):
    def add_turn(row: dict[str, Any]) -> dict[str, Any]:
        history = list(row["messages"]) + [{"role": "assistant", "content": row["generated_text"]}]
        return {
            "id": row["id"],
            "messages": history + [{"role": "user", "content": follow_up}],
            "turns": list(row["turns"])
            + [
                {
                    "answer": row["generated_text"],
                    "num_input_tokens": row["num_input_tokens"],
                    "error": row["error"],
                }
            ],
        }

    return add_turn


def test_multi_turn_conversation_on_one_shared_engine(engine):
    import ray

    handle = engine.handle()
    before = handle.info.remote().result(timeout_s=120)
    rows = [
        {"id": i, "messages": [{"role": "user", "content": q}], "turns": []}
        for i, q in enumerate(QUESTIONS)
    ]
    ds = processor()(ray.data.from_items(rows))
    for follow_up in FOLLOW_UPS:
        ds = processor()(ds.map(next_turn(follow_up)))
    out = ds.map(next_turn("(end)")).take_all()
    after = handle.info.remote().result(timeout_s=120)

    assert [r["id"] for r in out] == list(range(len(QUESTIONS)))
    for row in out:
        turns = row["turns"]
        assert len(turns) == 3 and all(t["error"] is None for t in turns), turns
        assert all(t["answer"].strip() for t in turns), turns
        # Each turn carries the whole conversation so far: the prompt only grows.
        tokens = [t["num_input_tokens"] for t in turns]
        assert tokens[0] < tokens[1] < tokens[2], tokens
    assert "paris" in out[0]["turns"][0]["answer"].lower(), out[0]["turns"][0]
    assert after["replica_id"] == before["replica_id"], "a second engine started"
    assert after["rows"] - before["rows"] == 3 * len(QUESTIONS)
    assert after["engine"] == "sglang" and after["model"] == engine_test_model()


def test_a_too_long_prompt_fails_only_its_row(engine):
    import ray

    rows = [
        {"id": i, "messages": [{"role": "user", "content": q}]} for i, q in enumerate(QUESTIONS[:4])
    ]
    rows[2]["messages"] = [{"role": "user", "content": "apple " * (2 * CONTEXT)}]
    out = processor()(ray.data.from_items(rows, override_num_blocks=1)).take_all()
    errors = {r["id"]: r["error"] for r in out if r["error"]}
    assert list(errors) == [2], errors
    assert "context length" in errors[2]
    assert all(r["generated_text"] for r in out if r["id"] != 2)


def test_json_schema_response_format(engine):
    import ray

    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string"}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    rows = [
        {"id": 0, "messages": [{"role": "user", "content": "Give the capital of France as JSON."}]}
    ]
    out = processor(
        max_tokens=48,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "capital", "schema": schema},
        },
    )(ray.data.from_items(rows)).take_all()
    assert out[0]["error"] is None, out[0]["error"]
    assert isinstance(json.loads(out[0]["generated_text"])["capital"], str)
