"""Validating a batch's input file before anything runs: each way a file fails, as OpenAI's
``errors`` list (checked with the ``openai`` package's types), from a file read back through
the service's storage; and the line checks are ``batch/format.py``'s, not a second parser's."""

from __future__ import annotations

import io
import json

import pytest
from openai.types.batch import Errors
from openai.types.batch_error import BatchError

from relayllm.batch.format import BadLine, parse_envelope, parse_line
from relayllm_service.errors import InvalidRequestError
from relayllm_service.ids import new_file_id
from relayllm_service.runner.validate import Limits, check_endpoint, validate_input
from relayllm_service.store.files import FileStorage

CHAT = "/v1/chat/completions"


def line(custom_id="c1", url=CHAT, model=None, **extra) -> str:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    if model is not None:
        body["model"] = model
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra})


def run(text: str | bytes, endpoint=CHAT, limits=None, **kwargs):
    data = text.encode() if isinstance(text, str) else text
    found = validate_input(io.BytesIO(data), endpoint, limits, **kwargs)
    errors = found.errors()
    if errors is not None:
        parsed = Errors.model_validate(errors)  # OpenAI's shape, field by field
        assert parsed.object == "list"
        assert all(set(e) == set(BatchError.model_fields) for e in errors["data"])
    return found, errors


def codes(errors):
    return [(e["code"], e["line"], e["param"]) for e in errors["data"]]


def test_a_good_file_validates_and_counts_its_request_lines():
    text = "\n".join([line("a", model="m1"), "", line("b", model="m2"), line("c")]) + "\n"
    found, errors = run(text)
    assert found.ok and errors is None
    assert found.lines == 3, "blank lines are not requests"
    assert found.first_line == {"m1": 1, "m2": 3, None: 4}, "physical line numbers, as the run's"


@pytest.mark.parametrize(
    ("bad", "code", "param"),
    [
        ("{not json", "invalid_json", None),
        ("[1, 2]", "invalid_request", None),
        (json.dumps({"method": "POST", "url": CHAT, "body": {}}), "missing_custom_id", "custom_id"),
        (line(url="/v1/images/generations"), "unsupported_url", "url"),
        (line(method="GET"), "invalid_request", "method"),
        (json.dumps({"custom_id": "x", "url": CHAT, "body": "text"}), "invalid_request", "body"),
        (line(model=5), "invalid_request", "body.model"),
    ],
)
def test_a_bad_line_fails_the_batch_with_the_run_parsers_code(bad, code, param):
    found, errors = run("\n".join([line("a"), bad, line("z")]))
    assert not found.ok
    assert codes(errors) == [(code, 2, param)]
    reference = parse_envelope(bad, 2)
    assert isinstance(reference, BadLine)
    assert (reference.code, reference.message) == (code, errors["data"][0]["message"]), (
        "validation must say what batch/format.py says of the line"
    )


def test_lines_for_another_endpoint_fail_the_batch():
    text = "\n".join([line("a"), line("b", url="/v1/embeddings"), line("c", url="/v1/completions")])
    found, errors = run(text)
    assert codes(errors) == [("mismatched_endpoint", 2, "url"), ("mismatched_endpoint", 3, "url")]
    assert "'/v1/embeddings'" in errors["data"][0]["message"]


def test_a_repeated_custom_id_fails_the_batch_naming_both_lines():
    text = "\n".join([line("a"), line("b"), line("a"), "{bad", line("b")])
    _, errors = run(text)
    assert codes(errors) == [
        ("duplicate_custom_id", 3, "custom_id"),
        ("invalid_json", 4, None),
        ("duplicate_custom_id", 5, "custom_id"),
    ]
    assert "repeats line 1" in errors["data"][0]["message"]


@pytest.mark.parametrize("text", ["", "\n\n  \n"])
def test_a_file_without_request_lines_fails(text):
    _, errors = run(text)
    assert codes(errors) == [("empty_file", None, None)]


def test_too_many_lines_and_too_many_bytes_stop_the_pass():
    text = "\n".join(line(f"c{i}") for i in range(10)) + "\n"
    found, errors = run(text, limits=Limits(max_lines=4))
    assert codes(errors) == [("too_many_lines", 5, None)] and found.lines == 5

    size = len(line("c0")) + 1
    found, errors = run(text, limits=Limits(max_bytes=3 * size + 5))
    assert codes(errors) == [("file_too_large", 4, None)]
    assert found.lines == 3


def test_an_oversize_line_is_never_read_past_the_limit():
    data = io.BytesIO(b'{"custom_id": "' + b"x" * 10_000_000 + b'"}\n')
    found = validate_input(data, CHAT, Limits(max_bytes=1000))
    assert codes(found.errors()) == [("file_too_large", 1, None)]
    assert data.tell() <= 1001, "validation read past the byte limit"


