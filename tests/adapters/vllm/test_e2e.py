"""End to end on the real vLLM engine: the multi-turn case, bad input, structured output.

The tests share the examples' deployment (see ``vllm_support``); the HTTP front's test runs on
the suite's HTTP deployment.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from support import wait_for
from vllm_support import (
    CONTEXT_LENGTH,
    DEPLOYMENT_NAME,
    HTTP_NAME,
    http_key,
    is_quiet,
    only_replica_info,
)

import relayllm

QUESTIONS = [
    "What is the capital of France?",
    "How many days are there in a week?",
    "What color is the sky on a clear day?",
    "What is the largest planet in our solar system?",
    "Who wrote Romeo and Juliet?",
    "What do bees make?",
    "What is the boiling point of water in Celsius?",
    "How many legs does a spider have?",
]


@pytest.fixture
def deployment(demo_deployment):
    return demo_deployment


def processor(**fields: Any) -> relayllm.Processor:
    fields.setdefault("batch_size", 16)
    return relayllm.build_processor(relayllm.ProcessorConfig(deployment=DEPLOYMENT_NAME, **fields))


def run(proc: relayllm.Processor, rows: list[dict[str, Any]], blocks: int | None = None):
    import ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    return proc(ray.data.from_items(rows, override_num_blocks=blocks)).take_all()


def replica_states() -> dict[str, int]:
    from ray import serve

    app = serve.status().applications[f"relayllm-{DEPLOYMENT_NAME}"]
    return {
        str(k).rsplit(".", 1)[-1]: v
        for k, v in app.deployments[DEPLOYMENT_NAME].replica_states.items()
    }


def test_multi_turn_on_one_engine(deployment):
    """Answer, then "make it shorter": two sequential processors, 24 rows, one engine."""
    import ray

    handle = deployment.handle()
    # The rows of an earlier module's calls would count as this test's.
    wait_for(
        lambda: is_quiet(only_replica_info(relayllm.control(DEPLOYMENT_NAME))),
        "a quiet engine",
        timeout_s=300,
    )
    before = handle.info.remote().result(timeout_s=120)
    n = 24
    rows = [{"id": i, "question": QUESTIONS[i % len(QUESTIONS)]} for i in range(n)]

    def ask(row: dict[str, Any]) -> dict[str, Any]:
        return {**row, "messages": [{"role": "user", "content": row["question"]}]}

    def shorten(row: dict[str, Any]) -> dict[str, Any]:
        prompt = f"Make this answer shorter, ten words at most: {row['generated_text']}"
        return {
            "id": row["id"],
            "question": row["question"],
            "answer": row["generated_text"],
            "answer_error": row["error"],
            "messages": [{"role": "user", "content": prompt}],
        }

    answer = processor(sampling_params={"temperature": 0.0, "max_tokens": 48})
    shorter = processor(sampling_params={"temperature": 0.0, "max_tokens": 24})
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    dataset = ray.data.from_items(rows).map(ask)
    out = shorter(answer(dataset).map(shorten)).take_all()
    after = handle.info.remote().result(timeout_s=120)

    assert [r["id"] for r in out] == list(range(n))
    assert all(r["answer_error"] is None and r["error"] is None for r in out), [
        (r["answer_error"], r["error"]) for r in out if r["answer_error"] or r["error"]
    ]
    france = [r for r in out if r["question"] == QUESTIONS[0]]
    assert france and all("Paris" in r["answer"] for r in france), [r["answer"] for r in france]
    assert all(r["generated_text"] and r["num_generated_tokens"] > 0 for r in out)
    # One replica, one engine, one model load, for both processors' requests.
    assert replica_states() == {"RUNNING": 1}
    assert after["replica_id"] == before["replica_id"] and after["pid"] == before["pid"]
    assert after["engine_starts"] == 1
    assert after["engine_started_at"] == before["engine_started_at"]
    assert after["rows"] - before["rows"] == 2 * n


def test_bad_input_becomes_row_errors(deployment):
    """Each bad row gets its own error, from the engine or from the row check; others complete."""
    # Every row has every column: a column only some rows have could be dropped on the way in.
    ok = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "sampling_params": {"max_tokens": 8},
        "model": None,
    }
    rows = [{"id": i, **ok} for i in range(12)]
    bad = {
        2: (
            {"messages": [{"role": "user", "content": "word " * (CONTEXT_LENGTH + 100)}]},
            "maximum context length",
        ),
        4: ({"sampling_params": {"max_tokens": 8, "presence_penalty": 5.0}}, "presence_penalty"),
        6: ({"sampling_params": {"max_tokens": 8, "temperature": -1.0}}, "temperature"),
        8: (
            {"messages": [{"role": "user", "content": [{"type": "bogus", "text": "hi"}]}]},
            "bogus",
        ),
        10: ({"messages": [{"content": "no role"}]}, "role"),
        11: ({"model": "no-such-adapter"}, "no-such-adapter"),
    }
    for i, (change, _) in bad.items():
        rows[i] = {**rows[i], **change}
    # One block: Ray Data cannot concatenate blocks whose column types differ.
    out = run(processor(), rows, blocks=1)

    assert [r["id"] for r in out] == list(range(12))
    errors = {r["id"]: r["error"] for r in out if r["error"]}
    assert sorted(errors) == sorted(bad), errors
    for i, (_, fragment) in bad.items():
        assert fragment in errors[i], (i, errors[i])
        assert out[i]["generated_text"] is None
    assert all(r["generated_text"] for r in out if r["id"] not in bad)


PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0},
        "city": {"type": "string"},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}


def test_structured_output_follows_the_schema(deployment):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "person", "schema": PERSON_SCHEMA},
    }
    people = [("Ann", 31, "Oslo"), ("Bob", 45, "Lima"), ("Chen", 28, "Pune"), ("Dana", 52, "Kyiv")]
    rows = [
        {
            "id": i,
            "messages": [
                {"role": "user", "content": f"{n} is {a} and lives in {c}. Reply with JSON."}
            ],
        }
        for i, (n, a, c) in enumerate(people)
    ]
    proc = processor(
        sampling_params={"temperature": 0.0, "max_tokens": 80, "response_format": response_format}
    )
    out = run(proc, rows)

    assert all(r["error"] is None for r in out), [r["error"] for r in out]
    for row in out:
        value = json.loads(row["generated_text"])  # parses...
        validate(value, PERSON_SCHEMA)  # ...and matches the schema


def validate(value: Any, schema: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError:  # a plain check of this flat schema
        assert isinstance(value, dict) and set(value) == set(schema["required"]), value
        for key, spec in schema["properties"].items():
            assert isinstance(value[key], {"string": str, "integer": int}[spec["type"]]), (
                key,
                value,
            )
        return
    jsonschema.validate(value, schema)


def test_completion_and_info(deployment):
    out = run(
        processor(task="completion", sampling_params={"temperature": 0.0, "max_tokens": 6}),
        [{"id": 0, "prompt": "The capital of France is"}],
    )
    assert out[0]["error"] is None and "Paris" in out[0]["generated_text"], out
    assert out[0]["finish_reason"] in ("stop", "length")
    info = deployment.handle().info.remote().result(timeout_s=120)
    assert info["backend"] == "vllm" and info["model"] == "demo" and info["device"] == "cpu"
    assert info["engine_version"] and info["engine_version"][0].isdigit(), info
    assert info["max_model_len"] == CONTEXT_LENGTH
    # The engine start, phase by phase (#20): what `relayllm` shows as "engine ready in N s".
    phases = info["engine_start_phases"]
    assert set(phases) == {"imports_s", "engine_config_s", "engine_core_s"}, phases
    assert all(v >= 0 for v in phases.values()) and phases["engine_core_s"] > 0
    assert info["engine_ready_s"] >= sum(phases.values()) - 0.5
    # What vLLM resolved (the benchmark against vLLM's own runner passes it the same values).
    resolved = info["engine_resolved"]
    assert resolved["dtype"] in ("float32", "bfloat16", "float16"), resolved
    assert resolved["max_num_seqs"] > 0 and resolved["max_num_batched_tokens"] > 0, resolved
    # The KV cache sized to the model and the job, not a fraction of the machine, and vLLM
    # really allocated that much.
    from relayllm_vllm.memory import model_shape

    # In the dtype the engine runs (float32 on a CPU without native bfloat16).
    per_token = model_shape(info["model_path"], info["engine_args"]["dtype"]).bytes_per_token()
    tokens = info["kv_cache_blocks"] * info["kv_cache_block_size"]
    assert info["kv_cache_memory_bytes"] < 2**30
    assert tokens * per_token <= info["kv_cache_memory_bytes"]
    assert tokens >= 0.9 * info["kv_cache_memory_bytes"] / per_token
    assert tokens >= CONTEXT_LENGTH, "at least one full-length sequence fits"


def test_http_front_streams_real_tokens_from_the_batch_engine(http_deployment):
    """The OpenAI client on a deployment's HTTP front: the same engine (one model load) that
    answers processors, real token deltas in the stream, priority scheduling on."""
    import openai

    deployment = http_deployment
    before = deployment.handle().info.remote().result(timeout_s=120)
    client = openai.OpenAI(base_url=before["http"]["url"], api_key=http_key(), max_retries=0)
    ask = {
        "model": HTTP_NAME,
        "messages": [{"role": "user", "content": QUESTIONS[0]}],
        "temperature": 0.0,
        "max_tokens": 12,
    }
    reply = client.chat.completions.create(**ask)
    assert "Paris" in reply.choices[0].message.content, reply
    chunks = list(
        client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    )
    deltas = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    assert len(deltas) > 1, "a real stream: the text arrives in several parts"
    assert "".join(deltas) == reply.choices[0].message.content  # greedy: the same answer
    assert chunks[-1].usage.completion_tokens == reply.usage.completion_tokens
    after = deployment.handle().info.remote().result(timeout_s=120)
    assert after["replica_id"] == before["replica_id"] and after["engine_starts"] == 1
    assert after["rows_by_class"]["interactive"] == before["rows_by_class"]["interactive"] + 2
    assert after["engine_args"]["scheduling_policy"] == "priority"


def test_engine_metrics_in_info_and_on_rays_metrics_endpoint(deployment):
    """vLLM's step stats (engine_metrics, on by default) reach the replica's summary and, through
    vLLM's own Ray stat logger, Ray's Prometheus endpoint, next to the core's class counters."""
    from relayllm.testing.prometheus import samples, wait_for_sample

    out = run(
        processor(sampling_params={"temperature": 0.0, "max_tokens": 16}),
        [{"messages": [{"role": "user", "content": q}]} for q in QUESTIONS],
    )
    assert all(r["error"] is None for r in out)
    info = deployment.handle().info.remote().result(timeout_s=120)
    metrics = info["metrics"]
    assert info["engine_metrics"] is True and "ray_vllm_*" in metrics["exported_as"]
    assert metrics["ttft_s"]["p50"] > 0 and metrics["ttft_s"]["count"] >= len(QUESTIONS)
    assert metrics["tpot_s"]["p50"] > 0 and metrics["latency_s"]["p50"] > 0
    assert 0 < metrics["kv_cache_peak"] <= 1 and metrics["kv_cache_use"] is not None
    assert metrics["queue"] is not None and metrics["prefix_cache_queries"] > 0
    batch = metrics["tokens_by_class"]["batch"]
    assert metrics["rows_by_class"]["batch"] == info["rows"] and batch["generated"] > 0
    # Counted per engine step, every class: at least what the finished requests generated.
    steps = metrics["engine_step_tokens"]
    interactive = metrics["tokens_by_class"]["interactive"]
    assert steps["generated"] >= batch["generated"] + interactive["generated"]
    assert steps["prefilled"] > 0 and metrics["engine_preemptions"] is not None
    # vLLM's names (sanitized by its Ray wrappers), and the core's counters.
    wait_for_sample("ray_vllm_time_to_first_token_seconds_count", lambda v: v >= len(QUESTIONS))
    wait_for_sample("ray_vllm_prefix_cache_queries_total", lambda v: v > 0)
    assert samples("ray_vllm_kv_cache_usage_perc")
    rows = info["rows"]
    wait_for_sample(
        "ray_relayllm_rows_total",
        lambda v: v >= rows,
        deployment=DEPLOYMENT_NAME,
        traffic_class="batch",
    )


def test_engine_kwargs_typo_fails_before_any_engine_starts():
    from ray import serve

    config = relayllm.DeploymentConfig(
        name="typo", backend="vllm", options={"engine_kwargs": {"max_num_seq": 4}}
    )
    with pytest.raises(relayllm.ConfigError, match="max_num_seq.*did you mean 'max_num_seqs'"):
        relayllm.deploy(config)
    assert "relayllm-typo" not in serve.status().applications
