"""The row protocol, without a cluster."""

import pytest

from relayllm.rows import build_request, check_messages, check_sampling_params


def test_chat_request_merges_processor_and_row_params():
    request = build_request(
        "chat",
        [{"role": "user", "content": "hi", "name": None}],
        {"temperature": 0.0, "max_tokens": 5},
        {"max_tokens": 9, "top_p": None},
        None,
        "rid-1",
    )
    assert request == {
        "request_id": "rid-1",
        "task": "chat",
        "messages": [{"role": "user", "content": "hi"}],  # Arrow's null keys dropped
        "sampling_params": {"temperature": 0.0, "max_tokens": 9},
    }


@pytest.mark.parametrize(
    "messages, needle",
    [
        (None, "no 'messages'"),
        ("hello", "non-empty list"),
        ([], "non-empty list"),
        (["hi"], "messages[0] must be an object"),
        ([{"content": "hi"}], "messages[0].role"),
        ([{"role": "user", "content": 3}], "messages[0].content"),
    ],
)
def test_malformed_messages_are_explained(messages, needle):
    reason = build_request("chat", messages, {}, None, None, "r")
    assert isinstance(reason, str) and needle in reason


@pytest.mark.parametrize(
    "params, field",
    [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"max_tokens": "ten"}, "max_tokens"),
        ({"max_tokens": True}, "max_tokens"),
        ({"n": 0}, "n"),
        ({"stop": [1]}, "stop"),
        ("greedy", "object"),
    ],
)
def test_invalid_sampling_params_name_the_field(params, field):
    assert field in check_sampling_params(params)


def test_valid_inputs_pass():
    assert (
        check_messages([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}])
        is None
    )
    assert check_sampling_params({"temperature": 0, "stop": ["\n"], "seed": 1, "n": 1}) is None
    assert (
        build_request("completion", "", {}, None, None, "r")
        == "'prompt' must be a non-empty string, got ''"
    )
    assert build_request("completion", "go", {}, None, 7, "r").startswith(
        "'model' must be a string"
    )
