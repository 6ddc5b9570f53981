"""The ``relayllm`` command on the real vLLM engine with the bundled demo model.

One engine for most of the module, the suite's shared one: ``relayllm deploy
examples/questions.yaml`` starts the examples' ``smollm`` deployment on this session's Ray
cluster (conftest's ``demo_deployed``), then ``run`` (questions, sentiment, prompts), ``batch``
and ``demo`` -- each a separate driver process -- find it by name and reuse it. The multi-turn
and capitals examples declare deployments of their own; they run after the shared engine's
users, with nothing else running (one engine at a time).
"""

from __future__ import annotations

import json
import subprocess

import pytest
from support import RELAYLLM
from vllm_support import EXAMPLES, cli, cli_env

NAME = "smollm"  # the deployment every single-engine example declares


def summary_rows(stderr_or_stdout: str) -> dict[str, list[str]]:
    table = {}
    for line in stderr_or_stdout.splitlines():
        parts = line.split()
        if len(parts) == 9 and parts[1] == NAME:
            table[parts[0]] = parts
    return table


def replica(env) -> dict:
    status = json.loads(cli("status", "--json", env=env).stdout)
    return next(d for d in status if d["name"] == NAME)


@pytest.fixture
def engine(env, demo_deployed, demo_deployment):
    deployed = demo_deployed.stdout
    assert f"{NAME}: RUNNING (backend vllm)" in deployed
    # The engine's start, from the replica's info() (#20): "'smollm': engine ready in N s (...)"
    assert f"{NAME!r}: engine ready in " in deployed, deployed
    assert "engine core" in deployed, deployed
    first = replica(env)
    assert first["backend"] == "vllm"
    return first


def test_run_questions_on_one_engine(address, engine, tmp_path):
    """With ``--address`` (no RAY_ADDRESS): the command joins the cluster it names."""
    env = cli_env(address, with_address=False)
    done = cli(
        "run",
        EXAMPLES / "questions.yaml",
        "--output",
        tmp_path / "answers.jsonl",
        "--address",
        address,
        env=env,
    )
    rows = [json.loads(line) for line in (tmp_path / "answers.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 2, 3, 4]
    assert all(r["error"] is None and r["answer"] and r["short_answer"] for r in rows), rows
    assert "Paris" in rows[0]["answer"], rows[0]
    table = summary_rows(done.stderr)
    for step in ("answer", "shorter"):
        name, _, n, errors, tokens_in, tokens_out, *_ = table[step]
        assert (n, errors) == ("4", "0") and int(tokens_in) > 0 and int(tokens_out) > 0
    after = replica(cli_env(address))
    # The same replica: 4 answers + 4 shorter ones.
    assert after["replica"] == engine["replica"] and after["rows"] == engine["rows"] + 8


def test_sentiment_with_a_json_schema_on_the_same_engine(env, engine, tmp_path):
    out = tmp_path / "sentiment.csv"
    done = cli("run", EXAMPLES / "sentiment.yaml", "--output", out, env=env)
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [r["post_id"] for r in rows] == [f"p{i}" for i in range(1, 9)]
    assert set(rows[0]) == {"post_id", "text", "label", "error"}
    labelled = [r for r in rows if not r["error"]]
    # Structured output: every answer parsed and its label is one the schema allows.
    assert len(labelled) == 8, [r["error"] for r in rows if r["error"]]
    assert {r["label"] for r in labelled} <= {"positive", "negative", "neutral"}
    assert summary_rows(done.stderr)["classify"][2:4] == ["8", "0"]
    assert replica(env)["replica"] == engine["replica"]


def test_batch_file_on_the_running_engine(env, engine, tmp_path):
    lines = [
        {
            "custom_id": "france",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": NAME,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "temperature": 0,
                "max_tokens": 24,
            },
        },
        {
            "custom_id": "count",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"prompt": "One, two, three,", "max_tokens": 8, "temperature": 0},
        },
        {
            "custom_id": "bad",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "word " * 9000}], "max_tokens": 8},
        },
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    done = cli(
        "batch",
        tmp_path / "in.jsonl",
        "--deployment",
        NAME,
        "--output",
        tmp_path / "out.jsonl",
        env=env,
    )
    assert json.loads(done.stdout.splitlines()[-1])["request_counts"] == {
        "total": 3,
        "completed": 2,
        "failed": 1,
    }
    out = {
        r["custom_id"]: r
        for r in map(json.loads, (tmp_path / "out.jsonl").read_text().splitlines())
    }
    france = out["france"]["response"]["body"]
    assert "Paris" in france["choices"][0]["message"]["content"]
    # The deployment's name, the one a client routes by and the gateway answers online with
    assert france["usage"]["completion_tokens"] > 0 and france["model"] == NAME
    assert out["count"]["response"]["body"]["choices"][0]["text"]
    (error,) = map(json.loads, (tmp_path / "out.errors.jsonl").read_text().splitlines())
    assert error["custom_id"] == "bad" and error["error"]["code"] == "engine_error"
    assert (
        "maximum context length" in error["error"]["message"]
        or "too long" in error["error"]["message"]
    )


