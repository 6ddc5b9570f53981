"""The conformance kit against the echo backend (registered in code, not by an entry point)."""

from relayllm.testing import BackendConformanceTests


class TestEchoConformance(BackendConformanceTests):
    backend = "echo"
    options = {"mode": "reverse"}
    supports_embedding = True
