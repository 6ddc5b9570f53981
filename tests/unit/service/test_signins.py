"""Failed sign-ins limited per client address (issue 48): repeated bad keys, through the API's
header, the console's form or its header, get 429 with ``Retry-After`` (a good key from the
same address too, until the window passes); another address and a missing key are not
counted; the count is by a clock the test sets, not by waiting."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("starlette")

from starlette.requests import Request

from relayllm_service.console import routes as console_module
from relayllm_service.gateway.app import Gateway
from relayllm_service.runner import actor as runner_module
from relayllm_service.settings import ServiceSettings
from relayllm_service.tenancy.keys import KeyMap

KEY_A, ADMIN_KEY = "alpha-key-" + "a" * 20, "admin-" + "z" * 20
BAD = "guess-" + "g" * 20
#: The limit as docs/batch-service.md states it, not as the module's constants say: a
#: changed limit fails here until the docs say so too.
MAX_FAILURES, WINDOW_S = 10, 60
DOCUMENTED = "after 10 failures within 60 seconds"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    monkeypatch.setattr(console_module, "_deployments", lambda: ([], None))
    made = Gateway(
        ServiceSettings(state_dir=str(tmp_path)), KeyMap([("alpha", KEY_A)], admin=ADMIN_KEY)
    )
    made.signins.clock = Clock()
    yield made
    made.store.close()


def call(gateway, method, path, *, key=None, body=b"", client="10.0.0.1", form=False):
    headers = [(b"authorization", f"Bearer {key}".encode())] if key else []
    if form:
        headers.append((b"content-type", b"application/x-www-form-urlencoded"))
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": (client, 40000),
    }
    sent = [body]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    return asyncio.run(gateway(Request(scope, receive)))


def sign_in(gateway, key, client="10.0.0.1"):
    return call(
        gateway, "POST", "/console/login", body=f"key={key}".encode(), form=True, client=client
    )


def test_the_limit_tested_is_the_documented_one():
    page = (Path(__file__).resolve().parents[3] / "docs" / "batch-service.md").read_text()
    assert DOCUMENTED in " ".join(page.split())


def test_repeated_bad_keys_on_the_api_get_429_with_retry_after_then_the_window_passes(gateway):
    for _ in range(MAX_FAILURES):
        assert call(gateway, "GET", "/v1/files", key=BAD).status_code == 401
    refused = call(gateway, "GET", "/v1/files", key=BAD)
    assert refused.status_code == 429
    assert int(refused.headers["retry-after"]) == WINDOW_S
    assert b"rate_limit_exceeded" in refused.body
    good = call(gateway, "GET", "/v1/files", key=KEY_A)  # a right guess looks the same
    assert good.status_code == 429
    assert call(gateway, "GET", "/v1/files", key=KEY_A, client="10.0.0.2").status_code == 200
    gateway.signins.clock.now += WINDOW_S
    assert call(gateway, "GET", "/v1/files", key=KEY_A).status_code == 200


def test_no_key_is_no_guess(gateway):
    for _ in range(3 * MAX_FAILURES):
        assert call(gateway, "GET", "/v1/files").status_code == 401
    assert call(gateway, "GET", "/v1/files", key=KEY_A).status_code == 200


def test_repeated_bad_keys_at_the_console_sign_in_get_429(gateway):
    for _ in range(MAX_FAILURES):
        assert sign_in(gateway, BAD).status_code == 401
    refused = sign_in(gateway, ADMIN_KEY)
    assert refused.status_code == 429 and int(refused.headers["retry-after"]) >= 1
    assert "set-cookie" not in refused.headers
    assert call(gateway, "GET", "/console", key=ADMIN_KEY).status_code == 429
    assert sign_in(gateway, ADMIN_KEY, client="10.0.0.9").status_code == 303


def test_the_console_and_the_api_count_together(gateway):
    for n in range(MAX_FAILURES):
        bad = sign_in(gateway, BAD) if n % 2 else call(gateway, "GET", "/console", key=BAD)
        assert bad.status_code == 401
    assert call(gateway, "GET", "/v1/batches", key=KEY_A).status_code == 429
