"""The core conformance kit against the real vLLM engine and the demo model: on the examples'
deployment (vllm_support), the last of its users, as the kit stops its engine and shuts it
down at its end."""

import signal

import pytest
from vllm_support import CONTEXT_LENGTH, DEPLOYMENT_NAME, OPTIONS

from relayllm.testing import BackendConformanceTests


class TestVLLMConformance(BackendConformanceTests):
    backend = "vllm"
    distribution = "relayllm-vllm"
    options = OPTIONS
    context_length = CONTEXT_LENGTH  # a longer prompt: vLLM refuses that row
    chat_template_kwargs_untestable = (
        "the demo model's chat template (SmolLM2) reads no keyword argument but "
        "add_generation_prompt, which the adapter sets itself"
    )

    @classmethod
    def deployment_name(cls) -> str:
        return DEPLOYMENT_NAME  # the examples' deployment, same name and config: reused

    @pytest.fixture(scope="class", autouse=True)
    def _the_shared_engine(self, demo_deployed):
        """Started by ``relayllm deploy examples/questions.yaml`` if no test did it before."""

    def stop_engine(self, ref):
        """Kill the replica's EngineCore process, as a crash or the OOM killer would."""
        import psutil

        pid = ref.handle().info.remote().result(timeout_s=120)["pid"]
        children = psutil.Process(pid).children(recursive=True)
        assert children, "the vLLM replica has no engine process to stop"
        for child in children:
            child.send_signal(signal.SIGKILL)
