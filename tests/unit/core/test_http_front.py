"""The HTTP front's units, without a cluster: its configuration, the traffic class of rows and
requests, and the front alone on a stand-in replica (the front through Serve's real proxy:
tests/core/test_http_front_on_ray.py): the fields it passes on, and its bounds
(docs/concepts.md, "The HTTP front"): a body that names no max_tokens gets the deployment's
default, and an engine that does not answer within ``http.request_timeout_s`` gets the client
a 504 in OpenAI's envelope (``x-should-retry: false``) and its work cancelled, whole answers
and streams alike."""

import asyncio
import importlib

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


class _StuckReplica:
    """A replica stand-in: it keeps the rows it is sent; its engine answers ``parts`` parts
    of a stream and then nothing, ever (``parts=0``: not even a whole answer). Every await
    the front gave up on is counted in ``cancelled``."""

    backend_name = "stuck"
    deployment = {"name": "stuck"}

    def __init__(self, parts=0, context=None):
        self.rows, self.cancelled, self.parts, self.context = [], [], parts, context

    def engine_info(self):
        return {"model": "stuck-model", "max_model_len": self.context}

    async def serve_http_row(self, row):
        self.rows.append(row)
        if self.parts:
            return {"generated_text": "done", "finish_reason": "stop", "num_generated_tokens": 1}
        await self._never([row])

    async def serve_http_rows(self, rows):  # an embeddings request's inputs, in one call
        self.rows.extend(rows)
        await self._never(rows)

    async def stream_http_row(self, row):
        self.rows.append(row)
        for i in range(self.parts):
            yield {"generated_text": f"w{i} "}
        await self._never([row])
        yield {}

    async def _never(self, rows):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled.extend(row["request_id"] for row in rows)
            raise


def _ask(front, call):
    """``call(client)`` with the real openai client on the front, in this process."""
    from starlette.requests import Request

    async def app(scope, receive, send):
        response = await front(Request(scope, receive))
        await response(scope, receive, send)

    http_library = importlib.import_module(
        openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]
    )

    async def run():
        transport = http_library.ASGITransport(app=app)
        async with openai.DefaultAsyncHttpxClient(transport=transport) as http:
            client = openai.AsyncOpenAI(
                base_url="http://front/v1", api_key="-", http_client=http, max_retries=2
            )
            return await call(client)

    return asyncio.run(run())


def _front(replica, **http):
    from relayllm.serving.http_config import HttpConfig
    from relayllm.serving.http_front import HttpFront

    return HttpFront(replica, HttpConfig(**http), "stuck")


CHAT = {"model": "stuck", "messages": [{"role": "developer", "content": ""}]}


def test_a_body_without_max_tokens_gets_the_documented_default_or_the_engines_context():
    """http.default_max_tokens is 4096 (the number docs/reference/configuration.md shows);
    an engine whose context is shorter bounds it; a body's own max_tokens is kept."""
    for context, expected in ((None, 4096), (512, 512), (10_000, 4096)):
        replica = _StuckReplica(parts=1, context=context)
        _ask(_front(replica), lambda c: c.chat.completions.create(**CHAT))
        assert replica.rows[-1]["sampling_params"]["max_tokens"] == expected, context
    replica = _StuckReplica(parts=1)
    _ask(_front(replica), lambda c: c.completions.create(model="stuck", prompt="a", max_tokens=3))
    _ask(
        _front(replica, default_max_tokens=None),
        lambda c: c.completions.create(model="s", prompt="a"),
    )
    assert replica.rows[0]["sampling_params"]["max_tokens"] == 3
    assert "max_tokens" not in replica.rows[1]["sampling_params"]  # null: the engine's own


def test_an_engine_that_never_answers_is_a_504_not_retried_and_its_work_cancelled():
    """Regression: a request the engine did not answer held the connection until the
    client's own timeout, with no status and no error."""
    for rows, call in (
        (1, lambda c: c.chat.completions.create(**CHAT)),
        (2, lambda c: c.embeddings.create(model="stuck", input=["a b", "c"])),
        (1, lambda c: c.chat.completions.create(**CHAT, stream=True)),  # no first part
    ):
        replica = _StuckReplica()
        with pytest.raises(openai.APIStatusError) as err:
            _ask(_front(replica, request_timeout_s=0.05), call)
        assert err.value.status_code == 504
        # One request, not three (max_retries=2): the client did not send it again, and the
        # engine's work on each row was cancelled.
        assert len(replica.rows) == rows
        assert err.value.response.headers["x-should-retry"] == "false"
        assert err.value.body["code"] == "timeout" and err.value.body["type"] == "server_error"
        assert "http.request_timeout_s" in err.value.body["message"]
        assert sorted(replica.cancelled) == sorted(r["request_id"] for r in replica.rows)


def test_a_stream_whose_engine_stops_ends_with_the_timeout_error_event():
    """The status line of a stream is sent with its first part: a later part that does not
    come in time ends the stream with OpenAI's error event (the client raises it), and the
    engine's work is cancelled."""
    replica = _StuckReplica(parts=2)
    seen = []

    async def read(client):
        stream = await client.chat.completions.create(**CHAT, stream=True)
        async for chunk in stream:
            seen.extend(c.delta.content for c in chunk.choices)

    with pytest.raises(openai.APIError) as err:
        _ask(_front(replica, request_timeout_s=0.5), read)
    assert "http.request_timeout_s" in err.value.message
    assert seen == ["", "w0 ", "w1 "]  # the parts that came, then the error
    assert replica.cancelled == [replica.rows[0]["request_id"]]


def test_a_request_that_meets_a_failed_engine_is_a_503_with_retry_after():
    """A failed engine is a failure time mends (another replica, or this one replaced): the
    503 says when to come back, as a paused deployment's does, and is not marked final."""
    from starlette.requests import Request

    from relayllm.serving.http_front import ENGINE_FAILED_RETRY_AFTER_S
    from relayllm.serving.replica import Replica
    from relayllm.testing.echo import EchoEngine
    from relayllm.testing.echo_options import EchoOptions

    replica = Replica(
        EchoEngine, EchoOptions(engine_dies_after_rows=1), {"name": "unit", "http": {}}
    )

    async def app(scope, receive, send):
        response = await replica.http_front(Request(scope, receive))
        await response(scope, receive, send)

    http = importlib.import_module(
        openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0]
    )

    async def scenario():
        body = {"model": "unit", "prompt": "hello", "max_tokens": 2}
        async with http.AsyncClient(transport=http.ASGITransport(app=app)) as client:
            assert (await client.post("http://front/v1/completions", json=body)).status_code == 200
            failed = await client.post("http://front/v1/completions", json=body)
            assert failed.status_code == 503, failed.text
            assert failed.headers["retry-after"] == str(ENGINE_FAILED_RETRY_AFTER_S) == "5"
            assert "x-should-retry" not in failed.headers
            error = failed.json()["error"]
            assert error["type"] == "server_error" and "engine failed" in error["message"]

    asyncio.run(scenario())
