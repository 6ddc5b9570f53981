"""The KV cache sized to the model and the job on the CPU build; vLLM's defaults on GPU."""

from __future__ import annotations

import pytest

import relayllm
from relayllm_vllm.demo import ensure_demo_model
from relayllm_vllm.memory import (
    CPU_KVCACHE_ENV,
    CPU_OFFLINE_MAX_NUM_SEQS,
    CPU_TOKENS_PER_SEQUENCE,
    GIB,
    cpu_kv_cache_bytes,
    model_shape,
)
from relayllm_vllm.options import VLLMOptions, engine_args, resolved_dtype

MIB = 2**20


@pytest.fixture(scope="module")
def demo() -> str:
    return str(ensure_demo_model())


def test_the_demo_models_shape_comes_from_its_config(demo):
    shape = model_shape(demo)
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.dtype_bytes) == (30, 3, 64, 2)
    assert shape.max_position_embeddings == 8192
    assert shape.bytes_per_token() == 2 * 30 * 3 * 64 * 2  # K and V, every layer, bf16
    assert shape.bytes_per_token(tensor_parallel_size=3) == 2 * 30 * 1 * 64 * 2
    assert model_shape(demo, dtype="float32").dtype_bytes == 4
    assert model_shape("org/not-a-local-dir") is None


def test_cpu_default_is_derived_from_context_sequences_and_shape(demo):
    # In the dtype the engine will run (float32 on a CPU without native bfloat16).
    shape = model_shape(demo, resolved_dtype(VLLMOptions(), cpu=True))
    per_token = shape.bytes_per_token()
    default = engine_args(VLLMOptions(), cpu=True, model_path=demo)["kv_cache_memory_bytes"]
    tokens = max(8192, CPU_OFFLINE_MAX_NUM_SEQS * CPU_TOKENS_PER_SEQUENCE)
    assert default == -(-tokens * per_token // MIB) * MIB
    assert default < 2 * GIB, "the demo model's KV cache (float32 at most), not 30% of the machine"
    # A shorter context and fewer sequences take less; one full-length sequence always fits.
    small = engine_args(VLLMOptions(max_model_len=512, max_num_seqs=8), cpu=True, model_path=demo)
    assert small["kv_cache_memory_bytes"] == -(-1024 * per_token // MIB) * MIB
    long = cpu_kv_cache_bytes(shape, max_model_len=8192, max_num_seqs=1)
    assert long >= 1.05 * 8192 * per_token  # vLLM refused 8,192 tokens' worth: it needs more


def test_explicit_choices_win_and_gpu_keeps_vllms_defaults(demo, monkeypatch):
    def args(cpu=True, **options):
        return engine_args(VLLMOptions(**options), cpu=cpu, model_path=demo)

    assert args(kv_cache_memory_gb=1.5)["kv_cache_memory_bytes"] == int(1.5 * GIB)
    assert args(cpu=False, kv_cache_memory_gb=2)["kv_cache_memory_bytes"] == 2 * GIB
    fraction = args(gpu_memory_utilization=0.2)
    assert fraction["gpu_memory_utilization"] == 0.2 and "kv_cache_memory_bytes" not in fraction
    gpu = args(cpu=False)
    assert "kv_cache_memory_bytes" not in gpu and "gpu_memory_utilization" not in gpu
    # A model relayllm cannot read: the CPU build's fraction, as before.
    assert engine_args(VLLMOptions(), cpu=True, model_path="/m")["gpu_memory_utilization"] == 0.3
    monkeypatch.setenv(CPU_KVCACHE_ENV, "2")  # vLLM's own setting: it decides
    assert "kv_cache_memory_bytes" not in args()


def test_kv_cache_bytes_in_engine_kwargs_points_to_the_option():
    with pytest.raises(relayllm.ConfigError, match="kv_cache_memory_bytes"):
        from relayllm_vllm.backend import VLLMBackend

        VLLMBackend.parse_options({"engine_kwargs": {"kv_cache_memory_bytes": 1}})
