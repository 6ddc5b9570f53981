"""The same OpenAI bodies through both front doors of one vLLM engine -- the HTTP front and a
batch file -- answer the same, field by field (ids, times, engine times and the ``model`` name
aside): logprobs, n samples, engine extensions (top_k, min_p, repetition_penalty, logit_bias)
and the refusal of what the engine cannot do, by name."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from vllm_support import HTTP_NAME, http_key

import relayllm

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"model": HTTP_NAME, "temperature": 0, "max_tokens": 4}
BODIES = [
    ("/v1/chat/completions", {**GREEDY, "messages": FRANCE, "logprobs": True, "top_logprobs": 2}),
    (
        "/v1/chat/completions",
        {
            "model": HTTP_NAME,
            "messages": FRANCE,
            "max_completion_tokens": 4,
            "top_k": 1,
            "min_p": 0.1,
            "repetition_penalty": 1.1,
            "logit_bias": {"0": -100},
        },
    ),
    (  # n > 1 samples (vLLM refuses it greedy); a seed makes them the same through both doors
        "/v1/chat/completions",
        {"model": HTTP_NAME, "messages": FRANCE, "n": 2, "max_tokens": 3, "seed": 1},
    ),
    ("/v1/completions", {**GREEDY, "prompt": "The capital of France is", "logprobs": 2}),
    # refused by the adapter, naming the field
    ("/v1/chat/completions", {**GREEDY, "messages": FRANCE, "best_of": 2}),
]


@pytest.fixture
def deployment(http_deployment):
    return http_deployment


def _send(url: str, method: str, body: dict | None) -> tuple[int, str]:
    request = urllib.request.Request(
        url,
        data=None if body is None else json.dumps(body).encode(),
        method=method,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {http_key()}"},
    )
    try:
        with urllib.request.urlopen(request, timeout=300) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def _post(url: str, body: dict) -> tuple[int, dict]:
    status, text = _send(url, "POST", body)
    return status, json.loads(text)


def _same(a, b, where="body"):
    """Equal, floats within 1e-3 (the engine batches the file's rows together)."""
    if isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, abs=1e-3), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def test_the_same_bodies_answer_the_same_through_both_doors(deployment, tmp_path):
    from openai.types import Completion
    from openai.types.chat import ChatCompletion

    info = deployment.handle().info.remote().result(timeout_s=60)
    base = info["http"]["url"].removesuffix("/v1")
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body}) + "\n"
            for i, (url, body) in enumerate(BODIES)
        )
    )
    counts = relayllm.run_batch_file(path, deployment=HTTP_NAME, output=tmp_path / "o.jsonl")
    assert (counts.completed, counts.failed) == (4, 1), Path(counts.errors).read_text()
    with open(counts.output) as out, open(counts.errors) as err:
        by_id = {line["custom_id"]: line for line in map(json.loads, [*out, *err])}
    for i, (url, body) in enumerate(BODIES):
        status, answer = _post(base + url, body)
        line = by_id[f"c{i}"]
        if status != 200:
            assert status == 400 and line["response"] is None, (status, answer)
            assert "best_of" in answer["error"]["message"]
            assert answer["error"]["message"] in line["error"]["message"], (answer, line)
            continue
        batch = line["response"]["body"]
        (ChatCompletion if "chat" in url else Completion).model_validate(answer)
        drop = ("id", "created", "model", "engine_s")  # engine time: per request, as the ids
        _same(
            {k: v for k, v in batch.items() if k not in drop},
            {k: v for k, v in answer.items() if k not in drop},
            url,
        )
    lp = by_id["c0"]["response"]["body"]["choices"][0]["logprobs"]["content"]
    assert len(lp) == 4 and len(lp[0]["top_logprobs"]) == 2
    assert len(by_id["c2"]["response"]["body"]["choices"]) == 2


def test_every_answer_and_refusal_of_the_front_on_the_real_engine_is_openais(deployment):
    """The shapes the echo suites check (tests/openai_shapes.py), on vLLM: every generating
    route's answer, streamed or not, with logprobs and n; every refusal in OpenAI's envelope.
    (Embeddings: a pooling engine's, test_task_embed.py.) Short answers: the shapes, not the
    default length, are checked here."""
    from openai_shapes import answer_problems, answers, error_problems, refusals

    url = deployment.handle().info.remote().result(timeout_s=60)["http"]["url"]
    checked = []
    for path, body, route in answers(HTTP_NAME):
        if route not in ("chat", "completion", "models"):
            continue
        short = None if body is None else {**body, "max_tokens": 4}
        status, text = _send(url + path, "GET" if body is None else "POST", short)
        assert status == 200, (path, short, text)
        assert answer_problems(route, short, text) == [], (path, short, text)
        checked.append(route)
    assert checked.count("chat") == 5 and checked.count("completion") == 2, checked
    for method, path, body, status in refusals(HTTP_NAME):
        if body is not None and "POISON" in json.dumps(body):
            continue  # the echo backend's own refusal
        got, text = _send(url + path, method, body)
        assert got == status, (path, body, text)
        assert error_problems(got, json.loads(text)) == [], (path, body, text)
