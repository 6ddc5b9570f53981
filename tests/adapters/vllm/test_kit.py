"""The core conformance kit against the real vLLM engine and the demo model."""

from vllm_support import DEPLOYMENT_FIELDS, OPTIONS

from relayllm.testing import BackendConformanceTests


class TestVLLMConformance(BackendConformanceTests):
    backend = "vllm"
    distribution = "relayllm-vllm"
    options = OPTIONS
    deployment_fields = DEPLOYMENT_FIELDS
    sampling_params = {"max_tokens": 8, "temperature": 0.0}
