"""Options: validation, the Engine kwargs they become, deploy-time checks, GPUs per replica."""

from __future__ import annotations

import pytest

import relayllm
from relayllm.deployments import build_application
from relayllm.plugin.manager import get_registry
from relayllm_sglang.backend import SGLangBackend, check_options_against, placement
from relayllm_sglang.options import FIRST_CLASS_OPTIONS, SGLangOptions, engine_kwargs


def parse(**options):
    return SGLangBackend.parse_options(options)


def test_defaults_need_only_a_model():
    options = parse(model_path="org/model")
    assert engine_kwargs(options) == {
        "model_path": "org/model",
        "tp_size": 1,
        "dp_size": 1,
        "dtype": "auto",
    }


def test_every_option_becomes_the_engine_kwarg_of_the_same_name():
    options = parse(
        model_path="m",
        tokenizer_path="t",
        tp_size=2,
        dp_size=2,
        mem_fraction_static=0.7,
        context_length=4096,
        chunked_prefill_size=-1,
        max_running_requests=64,
        dtype="bfloat16",
        chat_template="templates/chat.jinja",
        lora_paths={"sql": "adapters/sql"},
        reasoning_parser="qwen3",
        server_args={"is_embedding": False, "random_seed": 7},
    )
    kwargs = engine_kwargs(options)
    assert set(kwargs) == FIRST_CLASS_OPTIONS | {"is_embedding", "random_seed"}
    assert kwargs["lora_paths"] == {"sql": "adapters/sql"}
    assert kwargs["chunked_prefill_size"] == -1 and kwargs["random_seed"] == 7


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({}, "model_path"),
        ({"model_path": ""}, "model_path"),
        ({"model_path": "m", "tp_size": 0}, "tp_size"),
        ({"model_path": "m", "mem_fraction_static": 1.5}, "mem_fraction_static"),
        ({"model_path": "m", "chunked_prefill_size": 0}, "chunked_prefill_size"),
        ({"model_path": "m", "dtype": "fp64"}, "dtype"),
        ({"model_path": "m", "chat_template": "chatml"}, "chat_template"),
        ({"model_path": "m", "lora_paths": {"": "x"}}, "lora_paths"),
        ({"model_path": "m", "model": "m"}, "model"),  # vLLM's name, not SGLang's
        ({"model_path": "m", "server_args": {"tp_size": 2}}, "tp_size"),
        ({"model_path": "m", "server_args": {"skip_tokenizer_init": True}}, "skip_tokenizer_init"),
    ],
)
def test_bad_options_fail_naming_the_field(options, field):
    with pytest.raises(relayllm.ConfigError, match=field):
        SGLangBackend.parse_options(options)


def test_server_args_names_checked_against_the_real_serverargs(sglang_source):
    check_options_against(
        parse(model_path="m", server_args={"enable_deterministic_inference": True}), sglang_source
    )
    with pytest.raises(relayllm.ConfigError) as caught:
        check_options_against(
            parse(model_path="m", server_args={"max_total_tokenz": 10}), sglang_source
        )
    message = str(caught.value)
    assert "max_total_tokenz" in message and "did you mean 'max_total_tokens'" in message


def test_deploy_without_the_engine_names_the_extra_and_starts_nothing():
    import ray

    config = relayllm.DeploymentConfig(
        name="no-engine", backend="sglang", options={"model_path": "m"}
    )
    with pytest.raises(
        relayllm.MissingDependencyError, match=r"\./packages/adapter-sglang\[engine\]"
    ):
        relayllm.deploy(config)
    assert not ray.is_initialized(), "a cluster was started for a config that cannot deploy"


def test_replica_without_the_engine_names_the_extra():
    from relayllm.serving.replica import Replica
    from relayllm_sglang.deployment import SGLangEngine, import_sglang

    if SGLangBackend.missing_requirements() == []:
        pytest.skip("sglang is installed here")
    with pytest.raises(
        relayllm.MissingDependencyError, match=r"\./packages/adapter-sglang\[engine\]"
    ):
        import_sglang()
    with pytest.raises(
        relayllm.MissingDependencyError, match=r"\./packages/adapter-sglang\[engine\]"
    ):
        Replica(SGLangEngine, SGLangOptions(model_path="m"), {"name": "x"})


@pytest.mark.parametrize(
    ("options", "gpus"),
    [
        ({}, 1),
        ({"tp_size": 4}, 4),
        ({"tp_size": 2, "dp_size": 2}, 4),
        ({"tp_size": 2, "dp_size": 2, "server_args": {"enable_dp_attention": True}}, 2),
    ],
)
def test_gpus_per_replica(options, gpus):
    serve_options = placement(parse(model_path="m", **options))
    assert serve_options["ray_actor_options"]["num_gpus"] == gpus
    if gpus == 1:
        assert "placement_group_bundles" not in serve_options
    else:
        # All of the engine's GPUs in one bundle on one node: its workers are local processes.
        assert serve_options["placement_group_bundles"] == [{"CPU": 1, "GPU": gpus}]
        assert serve_options["placement_group_strategy"] == "STRICT_PACK"


