"""How much memory a vLLM engine gets for its KV cache, sized to the model and the job.

On a GPU vLLM takes ``gpu_memory_utilization`` of the device (its default,
:data:`GPU_MEMORY_UTILIZATION_DEFAULT`, is left alone: the GPU is the engine's). On the CPU
build the same fraction is of the machine's memory, shared with Ray and everything else, and
0.3 of a 24 GiB machine is 7 GiB of KV cache for a 135M-parameter model. So there the KV cache
is sized instead from what the job can hold at once:

    bytes per token = 2 (K and V) x layers x kv heads / tensor_parallel x head dim x dtype bytes
    tokens          = max(max_model_len x 1.05 + one block,
                          max_num_seqs x min(max_model_len, CPU_TOKENS_PER_SEQUENCE))

with the shape read from the model's ``config.json``. One full-length sequence always fits (vLLM
refuses to start otherwise); beyond that, sequences longer than the per-sequence budget make
vLLM's scheduler run fewer at once, never fail. ``kv_cache_memory_gb`` sets the size
explicitly (on either build), as does vLLM's own ``VLLM_CPU_KVCACHE_SPACE`` (GiB) variable.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 1024**3
#: vLLM's ``CacheConfig.gpu_memory_utilization`` default, used as is on GPU (the contract
#: test checks the pinned release still declares it).
GPU_MEMORY_UTILIZATION_DEFAULT = 0.92
#: vLLM's ``SchedulerConfig.DEFAULT_MAX_NUM_SEQS``: ``max_num_seqs`` of an engine whose
#: usage context has no default of its own (checked by the contract test too).
VLLM_DEFAULT_MAX_NUM_SEQS = 128
#: ``max_num_seqs`` of vLLM's offline API (``LLM``, usage context ``LLM_CLASS``) on the CPU
#: build, which the replica's engine takes too (see :mod:`relayllm_vllm.engine`).
CPU_OFFLINE_MAX_NUM_SEQS = 256
#: KV tokens budgeted per running sequence on the CPU build: one KV block of the CPU build
#: (128 tokens), a short batch row's prompt plus answer. Longer rows still run, fewer at a time.
CPU_TOKENS_PER_SEQUENCE = 128
#: The full-length sequence that must fit gets this much room, plus one block.
FULL_SEQUENCE_HEADROOM = 1.05
#: vLLM's own setting of the CPU KV-cache size (GiB); when set, it wins and nothing is derived.
CPU_KVCACHE_ENV = "VLLM_CPU_KVCACHE_SPACE"
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2}


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache of one token costs: read from a model directory's ``config.json``."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_position_embeddings: int | None

    def bytes_per_token(self, tensor_parallel_size: int = 1) -> int:
        heads = math.ceil(self.kv_heads / tensor_parallel_size)
        return 2 * self.layers * heads * self.head_dim * self.dtype_bytes


def model_shape(model_path: str, dtype: str = "auto") -> ModelShape | None:
    """The shape of the model at ``model_path`` (a local directory), or None when it has no
    readable ``config.json`` or not the usual fields (a hub id, an unusual architecture)."""
    config_file = Path(model_path) / "config.json"
    try:
        config: dict[str, Any] = json.loads(config_file.read_text("utf-8"))
    except (OSError, ValueError):
        return None
    text = config.get("text_config") or config  # vision-language models nest the LM's config
    try:
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        shape_dtype = (
            dtype
            if dtype != "auto"
            else str(
                text.get("dtype")
                or text.get("torch_dtype")
                or config.get("torch_dtype")
                or "float32"
            )
        )
        return ModelShape(
            layers=int(text["num_hidden_layers"]),
            kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=head_dim,
            dtype_bytes=_DTYPE_BYTES.get(shape_dtype.replace("torch.", ""), 4),
            max_position_embeddings=text.get("max_position_embeddings"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def cpu_kv_cache_bytes(
    shape: ModelShape,
    *,
    max_model_len: int | None,
    max_num_seqs: int | None,
    tensor_parallel_size: int = 1,
) -> int | None:
    """KV-cache bytes for one engine worker on the CPU build (formula in the module doc),
    rounded up to whole MiB; None when the context length is unknown."""
    length = max_model_len or shape.max_position_embeddings
    if not length:
        return None
    sequences = max_num_seqs or CPU_OFFLINE_MAX_NUM_SEQS
    # One full-length sequence, with headroom: vLLM's own accounting of a KV block is a little
    # larger than the shape's (an 8,192-token demo sequence was refused at 1.6% short).
    full = (math.ceil(length * FULL_SEQUENCE_HEADROOM / CPU_TOKENS_PER_SEQUENCE) + 1) * (
        CPU_TOKENS_PER_SEQUENCE
    )
    tokens = max(full, sequences * min(length, CPU_TOKENS_PER_SEQUENCE))
    raw = tokens * shape.bytes_per_token(tensor_parallel_size)
    return math.ceil(raw / 2**20) * 2**20


def weights_bytes(model_path: str) -> int:
    """Bytes of the model's weight files in a local directory (0 for a hub id)."""
    root = Path(model_path)
    if not root.is_dir():
        return 0
    return sum(
        f.stat().st_size for f in root.iterdir() if f.suffix in (".safetensors", ".bin", ".pt")
    )


def memory_shortfall(kv_cache: int | None, weights: int, available: int) -> str | None:
    """Why a CPU engine with this KV cache and these weights cannot start in ``available``
    bytes of free memory, or None when it fits. vLLM would otherwise find out only after
    loading the model, or be killed by the kernel mid-start with no message."""
    needed = (kv_cache or 0) + weights
    if needed <= available:
        return None
    return (
        f"the vLLM engine needs about {needed / GIB:.1f} GiB of memory (KV cache "
        f"{(kv_cache or 0) / GIB:.1f} GiB + weights {weights / GIB:.1f} GiB) but this node has "
        f"{available / GIB:.1f} GiB available; lower options.kv_cache_memory_gb (or "
        "max_model_len / max_num_seqs), or free memory on the node"
    )


def cpu_kvcache_env_set() -> bool:
    return os.environ.get(CPU_KVCACHE_ENV, "") != ""


__all__ = [
    "CPU_KVCACHE_ENV",
    "CPU_OFFLINE_MAX_NUM_SEQS",
    "CPU_TOKENS_PER_SEQUENCE",
    "GIB",
    "GPU_MEMORY_UTILIZATION_DEFAULT",
    "ModelShape",
    "VLLM_DEFAULT_MAX_NUM_SEQS",
    "cpu_kv_cache_bytes",
    "cpu_kvcache_env_set",
    "memory_shortfall",
    "model_shape",
    "weights_bytes",
]
