"""Shared set-up for the OpenAI adapter tests.

The test key is put in the environment before Ray starts, so the Serve replicas inherit it
(as a user's would); the openai client logs at debug level in the replicas, so the secret test
reads the most talkative logs the client can write.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # fault_server, openai_support

from openai_support import KEY_ENV, ensure_test_key

ensure_test_key()
os.environ.setdefault("OPENAI_LOG", "debug")


@pytest.fixture(scope="module")
def ray_per_module():
    """A real local Ray cluster (2 CPUs, like the machine) per test module, stopped after it,
    so each module's logs are its own session's."""
    import ray
    from support import ray_cluster

    with ray_cluster():
        yield ray


@pytest.fixture(scope="module")
def test_key() -> str:
    return os.environ[KEY_ENV]
