"""The ``score`` task on the real engine: a tiny cross-encoder (a one-label
``LlamaForSequenceClassification`` with random weights, relayllm_vllm.tiny_models) on a
``task: score`` deployment. Each (query, document) row becomes one prompt the way vLLM's own
``/score`` endpoint builds it. Scores are meaningless; their range, determinism, the pairing
and per-row errors are not. Also ``relayllm batch``'s ``/v1/score`` and ``/v1/rerank`` lines.

One engine for the module.
"""

from __future__ import annotations

import json

import pytest
from vllm_support import stop, stop_others

import relayllm

NAME = "vllm-score"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    from relayllm_vllm.tiny_models import build

    model = build("score", tmp_path_factory.mktemp("cross-encoder"))
    stop_others()  # one engine at a time
    ref = relayllm.deploy(
        relayllm.DeploymentConfig(
            name=NAME,
            backend="vllm",
            options={"model": str(model), "task": "score", "max_model_len": 256},
            startup_timeout_s=1200,
        )
    )
    yield ref
    stop(NAME)


def run(rows: list[dict]) -> list[dict]:
    import ray

    ray.data.DataContext.get_current().execution_options.preserve_order = True
    config = relayllm.ProcessorConfig(deployment=NAME, task="score", batch_size=8)
    return relayllm.build_processor(config)(ray.data.from_items(rows)).take_all()


def test_scores_per_pair(deployment):
    pairs = [
        ("What is the capital of France?", "Paris is the capital of France."),
        ("What is the capital of France?", "Paris is the capital of France."),
        ("What is the capital of France?", "Bananas are yellow."),
        ("What is the capital of France?", None),
        ("What is the capital of France?", "word " * 400),
    ]
    out = run([{"id": i, "query": q, "document": d} for i, (q, d) in enumerate(pairs)])
    assert [r["id"] for r in out] == [0, 1, 2, 3, 4]
    assert all(r["error"] is None for r in out[:3]), out
    scores = [r["score"] for r in out[:3]]
    assert all(0.0 <= s <= 1.0 for s in scores)  # one label: vLLM's pooler applies a sigmoid
    assert scores[0] == pytest.approx(scores[1], abs=1e-4)  # same pair, same score
    assert scores[0] != pytest.approx(scores[2], abs=1e-6)  # the document is in the prompt
    assert out[0]["num_input_tokens"] > out[2]["num_input_tokens"] > 0
    assert "'document' must be a non-empty string" in out[3]["error"]
    assert out[4]["error"] and "maximum context length" in out[4]["error"]


def test_batch_file_score_and_rerank_lines(deployment, tmp_path):
    docs = ["Paris is the capital of France.", "Bananas are yellow.", "France is in Europe."]
    lines = [
        {"custom_id": "s", "url": "/v1/score", "body": {"text_1": "capital?", "text_2": docs}},
        {
            "custom_id": "r",
            "url": "/v1/rerank",
            "body": {"query": "capital?", "documents": docs, "top_n": 2},
        },
    ]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out, err = tmp_path / "out.jsonl", tmp_path / "err.jsonl"
    counts = relayllm.run_batch_file(path, deployment=NAME, output=out, errors=err)
    counts = counts.request_counts()
    assert counts == {"total": 2, "completed": 2, "failed": 0}, err.read_text()
    bodies = {r["custom_id"]: r["response"]["body"] for r in map(json.loads, out.open())}
    scores = [d["score"] for d in bodies["s"]["data"]]
    assert [d["index"] for d in bodies["s"]["data"]] == [0, 1, 2]
    ranked = bodies["r"]["results"]
    best = sorted(range(3), key=scores.__getitem__, reverse=True)[:2]
    assert [r["index"] for r in ranked] == best  # the same pairs, the same engine: same order
    assert [r["relevance_score"] for r in ranked] == pytest.approx([scores[i] for i in best])
    assert ranked[0]["document"]["text"] == docs[best[0]]
    # The bodies are what vLLM's own server answers on these endpoints: its response types
    # read them.
    from relayllm_vllm.compat import hide_broken_torch_extensions

    hide_broken_torch_extensions(for_subprocesses=False)
    from vllm.entrypoints.pooling.scoring.protocol import RerankResponse, ScoreResponse

    assert len(ScoreResponse.model_validate(bodies["s"]).data) == 3
    assert RerankResponse.model_validate(bodies["r"]).results[0].index == best[0]
