"""Store rows as OpenAI's JSON bodies, validated with the ``openai`` package's own types (and
its cursor page's paging), from a real store taken through every status; nothing internal (the
project, the claim, the runner) reaches a client; the service's refusals are OpenAI's error
bodies through the HTTP layer's one refusal path."""

from __future__ import annotations

import asyncio
import json

import pytest
from openai.pagination import SyncCursorPage
from openai.types import ErrorObject
from openai.types.batch import Batch
from openai.types.file_deleted import FileDeleted
from openai.types.file_object import FileObject

from relayllm.http.errors import envelope as error_body
from relayllm.http.errors import refusal_of
from relayllm_service.errors import (
    IllegalTransitionError,
    InvalidRequestError,
    NotFoundError,
    StaleClaimError,
    TooLargeError,
    UnauthorizedError,
)
from relayllm_service.gateway.objects import batch_object, file_deleted, file_object, list_object
from relayllm_service.store.records import RequestCounts
from relayllm_service.store.sqlite import SQLiteJobStore

INTERNAL = {"project", "claim", "runner", "heartbeat_at"}


@pytest.fixture
def store(tmp_path):
    s = SQLiteJobStore(str(tmp_path / "jobs.sqlite"))
    yield s
    s.close()


def strict(model, body):
    """``model`` (an openai type) parses ``body`` and knows each of its keys: openai's types
    accept extra keys, so a misspelt field would otherwise pass unseen."""
    parsed = model.model_validate(body, strict=True)  # no coercion: "3" is no int
    assert set(body) <= set(model.model_fields), set(body) - set(model.model_fields)
    assert not INTERNAL & set(body), "a store-internal field reached a client"
    return parsed


def test_a_batch_in_each_status_is_openais_batch_object(store):
    source = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=3)
    batch = store.create_batch(
        "alpha", input_file_id=source.id, endpoint="/v1/completions", metadata={"k": "v"}
    )
    claim = store.claim(batch.id, "runner-secret-name")
    out = store.add_batch_file(batch.id, claim, filename="o", purpose="batch_output", bytes=9)
    records = [store.get_batch("alpha", batch.id)]
    records.append(
        store.update(batch.id, claim, status="in_progress", request_counts=RequestCounts(4, 1, 1))
    )
    records.append(store.update(batch.id, claim, status="finalizing"))
    records.append(
        store.update(
            batch.id,
            claim,
            status="completed",
            request_counts=RequestCounts(4, 3, 1),
            output_file_id=out.id,
        )
    )
    for record in records:
        body = batch_object(record)
        parsed = strict(Batch, body)
        assert (parsed.id, parsed.status) == (record.id, record.status)
        assert "runner-secret-name" not in json.dumps(body) and "alpha" not in json.dumps(body)
    done = strict(Batch, batch_object(records[-1]))
    assert done.request_counts.model_dump() == {"total": 4, "completed": 3, "failed": 1}
    assert (done.output_file_id, done.metadata, done.errors) == (out.id, {"k": "v"}, None)
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert set(batch_object(records[0])) >= {"errors", "output_file_id", "cancelled_at"}, (
        "OpenAI sends every field, null or not"
    )


def test_a_failed_batch_carries_openais_errors_list(store):
    source = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=3)
    batch = store.create_batch("alpha", input_file_id=source.id, endpoint="/v1/completions")
    claim = store.claim(batch.id, "r")
    problem = {"code": "duplicate_custom_id", "message": "m", "param": "custom_id", "line": 3}
    failed = store.update(batch.id, claim, status="failed", errors=[problem])
    parsed = strict(Batch, batch_object(failed))
    assert parsed.status == "failed" and parsed.failed_at is not None
    assert parsed.errors.object == "list"
    assert [e.model_dump() for e in parsed.errors.data] == [problem]


