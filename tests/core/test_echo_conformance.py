"""The conformance kit against the echo backend (registered in code, not by an entry point)."""

import pytest

from relayllm.testing import BackendConformanceTests
from relayllm.testing.echo_options import ECHO_FEATURES

pytestmark = pytest.mark.usefixtures("ray_session")


class TestEchoConformance(BackendConformanceTests):
    backend = "echo"
    # Sampling on and every feature echo implements declared, so each sampling check runs.
    options = {
        "mode": "reverse",
        "fail_marker": "REFUSE-THIS-ROW",
        "delay_s": 0.0,
        "sampling": True,
        "features": list(ECHO_FEATURES),
    }

    def refused_row(self, task):
        return self.text_row(task, "Please REFUSE-THIS-ROW now")

    def stop_engine(self, ref):
        ref.handle().stop_engine.remote().result(timeout_s=60)
