"""The conformance kit against the echo backend (registered in code, not by an entry point)."""

from relayllm.testing import BackendConformanceTests


class TestEchoConformance(BackendConformanceTests):
    backend = "echo"
    # Per-row engine time, so the kit can tell rows served together from rows served in turn.
    options = {"mode": "reverse", "fail_marker": "REFUSE-THIS-ROW", "delay_s": 0.0}

    def refused_row(self, task):
        return self.text_row(task, "Please REFUSE-THIS-ROW now")

    def stop_engine(self, ref):
        ref.handle().stop_engine.remote().result(timeout_s=60)
