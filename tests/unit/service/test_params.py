"""Every query parameter of the gateway's routes checked before it is used (through the
gateway, without Ray): a value of the wrong type, out of range or not one of the choices is a
400 naming the parameter in OpenAI's envelope, never a 500 (a huge number reaching SQLite, a
non-ASCII digit reaching ``int``)."""

from __future__ import annotations

import asyncio
import json
from urllib.parse import quote

import pytest

pytest.importorskip("starlette")

from starlette.requests import Request

from relayllm_service.gateway.app import Gateway
from relayllm_service.runner import actor as runner_module
from relayllm_service.settings import ServiceSettings
from relayllm_service.tenancy.keys import KeyMap

KEY_A, ADMIN_KEY = "alpha-key-" + "a" * 20, "admin-" + "z" * 20


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    start, runner_module.start_runner = runner_module.start_runner, lambda settings: None
    try:
        keys = KeyMap([("alpha", KEY_A)], admin=ADMIN_KEY)
        state = tmp_path_factory.mktemp("state")
        made = Gateway(ServiceSettings(state_dir=str(state)), keys)
    finally:
        runner_module.start_runner = start
    yield made
    made.store.close()


def get(gateway, path: str, query: str, key: str) -> tuple[int, dict]:
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "root_path": "",
        "query_string": query.encode("latin-1"),
        "headers": [(b"authorization", f"Bearer {key}".encode())],
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    return response.status_code, json.loads(response.body)


USAGE = "/v1/organization/usage/completions"
START = "start_time=1700000000"


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("start_time=-99999999999999999999999", "start_time"),
        ("start_time=99999999999999999999999", "start_time"),
        ("start_time=" + quote("١٧٠٠٠٠٠٠٠٠"), "start_time"),  # Arabic-Indic digits
        ("start_time=1_700_000_000", "start_time"),
        ("start_time=%201700000000", "start_time"),
        ("", "start_time"),
        (f"{START}&end_time=-1", "end_time"),
        (f"{START}&end_time=1e9", "end_time"),
        (f"{START}&end_time=1600000000", "end_time"),  # before start_time
        (f"{START}&page=" + quote("²"), "page"),
        (f"{START}&page=" + quote("١٧٠٠٠٠٠٠٠٠"), "page"),
        (f"{START}&page=-86400", "page"),
        (f"{START}&page=" + "9" * 2000, "page"),
        (f"{START}&limit=0", "limit"),
        (f"{START}&limit=-3", "limit"),
        (f"{START}&limit=32", "limit"),  # 31 buckets at most for 1d
        (f"{START}&bucket_width=1w", "bucket_width"),
        (f"{START}&group_by=user", "group_by"),
        (f"{START}&batch=maybe", "batch"),
        (f"{START}&user_ids=u", "user_ids"),
        (f"{START}&project_ids=" + ",".join(f"p{i}" for i in range(101)), "project_ids"),
        (f"{START}&models=" + "m" * 1025, "models"),
    ],
)
def test_a_bad_usage_parameter_is_a_400_naming_it(gateway, query, param):
    status, body = get(gateway, USAGE, query, ADMIN_KEY)
    assert (status, body["error"]["param"]) == (400, param), body
    assert body["error"]["type"] == "invalid_request_error"


def test_good_usage_parameters_answer_a_page(gateway):
    query = f"{START}&end_time=1700172800&bucket_width=1h&limit=48&group_by=model&batch=true"
    status, body = get(gateway, USAGE, query, ADMIN_KEY)
    assert status == 200 and len(body["data"]) == 48 and body["has_more"] is True
    query = f"{START}&end_time=1700172800&limit=1"
    status, first = get(gateway, USAGE, query, ADMIN_KEY)
    status, body = get(gateway, USAGE, f"{query}&page={first['next_page']}", ADMIN_KEY)
    assert status == 200 and body["data"][0]["start_time"] == int(first["next_page"])


@pytest.mark.parametrize(
    ("path", "query", "param"),
    [
        ("/v1/files", "limit=abc", "limit"),
        ("/v1/files", "limit=" + quote("٣"), "limit"),
        ("/v1/files", "limit=0", "limit"),
        ("/v1/files", "limit=10001", "limit"),
        ("/v1/files", "limit=99999999999999999999999", "limit"),
        ("/v1/files", "order=sideways", "order"),
        ("/v1/files", "purpose=nothing", "purpose"),
        ("/v1/files", "after=" + "f" * 1025, "after"),
        ("/v1/batches", "limit=101", "limit"),
        ("/v1/batches", "limit=-1", "limit"),
        ("/v1/batches", "limit=" + quote("٣"), "limit"),
        ("/v1/batches", "limit=1.5", "limit"),
    ],
)
def test_a_bad_list_parameter_is_a_400_naming_it(gateway, path, query, param):
    for key in (KEY_A, ADMIN_KEY):
        status, body = get(gateway, path, query, key)
        assert (status, body["error"]["param"]) == (400, param), (key == ADMIN_KEY, body)


def test_good_list_parameters_answer_a_list(gateway):
    for path, query in [
        ("/v1/files", "limit=5&order=asc&purpose=batch"),
        ("/v1/files", "purpose=fine-tune"),
        ("/v1/batches", "limit=100"),
    ]:
        status, body = get(gateway, path, query, KEY_A)
        assert status == 200 and body["object"] == "list", body
