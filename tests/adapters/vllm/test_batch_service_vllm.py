"""The Batch API service on the real engine: ``relayllm serve examples/questions.yaml`` reuses
the examples' running ``smollm`` deployment and starts a gateway on the tests' Serve proxy; the
real ``openai`` client uploads a batch file, creates a batch, polls it and downloads OpenAI's
output and error files, and asks an online question on the same base URL."""

import json
import time

import pytest
from vllm_support import DEPLOYMENT_NAME, EXAMPLES, HTTP_PORT, cli, cli_env

openai = pytest.importorskip("openai")

KEY = "team-key-" + "k" * 24
CHAT = "/v1/chat/completions"
#: Of different lengths: each answer's prompt token count tells whose line it answers.
QUESTIONS = [
    "What is the capital of France?",
    "Name a colour.",
    "What is two plus two, written in words?",
    "Name a fruit that is yellow, long and curved.",
    "What do bees make?",
    "Name the largest animal that lives in the ocean today, please.",
]


@pytest.fixture(scope="module")
def base_url(demo_deployed, address, tmp_path_factory):
    env = {**cli_env(address, with_address=False), "RELAYLLM_API_KEYS": f"team={KEY}"}
    state = tmp_path_factory.mktemp("service-state")
    served = cli(
        "serve", EXAMPLES / "questions.yaml", "--port", HTTP_PORT, "--direct-port", 0,
        "--state-dir", state,
        "--batch-size", 4, "--address", address, env=env,
    )  # fmt: skip
    yield served.stdout.split("base URL: ")[1].split()[0]
    cli("unserve", "--address", address, env=env)


def line(i, question, model=DEPLOYMENT_NAME):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 8,
        "temperature": 0.0,
    }
    return {"custom_id": f"q{i}", "method": "POST", "url": CHAT, "body": body}


def test_a_batch_file_runs_on_the_demo_engine_with_openai_shapes(demo_deployment, base_url):
    from openai.types.chat import ChatCompletion

    api = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
    lines = [line(i, q) for i, q in enumerate(QUESTIONS)]
    lines.append(line(len(QUESTIONS), "Hello?", model="no-such-model"))
    rows_before = demo_deployment.handle().info.remote().result(timeout_s=60)["rows"]

    uploaded = api.files.create(
        file=("questions.jsonl", "".join(json.dumps(x) + "\n" for x in lines).encode()),
        purpose="batch",
    )
    batch = api.batches.create(
        input_file_id=uploaded.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"job": "e2e"},
    )
    deadline = time.monotonic() + 600
    while batch.status not in ("completed", "failed", "expired", "cancelled"):
        assert time.monotonic() < deadline, f"batch still {batch.status}: {batch}"
        time.sleep(1)
        batch = api.batches.retrieve(batch.id)

    assert batch.status == "completed", batch
    assert batch.metadata == {"job": "e2e"}
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (7, 6, 1)
    output = [json.loads(x) for x in api.files.content(batch.output_file_id).text.splitlines()]
    errors = [json.loads(x) for x in api.files.content(batch.error_file_id).text.splitlines()]
    ids = sorted(x["custom_id"] for x in output + errors)
    assert ids == sorted(x["custom_id"] for x in lines), "each custom_id exactly once"
    texts, prompt_tokens = {}, {}
    for answer in output:
        assert answer["response"]["status_code"] == 200, answer
        completion = ChatCompletion.model_validate(answer["response"]["body"])
        texts[answer["custom_id"]] = completion.choices[0].message.content
        prompt_tokens[answer["custom_id"]] = completion.usage.prompt_tokens
        assert 0 < completion.usage.completion_tokens <= 8
    # Each answer is its own line's (greedy: the demo model knows this one), not any text.
    assert "Paris" in texts["q0"], texts
    assert all(texts.values()), texts
    (error,) = errors
    assert error["custom_id"] == f"q{len(QUESTIONS)}"
    assert error["response"]["status_code"] == 404, error
    assert error["response"]["body"]["error"]["code"] == "model_not_found", error
    # The answers came from the shared engine: its rows went up by one per answered line.
    rows_after = demo_deployment.handle().info.remote().result(timeout_s=60)["rows"]
    assert rows_after - rows_before == len(QUESTIONS)
    # Every answer is its own line's: its prompt is as long as that line's question asked
    # alone through the online door (the same chat template), and no two questions are.
    alone = {
        f"q{i}": api.chat.completions.create(**line(i, q)["body"]).usage.prompt_tokens
        for i, q in enumerate(QUESTIONS)
    }
    assert len(set(alone.values())) == len(QUESTIONS), alone
    assert prompt_tokens == alone


def test_an_online_question_on_the_same_base_url(demo_deployment, base_url):
    api = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
    answer = api.chat.completions.create(
        model=DEPLOYMENT_NAME,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=8,
        temperature=0.0,
    )
    assert answer.choices[0].message.content
    assert DEPLOYMENT_NAME in [m.id for m in api.models.list()]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="wrong-key", max_retries=0).models.list()
