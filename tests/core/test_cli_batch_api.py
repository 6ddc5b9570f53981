"""The OpenAI Batch file format, line by line (no cluster): parsing, routing, output shapes."""

import json

import pytest

from relayllm.batch.format import (
    BadLine,
    BatchRequest,
    parse_line,
    read_batch_file,
    response_line,
    route,
)
from relayllm.errors import ConfigError


def line(**fields):
    base = {
        "custom_id": "c1",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
    }
    base.update(fields)
    return json.dumps(base)


def test_a_chat_line_becomes_a_request_with_its_sampling_params():
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "temperature": 0.2,
        "max_completion_tokens": 9,
        "response_format": {"type": "json_object"},
        "user": "u1",
    }
    request = parse_line(line(body=body), 1)
    assert request == BatchRequest(
        1,
        "c1",
        "chat",
        [{"role": "user", "content": "hi"}],
        {"temperature": 0.2, "max_tokens": 9, "response_format": {"type": "json_object"}},
        "m",
    )


@pytest.mark.parametrize(
    ("text", "code", "fragment"),
    [
        ("{not json", "invalid_json", "line 7: not valid JSON"),
        ("[1, 2]", "invalid_request", "must be a JSON object"),
        (line(custom_id=""), "missing_custom_id", "'custom_id' must be a non-empty string"),
        (
            line(url="/v1/images/generations"),
            "unsupported_url",
            "'/v1/images/generations' is not supported",
        ),
        (line(method="GET"), "invalid_request", "'method' must be POST"),
        (line(body="hi"), "invalid_request", "'body' must be a JSON object"),
        (line(extra=1), "invalid_request", "unknown keys ['extra']"),
        (
            line(body={"messages": [{"role": "user", "content": "x"}], "stream": True}),
            "invalid_request",
            "stream",
        ),
        (
            line(body={"messages": [{"role": "robot", "content": "x"}]}),
            "invalid_request",
            "messages[0].role",
        ),
        (
            line(body={"messages": [{"role": "user", "content": "x"}], "n": 0}),
            "invalid_request",
            "body.n is invalid",
        ),
        (
            line(url="/v1/completions", body={"prompt": ["a", "b"]}),
            "invalid_request",
            "'prompt' must be a non-empty",
        ),
        (
            line(url="/v1/embeddings", body={"input": ""}),
            "invalid_request",
            "'input' must be a non-empty",
        ),
    ],
)
def test_bad_lines_say_why(text, code, fragment):
    bad = parse_line(text, 7)
    assert isinstance(bad, BadLine) and bad.code == code and bad.line == 7
    assert fragment in bad.message and bad.message.startswith("line 7: ")


def test_single_item_lists_and_embeddings_without_params():
    completion = parse_line(
        line(url="/v1/completions", body={"prompt": ["once upon"], "max_tokens": 5}), 1
    )
    assert (completion.task, completion.value, completion.sampling_params) == (
        "completion",
        "once upon",
        {"max_tokens": 5},
    )
    embedding = parse_line(line(url="/v1/embeddings", body={"input": ["abc"], "dimensions": 8}), 2)
    assert (embedding.task, embedding.value, embedding.sampling_params) == ("embedding", "abc", {})


def test_duplicate_ids_reject_the_file(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text(
        "\n".join([line(custom_id="a"), "{bad", line(custom_id="b"), line(custom_id="a")]) + "\n"
    )
    with pytest.raises(
        ConfigError, match=r"duplicate custom_id values, nothing was run: 'a' on lines 1, 4"
    ):
        read_batch_file(str(path))
    path.write_text("\n\n")
    with pytest.raises(ConfigError, match="no request lines"):
        read_batch_file(str(path))


def requests(*models):
    return [BatchRequest(i + 1, f"c{i}", "chat", [], {}, m) for i, m in enumerate(models)]


def test_routing_by_model():
    assert route(requests("a", "b", "a"), ["a", "b"], None) == {1: "a", 2: "b", 3: "a"}
    # One model value that names no deployment (an OpenAI model name): the default takes it.
    assert route(requests("gpt-4o", "gpt-4o", None), ["dep"], "dep") == {
        1: "dep",
        2: "dep",
        3: "dep",
    }
    assert route(requests("a", None), ["a", "dep"], "dep") == {1: "a", 2: "dep"}
    with pytest.raises(ConfigError, match=r"mixes model values .* \['x'\] do not"):
        route(requests("a", "x"), ["a", "dep"], "dep")
    with pytest.raises(ConfigError, match="line 1: model 'x' names none of the deployments"):
        route(requests("x"), ["a", "b"], None)


def test_response_lines_follow_openai_shapes():
    chat = response_line(
        BatchRequest(1, "c", "chat", [], {}, None),
        {
            "generated_text": "hi",
            "finish_reason": "length",
            "num_input_tokens": 3,
            "num_generated_tokens": 2,
            "request_id": "r1",
        },
        "dep",
    )
    assert (
        chat["custom_id"] == "c" and chat["error"] is None and chat["id"].startswith("batch_req_")
    )
    assert chat["response"]["status_code"] == 200 and chat["response"]["request_id"] == "r1"
    body = chat["response"]["body"]
    assert (
        body["object"] == "chat.completion"
        and body["model"] == "dep"
        and body["id"] == "chatcmpl-r1"
    )
    assert body["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "hi"},
            "finish_reason": "length",
            "logprobs": None,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    embedding = response_line(
        BatchRequest(1, "e", "embedding", "x", {}, "m"),
        {"embedding": [0.5, 1.0], "num_input_tokens": 1},
        "m",
    )["response"]["body"]
    assert embedding["data"] == [{"object": "embedding", "index": 0, "embedding": [0.5, 1.0]}]
    assert embedding["model"] == "m" and embedding["usage"] == {
        "prompt_tokens": 1,
        "total_tokens": 1,
    }
