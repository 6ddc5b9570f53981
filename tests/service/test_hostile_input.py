"""Input a careless client or an attacker sends, end to end: ``relayllm serve`` (a subprocess)
on the echo backend with two projects' keys and the admin key, the real ``openai`` client and
raw HTTP on loopback.

- A body nested 100,000 deep (arrays) or 50,000 deep (objects) is a 400 at every JSON route of
  the gateway, through its own server and Serve's proxy, never a 500.
- A batch file with one line nested that deep completes: the line is its entry in the error
  file (``nesting_too_deep``, with its custom_id), the other lines are answered.
- A lone surrogate in a batch's metadata is refused naming it, and nothing is stored.
- A record with one, written to the store directly (as an older version wrote it), breaks no
  list: every project's and the admin key's lists answer 200.
- The enqueued-token quota's 429 says ``x-should-retry: false``: the ``openai`` client, left
  to retry twice, sends the refused create once (counted on the wire).
- What the service answers validates strictly against the ``openai`` package's types."""

import json
import sqlite3
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlencode

import pytest
from batch_api import ADMIN_KEY, PROJECT_KEYS, chat_lines, client, jsonl, lines_of, serve_echo, wait

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
"""
QUOTAS = "beta: {enqueued_tokens: {echo: 2000}}\n"
DEEP = {
    "arrays": b"[" * 100_000 + b"]" * 100_000,
    "objects": b'{"a":' * 50_000 + b"1" + b"}" * 50_000,
    "in a field": b'{"model": "echo", "messages": ' + b"[" * 5000 + b"]" * 5000 + b"}",
}


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    (root / "quotas.yaml").write_text(QUOTAS)
    url, _, stdout = serve_echo(ray_session, root, DEPLOYMENTS, "--quotas", root / "quotas.yaml")
    yield {
        "url": url,
        "proxy": stdout.split("also through Serve's proxy: ")[1].split()[0],
        "state": root / "state",
        "alpha": client(url, PROJECT_KEYS["alpha"]),
        "beta": client(url, PROJECT_KEYS["beta"]),
        "admin": client(url, ADMIN_KEY),
    }


class Answer:
    def __init__(self, status: int, headers, body: bytes) -> None:
        self.status_code, self.headers, self.body = status, headers, body
        self.text = body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)


def ask(url: str, key: str, raw: bytes | None = None, query: dict | None = None) -> Answer:
    """One request with nothing between (no client's retries or checks)."""
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if query is not None:
        url += "?" + urlencode(query, doseq=True)
    request = urllib.request.Request(url, data=raw, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return Answer(answer.status, answer.headers, answer.read())
    except urllib.error.HTTPError as refused:
        return Answer(refused.code, refused.headers, refused.read())


def post(url: str, key: str, raw: bytes) -> Answer:
    return ask(url, key, raw)


def strict(model, body, extra=()):
    """``body`` as ``model`` strictly (no coercion), with no field ``model`` lacks but
    ``extra``."""
    model.model_validate(body, strict=True)
    unknown = set(body) - set(model.model_fields) - set(extra)
    assert not unknown, f"{model.__name__} has no fields {sorted(unknown)}"


@pytest.mark.parametrize("route", ["chat/completions", "completions", "embeddings", "batches"])
@pytest.mark.parametrize("shape", list(DEEP))
def test_a_deep_body_is_a_400_through_both_doors_of_the_gateway(service, route, shape):
    from openai.types import ErrorObject

    for door in (service["url"], service["proxy"]):
        answer = post(f"{door}/{route}", PROJECT_KEYS["alpha"], DEEP[shape])
        assert answer.status_code == 400, (door, answer.text[:300])
        error = answer.json()["error"]
        strict(ErrorObject, error)
        assert "nested deeper than 128" in error["message"], error


def test_a_batch_with_a_line_nested_too_deep_completes_with_that_line_in_its_error_file(service):
    alpha = service["alpha"]
    lines = chat_lines(3, prefix="d")
    deep = jsonl([lines[1]]).replace(
        b'"messages": [', b'"messages": [' + b"[" * 50_000 + b"]" * 50_000 + b", "
    )
    data = jsonl([lines[0]]) + deep + jsonl([lines[2]])
    uploaded = alpha.files.create(file=("deep.jsonl", data), purpose="batch")
    created = alpha.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    batch = wait(alpha, created.id, timeout=120)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (2, 1)
    assert sorted(line["custom_id"] for line in lines_of(alpha, batch.output_file_id)) == [
        "d0",
        "d2",
    ]
    (error,) = lines_of(alpha, batch.error_file_id)
    assert error["custom_id"] == "d1" and error["error"]["code"] == "nesting_too_deep"
    assert "line 2" in error["error"]["message"]


def test_a_lone_surrogate_in_metadata_is_refused_naming_it_and_nothing_is_stored(service):
    alpha = service["alpha"]
    uploaded = alpha.files.create(file=("in.jsonl", jsonl(chat_lines(1))), purpose="batch")
    before = [b.id for b in alpha.batches.list()]
    raw = json.dumps(
        {
            "input_file_id": uploaded.id,
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
            "metadata": {"note": "PLACE"},
        }
    ).replace("PLACE", "\\udc80")
    answer = post(f"{service['url']}/batches", PROJECT_KEYS["alpha"], raw.encode())
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "metadata.note"
    assert answer.headers["x-should-retry"] == "false"
    assert [b.id for b in alpha.batches.list()] == before


def test_a_stored_record_with_a_lone_surrogate_breaks_no_projects_list(service):
    """Written to the store's file directly, as a relayllm that accepted it stored it."""
    from openai.types import Batch, FileObject

    beta = service["beta"]
    uploaded = beta.files.create(file=("in.jsonl", jsonl(chat_lines(1))), purpose="batch")
    made = beta.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        metadata={"note": "fine"},
    )
    wait(beta, made.id, timeout=120)
    store = sqlite3.connect(Path(service["state"]) / "jobs.sqlite", timeout=30)
    try:
        with store:
            store.execute(
                "UPDATE batches SET metadata = ? WHERE id = ?", ('{"note": "\\udc80"}', made.id)
            )
            store.execute(
                "UPDATE files SET filename = CAST(X'6E6FEDB380' AS TEXT) WHERE id = ?",
                (uploaded.id,),
            )
    finally:
        store.close()
    keys = {"alpha": PROJECT_KEYS["alpha"], "beta": PROJECT_KEYS["beta"], "admin": ADMIN_KEY}
    for name, key in keys.items():
        listed = {}
        for route in ("batches", "files"):
            answer = ask(f"{service['url']}/{route}", key, query={"limit": 100})
            assert answer.status_code == 200, (name, route, answer.text[:300])
            listed[route] = answer.json()["data"]
        extra = {"project"} if name == "admin" else set()
        for body in listed["batches"]:
            strict(Batch, body, extra)
        for body in listed["files"]:
            strict(FileObject, body, extra)
        if name != "alpha":
            (shown,) = (b for b in listed["batches"] if b["id"] == made.id)
            assert shown["metadata"] == {"note": "\ufffd"}
            (named,) = (f for f in listed["files"] if f["id"] == uploaded.id)
            assert named["filename"] == "no\ufffd\ufffd\ufffd"
        else:
            assert made.id not in {b["id"] for b in listed["batches"]}
    console = ask(f"{service['url'].removesuffix('/v1')}/console", ADMIN_KEY)
    assert console.status_code == 200 and made.id in console.text


def test_the_enqueued_token_quota_429_is_sent_once_though_the_client_may_retry(service):
    sent = []
    http_client = openai.DefaultHttpxClient(event_hooks={"request": [sent.append]})
    beta = openai.OpenAI(
        base_url=service["url"],
        api_key=PROJECT_KEYS["beta"],
        max_retries=2,
        http_client=http_client,
    )
    big = [
        {**line, "body": {**line["body"], "messages": [{"role": "user", "content": "w" * 8004}]}}
        for line in chat_lines(1, prefix="big")
    ]
    uploaded = beta.files.create(file=("big.jsonl", jsonl(big)), purpose="batch")
    sent.clear()
    with pytest.raises(openai.RateLimitError) as refused:
        beta.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert refused.value.code == "token_limit_exceeded"
    assert refused.value.response.headers["x-should-retry"] == "false"
    creates = [r for r in sent if r.method == "POST" and r.url.path.endswith("/batches")]
    assert len(creates) == 1, f"the refused create was sent {len(creates)} times"


def test_usage_and_error_bodies_are_openais_types(service):
    from openai.types import ErrorObject
    from openai.types.admin.organization.usage_completions_response import (
        UsageCompletionsResponse,
    )

    now = int(time.time())
    usage_url = f"{service['url']}/organization/usage/completions"
    query = {"start_time": now - 3600, "bucket_width": "1m", "group_by": ["model"]}
    usage = ask(usage_url, ADMIN_KEY, query=query)
    assert usage.status_code == 200
    UsageCompletionsResponse.model_validate(usage.json())
    for query in ({"start_time": "-99999999999999999999999"}, {"start_time": now, "page": "²"}):
        refused = ask(usage_url, ADMIN_KEY, query=query)
        assert refused.status_code == 400, refused.text
        strict(ErrorObject, refused.json()["error"])
