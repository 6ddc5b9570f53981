"""The gateway's online routes answer OpenAI's bodies (docs/batch-service.md): the same
requests as the HTTP front's check (tests/core/test_http_shapes_on_ray.py), sent to
``relayllm serve``'s base URL with a project's key and read raw, each checked against the
``openai`` package's type for its route with every field OpenAI's schema requires
(tests/openai_shapes.py); the refusals are OpenAI's envelope.
An embeddings request of OpenAI's most inputs (2048) answers here too: the gateway reaches
the deployment in one handle call for all of them (``serve_http_rows``), where one call per
input took longer than this client waits on a loaded host."""

import json
import urllib.error
import urllib.request

import pytest
from batch_api import PROJECT_KEYS, serve_echo
from openai_shapes import answer_problems, answers, error_problems, refusals
from support import cli

pytestmark = pytest.mark.usefixtures("ray_session")

pytest.importorskip("openai")

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
    options:
      fail_marker: POISON
      features: [logprobs, n, structured_outputs.json, structured_outputs.choice]
"""


@pytest.fixture(scope="module")
def url(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("online-shapes")
    base, address, _ = serve_echo(ray_session, root, DEPLOYMENTS)
    yield base
    cli("unserve", "--address", address, check=0)
    from ray import serve

    serve.shutdown()  # its proxy too: a module after this one starts Serve on its own port


def send(url, method, path, body=None):
    """(status, raw text) of one request of project alpha, as the gateway sent it."""
    data = None if body is None else json.dumps(body).encode()
    headers = {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {PROJECT_KEYS['alpha']}",
    }
    request = urllib.request.Request(url + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


@pytest.mark.parametrize(("path", "body", "route"), answers("echo"), ids=lambda v: str(v)[:40])
def test_every_online_answer_is_openais_body_for_its_route(url, path, body, route):
    status, text = send(url, "GET" if body is None else "POST", path, body)
    assert status == 200, text
    found = answer_problems(route, body, text)
    assert found == [], found


@pytest.mark.parametrize(
    ("method", "path", "body", "status"), refusals("echo"), ids=lambda v: str(v)[:30]
)
def test_every_online_refusal_is_openais_error_envelope(url, method, path, body, status):
    got, text = send(url, method, path, body)
    assert got == status, text
    found = error_problems(got, json.loads(text))
    assert found == [], found
