"""The OpenAI Batch file format, line by line (no cluster): parsing, routing, output shapes;
the one OpenAI body translation both doors use; a deployments file read alone."""

import json

import pytest

from relayllm.batch.format import BadLine, BatchRequest, parse_line, route_models
from relayllm.batch.output import response_line
from relayllm.batch.scan import scan_batch_file
from relayllm.errors import ConfigError

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


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
        scan_batch_file(str(path))
    path.write_text("\n\n")
    with pytest.raises(ConfigError, match="no request lines"):
        scan_batch_file(str(path))


def first_lines(*models):
    """Each model value and the first line that uses it, as the scan finds them."""
    found = {}
    for i, model in enumerate(models):
        found.setdefault(model, i + 1)
    return found


def test_routing_by_model():
    assert route_models(first_lines("a", "b", "a"), ["a", "b"], None) == {"a": "a", "b": "b"}
    # One model value that names no deployment (an OpenAI model name): the default takes it.
    assert route_models(first_lines("gpt-4o", "gpt-4o", None), ["dep"], "dep") == {
        "gpt-4o": "dep",
        None: "dep",
    }
    assert route_models(first_lines("a", None), ["a", "dep"], "dep") == {"a": "a", None: "dep"}
    with pytest.raises(ConfigError, match=r"mixes model values .* \['x'\] do not"):
        route_models(first_lines("a", "x"), ["a", "dep"], "dep")
    with pytest.raises(ConfigError, match="line 1: model 'x' names none of the deployments"):
        route_models(first_lines("x"), ["a", "b"], None)


def test_lenient_routing_leaves_out_only_the_models_that_route_nowhere():
    """The batch service's rule (strict=False): where strict routing refuses the file, the
    lines of the models that route nowhere fail alone."""
    assert route_models(first_lines("a", "x"), ["a", "dep"], "dep", strict=False) == {"a": "a"}
    assert route_models(first_lines("x", None), ["a", "b"], None, strict=False) == {}
    assert route_models(first_lines("a", "x", None), ["a"], "a", strict=False) == {
        "a": "a",
        None: "a",
    }
    # one deployment, one model value naming none: the default takes it, as strictly
    assert route_models(first_lines("gpt-4o"), ["dep"], "dep", strict=False) == {"gpt-4o": "dep"}


def test_response_lines_follow_openai_shapes():
    chat = response_line(
        BatchRequest(1, "c", "chat", [], {}, None),
        {
            "generated_text": "hi",
            "finish_reason": "length",
            "num_input_tokens": 3,
            "num_generated_tokens": 2,
            "request_id": "r1",
            "weight_version": "7",
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
            "message": {"role": "assistant", "content": "hi", "refusal": None},  # schema's
            "finish_reason": "length",
            "logprobs": None,
        }
    ]
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    assert body["weight_version"] == "7", "the weights that produced the answer"
    embedding = response_line(
        BatchRequest(1, "e", "embedding", "x", {}, "m"),
        {"embedding": [0.5, 1.0], "num_input_tokens": 1},
        "m",
    )["response"]["body"]
    assert embedding["data"] == [{"object": "embedding", "index": 0, "embedding": [0.5, 1.0]}]
    assert embedding["weight_version"] is None, "a deployment never updated"
    assert embedding["model"] == "m" and embedding["usage"] == {
        "prompt_tokens": 1,
        "total_tokens": 1,
    }


def test_one_body_translation_passes_engine_extensions_and_renames_openai_names():
    """Both doors make a row's sampling_params with this one function: OpenAI's names and an
    engine's extensions alike reach the backend (which refuses what it cannot do, by name);
    only the door's own fields and OpenAI bookkeeping stay behind."""
    from relayllm.openai_body import sampling_params

    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": False,
        "max_completion_tokens": 5,
        "temperature": None,  # null: OpenAI's default
        "logprobs": False,  # chat's "no logprobs"
        "logit_bias": {"42": -100},
        "top_k": 1,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"choice": ["yes", "no"]},
        "priority": 3,
        "user": "u1",
        "metadata": {"team": "a"},
    }
    assert sampling_params("chat", body) == {
        "max_tokens": 5,
        "logit_bias": {"42": -100},
        "top_k": 1,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "chat_template_kwargs": {"enable_thinking": False},
        "structured_outputs": {"choice": ["yes", "no"]},
        "priority": 3,
    }
    assert sampling_params("completion", {"prompt": "x", "logprobs": 0}) == {"logprobs": 0}
    assert sampling_params("embedding", {"input": "x", "dimensions": 8, "priority": 2}) == {
        "priority": 2
    }
    request = parse_line(line(body=body), 1)
    assert request.sampling_params == sampling_params("chat", body)  # the batch door's


