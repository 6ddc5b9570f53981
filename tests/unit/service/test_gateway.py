"""The gateway's HTTP handling without Ray (its runner patched out): an upload without a
Content-Length is refused before its body is read."""

from __future__ import annotations

import asyncio
import json

import pytest

pytest.importorskip("starlette")
pytest.importorskip("multipart")

from starlette.requests import Request

from relayllm_service.gateway.app import Gateway
from relayllm_service.runner import actor as runner_module
from relayllm_service.settings import ServiceSettings
from relayllm_service.tenancy.keys import KeyMap

BOUNDARY = "xyz"
BODY = (
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
    f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
    f"Content-Type: application/jsonl\r\n\r\n"
    '{"custom_id": "a"}\n\r\n'
    f"--{BOUNDARY}--\r\n"
).encode()


@pytest.fixture
def gateway(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    return Gateway(ServiceSettings(state_dir=str(tmp_path)), KeyMap(anonymous="alpha"))


def upload(gateway, body: bytes, length: bool):
    headers = [(b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode())]
    if length:
        headers.append((b"content-length", str(len(body)).encode()))
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    sent = [body]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    return response.status_code, json.loads(response.body)


def test_an_upload_without_content_length_is_refused_with_411(gateway):
    status, body = upload(gateway, BODY, length=False)
    assert status == 411 and "Content-Length" in body["error"]["message"]
    assert gateway.store.list_files("alpha").data == []


def test_an_upload_with_content_length_is_stored(gateway):
    status, body = upload(gateway, BODY, length=True)
    assert status == 200 and body["purpose"] == "batch" and body["bytes"] > 0


def test_models_lists_the_deployment_names_routing_matches(gateway, monkeypatch):
    """A deployment with its own http.model_name is listed (and answers) under its
    deployment name here: the id a client sees in /v1/models is one routing accepts."""
    from relayllm import deployments
    from relayllm_service.runner import job as runner

    class Method:
        def __init__(self, value):
            self.value = value

        async def remote(self):
            return self.value

    class Handle:
        describe = Method({"http": {"model_name": "their-own-name"}, "backend": "echo"})
        info = Method({"backend": "echo"})

    monkeypatch.setattr(runner, "deployment_names", lambda: ["smollm"])
    monkeypatch.setattr(deployments, "handle_for", lambda name: Handle())
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/models",
        "root_path": "",
        "query_string": b"",
        "headers": [],
    }

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    assert [m["id"] for m in json.loads(response.body)["data"]] == ["smollm"]


def test_an_online_request_to_a_known_deployment_skips_serves_status(gateway, monkeypatch):
    from relayllm_service.runner import job as runner

    def no_status():
        raise AssertionError("serve.status() asked on the hot path")

    class Front:
        async def answer(self, route, request):
            from starlette.responses import JSONResponse

            return JSONResponse({"ok": True})

    monkeypatch.setattr(runner, "deployment_names", no_status)
    gateway.fronts["smollm"] = Front()
    body = json.dumps({"model": "smollm", "messages": []}).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    sent = [body]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    assert response.status_code == 200 and json.loads(response.body) == {"ok": True}


def form_with(fields: dict[str, str]) -> bytes:
    extra = "".join(
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{k}"\r\n\r\n{v}\r\n'
        for k, v in fields.items()
    )
    return extra.encode() + BODY


