"""What adapter authors test with: the echo backend and the conformance kit.

Install with ``pip install 'relayllm[testing]'``. :class:`BackendContractTests` is the
engine-free half of the kit (run it on every commit); :class:`BackendConformanceTests` adds the
checks that need a running engine.
"""

from __future__ import annotations

from relayllm.testing.echo import EchoBackend, EchoEngine
from relayllm.testing.echo_options import EchoOptions


def enable_echo_backend() -> None:
    """Register the echo backend in this process (it is never registered by default)."""
    from relayllm.plugin import manager
    from relayllm.testing import echo

    manager.MANAGER.register(echo, "relayllm.testing.echo")


def __getattr__(name: str):
    # The kit imports pytest; keep ``import relayllm.testing`` usable without it.
    if name == "BackendConformanceTests":
        from relayllm.testing.kit import BackendConformanceTests

        return BackendConformanceTests
    if name == "BackendContractTests":
        from relayllm.testing.contract import BackendContractTests

        return BackendContractTests
    raise AttributeError(name)


__all__ = [
    "BackendConformanceTests",
    "BackendContractTests",
    "EchoBackend",
    "EchoEngine",
    "EchoOptions",
    "enable_echo_backend",
]
