"""The conformance kit for the sglang backend.

The engine-free tests (entry point discovery, options rejecting unknown keys, light import, the
override guard) run everywhere. The engine tests need a CUDA GPU: they are marked ``gpu`` (see
conftest) and skip elsewhere with a reason saying to run ``tox -e sglang-gpu`` on a GPU machine.
"""

from __future__ import annotations

import pytest

from relayllm.testing import BackendConformanceTests
from relayllm_sglang.testing import engine_skip_reason, engine_test_model


class TestSGLangConformance(BackendConformanceTests):
    backend = "sglang"
    distribution = "relayllm-sglang"
    # A small share of GPU memory: the kit and the end-to-end test never hold an engine at once,
    # but the GPU may be shared with other work.
    options = {"model_path": engine_test_model(), "mem_fraction_static": 0.5, "context_length": 2048}
    deployment_fields = {"startup_timeout_s": 1800}
    skip_engine_reason = engine_skip_reason()

    @pytest.fixture(scope="class")
    def ray_cluster(self):
        # Skip before a Ray cluster is started for engine tests that cannot run here.
        if self.skip_engine_reason:
            pytest.skip(self.skip_engine_reason)
        import ray

        if not ray.is_initialized():
            ray.init(include_dashboard=False, log_to_driver=False)
        yield ray
