"""The one fit check (relayllm.fit): what a deployment or a pipeline needs at once, against
the cluster, refused before any engine starts with one error, ResourceFitError.

The pipeline cases guard a deadlock: on 2 CPUs, an engine replica holding half a CPU, three
stage actors and a read task asking a whole CPU left the read unscheduled forever, with no
error. The echo backend with a CPU reservation stands in for the engine's hold on the cluster:
the deadlock is Ray's scheduling, not the model.
"""

import json
import threading

import pytest
from ray import serve

import relayllm
from relayllm import DeploymentConfig, ResourceFitError
from relayllm.fit import SKIP_ENV, Demand, check_fit, engine_demand, replica_count
from relayllm.pipelines import deployed, parse_pipeline
from relayllm.pipelines.deploy import check_fit as check_pipeline_fit
from relayllm.pipelines.inputs import open_dataset
from relayllm.pipelines.run import execute

GROUP = {  # serve options of a replica in a placement group: 1 CPU, then 4 GPUs
    "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1}] * 4,
    "placement_group_strategy": "PACK",
    "num_replicas": 2,
}
NODES = [{"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0, "GPU": 4.0}, {"CPU": 8.0}]
TOTAL = {"CPU": 24.0, "GPU": 8.0}


def check_deployment(name, serve_options):
    """What deploy() checks: the replicas against what the nodes have."""
    check_fit([engine_demand(name, serve_options)], None, TOTAL, NODES, subject=f"{name!r}")


def test_a_deployment_that_asks_for_gpus_here_fails_before_it_starts():
    """The regression: deploy() raised a ConfigError that was not a ResourceFitError."""
    config = DeploymentConfig(name="wants-gpu", backend="echo", ray_actor_options={"num_gpus": 1})
    with pytest.raises(ResourceFitError) as err:
        relayllm.deploy(config)
    message = str(err.value)
    assert "deployment 'wants-gpu' cannot run" in message, message
    assert "GPU: needs 1, the cluster has 0" in message, message
    assert "lower num_replicas" in message  # what to change
    assert "relayllm-wants-gpu" not in serve.status().applications, "nothing was started"


def test_fitting_and_gpu_free_deployments_pass():
    check_deployment("x", GROUP)
    check_deployment("x", {"ray_actor_options": {"num_cpus": 0.5}, "num_replicas": 5})
    check_deployment("x", {"ray_actor_options": {"num_gpus": 1}, "num_replicas": 8})


def test_too_many_gpus_in_total_names_asked_and_existing():
    with pytest.raises(ResourceFitError) as err:
        check_deployment("big", {**GROUP, "num_replicas": 3})
    message = str(err.value)
    assert "GPU: needs 12, the cluster has 8" in message, message
    assert "deployment 'big' (3 replicas): 3 CPU, 12 GPU -- to change: lower num_replicas" in (
        message
    )
    with pytest.raises(ResourceFitError, match="GPU: needs 9"):
        check_deployment("x", {"ray_actor_options": {"num_gpus": 1}, "num_replicas": 9})
    autoscaled = {**GROUP, "autoscaling_config": {"min_replicas": 3, "max_replicas": 4}}
    with pytest.raises(ResourceFitError, match="GPU: needs 12"):
        check_deployment("x", autoscaled)


def test_strict_pack_needs_one_node_that_holds_the_group():
    tp8 = {
        "placement_group_bundles": [{"CPU": 1}] + [{"GPU": 1}] * 8,
        "placement_group_strategy": "STRICT_PACK",
        "num_replicas": 1,
    }
    with pytest.raises(ResourceFitError, match="8 GPU on one node .*more than any node has"):
        check_deployment("tp8", tp8)
    check_deployment("pp", {**tp8, "placement_group_strategy": "PACK"})  # may span nodes


def test_an_autoscaling_cluster_can_skip_the_check(monkeypatch):
    monkeypatch.setenv(SKIP_ENV, "1")
    check_deployment("big", {**GROUP, "num_replicas": 30})


def test_one_rule_counts_replicas():
    assert replica_count({"num_replicas": 3}) == replica_count({"num_replicas": 3}, "max") == 3
    scaling = {"min_replicas": 0, "max_replicas": 4}
    assert replica_count({"num_replicas": 1, "autoscaling_config": scaling}) == 1  # work waits
    assert replica_count({"num_replicas": 1, "autoscaling_config": scaling}, "max") == 4
    started = {"autoscaling_config": {"min_replicas": 1, "initial_replicas": 2}}
    assert replica_count(started) == 2
    assert replica_count({}) == replica_count({"autoscaling_config": {"min_replicas": 1}}) == 1


THREE_STEPS = """\
deployments:
  - name: {name}
    backend: echo
    ray_actor_options: {{num_cpus: {engine_cpus}}}
input:
  path: rows.jsonl
  id_column: id
steps:
  - name: answer
    deployment: {name}
    messages: [{{role: user, content: "{{question}}"}}]
    output_column: answer
    concurrency: {concurrency}
    compute: {compute}
  - name: critique
    deployment: {name}
    messages: [{{role: user, content: "{{question}} {{answer}}"}}]
    output_column: critique
  - name: rewrite
    deployment: {name}
    messages: [{{role: user, content: "{{answer}} {{critique}}"}}]
    output_column: final
"""


def _pipeline(tmp_path, name, engine_cpus, concurrency=1, compute="actors"):
    (tmp_path / "rows.jsonl").write_text(
        "".join(json.dumps({"id": i, "question": f"question {i}"}) + "\n" for i in range(20))
    )
    text = THREE_STEPS.format(
        name=name, engine_cpus=engine_cpus, concurrency=concurrency, compute=compute
    )
    return parse_pipeline(text, "fit.yaml", tmp_path)


def test_three_steps_reading_a_file_next_to_an_engine_holding_cpus_finish(ray_session, tmp_path):
    """Half a CPU held by the engine (the vLLM replica on the CPU build), three stage actors,
    a file to read: before relayllm sized its tasks this never finished."""
    pipeline = _pipeline(tmp_path, "holds-cpu", 0.5)
    out: list[dict] = []
    with deployed(pipeline):  # stops 'holds-cpu', which it started, on the way out
        job = threading.Thread(target=lambda: execute(pipeline, open_dataset(pipeline), out.extend))
        job.start()
        job.join(timeout=240)
        assert not job.is_alive(), "the pipeline is stuck: a task cannot be scheduled"
    assert sorted(r["id"] for r in out) == list(range(20))
    assert all(r["error"] is None and r["final"] for r in out)


def test_an_engine_bigger_than_the_cluster_fails_before_it_starts(ray_session, tmp_path):
    pipeline = _pipeline(tmp_path, "too-big", 8)
    with pytest.raises(ResourceFitError) as err, deployed(pipeline):
        pass
    message = str(err.value)
    assert "CPU: needs" in message and "of 2 in the cluster" in message, message
    assert "deployment 'too-big' (1 replica): 8 CPU" in message, message
    assert "ray_actor_options" in message  # what to change
    assert "relayllm-too-big" not in serve.status().applications, "no engine was started"


def test_too_many_stage_actors_are_named_with_what_to_change(ray_session, tmp_path):
    pipeline = _pipeline(tmp_path, "crowd", 0, concurrency=12)  # 12 x 0.25 CPU
    with pytest.raises(
        ResourceFitError, match=r"step 'answer' \(12 x 0.25 CPU\).*lower the step's concurrency"
    ):
        check_pipeline_fit(pipeline)
    assert "relayllm-crowd" not in serve.status().applications


def test_stage_tasks_are_two_per_unit_of_concurrency_sharing_its_cpus(ray_session, tmp_path):
    # As tasks a step runs two at once per unit of concurrency, each with half the unit's
    # num_cpus (processor.stage_workers): what the unit reserves is what one actor would.
    pipeline = _pipeline(tmp_path, "crowd-tasks", 0, concurrency=12, compute="tasks")
    with pytest.raises(ResourceFitError, match=r"stage tasks of step 'answer' \(24 x 0.125 CPU\)"):
        check_pipeline_fit(pipeline)


def test_a_bundle_no_single_node_can_hold_is_refused_even_if_the_sum_fits():
    gpu_pair = Demand(
        "deployment 'tp2' (1 replica)", ({"CPU": 1}, {"GPU": 2}), 1, "lower tensor_parallel_size"
    )
    two_nodes = [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}]
    with pytest.raises(ResourceFitError, match="asks 2 GPU, more than any node has"):
        check_fit([gpu_pair], {"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2}, two_nodes)
    check_fit([gpu_pair], {"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2}, [{"CPU": 8, "GPU": 2}])
