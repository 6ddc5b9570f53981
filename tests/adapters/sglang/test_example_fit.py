"""examples/multiturn-sglang.yaml where it cannot run (no GPU): everything around the engine.

The file parses, its options validate against the SGLang backend's own model, and what the
pipeline would ask of a CPU-only cluster is refused up front, naming the GPU -- instead of a
replica that waits forever for a GPU that is not there."""

from pathlib import Path

import pytest

from relayllm import ResourceFitError
from relayllm.deployments import engine_demand
from relayllm.fit import check_fit, stage_demand, task_demand
from relayllm.pipelines import load_pipeline
from relayllm.plugin.manager import get_registry

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "multiturn-sglang.yaml"


def test_the_example_parses_and_its_options_validate():
    pipeline = load_pipeline(EXAMPLE)
    (deployment,) = pipeline.spec.deployments
    options = get_registry().get("sglang").parse_options(deployment.options)
    assert options.model_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert [s.name for s in pipeline.spec.steps] == ["answer", "critique", "rewrite"]


def test_a_cpu_only_cluster_is_refused_before_the_engine_starts_naming_the_gpu():
    pipeline = load_pipeline(EXAMPLE)
    (deployment,) = pipeline.spec.deployments
    demands = [engine_demand(deployment)]
    demands += [stage_demand(s.name, 0.25, 1) for s in pipeline.spec.steps]
    demands.append(task_demand(len(pipeline.spec.steps) + 2))
    cpu_only = {"CPU": 2.0}
    with pytest.raises(ResourceFitError) as err:
        check_fit(demands, cpu_only, cpu_only, [cpu_only])
    message = str(err.value)
    assert "GPU: needs 1, 0 free of 0 in the cluster" in message, message
    assert "deployment 'assistant' (1 replica): 1 CPU, 1 GPU" in message, message
    # The same pipeline fits a machine with one GPU.
    gpu_box = {"CPU": 8.0, "GPU": 1.0}
    check_fit(demands, gpu_box, gpu_box, [gpu_box])