def test_files_and_deleted_files_are_openais_objects(store):
    record = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=123)
    parsed = strict(FileObject, file_object(record))
    assert (parsed.id, parsed.bytes, parsed.filename, parsed.purpose, parsed.status) == (
        record.id,
        123,
        "in.jsonl",
        "batch",
        "processed",
    )
    deleted = strict(FileDeleted, file_deleted(record.id))
    assert deleted.deleted and deleted.id == record.id


def test_a_list_page_pages_as_the_openai_client_pages(store):
    source = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=3)
    made = [
        store.create_batch("alpha", input_file_id=source.id, endpoint="/v1/completions").id
        for _ in range(3)
    ]
    first = list_object(store.list_batches("alpha", limit=2), batch_object)
    page = SyncCursorPage[Batch].model_validate(first)
    assert [b.id for b in page.data] == made[:0:-1]
    assert (first["first_id"], first["last_id"], page.has_more) == (made[2], made[1], True)
    follow = page.next_page_info()
    assert follow is not None and follow.params == {"after": made[1]}, "the client's next cursor"
    second = list_object(store.list_batches("alpha", **follow.params, limit=2), batch_object)
    last = SyncCursorPage[Batch].model_validate(second)
    assert [b.id for b in last.data] == [made[0]] and last.has_more is False
    assert not last.has_next_page()
    empty = list_object(store.list_batches("beta"), batch_object)
    assert empty == {
        "object": "list",
        "data": [],
        "first_id": None,
        "last_id": None,
        "has_more": False,
    }
    files = list_object(store.list_files("alpha"), file_object)
    assert [FileObject.model_validate(f).id for f in files["data"]] == [source.id]


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (UnauthorizedError("the API key is not valid"), 401, "invalid_api_key"),
        (NotFoundError("no batch 'batch_x'"), 404, "not_found"),
        (TooLargeError("too big", "file"), 413, "file_too_large"),
        (InvalidRequestError("bad limit", "limit"), 400, None),
        (IllegalTransitionError("cannot cancel"), 400, "invalid_state"),
    ],
)
def test_service_errors_become_openai_error_bodies(error, status, code):
    refusal = refusal_of(error)
    assert refusal is not None and refusal.status == status
    body = refusal.body()
    assert body["error"]["message"] == str(error) and body["error"]["code"] == code
    assert body["error"]["param"] == getattr(error, "param", None)
    assert body["error"]["type"] == "invalid_request_error"
    strict(ErrorObject, body["error"])


@pytest.mark.parametrize(
    "error",
    [
        OSError("/srv/relayllm/private/jobs.sqlite: disk I/O error"),
        StaleClaimError("claim 2 of batch 'batch_x' held by 'host-7'"),
    ],
)
def test_unexpected_errors_are_a_500_that_shows_nothing_of_the_server(error):
    from starlette.requests import Request
    from starlette.routing import Route

    from relayllm.http.app import HttpApp

    async def fail(request):
        raise error

    app = HttpApp([Route("/v1/batches", fail)], server="the batch service")
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/v1/batches",
        "headers": [],
        "query_string": b"",
        "root_path": "",
    }
    response = asyncio.run(app.respond(Request(scope)))
    assert refusal_of(error) is None
    text = response.body.decode()
    assert response.status_code == 500 and json.loads(text)["error"]["type"] == "server_error"
    assert "the batch service failed" in text and str(error) not in text
    assert "/srv" not in text and "host-7" not in text


def test_error_body_is_openais_envelope():
    assert error_body("m", param="p", code="c") == {
        "error": {"message": "m", "type": "invalid_request_error", "param": "p", "code": "c"}
    }


def test_the_service_layers_import_neither_ray_nor_openai():
    """The gateway and the runner import these; the openai package is the tests' judge, not a
    dependency of the service, and the store must load where Ray does not (a CLI, a tool)."""
    import subprocess
    import sys

    modules = [
        "errors",
        "ids",
        "store.files",
        "store.sqlite",
        "runner.validate",
        "gateway.objects",
        "tenancy.keys",
    ]
    code = (
        "import sys\n"
        + "".join(f"import relayllm_service.{m}\n" for m in modules)
        + "print(sorted(m for m in ('ray', 'openai') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"
