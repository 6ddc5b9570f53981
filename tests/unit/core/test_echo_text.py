"""Echo's answers to structured-output rows (relayllm/testing/echo_text.py): a JSON schema's
``minItems`` is honoured up to echo's bound, and past it the row is refused at once rather
than answered with an array no ``max_tokens`` would hold (a fuzzed body with a huge
``minItems`` left the replica building it, and the request without an answer)."""

import json

import pytest

from relayllm.testing.echo_text import generate


def _schema(min_items):
    return {
        "response_format": {
            "type": "json_schema",
            "json_schema": {
                "name": "list",
                "schema": {"type": "array", "items": {"type": "integer"}, "minItems": min_items},
            },
        }
    }


def test_min_items_is_honoured_up_to_echos_bound_and_refused_past_it():
    assert json.loads(generate(["a", "b"], _schema(3))["generated_text"]) == [2, 2, 2]
    assert len(json.loads(generate(["a"], _schema(1024))["generated_text"])) == 1024
    with pytest.raises(ValueError, match="minItems 1000000000"):
        generate(["a"], _schema(10**9))
