"""The unit tier: tests that need no Ray cluster, no engine and no network, run first.

Network sockets are off for every test here (Unix sockets stay: asyncio's event loop wakes
itself through a socket pair), and starting Ray fails, in a test or in a fixture of any scope:
a test that needs a cluster belongs in its package's cluster suite (tests/core,
tests/reliability), not here.
"""

from __future__ import annotations

import pytest
import pytest_socket
import ray


def _refuse(*args, **kwargs):
    raise AssertionError("a unit test started Ray: move it to the cluster suite")


@pytest.fixture(scope="session", autouse=True)
def _no_ray():
    # Session-wide, so a module fixture that deploys fails too. Ray Data and Serve call
    # ray.init() themselves (auto-init) when no cluster is connected: that is refused as well.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "init", _refuse)
        yield
    assert not ray.is_initialized(), "a unit test left Ray running"


@pytest.fixture(autouse=True)
def _no_network(_no_ray):
    pytest_socket.disable_socket(allow_unix_socket=True)
    try:
        yield
    finally:
        pytest_socket.enable_socket()
    assert not ray.is_initialized(), "a unit test started Ray"
