"""The pooling tasks ``classify`` (``label``/``probs``) and ``score`` (a (query, document) pair ->
``score``) through the one row protocol, the stage, the batch-file format and a pipeline step,
on the echo backend (a real Serve deployment). The vLLM engine path is in
tests/adapters/vllm/test_pooling.py."""

import json

import pytest
import ray
from samples import POOLING_PIPELINE
from support import SHARED_ECHO

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.pipelines import parse_pipeline, run_pipeline

pytestmark = pytest.mark.usefixtures("ray_session")

ECHO = SHARED_ECHO  # the `echo` fixture's deployment: the session's, shared


def test_classify_and_score_through_the_stage_with_per_row_errors(echo):
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    texts = ["one two", "one two three four five six", None, "a b c d e f g h i j"]
    out = build_processor(ProcessorConfig(deployment=ECHO["name"], task="classify"))(
        ray.data.from_items([{"id": i, "text": t} for i, t in enumerate(texts)])
    ).take_all()
    assert [r["label"] for r in out] == ["short", "long", None, "long"]
    assert all(abs(sum(r["probs"]) - 1.0) < 1e-6 for r in out if r["probs"] is not None)
    assert "no 'text' column value" in out[2]["error"] and out[0]["error"] is None

    pairs = [
        {"query": "red apple pie", "document": "apple pie"},
        {"query": "red apple pie", "document": "blue sky"},
        {"query": "red apple pie", "document": None},
    ]
    scored = build_processor(ProcessorConfig(deployment=ECHO["name"], task="score"))(
        ray.data.from_items(pairs)
    ).take_all()
    assert [r["score"] for r in scored[:2]] == [1.0, 0.0]
    assert scored[2]["score"] is None and "'document' must be a non-empty" in scored[2]["error"]


def test_a_backend_without_the_task_is_refused_before_any_row(echo):
    relayllm.deploy(
        DeploymentConfig(name="chat-only-pool", backend="echo", options={"tasks": ["chat"]})
    )
    try:
        with pytest.raises(Exception, match="does not serve task 'classify'"):
            build_processor(ProcessorConfig(deployment="chat-only-pool", task="classify"))(
                ray.data.from_items([{"text": "x"}])
            ).take_all()
    finally:
        relayllm.shutdown("chat-only-pool")


def test_relayllm_batch_runs_score_and_rerank_lines(echo, tmp_path):
    lines = [
        {
            "custom_id": "s",
            "url": "/v1/score",
            "body": {"text_1": "red apple", "text_2": ["apple", "sky blue", "red"]},
        },
        {
            "custom_id": "r",
            "url": "/v1/rerank",
            "body": {"query": "red apple", "documents": ["sky", "red apple"], "top_n": 1},
        },
        {"custom_id": "bad", "url": "/v1/rerank", "body": {"query": "q", "documents": [""]}},
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    counts = relayllm.run_batch_file(path, deployment=ECHO["name"], output=out, errors=err)
    counts = counts.request_counts()
    assert counts == {"total": 3, "completed": 2, "failed": 1}
    done = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, out.open())}
    assert [d["score"] for d in done["s"]["data"]] == [1.0, 0.0, 1.0]
    assert done["r"]["results"] == [
        {"index": 1, "relevance_score": 1.0, "document": {"text": "red apple"}}
    ]
    (bad,) = map(json.loads, err.open())
    assert bad["custom_id"] == "bad" and "non-empty strings" in bad["error"]["message"]


def test_a_pipeline_classifies_and_scores_with_templates(tmp_path):
    out = tmp_path / "out.jsonl"
    pipeline = parse_pipeline(POOLING_PIPELINE, "p.yaml", tmp_path)
    assert [s.task for s in pipeline.spec.steps] == ["classify", "classify", "score"]
    run_pipeline(pipeline, output=str(out))
    rows = sorted(
        (json.loads(line) for line in out.read_text().splitlines()), key=lambda r: r["id"]
    )
    assert [r["kind"] for r in rows] == ["short", "long"]
    assert all(len(r["confidence"]) == 2 for r in rows)
    assert [r["relevance"] for r in rows] == [0.5, 0.0]
    assert "text" not in rows[0] and "document" not in rows[0]  # template columns dropped
