"""The OpenAI adapter's reading of a vLLM server's ``/classify`` and ``/score`` answers, and its
default tasks (OpenAI's own three). No server: the end-to-end path is in
test_openai_pooling_vllm_server.py."""

import pytest

from relayllm_openai.backend import OpenAIBackend
from relayllm_openai.retrying import MalformedResponse
from relayllm_openai.translate import classify_result, score_result


def test_classify_and_score_bodies_become_row_columns():
    body = {"data": [{"index": 0, "label": "positive", "probs": [0.1, 0.9], "num_classes": 2}]}
    body["usage"] = {"prompt_tokens": 5, "total_tokens": 5}
    assert classify_result(body) == {
        "label": "positive",
        "probs": [0.1, 0.9],
        "num_input_tokens": 5,
    }
    scored = score_result({"data": [{"index": 0, "object": "score", "score": 0.25}]})
    assert scored == {"score": 0.25, "num_input_tokens": None}


@pytest.mark.parametrize("body", [{}, {"data": []}, {"data": [{"score": "high"}]}, "text"])
def test_a_body_without_the_answer_is_a_malformed_response(body):
    with pytest.raises(MalformedResponse):
        score_result(body)
    with pytest.raises(MalformedResponse):
        classify_result(body)


def test_default_tasks_are_openais_own():
    options = OpenAIBackend.parse_options({"base_url": "http://127.0.0.1:1/v1", "model": "m"})
    assert OpenAIBackend.tasks_for(options) == {"chat", "completion", "embedding"}
    both = OpenAIBackend.parse_options(
        {"base_url": "http://127.0.0.1:1/v1", "model": "m", "tasks": ["classify", "score"]}
    )
    assert OpenAIBackend.tasks_for(both) == {"classify", "score"}
