"""The ``classify`` task on the real engine: a tiny ``LlamaForSequenceClassification`` with
random weights (relayllm_vllm.tiny_models, built in a tmp dir from a transformers config, the
demo model's tokenizer) on a ``task: classify`` deployment, driven by examples/classify.yaml.
The labels are meaningless; shapes, probabilities, determinism and per-row errors are not.

One engine for the module (the example's ``classifier`` deployment, kept for the other tests).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from vllm_support import stop, stop_others

import relayllm
from relayllm_vllm.tiny_models import CLASSIFY_LABELS, build

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "classify.yaml"
NAME = "classifier"  # the example's deployment


@pytest.fixture(scope="module")
def example_rows(tmp_path_factory, monkeypatch_module):
    model = build("classify", tmp_path_factory.mktemp("classifier"))
    monkeypatch_module.setenv("RELAYLLM_CLASSIFIER", str(model))
    stop_others()  # one engine at a time
    out = tmp_path_factory.mktemp("out") / "classify.jsonl"
    relayllm.run_pipeline(EXAMPLE, output=str(out), keep_deployments=True)
    yield [json.loads(line) for line in out.read_text().splitlines()]
    stop(NAME)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def run(task: str, rows: list[dict]) -> list[dict]:
    import ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(deployment=NAME, task=task, batch_size=8)
    return relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()


def test_the_classify_example_labels_every_post(example_rows):
    assert len(example_rows) == 8
    for row in example_rows:
        assert row["error"] is None, row
        assert row["sentiment"] in CLASSIFY_LABELS
        probs = row["sentiment_probs"]
        assert len(probs) == len(CLASSIFY_LABELS) and math.isclose(sum(probs), 1, abs_tol=1e-3)
        assert row["sentiment"] == CLASSIFY_LABELS[probs.index(max(probs))]


def test_classify_rows_are_deterministic_and_bad_rows_fail_alone(example_rows):
    texts = ["The cat sat on the mat.", "The cat sat on the mat.", "", "word " * 600]
    out = run("classify", [{"id": i, "text": t} for i, t in enumerate(texts)])
    assert [r["id"] for r in out] == [0, 1, 2, 3]
    assert out[0]["error"] is None and out[0]["num_input_tokens"] > 0
    assert out[0]["probs"] == pytest.approx(out[1]["probs"], abs=1e-4)  # same text, same probs
    assert out[0]["label"] == out[1]["label"]
    assert "non-empty string" in out[2]["error"]
    assert out[3]["error"] and "maximum context length" in out[3]["error"]  # max_model_len 512


def test_other_tasks_are_refused_before_any_row(example_rows):
    with pytest.raises(Exception, match=r"does not serve task 'score'.*it serves classify"):
        run("score", [{"query": "q", "document": "d"}])
