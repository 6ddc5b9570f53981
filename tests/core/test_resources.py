"""What a pipeline asks of the cluster: sized to fit, or refused before any engine starts.

The regression these guard: on 2 CPUs, an engine replica holding half a CPU, three stage
actors and a read task asking a whole CPU left the read unscheduled forever, with no error
(``relayllm run examples/multiturn.yaml``). The echo backend with a CPU reservation stands in
for the engine's hold on the cluster: the deadlock is Ray's scheduling, not the model.
"""

import json
import threading

import pytest
from ray import serve

from relayllm import ResourceFitError
from relayllm.pipelines import deployed, parse_pipeline
from relayllm.pipelines.deploy import check_fit
from relayllm.pipelines.inputs import open_dataset
from relayllm.pipelines.run import execute
from relayllm.resources import Demand
from relayllm.resources import check_fit as check_demands

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
        check_fit(pipeline)
    assert "relayllm-crowd" not in serve.status().applications


def test_stage_tasks_are_two_per_unit_of_concurrency_sharing_its_cpus(ray_session, tmp_path):
    # As tasks a step runs two at once per unit of concurrency, each with half the unit's
    # num_cpus (processor.stage_workers): what the unit reserves is what one actor would.
    pipeline = _pipeline(tmp_path, "crowd-tasks", 0, concurrency=12, compute="tasks")
    with pytest.raises(ResourceFitError, match=r"stage tasks of step 'answer' \(24 x 0.125 CPU\)"):
        check_fit(pipeline)


def test_a_bundle_no_single_node_can_hold_is_refused_even_if_the_sum_fits():
    gpu_pair = Demand(
        "deployment 'tp2' (1 replica)", ({"CPU": 1}, {"GPU": 2}), 1, "lower tensor_parallel_size"
    )
    two_nodes = [{"CPU": 8, "GPU": 1}, {"CPU": 8, "GPU": 1}]
    with pytest.raises(ResourceFitError, match="asks 2 GPU, more than any node has"):
        check_demands([gpu_pair], {"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2}, two_nodes)
    check_demands([gpu_pair], {"CPU": 16, "GPU": 2}, {"CPU": 16, "GPU": 2}, [{"CPU": 8, "GPU": 2}])
