"""The conformance kit against the project's own OpenAI-compatible server in healthy mode:
real HTTP on loopback, no engine, so it is quick. Embeddings are covered here too."""

from __future__ import annotations

import os

import pytest
from fault_server import FaultServer
from openai_support import KEY_ENV

from relayllm.testing import BackendConformanceTests

SERVER = FaultServer(api_key=os.environ[KEY_ENV]).start()

pytestmark = pytest.mark.usefixtures("ray_per_module")


class TestOpenAIAgainstFaultServer(BackendConformanceTests):
    backend = "openai"
    distribution = "relayllm-openai"
    # The server echoes the prompt's words: it honours no optional request feature (stop, n,
    # logprobs, response formats, penalties), and says so, as a deployment of such an endpoint
    # would; the kit's checks of those features run against vLLM's server.
    options = {
        "base_url": SERVER.base_url,
        "model": SERVER.model,
        "api_key_env": KEY_ENV,
        "features": [],
    }
    greedy_only = "the server echoes the prompt's words: one answer per prompt"

    def refused_row(self, task):
        return self.text_row(task, "please answer fault=400")  # the endpoint answers 400

    def stop_engine(self, ref):
        SERVER.kill()  # the endpoint goes away: health() must say so

    def test_every_request_carried_the_key(self, deployment):
        records = SERVER.records
        assert records and all(r.authorized for r in records)