def test_an_upload_takes_openais_expires_after_within_its_bounds(gateway):
    fields = {"expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    status, body = upload(gateway, form_with(fields), length=True)
    assert status == 200 and body["expires_at"] == body["created_at"] + 3600
    for seconds in ("59", "2592001", "soon"):
        fields["expires_after[seconds]"] = seconds
        status, body = upload(gateway, form_with(fields), length=True)
        assert status == 400 and body["error"]["param"] == "expires_after", seconds
    fields = {"expires_after[anchor]": "last_active_at", "expires_after[seconds]": "3600"}
    assert upload(gateway, form_with(fields), length=True)[0] == 400
    status, body = upload(gateway, BODY, length=True)
    assert status == 200 and body["expires_at"] is None  # none asked: kept


def create(gateway, body: dict):
    raw = json.dumps(body).encode()
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/batches",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    sent = [raw]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    return response.status_code, json.loads(response.body)


def test_a_batchs_output_expiry_is_the_one_asked_else_the_servers_default(tmp_path, monkeypatch):
    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    monkeypatch.setattr(runner_module, "find_runner", lambda name: None)
    settings = ServiceSettings(state_dir=str(tmp_path), output_expires_s=7200)
    gateway = Gateway(settings, KeyMap(anonymous="alpha"))
    gateway.runner = type("Runner", (), {"wake": type("W", (), {"remote": lambda: None})})()
    status, uploaded = upload(gateway, BODY, length=True)
    assert status == 200
    base = {"input_file_id": uploaded["id"], "endpoint": "/v1/chat/completions"}
    status, batch = create(gateway, base)
    assert status == 200
    assert gateway.store.get_batch("alpha", batch["id"]).output_expires_s == 7200  # default
    asked = {**base, "output_expires_after": {"anchor": "created_at", "seconds": 3600}}
    status, batch = create(gateway, asked)
    assert status == 200
    assert gateway.store.get_batch("alpha", batch["id"]).output_expires_s == 3600
    too_short = {**base, "output_expires_after": {"anchor": "created_at", "seconds": 60}}
    status, error = create(gateway, too_short)
    assert status == 400 and error["error"]["param"] == "output_expires_after"


# -- uploads parsed as they arrive ---------------------------------------------------------


def upload_in_pieces(gateway, body: bytes, piece: int, unread: list[int] | None = None):
    """``body`` as ASGI messages of ``piece`` bytes (the proxy hands a body on in pieces)."""
    headers = [
        (b"content-type", f"multipart/form-data; boundary={BOUNDARY}".encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    pieces = [body[i : i + piece] for i in range(0, len(body), piece)]
    pieces.reverse()

    async def receive():
        chunk = pieces.pop() if pieces else b""
        return {"type": "http.request", "body": chunk, "more_body": bool(pieces)}

    response = asyncio.run(gateway(Request(scope, receive)))
    if unread is not None:
        unread.append(len(pieces))  # the messages the gateway never asked for
    return response.status_code, json.loads(response.body)


END = f"--{BOUNDARY}--\r\n".encode()


def file_form(content: bytes, before: str = "purpose", purpose: str = "batch") -> bytes:
    field = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n{purpose}\r\n'
    part = (
        (
            f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n'
            "Content-Type: application/octet-stream\r\n\r\n"
        ).encode()
        + content
        + b"\r\n"
    )
    if before == "purpose":
        return field.encode() + part + END
    return part + field.encode() + END


def stored_names(gateway) -> list[str]:
    import os

    return sorted(os.listdir(gateway.settings.files_location))


def spy_writes(gateway, monkeypatch) -> list[int]:
    """The size of each piece the upload wrote to storage."""
    from relayllm_service.store.files import FileWriter

    sizes: list[int] = []
    write = FileWriter.write

    def recording(self, piece):
        sizes.append(len(piece))
        return write(self, piece)

    monkeypatch.setattr(FileWriter, "write", recording)
    return sizes


def test_a_multi_mb_upload_arriving_in_pieces_round_trips_exactly(gateway, monkeypatch):
    """Bytes that look like the boundary's start, CRLFs and every byte value, in odd-sized
    messages: the stored file is the part's bytes exactly, written in pieces of about a
    CHUNK (never whole), and the fields after the file are read too."""
    import random

    from relayllm_service.store.files import CHUNK

    rng = random.Random(7)
    tricky = f"\r\n--{BOUNDARY[:-1]}\r\n--{BOUNDARY}_\r\n-\r\n".encode()  # never a delimiter
    content = b"".join(rng.randbytes(rng.randrange(1, 5000)) + tricky for _ in range(1200))  # ~3 MB
    assert len(content) > 2 * CHUNK
    sizes = spy_writes(gateway, monkeypatch)
    for before in ("purpose", "file"):
        status, body = upload_in_pieces(gateway, file_form(content, before), piece=7919)
        assert status == 200, body
        assert body["bytes"] == len(content) and body["filename"] == "big.jsonl"
        with gateway.storage.open(body["id"]) as stored:
            assert stored.read() == content
    assert max(sizes) < CHUNK + 7919, "the file was held whole before it was written"
    assert len(sizes) >= 2 * (len(content) // (CHUNK + 7919))


def test_an_upload_over_the_storage_limit_is_refused_as_it_crosses_it_and_keeps_nothing(
    tmp_path, monkeypatch
):
    """A Content-Length under the limit plus the form's room, a file over the limit: refused
    with the limit named once the bytes cross it, with no bytes or record kept."""
    monkeypatch.setattr(runner_module, "start_runner", lambda settings: None)
    settings = ServiceSettings(state_dir=str(tmp_path), max_file_bytes=100_000)
    gateway = Gateway(settings, KeyMap(anonymous="alpha"))
    body = file_form(b"x" * 150_000)
    unread: list[int] = []
    status, error = upload_in_pieces(gateway, body, piece=10_000, unread=unread)
    assert status == 413, error
    assert "100,000 bytes" in error["error"]["message"] and error["error"]["param"] == "file"
    assert stored_names(gateway) == [] and gateway.store.list_files("alpha").data == []
    assert unread[0] >= 3, "the body was read to its end before the limit stopped it"
    # the same file under the limit is stored
    assert upload_in_pieces(gateway, file_form(b"x" * 100_000), piece=10_000)[0] == 200


@pytest.mark.parametrize(
    "case, body, param",
    [
        ("purpose", file_form(b"abc\n" * 1000, purpose="fine-tune"), "purpose"),
        ("purpose after", file_form(b"abc\n" * 1000, before="file", purpose="x"), "purpose"),
        ("cut short", file_form(b"abc\n" * 1000)[:-300], None),
        ("no file", form_with({"purpose": "batch"})[: -len(BODY)] + END, "file"),
        ("two files", file_form(b"a\n")[: -len(END)] + BODY, "file"),
        ("not multipart", b"not a form at all", None),
    ],
)
def test_a_refused_upload_keeps_no_bytes(gateway, case, body, param):
    status, error = upload_in_pieces(gateway, body, piece=333)
    assert status == 400, (case, error)
    assert error["error"]["param"] == param, (case, error)
    assert stored_names(gateway) == [] and gateway.store.list_files("alpha").data == []


def test_a_body_that_is_not_multipart_is_refused_by_its_content_type(gateway):
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
    }

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    assert response.status_code == 400
    assert "multipart" in json.loads(response.body)["error"]["message"]


# -- text that cannot be encoded as UTF-8, bodies nested too deep ----------------------------


def post_json(gateway, path: str, raw: bytes):
    scope = {
        "type": "http",
        "method": "POST",
        "path": path,
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
    }
    sent = [raw]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    return response.status_code, json.loads(response.body), response.headers


def test_a_lone_surrogate_in_a_batchs_metadata_is_refused_naming_it_and_nothing_is_stored(
    gateway,
):
    status, uploaded = upload(gateway, BODY, length=True)
    assert status == 200
    body = json.dumps(
        {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"note": "PLACE"},
        }
    )
    for text in ("\\udc80", "a\\ud800b", "\\udfff\\ud83d"):
        status, error, headers = post_json(
            gateway, "/v1/batches", body.replace("PLACE", text).encode()
        )
        assert status == 400 and error["error"]["param"] == "metadata.note", (text, error)
        assert headers["x-should-retry"] == "false"
    assert gateway.store.list_batches("alpha").data == []
    # a pair is one character: accepted, and listed
    status, made, _ = post_json(
        gateway, "/v1/batches", body.replace("PLACE", "\\ud83d\\ude00").encode()
    )
    assert status == 200 and made["metadata"] == {"note": "\U0001f600"}


def test_the_store_refuses_unencodable_metadata_and_filenames_whatever_door_asks(tmp_path):
    from relayllm_service.errors import InvalidRequestError
    from relayllm_service.store.records import check_metadata
    from relayllm_service.store.sqlite import SQLiteJobStore

    with pytest.raises(InvalidRequestError) as refused:
        check_metadata({"k": "\udc80"})
    assert refused.value.param == "metadata"
    store = SQLiteJobStore(str(tmp_path / "jobs.db"))
    with pytest.raises(InvalidRequestError) as refused:
        store.add_file("alpha", filename="a\udc80.jsonl", purpose="batch", bytes=1)
    assert refused.value.param == "filename"
    assert store.list_files("alpha").data == []


@pytest.mark.parametrize("charset", ["utf-7", "unicode_escape"])
def test_an_upload_whose_filename_decodes_to_a_lone_surrogate_is_refused_and_keeps_nothing(
    gateway, charset
):
    """A form's charset may be one that decodes bytes to a lone surrogate."""
    spelled = {"utf-7": b"a+3IA-.jsonl", "unicode_escape": b"a\\udc80.jsonl"}[charset]
    body = BODY.replace(b'filename="in.jsonl"', b'filename="' + spelled + b'"')
    headers = [
        (b"content-type", f"multipart/form-data; boundary={BOUNDARY}; charset={charset}".encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/files",
        "root_path": "",
        "query_string": b"",
        "headers": headers,
    }
    sent = [body]

    async def receive():
        return {"type": "http.request", "body": sent.pop() if sent else b"", "more_body": False}

    response = asyncio.run(gateway(Request(scope, receive)))
    error = json.loads(response.body)
    assert response.status_code == 400 and error["error"]["param"] == "file", error
    assert stored_names(gateway) == [] and gateway.store.list_files("alpha").data == []


@pytest.mark.parametrize(
    "raw",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
        b'{"input_file_id": "file-x", "metadata": ' + b"[" * 200 + b"]" * 200 + b"}",
    ],
)
def test_a_body_nested_too_deep_is_a_400_at_the_batches_door(gateway, raw):
    status, error, _ = post_json(gateway, "/v1/batches", raw)
    assert status == 400 and "nested deeper than 128" in error["error"]["message"], error
    assert gateway.store.list_batches("alpha").data == []
