"""The HTTP front's units, without a cluster: its configuration, the traffic class of rows and
requests, and the front alone on a stand-in replica (the front through Serve's real proxy:
tests/core/test_http_front_on_ray.py)."""

import pytest

from relayllm import DeploymentConfig, ProcessorConfig

openai = pytest.importorskip("openai")


def test_http_config_from_yaml_and_its_checks():
    import yaml

    config = DeploymentConfig.model_validate(
        yaml.safe_load(
            "name: chat\nbackend: echo\nhttp: {route_prefix: /chat, port: 8123, "
            "api_key_env: CHAT_KEY}\n"
        )
    )
    assert config.http.url_for("chat") == "http://127.0.0.1:8123/chat/v1"
    assert DeploymentConfig(name="d", backend="echo", http={}).http.prefix_for("d") == "/d"
    with pytest.raises(ValueError, match="NAME of an environment variable"):
        DeploymentConfig(name="d", backend="echo", http={"api_key_env": "sk-abc def"})
    with pytest.raises(ValueError, match="trailing"):
        DeploymentConfig(name="d", backend="echo", http={"route_prefix": "chat/"})


def test_priority_http_interactive_rows_batch_overridable_per_processor_and_row():
    from relayllm.rows import build_request
    from relayllm.serving.traffic import BATCH_PRIORITY, INTERACTIVE_PRIORITY

    assert INTERACTIVE_PRIORITY < BATCH_PRIORITY  # vLLM's order: lower runs first
    assert ProcessorConfig(deployment="d").priority == BATCH_PRIORITY
    row = build_request("completion", "hi", {"priority": 3}, {"priority": 7}, None, "r1")
    assert row["priority"] == 7 and "priority" not in row["sampling_params"]
    assert "priority is invalid" in build_request(
        "completion", "hi", {}, {"priority": "x"}, None, "r2"
    )


class _RecordingReplica:
    """A replica stand-in for the front alone: it keeps the rows it is sent and answers with
    the logprobs an engine gives when asked."""

    backend_name = "recording"
    deployment = {"name": "recording"}  # declares no features: the front checks none

    def __init__(self):
        self.rows = []

    def engine_info(self):
        return {"model": "recording-model"}

    async def serve_http_row(self, row):
        self.rows.append(row)
        top = [{"token": "Paris", "logprob": -0.1}, {"token": "Rome", "logprob": -2.5}]
        return {
            "generated_text": "Paris",
            "finish_reason": "stop",
            "num_input_tokens": 3,
            "num_generated_tokens": 1,
            "logprobs": [{"token": "Paris", "logprob": -0.1, "top_logprobs": top}],
        }


def test_logprobs_and_engine_extensions_cross_the_http_front():
    """Regressions: the front answered logprobs=True with ``logprobs: null``, and dropped the
    engine extensions (top_k, min_p, repetition_penalty, logit_bias...) a client sends."""
    import asyncio
    import importlib

    from starlette.requests import Request

    from relayllm.serving.http_config import HttpConfig
    from relayllm.serving.http_front import HttpFront

    replica = _RecordingReplica()
    front = HttpFront(replica, HttpConfig(), "recording")

    async def app(scope, receive, send):
        response = await front(Request(scope, receive))
        await response(scope, receive, send)

    # The HTTP library the openai client is built on: its ASGI transport calls the app in
    # this process, no server.
    http_library = importlib.import_module(
        openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]
    )

    async def ask():
        transport = http_library.ASGITransport(app=app)
        async with openai.DefaultAsyncHttpxClient(transport=transport) as http:
            client = openai.AsyncOpenAI(base_url="http://front/v1", api_key="-", http_client=http)
            return await client.chat.completions.create(
                model="recording",
                messages=[{"role": "user", "content": "capital of France?"}],
                logprobs=True,
                top_logprobs=2,
                logit_bias={"42": -100},
                max_completion_tokens=4,
                extra_body={
                    "top_k": 1,
                    "min_p": 0.1,
                    "repetition_penalty": 1.2,
                    "chat_template_kwargs": {"enable_thinking": False},
                },
            )

    reply = asyncio.run(ask())
    content = reply.choices[0].logprobs.content
    assert [t.token for t in content[0].top_logprobs] == ["Paris", "Rome"]
    assert content[0].bytes == list(b"Paris")
    (row,) = replica.rows
    assert row["sampling_params"] == {
        "logprobs": True,
        "top_logprobs": 2,
        "logit_bias": {"42": -100},
        "max_tokens": 4,
        "top_k": 1,
        "min_p": 0.1,
        "repetition_penalty": 1.2,
        "chat_template_kwargs": {"enable_thinking": False},
    }