def test_the_openai_sampling_names_are_openais_own():
    """One list of OpenAI's sampling names (rows.py: the row protocol's vocabulary, which
    every adapter reads), each a field of the openai package's request types."""
    pytest.importorskip("openai")
    from openai.types import completion_create_params
    from openai.types.chat import completion_create_params as chat_params

    from relayllm.openai_body import DOOR_FIELDS, UNUSED_FIELDS
    from relayllm.rows import OPENAI_SAMPLING_PARAMS

    fields = set()
    for params in (
        chat_params.CompletionCreateParamsBase,
        completion_create_params.CompletionCreateParamsBase,
    ):
        fields |= params.__required_keys__ | params.__optional_keys__
    assert fields >= OPENAI_SAMPLING_PARAMS, OPENAI_SAMPLING_PARAMS - fields
    assert not OPENAI_SAMPLING_PARAMS & (DOOR_FIELDS | UNUSED_FIELDS)
    not_base = {"stream", "input", "encoding_format", "dimensions"}  # other request types
    assert (DOOR_FIELDS | UNUSED_FIELDS) - not_base <= fields


def test_finish_reasons_outside_openais_read_as_stop():
    line_out = response_line(
        BatchRequest(1, "c", "chat", [], {}, None),
        {"generated_text": "x", "finish_reason": "abort", "request_id": "r"},
        "m",
    )
    assert line_out["response"]["body"]["choices"][0]["finish_reason"] == "stop"


def test_a_deployments_file_is_read_alone_with_errors_at_their_lines(tmp_path):
    from relayllm.deployments.file import load_deployments
    from relayllm.pipelines import PipelineError

    alone = tmp_path / "deployments.yaml"
    alone.write_text(
        "deployments:\n  - name: a\n    backend: echo\n  - name: b\n    backend: echo\n"
    )
    assert load_deployments(alone).names == ["a", "b"]
    pipeline = load_deployments("examples/questions.yaml")  # a whole pipeline file works too
    assert pipeline.names

    cases = {
        "deployments:\n  - name: a\n    backend: echo\nstepz: []\n": ":4: stepz: unknown key",
        "deployments:\n  - name: a\n    backend: echo\n    replicas: 2\n": "replicas: unknown key",
        "deployments: []\n": ":1: deployments: List should have at least 1 item",
        "input: {rows: []}\n": "a 'deployments:' list",
        "deployments:\n  - name: a\n    backend: echo\n  - name: a\n    backend: echo\n": (
            ":4: deployments[1].name: deployment 'a' is declared twice"
        ),
    }
    for text, expected in cases.items():
        alone.write_text(text)
        with pytest.raises(PipelineError) as err:
            load_deployments(alone)
        assert expected in str(err.value), str(err.value)
    alone.write_text("deployments:\n  - name: a\n    backend: echo\n    options:\n      mode: up\n")
    with pytest.raises(PipelineError, match=r"deployments\[0\]\.options.*mode"):
        load_deployments(alone).check_backends()


def test_a_responses_line_runs_as_a_chat_and_answers_a_response_object():
    """``/v1/responses`` (text in, text out): instructions and input become the chat's
    messages, max_output_tokens its max_tokens; the answer validates as openai's Response."""
    openai_types = pytest.importorskip("openai.types.responses")
    line = {
        "custom_id": "r1",
        "method": "POST",
        "url": "/v1/responses",
        "body": {
            "model": "echo",
            "instructions": "be brief",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi there"}]}],
            "max_output_tokens": 5,
            "temperature": 0,
        },
    }
    request = parse_line(json.dumps(line), 1)
    assert isinstance(request, BatchRequest) and request.responses and request.task == "chat"
    assert request.value == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi there"},
    ]
    assert request.sampling_params == {"max_tokens": 5, "temperature": 0}
    result = {
        "generated_text": "hi there",
        "finish_reason": "stop",
        "num_input_tokens": 4,
        "num_generated_tokens": 2,
        "request_id": "abc",
    }
    out = response_line(request, result, "echo-echo")
    response = openai_types.Response.model_validate(out["response"]["body"])
    assert response.output_text == "hi there" and response.status == "completed"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (4, 2)
    cut = response_line(request, {**result, "finish_reason": "length"}, "echo-echo")
    cut_response = openai_types.Response.model_validate(cut["response"]["body"])
    assert cut_response.status == "incomplete"
    assert cut_response.incomplete_details.reason == "max_output_tokens"
    plain = {**line, "body": {"model": "echo", "input": "hello"}}
    assert parse_line(json.dumps(plain), 2).value == [{"role": "user", "content": "hello"}]
    for body, reason in (
        ({"input": "x", "tools": [{"type": "web_search"}]}, "not supported"),
        ({"input": "x", "text": {"format": {"type": "json_object"}}}, "text.format"),
        ({"input": [{"type": "function_call_output", "output": "1"}]}, "must be a message"),
        ({"input": ""}, "'input' must be"),
    ):
        bad = parse_line(json.dumps({**line, "body": body}), 3)
        assert isinstance(bad, BadLine) and reason in bad.message, (body, bad)
