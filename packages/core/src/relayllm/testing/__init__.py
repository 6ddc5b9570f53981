"""What adapter authors test with: the echo backend and the conformance kit.

Install with ``pip install 'relayllm[testing]'``; see :class:`BackendConformanceTests`.
"""

from __future__ import annotations

from relayllm.testing.echo import EchoBackend, EchoDeployment, EchoOptions


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
    raise AttributeError(name)


__all__ = [
    "BackendConformanceTests",
    "EchoBackend",
    "EchoDeployment",
    "EchoOptions",
    "enable_echo_backend",
]
