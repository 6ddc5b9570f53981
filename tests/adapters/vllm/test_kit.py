"""The core conformance kit against the real vLLM engine and the demo model."""

import signal

from vllm_support import DEPLOYMENT_FIELDS, OPTIONS

from relayllm.testing import BackendConformanceTests


class TestVLLMConformance(BackendConformanceTests):
    backend = "vllm"
    distribution = "relayllm-vllm"
    options = OPTIONS
    deployment_fields = DEPLOYMENT_FIELDS
    context_length = OPTIONS["max_model_len"]  # a longer prompt: vLLM refuses that row

    def stop_engine(self, ref):
        """Kill the replica's EngineCore process, as a crash or the OOM killer would."""
        import psutil

        pid = ref.handle().info.remote().result(timeout_s=120)["pid"]
        children = psutil.Process(pid).children(recursive=True)
        assert children, "the vLLM replica has no engine process to stop"
        for child in children:
            child.send_signal(signal.SIGKILL)
