"""Stored records the current doors would refuse, as an older relayllm (or another program)
may have written them: a batch's metadata holding a lone surrogate, a filename that is not
UTF-8, a metadata column that is not JSON at all. Put in the store directly, they must not
break a list: every other project's lists, the admin key's list of every project and the
console answer 200; the damaged record itself is shown with U+FFFD, or left out and logged
when it cannot be read at all. Through the gateway, without Ray."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

pytest.importorskip("starlette")

from starlette.requests import Request

from relayllm_service.console import routes as console_module
from relayllm_service.gateway.app import Gateway
from relayllm_service.runner import actor as runner_module
from relayllm_service.settings import ServiceSettings
from relayllm_service.tenancy.keys import KeyMap

KEY_A, KEY_B, ADMIN_KEY = "alpha-key-" + "a" * 20, "beta-key-" + "b" * 20, "admin-" + "z" * 20


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    monkeypatch.setattr(console_module, "_deployments", lambda: ([], None))
    keys = KeyMap([("alpha", KEY_A), ("beta", KEY_B)], admin=ADMIN_KEY)
    made = Gateway(ServiceSettings(state_dir=str(tmp_path)), keys)
    yield made
    made.store.close()


def get(gateway, path: str, key: str):
    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": [(b"authorization", f"Bearer {key}".encode())],
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    return asyncio.run(gateway(Request(scope, receive)))


def batch(gateway, project: str, metadata: dict | None = None) -> str:
    store = gateway.store
    upload = store.add_file(project, filename="in.jsonl", purpose="batch", bytes=3)
    made = store.create_batch(
        project, input_file_id=upload.id, endpoint="/v1/chat/completions", metadata=metadata
    )
    return made.id


def damage(gateway, sql: str, *args) -> None:
    """A write straight to the store's file, past every check (an older version's row)."""
    with gateway.store.write() as db:
        db.execute(sql, args)


def lists(gateway, key: str) -> dict[str, dict]:
    answers = {}
    for path in ("/v1/batches", "/v1/files", "/console"):
        response = get(gateway, path, key)
        assert response.status_code == 200, (path, response.body[:300])
        if path != "/console":
            answers[path] = json.loads(response.body)
        else:
            answers[path] = {"html": response.body.decode("utf-8")}
    return answers


def test_a_stored_lone_surrogate_breaks_no_list_and_is_shown_with_a_replacement(gateway, caplog):
    good = batch(gateway, "alpha", {"note": "fine"})
    bad = batch(gateway, "beta", {"note": "fine"})
    damage(gateway, "UPDATE batches SET metadata = ? WHERE id = ?", '{"note": "x\\udc80y"}', bad)
    not_utf8 = "UPDATE files SET filename = CAST(X'696EEDB380' AS TEXT) WHERE project = 'beta'"
    damage(gateway, not_utf8)
    with caplog.at_level(logging.WARNING):
        alpha, beta, admin = (lists(gateway, key) for key in (KEY_A, KEY_B, ADMIN_KEY))
    assert [b["id"] for b in alpha["/v1/batches"]["data"]] == [good]
    assert [b["id"] for b in beta["/v1/batches"]["data"]] == [bad]
    assert {b["id"] for b in admin["/v1/batches"]["data"]} == {good, bad}
    shown = {b["id"]: b["metadata"] for b in admin["/v1/batches"]["data"]}
    assert shown[bad] == {"note": "x\ufffdy"} and shown[good] == {"note": "fine"}
    assert beta["/v1/batches"]["data"][0]["metadata"] == {"note": "x\ufffdy"}
    names = {f["filename"] for f in admin["/v1/files"]["data"]}
    assert names == {"in.jsonl", "in\ufffd\ufffd\ufffd"}  # one U+FFFD per undecodable byte
    assert bad in admin["/console"]["html"] and good in admin["/console"]["html"]
    # a lookup by id answers too, for its project and the admin
    for key in (KEY_B, ADMIN_KEY):
        response = get(gateway, f"/v1/batches/{bad}", key)
        assert response.status_code == 200
        assert json.loads(response.body)["metadata"] == {"note": "x\ufffdy"}
    assert any("not UTF-8" in record.getMessage() for record in caplog.records)


def test_a_stored_row_that_cannot_be_read_is_left_out_of_lists_and_logged(gateway, caplog):
    good = batch(gateway, "alpha")
    bad = batch(gateway, "beta")
    damage(gateway, "UPDATE batches SET metadata = ? WHERE id = ?", "{not json", bad)
    with caplog.at_level(logging.ERROR):
        admin = lists(gateway, ADMIN_KEY)
        beta = lists(gateway, KEY_B)
        alpha = lists(gateway, KEY_A)
    assert [b["id"] for b in admin["/v1/batches"]["data"]] == [good]
    assert beta["/v1/batches"]["data"] == [] and len(alpha["/v1/batches"]["data"]) == 1
    assert any(bad in record.getMessage() for record in caplog.records)