def test_demo_prints_answers_and_the_summary(env, engine, tmp_path):
    before = replica(env)
    done = cli("demo", "--output", tmp_path / "demo.jsonl", env=env)
    out = done.stdout
    # --output: the rows in the file too, each with both steps' answers.
    rows = [json.loads(line) for line in (tmp_path / "demo.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and all(r["error"] is None for r in rows), rows
    assert "Paris" in rows[0]["answer"] and all(r["short_answer"] for r in rows), rows
    assert "Q: What is the capital of France?" in out and "Paris" in out
    assert out.count("\nQ: ") == 4 and out.count("\nShorter: ") == 4
    table = summary_rows(out)
    assert table["answer"][2:4] == ["4", "0"] and table["shorter"][2:4] == ["4", "0"]
    after = replica(env)
    # The demo found the running engine by name and config: no second engine, 8 more rows.
    assert after["replica"] == before["replica"] and after["rows"] == before["rows"] + 8


def test_prompts_from_a_csv_on_the_same_engine(env, engine, tmp_path):
    out = tmp_path / "prompts.jsonl"
    done = cli("run", EXAMPLES / "prompts.yaml", "--output", out, "--limit", "3", env=env)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and all(r["error"] is None and r["text"] for r in rows), rows
    assert summary_rows(done.stderr)["write"][2:4] == ["3", "0"]
    assert replica(env)["replica"] == engine["replica"]


def test_multiturn_example_runs_to_the_end(env, no_engine, tmp_path):
    """The README's three-step example reads a file next to its own engine: the pipeline that
    once waited forever on 2 CPUs (a read task asking a whole CPU). It declares its own
    deployment ('assistant'), so it runs with nothing else on the cluster (``no_engine``): one
    engine at a time on this machine."""
    out = tmp_path / "multiturn.jsonl"
    done = cli("run", EXAMPLES / "multiturn.yaml", "--output", out, "--limit", "2", env=env)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == [1, 2]
    assert all(
        r["error"] is None and r["answer"] and r["critique"] and r["final_answer"] for r in rows
    ), rows
    table = {
        line.split()[0]: line.split()
        for line in done.stderr.splitlines()
        if len(line.split()) == 9 and line.split()[1] == "assistant"
    }
    assert {step: table[step][2:4] for step in ("answer", "critique", "rewrite")} == {
        step: ["2", "0"] for step in ("answer", "critique", "rewrite")
    }


def test_capitals_example_keeps_choice_logprobs_tool_calls_and_reasoning(env, no_engine, tmp_path):
    """examples/capitals.yaml: a structured choice, a step keeping its logprobs, one keeping
    its (forced, named) tool call and one keeping the reasoning its deployment's parser split
    from the answer. It declares its own deployment ('surface', with a reasoning parser), so
    it runs with nothing else on the cluster: one engine at a time."""
    out = tmp_path / "capitals.jsonl"
    # Kept for the batch-file example after it (one engine start for both).
    done = cli("run", EXAMPLES / "capitals.yaml", "--output", out, "--keep-deployments", env=env)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["country"] for r in rows] == ["France", "Italy", "Spain"], done.stderr[-2000:]
    assert all(r["error"] is None for r in rows), rows
    assert {r["capital"] for r in rows} <= {"Paris", "Rome", "Madrid", "Berlin"}
    for row in rows:
        tokens = row["confidence"]  # the answer's tokens, then the end-of-turn token
        assert "".join(t["token"] for t in tokens).startswith(("yes", "no")), tokens
        assert all(t["logprob"] <= 0 and len(t["top_logprobs"]) == 2 for t in tokens)
        (call,) = row["weather_call"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"])["city"] in {
            "Paris",
            "Rome",
            "Madrid",
            "Berlin",
        }
        # The parser's half: the thought process alone, without the answer's marker.
        assert len(row["reasoning"].strip()) >= 5, row
        assert "Here is my response" not in row["reasoning"], row
    _surface_batch_file_example(env, tmp_path)
    subprocess.run([RELAYLLM, "shutdown"], env=env, capture_output=True, timeout=300, check=True)


def _surface_batch_file_example(env, tmp_path):
    """examples/batch/surface.jsonl on capitals.yaml's deployment (still running): each line
    asks for one field of the surface, and its response body is OpenAI's own type with it."""
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    out = tmp_path / "surface-out.jsonl"
    done = cli(
        "batch",
        EXAMPLES / "batch" / "surface.jsonl",
        "--config",
        EXAMPLES / "capitals.yaml",
        "--output",
        out,
        env=env,
    )
    assert json.loads(done.stdout.splitlines()[-1])["request_counts"] == {
        "total": 9,
        "completed": 9,
        "failed": 0,
    }, done.stderr[-3000:]
    bodies = {
        item["custom_id"]: item["response"]["body"]
        for item in map(json.loads, out.read_text().splitlines())
    }
    chats = {k: ChatCompletion.model_validate(v) for k, v in bodies.items() if k != "completion"}
    logprobs = chats["logprobs"].choices[0].logprobs.content
    assert logprobs and all(len(t.top_logprobs) == 2 for t in logprobs)
    assert len(chats["two-samples"].choices) == 2
    (call,) = chats["tool-call"].choices[0].message.tool_calls
    assert json.loads(call.function.arguments)["city"] in {"Paris", "Rome", "Madrid"}
    assert chats["choice"].choices[0].message.content in {"Paris", "Rome", "Madrid"}
    assert "city" in json.loads(chats["json-schema"].choices[0].message.content)
    reasoning = chats["reasoning"].choices[0].message
    assert reasoning.model_extra["reasoning_content"] and reasoning.content, reasoning
    assert "Paris" in chats["prefill"].choices[0].message.content  # the sentence continued
    assert chats["template-kwargs"].choices[0].message.content
    completion = Completion.model_validate(bodies["completion"]).choices[0]
    assert len(completion.logprobs.tokens) == 4 and len(completion.logprobs.top_logprobs[0]) == 2
