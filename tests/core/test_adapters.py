"""What adapters share (relayllm.adapters) and the row protocol's schema (relayllm.rows)."""

import pyarrow as pa
import pytest

from relayllm.adapters import (
    StructuredOutput,
    UnsupportedParameter,
    check_sampling_support,
    did_you_mean,
    parse_response_format,
)
from relayllm.rows import OUTPUT_COLUMNS, OUTPUT_SCHEMA, output_fields, request_text


def test_one_message_for_an_unsupported_sampling_parameter():
    with pytest.raises(UnsupportedParameter) as caught:
        check_sampling_support(
            "mine", {"temperature": 0, "temprature": 1}, ["temperature", "top_p"]
        )
    assert str(caught.value) == (
        "sampling_params.temprature is not supported by the 'mine' backend "
        "(did you mean 'temperature'?); supported: temperature, top_p"
    )
    check_sampling_support("mine", {"top_p": 0.5, "unknown_but_unset": None}, ["top_p"])


def test_did_you_mean():
    assert did_you_mean("max_token", ["max_tokens", "seed"]) == " (did you mean 'max_tokens'?)"
    assert did_you_mean("zzz", ["max_tokens"]) == ""


def test_response_format_forms():
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert parse_response_format({"type": "text"}) is None
    assert parse_response_format({"type": "json_object"}) == StructuredOutput("json_object")
    spec = parse_response_format(
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    )
    assert spec == StructuredOutput("json_schema", schema)
    as_text = parse_response_format(
        {"type": "json_schema", "json_schema": {"schema": '{"type": "object"}'}}
    )
    assert as_text.schema_or_object() == {"type": "object"}
    for bad, fragment in [
        ({"type": "yaml"}, "type must be"),
        ("json", "must be an object"),
        ({"type": "json_schema", "json_schema": {}}, "needs json_schema.schema"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            parse_response_format(bad)


def test_output_schema_is_the_one_list_of_output_columns():
    assert tuple(f.name for f in OUTPUT_SCHEMA) == OUTPUT_COLUMNS
    chat = [f.name for f in output_fields("chat")]
    assert "embedding" not in chat and "embedding" in [f.name for f in output_fields("embedding")]
    assert {f.name: f.arrow_type() for f in OUTPUT_SCHEMA}["embedding"] == pa.list_(pa.float32())


def test_request_text():
    chat = {
        "task": "chat",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "image_url"}]},
        ],
    }
    assert request_text(chat) == "Be brief. Hi"
    assert request_text(chat, roles=True) == "system\x01Be brief.\x00user\x01Hi"
    assert request_text({"task": "completion", "prompt": "p"}) == "p"
    assert request_text({"task": "embedding", "input": "i"}) == "i"
