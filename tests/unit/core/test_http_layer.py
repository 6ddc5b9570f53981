"""The HTTP layer both servers are route sets on (``relayllm/http/``), without a cluster:
routing under the root path, OpenAI's error envelope for every refusal, the two key
providers, the JSON-body reader; and the deployment front's control routes on a real echo
replica: none without ``admin_key_env``, and the sources ``update_weights`` and
``load_adapter`` may read over HTTP (docs/control.md, "Sources over HTTP")."""

from __future__ import annotations

import ast
import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("starlette")
pytest.importorskip("openai")

from starlette.requests import Request
from starlette.routing import Route

import relayllm
from relayllm.http.app import HttpApp, json_body, route_path
from relayllm.http.auth import SingleKey, project_of
from relayllm.http.errors import HttpError, UnauthorizedError, json_response
from relayllm.serving.http_config import HttpConfig
from relayllm_service.errors import UnauthorizedError as ServiceUnauthorized
from relayllm_service.tenancy.keys import KeyMap

pytestmark = pytest.mark.usefixtures("echo_backend")

KEY = "k" * 24
ADMIN = "a" * 24


def call(app, method, path, body=None, headers=(), root_path=""):
    """One request through ``app`` (anything with ``__call__(request) -> Response``, as
    Serve's replica calls it): (status, JSON body, headers)."""
    raw = b"" if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    scope = {
        "type": "http",
        "method": method,
        "path": root_path + path,
        "root_path": root_path,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    sent = [raw]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(app(Request(scope, receive)))
    return response.status_code, json.loads(response.body), dict(response.headers)


async def echo_path(request):
    return json_response({"path": route_path(request), **request.path_params})


async def boom(request):
    raise RuntimeError("/secret/server/path failed")


async def body_of(request):
    return json_response(await json_body(request))


async def keyed(request):
    return json_response({"project": project_of(request, request.app_keys)})


APP = HttpApp(
    [
        Route("/v1/things", echo_path, methods=["GET"]),
        Route("/v1/things/{thing_id}", echo_path, methods=["GET", "DELETE"]),
        Route("/v1/boom", boom),
        Route("/v1/body", body_of, methods=["POST"]),
    ]
)


def test_routes_match_under_the_root_path_with_or_without_a_trailing_slash():
    for root in ("", "/api"):
        assert call(APP.respond, "GET", "/v1/things/", root_path=root)[:2] == (
            200,
            {"path": "/v1/things"},
        )
        status, body, _ = call(APP.respond, "DELETE", "/v1/things/x1", root_path=root)
        assert (status, body) == (200, {"path": "/v1/things/x1", "thing_id": "x1"})


def test_every_refusal_is_openais_envelope():
    status, body, _ = call(APP.respond, "GET", "/v1/nowhere")
    assert status == 404 and set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "not_found" and "/v1/things" in body["error"]["message"]
    status, body, headers = call(APP.respond, "POST", "/v1/things")
    assert status == 405 and headers["allow"] == "GET, HEAD" and "GET" in body["error"]["message"]
    # An unexpected error: a 500 whose text (a path here) stays in the server's log.
    status, body, _ = call(APP.respond, "GET", "/v1/boom")
    assert status == 500 and body["error"]["type"] == "server_error"
    assert "secret" not in json.dumps(body)


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"{not json", "not JSON"), (b"[1, 2]", "JSON object"), (b"", "not JSON")],
)
def test_the_json_body_reader_refuses_what_is_not_an_object(raw, message):
    status, body, _ = call(APP.respond, "POST", "/v1/body", raw)
    assert status == 400 and message in body["error"]["message"]
    assert body["error"]["type"] == "invalid_request_error"


def test_the_two_key_providers_answer_the_same_header_the_same_way():
    single, anyone = SingleKey(KEY), SingleKey(None)
    keymap = KeyMap([("alpha", KEY)])
    for provider, project in ((single, "default"), (keymap, "alpha")):
        assert provider.project_for_header(f"Bearer {KEY}") == project
        assert provider.project_for_header(f"bearer  {KEY} ") == project
        for header in (None, "", "Bearer", f"Basic {KEY}", "Bearer wrong-key-" + "x" * 16):
            with pytest.raises(UnauthorizedError) as refused:
                provider.project_for_header(header)
            assert KEY not in str(refused.value)
    with pytest.raises(ServiceUnauthorized):  # the service's type, for its own callers
        keymap.project_for_header("Basic x")
    assert anyone.project_for_header("Basic whatever") == "default"  # no key asked
    assert KEY not in repr(single) + repr(keymap)


def test_an_unauthorized_error_is_a_401_invalid_api_key():
    async def refuse(request):
        raise UnauthorizedError("the API key is not valid")

    status, body, _ = call(HttpApp([Route("/v1/x", refuse)]).respond, "GET", "/v1/x")
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert isinstance(HttpError(400, "m").body()["error"], dict)


# -- the deployment front's control routes, on a real echo replica ----------------------------


def replica(monkeypatch, **http):
    from relayllm.testing.echo import EchoDeployment
    from relayllm.testing.echo_options import EchoOptions

    monkeypatch.setenv("RELAYLLM_UNIT_KEY", KEY)
    monkeypatch.setenv("RELAYLLM_UNIT_ADMIN", ADMIN)
    config = {"api_key_env": "RELAYLLM_UNIT_KEY", **http}
    return EchoDeployment(EchoOptions(), {"name": "unit", "http": config})


