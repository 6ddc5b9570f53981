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
from relayllm.pipelines import deployed, parse_pipeline
from relayllm.pipelines.deploy import check_fit as check_pipeline_fit
from relayllm.pipelines.inputs import open_dataset
from relayllm.pipelines.run import execute

pytestmark = pytest.mark.usefixtures("ray_session")

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


def test_a_pipeline_deployed_right_after_a_shutdown_finds_its_cpus_free(ray_session, tmp_path):
    """shutdown() returns once the replicas are gone, not only their application: the next
    pipeline's fit check (free resources) does not count the stopped replicas' CPUs."""
    for attempt in range(3):  # each time: 1.2 CPUs held, stopped, then a pipeline needing 1.95 of 2
        relayllm.deploy(
            DeploymentConfig(
                name="held", backend="echo", num_replicas=2, ray_actor_options={"num_cpus": 0.6}
            )
        )
        relayllm.shutdown("held")
        check_pipeline_fit(_pipeline(tmp_path, f"next-{attempt}", 1.0, compute="tasks"))


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