def test_not_utf8_is_a_bad_line():
    _, errors = run(line("a").encode() + b"\n" + b'{"custom_id": "\xff"}\n')
    assert codes(errors) == [("invalid_json", 2, None)]


def test_the_list_stops_at_max_errors_and_says_so():
    text = "\n".join(["{bad"] * 10 + [line("a")])
    found, errors = run(text, limits=Limits(max_errors=3))
    assert found.truncated and len(found.problems) == 3
    assert [e["code"] for e in errors["data"]] == ["invalid_json"] * 3 + ["too_many_errors"]
    assert "line 3" in errors["data"][-1]["message"]
    exactly, _ = run("\n".join(["{bad"] * 3), limits=Limits(max_errors=3))
    assert not exactly.truncated, "three problems fit a list of three"


def test_models_that_route_to_no_deployment_fail_when_deployments_are_given():
    text = "\n".join([line("a", model="m1"), line("b", model="m2")])
    found, errors = run(text, deployments=["m1"], default="m1")
    assert codes(errors) == [("model_not_found", None, "body.model")]
    assert "m2" in errors["data"][0]["message"]
    ok, _ = run(text, deployments=["m1", "m2"])
    assert ok.ok
    single, _ = run(line("a", model="gpt-4o"), deployments=["chat"], default="chat")
    assert single.ok, "one model value goes to the default deployment, as relayllm batch routes"


def test_endpoints_are_the_ones_the_run_supports():
    assert check_endpoint(CHAT) == "chat"
    assert check_endpoint("/v1/rerank") == "score"
    assert check_endpoint("/v1/responses") == "chat"  # text in, text out, as a chat
    for bad in ("/v1/moderations", None):
        with pytest.raises(InvalidRequestError) as caught:
            check_endpoint(bad)
        assert caught.value.param == "endpoint"
    with pytest.raises(InvalidRequestError):
        validate_input(io.BytesIO(line().encode()), "/v1/moderations")


def test_a_file_read_back_through_the_storage_validates(tmp_path):
    storage = FileStorage.from_uri(str(tmp_path))
    file_id = new_file_id()
    storage.put(file_id, [(line(f"c{i}") + "\n").encode() for i in range(3)] + [b"{oops\n"])
    with storage.open(file_id) as handle:
        found = validate_input(handle, CHAT)
    assert found.lines == 4
    assert codes(found.errors()) == [("invalid_json", 4, None)]


def deep_line(custom_id="deep", levels=50_000) -> str:
    messages = "[" * levels + "]" * levels
    return (
        f'{{"custom_id": "{custom_id}", "method": "POST", "url": "{CHAT}", '
        f'"body": {{"model": "m", "messages": {messages}}}}}'
    )


def test_a_line_nested_too_deep_passes_validation_to_be_its_entry_in_the_error_file():
    """Python's json raises RecursionError on such a line: it failed the whole batch as a
    runner error. Now the line is read as far as its envelope and goes to the error file."""
    text = "\n".join([line("a"), deep_line(), line("b")]) + "\n"
    found, errors = run(text)
    assert found.ok and errors is None and found.lines == 3
    bad = parse_envelope(deep_line(), 2)
    assert not isinstance(bad, BadLine) and bad.problem is not None
    assert (bad.problem.custom_id, bad.problem.code) == ("deep", "nesting_too_deep")
    assert "line 2: nested deeper than 128 levels" in bad.problem.message
    assert parse_line(deep_line(), 2) == bad.problem  # what the run writes to the error file
    # its custom_id still counts: a repeat of it fails the batch as any repeat does
    found, errors = run("\n".join([deep_line("same"), line("same")]) + "\n")
    assert codes(errors) == [("duplicate_custom_id", 2, "custom_id")]
    # and its url is still the batch's to match
    found, errors = run(deep_line().replace(CHAT, "/v1/embeddings") + "\n")
    assert codes(errors) == [("mismatched_endpoint", 1, "url")]


def test_a_lone_surrogate_in_a_custom_id_fails_the_batch_and_in_a_body_is_that_lines_error():
    bad_id = json.dumps({"custom_id": "x", "method": "POST", "url": CHAT, "body": {}})
    found, errors = run(bad_id.replace('"x"', '"x\\udc80"') + "\n")
    assert codes(errors) == [("invalid_request", 1, "custom_id")]
    body = line("b").replace('"hi"', '"hi\\ud800"')
    found, errors = run(line("a") + "\n" + body + "\n")
    assert found.ok and errors is None
    envelope = parse_envelope(body, 2)
    assert not isinstance(envelope, BadLine) and envelope.problem is not None
    assert envelope.problem.param == "body.messages[0].content"
    assert envelope.problem.custom_id == "b"