def test_building_the_application_is_pure_and_carries_the_gpus():
    config = relayllm.DeploymentConfig(
        name="tp2", backend="sglang", options={"model_path": "m", "tp_size": 2}
    )
    backend = get_registry().get("sglang")
    app = build_application(backend, config, backend.parse_options(config.options))
    deployment = app._bound_deployment  # Ray 2.60: the Deployment an Application binds
    assert deployment.ray_actor_options["num_gpus"] == 2
    assert deployment._replica_config.placement_group_bundles == [{"CPU": 1, "GPU": 2}]


def test_info_facts_follow_the_options():
    options = parse(
        model_path="m", server_args={"is_embedding": True, "enable_deterministic_inference": True}
    )
    assert options.embedding_model and options.seeded_sampling
    assert not SGLangOptions(model_path="m").seeded_sampling


def test_tasks_follow_is_embedding():
    from relayllm_sglang.backend import SGLangBackend
    from relayllm_sglang.options import SGLangOptions

    text = SGLangOptions(model_path="m")
    embed = SGLangOptions(model_path="m", server_args={"is_embedding": True})
    assert SGLangBackend.tasks_for(text) == {"chat", "completion"}
    assert SGLangBackend.tasks_for(embed) == {"embedding"}


@pytest.mark.parametrize(
    ("options", "tasks"),
    [
        ({}, {"chat", "completion"}),
        ({"server_args": {"is_embedding": True}}, {"embedding"}),
        ({"task": "generate"}, {"chat", "completion"}),
        ({"task": "embed"}, {"embedding"}),
        ({"task": "classify"}, {"classify"}),
        ({"task": "score"}, {"score"}),
        ({"task": "score", "server_args": {"is_embedding": True}}, {"score"}),
    ],
)
def test_the_task_option_decides_what_a_deployment_serves(options, tasks):
    parsed = parse(model_path="m", **options)
    assert SGLangBackend.tasks_for(parsed) == tasks <= SGLangBackend.tasks
    # Pooling models take no generation features (logprobs, structured output...).
    assert bool(SGLangBackend.features_for(parsed)) == (tasks == {"chat", "completion"})
    kwargs = engine_kwargs(parsed)
    assert "task" not in kwargs  # relayllm's own option, not a ServerArgs field
    assert kwargs.get("is_embedding", False) == (tasks != {"chat", "completion"})


@pytest.mark.parametrize(
    ("task", "is_embedding"), [("generate", True), ("classify", False), ("embed", False)]
)
def test_a_task_contradicting_is_embedding_fails_naming_both(task, is_embedding):
    with pytest.raises(relayllm.ConfigError, match=rf"task '{task}' contradicts"):
        parse(model_path="m", task=task, server_args={"is_embedding": is_embedding})


def test_a_processor_task_the_deployment_does_not_serve_is_named_before_any_engine():
    """What the stage and the pipeline loader check before sending a row: the tasks a replica
    reports (normalized_config) come from tasks_for, and the message names the task."""
    from relayllm.deployments import normalized_config, unserved_task_message

    config = relayllm.DeploymentConfig(
        name="clf", backend="sglang", options={"model_path": "m", "task": "classify"}
    )
    reported = normalized_config(config, SGLangBackend, parse(**config.options))
    assert reported["tasks"] == ["classify"] and reported["features"] == []
    message = unserved_task_message("clf", "sglang", "score", reported["tasks"])
    assert "(backend 'sglang') does not serve task 'score'" in message
    assert "it serves classify" in message


POOLING_PIPELINE = """\
deployments:
  - name: reranker
    backend: sglang
    options: {{model_path: BAAI/bge-reranker-base, task: {task}}}
input:
  rows:
    - {{id: 1, topic: "sky", post: "the sky is blue"}}
steps:
  - name: relevance
    deployment: reranker
    query: "{{topic}}"
    document: "{{post}}"
    output_column: relevance
"""


@pytest.mark.parametrize("task", ["score", "classify"])
def test_a_pipeline_step_is_checked_against_the_task_option_before_any_engine(tmp_path, task):
    """Loading the file checks the score step against the deployment's task (no cluster, no
    engine); without sglang installed it also says so, the task check still runs."""
    import ray

    from relayllm.pipelines import PipelineError, parse_pipeline

    pipeline = parse_pipeline(POOLING_PIPELINE.format(task=task), "p.yaml", tmp_path)
    problems = []
    try:
        pipeline.check_backends()
    except PipelineError as exc:
        problems = str(exc)
    if SGLangBackend.missing_requirements():
        assert "deployments[0].backend" in problems and "adapter-sglang[engine]" in problems
    unserved = "steps[0].task" in problems and "does not serve task 'score'" in problems
    assert unserved == (task == "classify"), problems
    assert not ray.is_initialized()


SECRET = "sk-live-0123456789abcdef-not-for-logs"


@pytest.mark.parametrize(
    "bad",
    [
        {"tp_size": SECRET},
        {"api_key": SECRET},
        {"lora_paths": {"a": {"k": SECRET}}},
        {"server_args": SECRET},
    ],
)
def test_an_options_error_never_shows_the_value(bad):
    """A value may be a key pasted in the wrong field: the message names the field only."""
    with pytest.raises(relayllm.ConfigError) as caught:
        parse(model_path="m", **bad)
    assert SECRET not in str(caught.value)
    assert SECRET not in relayllm.errors.describe_exception(caught.value, causes=5)
    assert str(caught.value).startswith(f"invalid options for backend 'sglang': {next(iter(bad))}")