def test_without_admin_key_env_every_control_route_answers_404(monkeypatch):
    echo = replica(monkeypatch)
    for method in ("POST", "GET", "PUT"):
        for path in ("/admin/pause", "/admin/update_weights", "/admin/nothing"):
            for key in (KEY, ADMIN, None):
                headers = [("Authorization", f"Bearer {key}")] if key else []
                status, body, _ = call(echo.http_front, method, path, {}, headers, "/unit")
                assert (status, body["error"]["code"]) == (404, "not_found"), (method, path)
    assert echo.paused is None
    assert (
        call(echo.http_front, "GET", "/v1/models", None, [("Authorization", f"Bearer {KEY}")])[0]
        == 200
    )


TRICKS = [
    "/models/../etc",
    "/models/a/../../etc",
    "/models/%2e%2e/etc",
    "/models/..%2Fetc",
    "/models/%252e%252e/etc",
    "/models\\..\\etc",
    "models/tiny",
    "~/models/tiny",
    "/elsewhere/tiny",
    "/modelsX/tiny",
    "file:///etc",
    "http://169.254.169.254/latest",
    "s3://other-bucket/ckpt",
    "s3://bucket/ckpt/../../x",
]


@pytest.mark.parametrize("source", TRICKS)
@pytest.mark.parametrize(
    ("call_name", "param"), [("update_weights", "source"), ("load_adapter", "path")]
)
def test_a_source_outside_admin_sources_is_refused_before_any_replica_is_asked(
    monkeypatch, source, call_name, param
):
    echo = replica(
        monkeypatch,
        admin_key_env="RELAYLLM_UNIT_ADMIN",
        admin_sources=["/models", "s3://bucket/ckpt"],
    )
    arguments = {
        param: source,
        **({"version": 3} if call_name == "update_weights" else {"name": "t"}),
    }
    headers = [("Authorization", f"Bearer {ADMIN}")]
    status, body, _ = call(echo.http_front, "POST", f"/admin/{call_name}", arguments, headers)
    assert (status, body["error"]["code"]) == (403, "source_not_allowed"), body
    assert echo.weight_version is None and echo.runtime_adapters == {}  # nothing loaded


def test_no_admin_sources_refuses_every_source_over_http(monkeypatch):
    echo = replica(monkeypatch, admin_key_env="RELAYLLM_UNIT_ADMIN")
    headers = [("Authorization", f"Bearer {ADMIN}")]
    status, body, _ = call(
        echo.http_front,
        "POST",
        "/admin/update_weights",
        {"source": "/models/x", "version": 1},
        headers,
    )
    assert status == 403 and "admin_sources" in body["error"]["message"]
    # The API key does not open the control routes at all.
    status, body, _ = call(
        echo.http_front, "POST", "/admin/pause", {}, [("Authorization", f"Bearer {KEY}")]
    )
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")


def test_the_source_policy_admits_what_lies_under_a_root():
    config = HttpConfig(admin_sources=["/models", "s3://bucket/ckpt", "file:///data"])
    for source in ("/models", "/models/tiny", "/models//tiny/./v2/", "s3://bucket/ckpt/step-7",
                   "S3://bucket/ckpt", "file:///data/x"):  # fmt: skip
        assert config.source_problem("update_weights", {"source": source}) is None, source
    assert config.source_problem("pause", {"mode": "wait"}) is None  # reads no source
    with pytest.raises(ValueError, match="absolute directory or a URI"):
        HttpConfig(admin_sources=["models"])
    with pytest.raises(ValueError, match="absolute directory or a URI"):
        HttpConfig(admin_sources=["/models/../etc"])


def test_the_front_knows_its_host_by_a_protocol_not_the_replica_class():
    """The import circle serving/http_front.py <-> serving/replica.py is gone, even under
    TYPE_CHECKING: the front is typed by relayllm.http.host.FrontHost."""
    import relayllm_service.gateway.app as gateway

    source = Path(relayllm.__file__).parent
    for module in (
        source / "serving/http_front.py",
        Path(gateway.__file__),
        source / "http/host.py",
    ):
        tree = ast.parse(module.read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
            a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
        }
        assert "relayllm.serving.replica" not in imported, module
        assert "getattr(self.host" not in module.read_text()


def test_a_refusal_retrying_cannot_mend_says_so_and_one_time_mends_says_when():
    """The openai client retries 408, 409, 429 and 5xx unless ``x-should-retry: false``."""
    from relayllm.http.errors import refusal_headers

    assert refusal_headers(400) == {"x-should-retry": "false"}
    assert refusal_headers(429) == {"x-should-retry": "false"}  # no Retry-After: permanent
    assert refusal_headers(429, {"Retry-After": "7"}) == {"Retry-After": "7"}
    assert refusal_headers(404, {"X-Should-Retry": "true"}) == {"X-Should-Retry": "true"}
    assert refusal_headers(408) == {} and refusal_headers(409) == {}
    assert refusal_headers(200) == {} and refusal_headers(500) == {}
    status, _, headers = call(APP.respond, "POST", "/v1/body", b"[" * 200 + b"]" * 200)
    assert status == 400 and headers.get("x-should-retry") == "false"
