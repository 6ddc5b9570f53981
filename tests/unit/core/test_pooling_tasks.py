"""The pooling tasks ``classify`` and ``score`` without a cluster: rows built and checked, the
output columns, pipeline templates and batch-file lines (through the stage and a real run:
tests/core/test_pooling_tasks_on_ray.py)."""

import json

import pyarrow as pa
import pytest
from samples import POOLING_PIPELINE

from relayllm.batch.format import parse_line
from relayllm.batch.output import response_line
from relayllm.pipelines import PipelineError, parse_pipeline
from relayllm.rows import ANSWER_COLUMN, build_request, output_fields
from relayllm.stage.columns import with_outputs

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")


def test_pooling_rows_are_built_and_bad_ones_say_why():
    ok = build_request("score", "what is x", {}, None, None, "r1", {"document": "x is y"})
    assert ok["query"] == "what is x" and ok["document"] == "x is y"
    missing = build_request("score", "what is x", {}, None, None, "r2", {})
    assert "'document' must be a non-empty string (task 'score')" in missing
    assert "non-empty string" in build_request("classify", "", {}, None, None, "r3")
    params = build_request("classify", "hi", {"max_tokens": 3}, None, None, "r4")
    assert "task 'classify' takes no sampling_params" in params


def test_pooling_output_columns_and_answers():
    assert [f.name for f in output_fields("classify") if f.name in ("label", "probs", "score")] == [
        "label",
        "probs",
    ]
    assert "score" in [f.name for f in output_fields("score")]
    assert ANSWER_COLUMN["classify"] == "label" and ANSWER_COLUMN["score"] == "score"
    table = with_outputs(
        pa.table({"text": ["a"]}), [{"label": "pos", "probs": [0.25, 0.75]}], ["id0"], "classify"
    )
    assert table.schema.field("probs").type == pa.list_(pa.float32())
    assert table.to_pylist()[0]["label"] == "pos"


def test_a_document_template_needs_the_score_task(tmp_path):
    bad = POOLING_PIPELINE.replace(
        '    text: "{post}"\n    output_column: kind',
        '    text: "{post}"\n    document: "{post}"\n    output_column: kind',
    )
    with pytest.raises(PipelineError, match="reads no 'document'"):
        parse_pipeline(bad, "p.yaml", tmp_path)


def test_batch_lines_for_score_and_rerank():
    score = parse_line(
        json.dumps(
            {
                "custom_id": "s1",
                "method": "POST",
                "url": "/v1/score",
                "body": {"model": "m", "text_1": "what is x", "text_2": ["x is y", "z"]},
            }
        ),
        1,
    )
    assert score.task == "score" and score.pairs == [("what is x", "x is y"), ("what is x", "z")]
    rerank = parse_line(
        json.dumps(
            {
                "custom_id": "r1",
                "method": "POST",
                "url": "/v1/rerank",
                "body": {"model": "m", "query": "q", "documents": ["a", "b"], "top_n": 1},
            }
        ),
        2,
    )
    rows = [{"score": 0.2, "num_input_tokens": 3}, {"score": 0.9, "num_input_tokens": 4}]
    body = response_line(rerank, {"pairs": rows}, "m")["response"]["body"]
    assert body["results"] == [{"index": 1, "relevance_score": 0.9, "document": {"text": "b"}}]
    assert body["usage"]["prompt_tokens"] == 7
    scored = response_line(score, {"pairs": rows}, "m")["response"]["body"]
    assert [d["score"] for d in scored["data"]] == [0.2, 0.9]
    assert scored["object"] == "list"
    uneven = parse_line(
        json.dumps(
            {
                "custom_id": "s2",
                "url": "/v1/score",
                "body": {"queries": ["a", "b"], "documents": ["x", "y", "z"]},
            }
        ),
        3,
    )
    assert uneven.code == "invalid_request" and "give one query" in uneven.message
