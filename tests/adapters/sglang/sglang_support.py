"""Running the SGLang engine tests: where they can run, and with which model.

The engine needs a CUDA GPU. Tests that need it skip elsewhere with a reason that says how to
run them; the GPU test environment sets ``RELAYLLM_REQUIRE_GPU=1`` so that a machine that cannot
run them fails loudly instead of passing on skips.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

REQUIRE_GPU_ENV = "RELAYLLM_REQUIRE_GPU"
TEST_MODEL_ENV = "RELAYLLM_SGLANG_TEST_MODEL"
DEFAULT_TEST_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
HOW_TO_RUN = (
    "run `tox -e sglang-gpu` on a machine with a CUDA GPU "
    f"(optionally {TEST_MODEL_ENV}=<model dir or hub id>, default {DEFAULT_TEST_MODEL})"
)


def cuda_available() -> bool:
    """A CUDA device is visible to torch. Probed in a subprocess, so the caller's process
    imports no torch and holds no CUDA state (Ray workers get the GPUs)."""
    if importlib.util.find_spec("torch") is None:
        return False
    probe = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    return probe.stdout.strip().endswith("True")


def engine_skip_reason() -> str | None:
    """Why the SGLang engine cannot run here, or None if it can (or must: REQUIRE_GPU)."""
    if os.environ.get(REQUIRE_GPU_ENV) == "1":
        return None
    if importlib.util.find_spec("sglang") is None:
        return (
            f"needs the sglang engine and a CUDA GPU (sglang is not installed here); {HOW_TO_RUN}"
        )
    if not cuda_available():
        return f"needs a CUDA GPU (none found); {HOW_TO_RUN}"
    return None


def engine_test_model() -> str:
    return os.environ.get(TEST_MODEL_ENV) or DEFAULT_TEST_MODEL


__all__ = [
    "DEFAULT_TEST_MODEL",
    "HOW_TO_RUN",
    "REQUIRE_GPU_ENV",
    "TEST_MODEL_ENV",
    "cuda_available",
    "engine_skip_reason",
    "engine_test_model",
]
