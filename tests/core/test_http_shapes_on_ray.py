"""Every body the HTTP front answers is OpenAI's (docs/concepts.md, "The HTTP front"), through
Serve's real proxy on loopback on an echo deployment: read raw and checked against the
``openai`` package's type for its route with every field OpenAI's schema requires
(tests/openai_shapes.py), and read by the real ``openai`` client. Bodies that once got no
answer get one, and an engine slower than ``http.request_timeout_s`` gets the client a 504."""

import json
import urllib.error
import urllib.request

import pytest
from openai_shapes import answer_problems, answers, error_problems, refusals
from support import HTTP_PORT, echo_deployment, serve_proxy_on_http_port

import relayllm

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

NAME = "shapes"
PORT = HTTP_PORT  # the session's one proxy, shared with test_http_front_on_ray
FEATURES = ["logprobs", "n", "structured_outputs.json", "structured_outputs.choice"]


@pytest.fixture(scope="module")
def url():
    serve_proxy_on_http_port()  # after test_http_front_on_ray: its proxy, already on the port
    options = {"fail_marker": "POISON", "features": FEATURES}
    http = {"route_prefix": "/shapes", "port": PORT}
    with echo_deployment(NAME, options=options, http=http) as ref:
        yield ref.handle().info.remote().result(timeout_s=60)["http"]["url"]


def send(url, method, path, body=None):
    """(status, headers, raw text) of one request, as the server sent it."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, dict(err.headers), err.read().decode()


ANSWERS = answers(NAME)


@pytest.mark.parametrize(("path", "body", "route"), ANSWERS, ids=lambda v: str(v)[:40])
def test_every_answer_is_openais_body_for_its_route(url, path, body, route):
    status, _, text = send(url, "GET" if body is None else "POST", path, body)
    assert status == 200, text
    found = answer_problems(route, body, text)
    assert found == [], found


REFUSALS = refusals(NAME)


@pytest.mark.parametrize(("method", "path", "body", "status"), REFUSALS, ids=lambda v: str(v)[:30])
def test_every_refusal_is_openais_error_envelope(url, method, path, body, status):
    got, _, text = send(url, method, path, body)
    assert got == status, text
    found = error_problems(got, json.loads(text))
    assert found == [], found


def test_the_openai_client_reads_every_answer(url):
    """The same answers through the real client: it raises on none, and reads the fields the
    raw check found (refusal null, every chunk's finish_reason)."""
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "developer", "content": ""}]
    )
    assert chat.choices[0].message.refusal is None and chat.choices[0].message.content == ""
    assert "refusal" in chat.choices[0].message.model_fields_set  # sent, not defaulted
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "s t"}], stream=True
        )
    )
    assert all("finish_reason" in c.choices[0].model_fields_set for c in chunks if c.choices)
    got = client.embeddings.create(model=NAME, input=["aa b"] * 2048)  # base64, decoded
    assert len(got.data) == 2048 and got.data[-1].embedding[:2] == [2.0, 1.0]
    with pytest.raises(openai.BadRequestError) as err:
        client.embeddings.create(model=NAME, input=["a"] * 2049)
    assert err.value.body["param"] == "input" and "2048" in err.value.body["message"]


def test_an_engine_slower_than_the_request_timeout_is_a_504_and_its_work_cancelled():
    """Echo's engine takes far longer than the deployment's http.request_timeout_s: the
    client gets 504 in OpenAI's envelope, not retried (x-should-retry: false), and the row
    is no longer in the engine (its call was cancelled), whole answers and streams alike."""
    config = relayllm.DeploymentConfig(
        name="httpslow",
        backend="echo",
        options={"delay_s": 3600},
        http={"route_prefix": "/slow", "port": PORT, "request_timeout_s": 1},
    )
    ref = relayllm.deploy(config)
    try:
        info = ref.handle().info.remote().result(timeout_s=60)
        client = openai.OpenAI(base_url=info["http"]["url"], api_key="unused", max_retries=2)
        for stream in (False, True):
            with pytest.raises(openai.APIStatusError) as err:
                client.chat.completions.create(
                    model="httpslow", messages=[{"role": "user", "content": "x"}], stream=stream
                )
            assert err.value.status_code == 504, err.value
            assert err.value.body["code"] == "timeout"
            assert err.value.response.headers["x-should-retry"] == "false"
            assert error_problems(504, err.value.response.json()) == []
        after = ref.handle().info.remote().result(timeout_s=60)
        assert after["http"]["rows"] == 2  # sent once each: the client did not retry
        assert after["metrics"]["queue"]["running"] == 0, after["metrics"]  # cancelled
    finally:
        relayllm.shutdown("httpslow")
