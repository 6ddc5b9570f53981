"""The config models: bad config raises ConfigError with the closest known key, in Python and
in a pipeline file; a pipeline step sets every processor setting; every field is described.
No cluster."""

import pytest
from pydantic import ValidationError

import relayllm
from relayllm import ConfigError, DeploymentConfig, ProcessorConfig
from relayllm.config import ProcessorSettings
from relayllm.configbase import undescribed_fields
from relayllm.pipelines import PipelineError, parse_pipeline
from relayllm.serving.admission_config import AdmissionConfig
from relayllm.serving.http_config import HttpConfig
from relayllm.testing.echo_options import EchoOptions

# Registered for each test and removed after it (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("echo_backend")

STEP = """\
deployments:
  - name: echo-a
    backend: echo
input:
  rows:
    - {id: 1, question: "hi there"}
steps:
  - name: answer
    deployment: echo-a
    prompt: "{question}"
    output_column: answer
"""


def test_a_misspelled_processor_key_is_a_config_error_naming_the_closest_key():
    with pytest.raises(ConfigError) as err:
        ProcessorConfig(deployment="x", batchsize=3)
    message = str(err.value)
    assert "batchsize: unknown key (did you mean 'batch_size'?)" in message, message
    assert not isinstance(err.value, ValidationError)
    assert isinstance(err.value, ValueError)  # what `except ValueError` caught before
    with pytest.raises(ConfigError, match=r"batch_size: Input should be greater than 0"):
        ProcessorConfig(deployment="x", batch_size=0)
    with pytest.raises(ConfigError, match=r"deployment: required key is missing"):
        ProcessorConfig()


def test_a_misspelled_deployment_key_is_a_config_error_naming_the_closest_key():
    with pytest.raises(
        ConfigError, match=r"num_replica: unknown key \(did you mean 'num_replicas'"
    ):
        DeploymentConfig(name="x", backend="echo", num_replica=2)
    with pytest.raises(ConfigError, match=r"http\.prot: unknown key \(did you mean 'port'\?\)"):
        DeploymentConfig(name="x", backend="echo", http={"prot": 8000})
    with pytest.raises(ConfigError, match=r"admission\.ttft_target: unknown key"):
        DeploymentConfig(name="x", backend="echo", admission={"ttft_target": 1})


def test_a_misspelled_key_in_a_pipeline_file_names_the_closest_key(tmp_path):
    with pytest.raises(PipelineError) as err:
        parse_pipeline(STEP + "    batchsize: 8\n", "p.yaml", tmp_path)
    assert "p.yaml:12: steps[0].batchsize: unknown key (did you mean 'batch_size'?)" in str(
        err.value
    )
    text = STEP.replace("    backend: echo\n", "    backend: echo\n    num_replica: 2\n")
    with pytest.raises(
        PipelineError, match=r"deployments\[0\]\.num_replica: unknown key \(did you"
    ):
        parse_pipeline(text, "p.yaml", tmp_path)


def test_a_step_sets_every_processor_setting(tmp_path):
    text = STEP + (
        "    num_cpus: 0.5\n    priority: 3\n    transport: actor\n    id_column: id\n"
        "    on_error: raise\n    max_retries: 0\n"
    )
    config = parse_pipeline(text, "p.yaml", tmp_path).spec.steps[0].processor_config()
    assert (config.num_cpus, config.priority, config.transport) == (0.5, 3, "actor")
    assert (config.id_column, config.on_error, config.max_retries) == ("id", "raise", 0)
    assert config.task == "completion" and config.deployment == "echo-a"
    shared = set(ProcessorSettings.model_fields)
    assert shared < set(ProcessorConfig.model_fields)
    assert shared == set(ProcessorConfig.model_fields) - {"deployment", "task", "sampling_params"}


def test_every_public_config_field_has_a_description():
    models = (ProcessorConfig, DeploymentConfig, HttpConfig, AdmissionConfig, EchoOptions)
    missing = [f for model in models for f in undescribed_fields(model)]
    assert not missing, f"fields without a description: {missing}"


def test_the_public_names_are_pinned():
    assert sorted(relayllm.__all__) == [
        "AdmissionConfig",
        "Backend",
        "BackendOptions",
        "BackendRegistry",
        "ConfigError",
        "ControlCallError",
        "ControlRefusedError",
        "Controller",
        "DeploymentConfig",
        "DeploymentConflictError",
        "DeploymentNotFoundError",
        "DeploymentPausedError",
        "DeploymentRef",
        "DeploymentStartError",
        "DuplicateBackendError",
        "EngineFailedError",
        "HttpConfig",
        "IncompatibleAdapterError",
        "MissingDependencyError",
        "NAME",
        "Processor",
        "ProcessorConfig",
        "RelayLLMError",
        "ResourceFitError",
        "RowError",
        "RunSummary",
        "UnknownBackendError",
        "WeightUpdateAbortedError",
        "build_processor",
        "configure_logging",
        "control",
        "deploy",
        "get_deployment",
        "hookimpl",
        "list_deployments",
        "run_batch_file",
        "run_pipeline",
        "shutdown",
    ]
    for name in relayllm.__all__:
        assert getattr(relayllm, name) is not None, name


def test_contract_2s_replica_is_out_of_the_facade_and_warns_where_it_is_still_found():
    import warnings

    from relayllm.backend import AdapterContractWarning
    from relayllm.plugin.legacy import BatchDeployment

    assert "BatchDeployment" not in relayllm.__all__
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert relayllm.BatchDeployment is BatchDeployment
    said = [str(w.message) for w in caught if issubclass(w.category, AdapterContractWarning)]
    assert len(said) == 1 and "relayllm.plugin.legacy" in said[0], said


def test_every_public_exception_is_a_relayllm_error():
    """One root: ``except relayllm.RelayLLMError`` catches whatever a public call raises."""
    import relayllm.adapters

    exported = [
        getattr(module, name) for module in (relayllm, relayllm.adapters) for name in module.__all__
    ]
    errors = [
        obj
        for obj in exported
        if isinstance(obj, type) and issubclass(obj, Exception) and not issubclass(obj, Warning)
    ]
    assert len(errors) >= 10, "the scan found the exceptions"
    strays = sorted(e.__name__ for e in errors if not issubclass(e, relayllm.RelayLLMError))
    assert not strays, f"public exceptions outside RelayLLMError: {strays}"


@pytest.mark.parametrize(
    ("model", "key", "hint"),
    [
        (HttpConfig, "route_prefx", "route_prefix"),
        (AdmissionConfig, "target_ttft", "target_ttft_s"),
    ],
)
def test_the_replicas_configs_refuse_a_bad_key_as_every_config_does(model, key, hint):
    """The HTTP front's and admission's configs are ConfigModels too: a ConfigError naming the
    field and the closest known name, not pydantic's ValidationError with the input."""
    with pytest.raises(relayllm.ConfigError, match=f"{key}: unknown key \\(did you mean '{hint}'"):
        model(**{key: 1})


def test_start_attempts_is_serves_constructor_retry_count_and_unset_leaves_serves_own():
    from relayllm.deployments import resolve, serve_options

    def options_of(**fields):
        config = DeploymentConfig(name="once", backend="echo", **fields)
        backend, options = resolve(config)
        return serve_options(backend, config, options)

    assert options_of(start_attempts=1)["max_constructor_retry_count"] == 1
    assert "max_constructor_retry_count" not in options_of()
    with pytest.raises(ConfigError, match=r"start_attempts: Input should be greater than 0"):
        DeploymentConfig(name="never", backend="echo", start_attempts=0)
