"""The gateway against hostile ids and for the secrecy of its keys, on the session's cluster:
``relayllm serve`` (a subprocess, keys in its environment as a user gives them) with the
gateway's two doors, its own server and Serve's proxy.

- Every ``{id}`` route (a file, its content, its deletion, a batch, its cancel) and every id a
  body or a query names answers 404 to ``..``, ``%2F`` (decoded by the server into ``/``),
  double-encoded ``%252F`` and backslashes, through both doors, and changes nothing: the
  state directory's files, a file beside it and each project's files are as they were.
- After the module's requests, no log file of the Ray session holds a key: not a project's,
  not a wrong one a client sent."""

import hashlib
import http.client
import json
import os
import secrets
from pathlib import Path
from urllib.parse import urlsplit

import batch_api
import pytest
from support import cli, session_logs_holding

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

# Random per run: a hit in a log file is this run's key, not a leftover.
KEY = f"gamma-key-{secrets.token_hex(16)}"
OTHER_KEY = f"delta-key-{secrets.token_hex(16)}"
WRONG_KEY = f"wrong-key-{secrets.token_hex(16)}"
SECRET = "secret.txt"  # beside the state directory: what a traversal would reach


@pytest.fixture(scope="module")
def gateway(ray_session, tmp_path_factory):
    from ray import serve

    import relayllm

    relayllm.shutdown()  # Serve gets its HTTP proxy only while no application runs
    serve.shutdown()
    root = tmp_path_factory.mktemp("gateway-paths")
    (root / "deployments.yaml").write_text("deployments:\n  - name: echo\n    backend: echo\n")
    (root / SECRET).write_text("outside the state\n")
    state = root / "state"
    address = ray_session.get_runtime_context().gcs_address
    env = {
        **os.environ,
        "RELAYLLM_ECHO_BACKEND": "1",
        "RELAYLLM_API_KEYS": f"gamma={KEY},delta={OTHER_KEY}",
    }
    served = batch_api.serve_on_free_ports(
        root / "deployments.yaml", "--state-dir", state, "--address", address, env=env
    )
    doors = {
        "direct": served.stdout.split("base URL: ")[1].split()[0],
        "proxy": served.stdout.split("also through Serve's proxy: ")[1].split()[0],
    }
    gamma = batch_api.client(doors["direct"], KEY)
    delta = batch_api.client(doors["direct"], OTHER_KEY)
    lines = batch_api.jsonl(batch_api.chat_lines(2))
    files = {
        "gamma": [gamma.files.create(file=("a.jsonl", lines), purpose="batch").id for _ in "ab"],
        "delta": delta.files.create(file=("d.jsonl", lines), purpose="batch").id,
    }
    yield {
        "root": root,
        "doors": doors,
        "files": files,
        "served": served,
        "clients": (gamma, delta),
    }
    cli("unserve", "--address", address, check=0)
    serve.shutdown()


def send(base_url, method, path, body=None, key=KEY):
    """A request with ``path`` sent as written (http.client does not normalise it)."""
    split = urlsplit(base_url)
    connection = http.client.HTTPConnection(split.hostname, split.port, timeout=30)
    headers = {"Authorization": f"Bearer {key}"}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    try:
        connection.request(method, split.path.removesuffix("/v1") + path, data, headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` and its digest; SQLite's own files left out (a read may
    touch its shared-memory index): the store is compared through the API."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file() and ".sqlite" not in path.name
    }


def hostile_ids(files):
    mine, theirs = files["gamma"][0], files["delta"]
    return [
        "..",
        "%2e%2e",
        f"..%2F..%2F{SECRET}",
        f"%2E%2E%2F%2E%2E%2F{SECRET}",
        f"..%252F..%252F{SECRET}",
        f"%252e%252e%252f%252e%252e%252f{SECRET}",
        f"..%5C..%5C{SECRET}",
        f"../../{SECRET}",
        f"{mine}%2F..%2F{theirs}",
        f"{mine}/../{theirs}",
        f"{mine}%252F..%252F{theirs}",
        f"{theirs}%00",
    ]


ID_ROUTES = [
    ("GET", "/v1/files/{}"),
    ("GET", "/v1/files/{}/content"),
    ("DELETE", "/v1/files/{}"),
    ("GET", "/v1/batches/{}"),
    ("POST", "/v1/batches/{}/cancel"),
]


@pytest.mark.parametrize("door", ["direct", "proxy"])
def test_every_id_route_answers_404_to_traversal_and_touches_nothing(gateway, door):
    base = gateway["doors"][door]
    gamma, delta = gateway["clients"]
    before = snapshot(gateway["root"])
    listed = [f.id for f in gamma.files.list()], [f.id for f in delta.files.list()]
    answers = {}
    for ident in hostile_ids(gateway["files"]):
        for method, route in ID_ROUTES:
            answers[method, route.format(ident)] = send(base, method, route.format(ident))[0]
        body = {"input_file_id": ident, "endpoint": batch_api.CHAT, "completion_window": "24h"}
        answers["POST", f"/v1/batches <- {ident}"] = send(base, "POST", "/v1/batches", body)[0]
        answers["GET", f"/v1/batches?after={ident}"] = send(
            base, "GET", f"/v1/batches?after={ident}"
        )[0]
    refused = {where: status for where, status in answers.items() if status != 404}
    assert not refused, refused
    assert snapshot(gateway["root"]) == before  # no file written, moved or deleted
    assert ([f.id for f in gamma.files.list()], [f.id for f in delta.files.list()]) == listed
    assert list(gamma.batches.list()) == []  # no batch created from a hostile input id
    # The files the traversals aimed at are whole, and still their owners' only.
    for project, client in (("gamma", gamma), ("delta", delta)):
        ids = gateway["files"][project]
        for file_id in ids if isinstance(ids, list) else [ids]:
            assert client.files.content(file_id).content == batch_api.jsonl(batch_api.chat_lines(2))


def test_the_keys_are_in_no_log_line_of_the_session(gateway, ray_session):
    """Runs after the module's requests: the keys were sent in headers with every one of
    them, and the wrong key with these."""
    base = gateway["doors"]["direct"]
    wrong = batch_api.client(base, WRONG_KEY)
    with pytest.raises(openai.AuthenticationError):
        wrong.files.list()
    assert send(gateway["doors"]["proxy"], "GET", "/v1/files", key=WRONG_KEY)[0] == 401
    assert send(base, "GET", "/v1/nowhere", key=WRONG_KEY)[0] in (401, 404)
    gamma, _ = gateway["clients"]
    reply = gamma.chat.completions.create(
        model="echo", messages=[{"role": "user", "content": "keys stay secret"}]
    )
    assert reply.choices[0].message.content == "keys stay secret"

    read, found = session_logs_holding(ray_session, KEY, OTHER_KEY, WRONG_KEY)
    assert read > 10 and not found, found
    served = gateway["served"]
    assert not any(k in served.stdout + served.stderr for k in (KEY, OTHER_KEY))
