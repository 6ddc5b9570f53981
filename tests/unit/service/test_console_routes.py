"""The console's server side without Ray or a browser (tests/console drives it in Chromium):
the page escapes what clients wrote, a session cookie is signed and expires, a forged one or
a wrong key gets the sign-in page, and a project's session sees only its project."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("starlette")

from starlette.requests import Request

from relayllm_service.console import routes as console_module
from relayllm_service.gateway.app import Gateway
from relayllm_service.runner import actor as runner_module
from relayllm_service.settings import ServiceSettings
from relayllm_service.tenancy.keys import ADMIN, KeyMap

KEY_A, KEY_B, ADMIN_KEY = "alpha-key-" + "a" * 20, "beta-key-" + "b" * 20, "admin-" + "z" * 20
HOSTILE = '<script>alert(1)</script>"><img src=x onerror=alert(2)>'


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    monkeypatch.setattr(console_module, "_deployments", lambda: ([], None))
    keys = KeyMap([("alpha", KEY_A), ("beta", KEY_B)], admin=ADMIN_KEY)
    made = Gateway(ServiceSettings(state_dir=str(tmp_path)), keys)
    yield made
    made.store.close()


def call(gateway, method, path, *, body=b"", headers=(), root=""):
    scope = {
        "type": "http",
        "method": method,
        "path": root + path,
        "root_path": root,
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers],
    }
    sent = [body]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    return asyncio.run(gateway(Request(scope, receive)))


def sign_in(gateway, key, root=""):
    form = f"key={key}".encode()
    headers = [("content-type", "application/x-www-form-urlencoded")]
    return call(gateway, "POST", "/console/login", body=form, headers=headers, root=root)


def batch(gateway, project, metadata=None):
    store = gateway.store
    upload = store.add_file(project, filename="in.jsonl", purpose="batch", bytes=3)
    return store.create_batch(
        project,
        input_file_id=upload.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata=metadata,
    )


def test_a_batchs_metadata_is_shown_as_text(gateway):
    made = batch(gateway, "alpha", {"note": HOSTILE})
    page = call(gateway, "GET", "/console", headers=[("authorization", f"Bearer {ADMIN_KEY}")])
    text = page.body.decode()
    assert page.status_code == 200 and made.id in text
    assert HOSTILE not in text and "<img" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&gt;&lt;img src=x" in text
    assert text.count("<script>") == 1  # the page's own, allowed by its hash alone
    policy = page.headers["content-security-policy"]
    assert "script-src 'sha256-" in policy and "unsafe-inline" not in policy.split("script-src")[1]


def test_sign_in_sets_a_signed_http_only_strict_cookie_under_the_prefix(gateway):
    batch(gateway, "alpha")
    made_b = batch(gateway, "beta")
    signed = sign_in(gateway, KEY_B, root="/api")
    assert signed.status_code == 303 and signed.headers["location"] == "/api/console"
    cookie = signed.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/api/console" in cookie
    assert KEY_B not in cookie
    value = cookie.split(";")[0].split("=", 1)[1]
    page = call(gateway, "GET", "/console", headers=[("cookie", f"relayllm_console={value}")])
    text = page.body.decode()
    assert page.status_code == 200 and made_b.id in text and 'data-project="alpha"' not in text
    # one character changed: no session
    forged = value[:-2] + ("A" if value[-2] != "A" else "B") + value[-1]
    refused = call(gateway, "GET", "/console", headers=[("cookie", f"relayllm_console={forged}")])
    assert refused.status_code == 401 and 'name="key"' in refused.body.decode()


def test_a_wrong_key_no_key_and_an_expired_session_get_the_sign_in_page(gateway, monkeypatch):
    assert sign_in(gateway, "wrong-" + "w" * 20).status_code == 401
    assert "set-cookie" not in sign_in(gateway, "wrong-" + "w" * 20).headers
    assert call(gateway, "GET", "/console").status_code == 401
    wrong = call(gateway, "GET", "/console", headers=[("authorization", "Bearer nope-" + "n" * 20)])
    assert wrong.status_code == 401
    console = gateway.console
    old = console._sign(ADMIN, int(time.time()) - 1, ADMIN_KEY)
    assert console._session(old) is None
    assert console._session(console._sign(ADMIN, int(time.time()) + 60, ADMIN_KEY)) == ADMIN
    assert console._session(console._sign(ADMIN, int(time.time()) + 60, KEY_A)) is None
    for junk in ("", "x", "a.b.c", "!!.!!"):
        assert console._session(junk) is None


def test_a_session_ends_when_its_key_is_rotated_out_of_the_keys_file(tmp_path, monkeypatch):
    """The cookie names the project; the key it signed in with must still be the project's."""
    import os

    from relayllm_service.tenancy.projects import service_keys

    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    monkeypatch.setattr(console_module, "_deployments", lambda: ([], None))
    path = tmp_path / "keys.txt"
    path.write_text(f"alpha={KEY_A}\n")
    keys = service_keys({"RELAYLLM_ADMIN_KEY": ADMIN_KEY}, str(path))
    made = Gateway(ServiceSettings(state_dir=str(tmp_path / "state")), keys)
    try:
        cookie = sign_in(made, KEY_A).headers["set-cookie"].split(";")[0]
        assert call(made, "GET", "/console", headers=[("cookie", cookie)]).status_code == 200
        (tmp_path / "keys.new").write_text(f"alpha={KEY_B}\n")
        os.replace(tmp_path / "keys.new", path)
        assert call(made, "GET", "/console", headers=[("cookie", cookie)]).status_code == 401
        assert sign_in(made, KEY_A).status_code == 401
        assert sign_in(made, KEY_B).status_code == 303
    finally:
        made.store.close()


def test_a_download_is_the_files_bytes_for_its_project_only(gateway):
    stored = gateway.storage
    record = gateway.store.add_file("alpha", filename="out.jsonl", purpose="batch_output", bytes=4)
    stored.put(record.id, [b"abc\n"])
    path = f"/console/files/{record.id}"
    own = call(gateway, "GET", path, headers=[("authorization", f"Bearer {KEY_A}")])
    assert own.status_code == 200
    assert "attachment" in own.headers["content-disposition"]
    other = call(gateway, "GET", path, headers=[("authorization", f"Bearer {KEY_B}")])
    assert other.status_code == 404
    assert call(gateway, "GET", path).status_code == 401


def test_a_batchs_tokens_are_the_usage_ledgers(gateway):
    from relayllm_service.tenancy.usage import Use, _add

    made, idle = batch(gateway, "alpha"), batch(gateway, "alpha")
    with gateway.ledger.write() as db:
        _add(db, "alpha", made.id, "echo", 60, Use(3, 1200, 0, 30))
        _add(db, "alpha", made.id, "other", 120, Use(1, 5, 0, 4))
    page = call(gateway, "GET", "/console", headers=[("authorization", f"Bearer {KEY_A}")])
    text = page.body.decode()
    row = text.split(f'data-batch="{made.id}"')[1].split("</tr>")[0]
    assert '<td class="num tokens">1,205 / 34</td>' in row
    other = text.split(f'data-batch="{idle.id}"')[1].split("</tr>")[0]
    assert '<td class="num tokens">-</td>' in other
