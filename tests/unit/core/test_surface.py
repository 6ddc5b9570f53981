"""The request/response surface in the row protocol (logprobs, n, tools, chat-template options,
structured output forms): validation, the features a request asks for, the up-front refusal,
and the Arrow shapes of the new output columns. No cluster."""

import pyarrow as pa
import pytest

from relayllm.batch.output import response_line
from relayllm.pipelines import PipelineError, load_pipeline
from relayllm.rows import (
    BASIC_FEATURES,
    FEATURES,
    OUTPUT_SCHEMA,
    build_request,
    check_sampling_params,
    features_of,
    output_fields,
    unsupported_features,
)
from relayllm.stage.columns import with_outputs

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")

STEP = """\
deployments:
  - name: echo-a
    backend: echo
input:
  rows:
    - {id: 1, question: "hi there"}
steps:
  - name: answer
    deployment: echo-a
    messages:
      - role: user
        content: "{question}"
    sampling_params:
      n: 2
      tool_choice: required
    output_column: answer
"""

TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}
LOGPROBS = [
    {
        "token": "Paris",
        "logprob": -0.5,
        "top_logprobs": [{"token": "Paris", "logprob": -0.5}, {"token": "Rome", "logprob": -2.0}],
    },
    {"token": ".", "logprob": -0.1, "top_logprobs": []},
]
CALLS = [
    {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
]


@pytest.mark.parametrize(
    "params, wanted",
    [
        ({}, set()),
        ({"logprobs": True, "top_logprobs": 2}, {"logprobs"}),
        ({"logprobs": False}, set()),
        ({"prompt_logprobs": 0}, {"prompt_logprobs"}),
        ({"n": 1}, set()),
        ({"n": 3}, {"n"}),
        ({"tools": [TOOL], "tool_choice": "auto"}, {"tools"}),
        ({"tool_choice": "none"}, set()),
        ({"chat_template_kwargs": {"enable_thinking": False}}, {"chat_template_kwargs"}),
        ({"continue_final_message": True}, {"continue_final_message"}),
        ({"response_format": {"type": "json_object"}}, {"structured_outputs.json"}),
        ({"response_format": {"type": "text"}}, set()),
        ({"structured_outputs": {"choice": ["a", "b"]}}, {"structured_outputs.choice"}),
        ({"structured_outputs": {"regex": "[0-9]+"}}, {"structured_outputs.regex"}),
        ({"structured_outputs": {"grammar": 'root ::= "x"'}}, {"structured_outputs.grammar"}),
    ],
)
def test_features_a_request_asks_for(params, wanted):
    assert check_sampling_params(params) is None
    assert features_of(params) == wanted
    assert wanted <= set(FEATURES)


@pytest.mark.parametrize(
    "params, field",
    [
        ({"n": 0}, "n"),
        ({"logprobs": 21}, "logprobs"),
        ({"top_logprobs": -1}, "top_logprobs"),
        ({"prompt_logprobs": "yes"}, "prompt_logprobs"),
        ({"tools": [{"type": "function", "function": {}}]}, "tools"),
        ({"tool_choice": "always"}, "tool_choice"),
        ({"chat_template_kwargs": "x"}, "chat_template_kwargs"),
        ({"continue_final_message": 1}, "continue_final_message"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs"),
        ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
        ({"structured_outputs": {"lark": "x"}}, "structured_outputs"),
    ],
)
def test_invalid_surface_params_name_the_field(params, field):
    assert check_sampling_params(params).startswith(f"sampling_params.{field} is invalid")


def test_prefill_needs_a_last_assistant_message():
    user_last = [{"role": "user", "content": "hi"}]
    prefill = [*user_last, {"role": "assistant", "content": "Hello, I am"}]
    params = {"continue_final_message": True}
    assert "continue_final_message needs" in build_request(
        "chat", user_last, params, None, None, "r"
    )
    assert build_request("chat", prefill, params, None, None, "r")["messages"] == prefill
    assert "continue_final_message" in build_request("completion", "x", params, None, None, "r")


def test_unsupported_features_message_names_backend_and_feature():
    message = unsupported_features("sglang", {"tools", "logprobs"}, {"logprobs"})
    assert message.startswith("backend 'sglang' does not support tools;")
    assert unsupported_features("vllm", {"tools"}, FEATURES) is None


def test_a_step_asking_for_a_feature_its_backend_lacks_fails_at_load(tmp_path):
    # The echo backend declares only the basic features: tools are refused before any
    # engine starts, naming the step's field.
    assert {"structured_outputs.json"} == BASIC_FEATURES
    path = tmp_path / "bad.yaml"
    path.write_text(STEP)
    with pytest.raises(PipelineError) as info:
        load_pipeline(path).check_backends()
    message = str(info.value)
    assert "steps[0].sampling_params: backend 'echo' does not support n, tools" in message


def test_new_output_columns_take_openai_shapes_in_arrow():
    names = [f.name for f in OUTPUT_SCHEMA]
    for name in ("logprobs", "prompt_logprobs", "tool_calls", "reasoning_content", "samples"):
        assert name in names
    assert "tool_calls" not in [f.name for f in output_fields("completion")]
    assert "logprobs" not in [f.name for f in output_fields("embedding")]
    result = {
        "generated_text": None,
        "finish_reason": "tool_calls",
        "logprobs": LOGPROBS,
        "prompt_logprobs": [{"token": "<s>", "logprob": None, "top_logprobs": None}],
        "tool_calls": CALLS,
        "reasoning_content": "think",
        "samples": [{"generated_text": "a", "finish_reason": "stop", "tool_calls": CALLS}],
    }
    table = with_outputs(pa.table({"id": [1, 2]}), [result, {"error": "x"}], ["r1", "r2"], "chat")
    first, second = table.to_pylist()
    assert first["logprobs"] == LOGPROBS and first["tool_calls"] == CALLS
    assert first["prompt_logprobs"][0]["logprob"] is None
    assert first["samples"][0]["tool_calls"] == CALLS and first["samples"][0]["logprobs"] is None
    assert second["logprobs"] is None and second["samples"] is None and second["error"] == "x"


def test_batch_response_line_puts_fields_where_openai_has_them():
    class Request:
        task, custom_id = "chat", "c1"

    row = {
        "generated_text": "a",
        "finish_reason": "stop",
        "logprobs": LOGPROBS,
        "samples": [
            {"generated_text": "a", "finish_reason": "stop", "logprobs": LOGPROBS},
            {"generated_text": None, "finish_reason": "tool_calls", "tool_calls": CALLS},
        ],
    }
    body = response_line(Request, row, "m")["response"]["body"]
    first, second = body["choices"]
    assert first["logprobs"]["content"][0]["top_logprobs"][1] == {
        "token": "Rome",
        "logprob": -2.0,
        "bytes": list(b"Rome"),
    }
    assert second["index"] == 1 and second["message"]["tool_calls"] == CALLS
    assert second["message"]["content"] is None and second["logprobs"] is None

    Request.task = "completion"
    body = response_line(Request, {"generated_text": "Paris.", "logprobs": LOGPROBS}, "m")
    logprobs = body["response"]["body"]["choices"][0]["logprobs"]
    assert logprobs["tokens"] == ["Paris", "."] and logprobs["text_offset"] == [0, 5]
    assert logprobs["top_logprobs"][0] == {"Paris": -0.5, "Rome": -2.0}


def test_a_step_keeps_another_output_with_output_field(tmp_path):
    from relayllm.pipelines.spec import StepSpec

    step = StepSpec(
        name="s", deployment="d", prompt="{q}", output_column="o", output_field="logprobs"
    )
    assert step.output_field == "logprobs"
    with pytest.raises(ValueError, match="output_field 'tool_calls' is not an output of task"):
        StepSpec(
            name="s", deployment="d", prompt="{q}", output_column="o", output_field="tool_calls"
        )
    with pytest.raises(ValueError, match="output_field 'request_id'"):
        StepSpec(
            name="s", deployment="d", prompt="{q}", output_column="o", output_field="request_id"
        )
