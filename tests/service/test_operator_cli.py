"""The operator CLI (``relayllm batches``, ``relayllm files``, ``relayllm unserve``) run as a
user runs it, in a subprocess, against a real gateway on loopback (``relayllm serve`` on the
echo backend): its tables and JSON read back against what the ``openai`` client sees, a
project's key against the admin key, and the refusals (a wrong key, a wrong URL, no key).

One service for the module; ``relayllm unserve`` stops it at the end."""

import json
import os

import pytest
from batch_api import ADMIN_KEY, PROJECT_KEYS, chat_lines, client, serve_echo, submit, wait
from support import cli, free_port

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
    options:
      delay_s: 0.2
"""


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("operator")
    url, address, printed = serve_echo(ray_session, root, DEPLOYMENTS, "--batch-size", 2, "--json")
    started = json.loads(printed)  # serve --json: what started, and where
    assert started["deployments"] == {"echo": "RUNNING"}, started
    assert started["gateway"] == {"name": "gateway", "status": "RUNNING", "api_keys": 2}
    assert started["state_dir"] == str(root / "state") and started["base_url"] == url
    alpha, beta = client(url, PROJECT_KEYS["alpha"]), client(url, PROJECT_KEYS["beta"])
    done = {
        "alpha": wait(alpha, submit(alpha, chat_lines(3), metadata={"team": "a"}).id),
        "beta": wait(beta, submit(beta, chat_lines(2, prefix="b")).id),
    }
    yield {"url": url, "address": address, "alpha": alpha, "beta": beta, "done": done}
    stopped = cli("unserve", "--address", address, check=0).stdout
    assert stopped.split() == ["stopped:", "gateway"]
    assert "no gateways were running" in cli("unserve", "--address", address, check=0).stdout


def run(service, *args, key=None, check=0, cwd=None, url=None):
    """``relayllm ARGS`` with the service's URL and a key in the environment, as an operator
    sets them once."""
    env = {
        **os.environ,
        "RELAYLLM_BASE_URL": url or service["url"],
        "RELAYLLM_API_KEY": key or ADMIN_KEY,
    }
    env.pop("OPENAI_API_KEY", None)
    return cli(*args, env=env, check=check, cwd=cwd)


def test_the_admin_key_lists_every_projects_batches_and_a_project_key_its_own(service):
    alpha, beta = service["done"]["alpha"], service["done"]["beta"]
    shown = run(service, "batches", "list").stdout.splitlines()
    assert shown[0].split() == ["id", "project", "status", "progress", "failed", "created",
                                "metadata"]  # fmt: skip
    rows = {line.split()[0]: line.split() for line in shown[2:]}
    assert rows[alpha.id][1:5] == ["alpha", "completed", "3/3", "0"]
    assert rows[beta.id][1:5] == ["beta", "completed", "2/2", "0"]
    assert rows[alpha.id][-1] == "team=a"
    own = run(service, "batches", "list", key=PROJECT_KEYS["beta"]).stdout.splitlines()
    assert own[0].split()[:3] == ["id", "status", "progress"]  # no project column
    assert [line.split()[0] for line in own[2:]] == [beta.id]
    listed = json.loads(run(service, "batches", "list", "--json").stdout)
    batches = [openai.types.Batch.model_validate(item) for item in listed]
    projects = {b.id: b.model_extra["project"] for b in batches}
    assert (projects[alpha.id], projects[beta.id]) == ("alpha", "beta")
    assert [b.id for b in batches][:2] == [beta.id, alpha.id]  # newest first


def test_show_and_download_give_what_the_openai_client_gives(service, tmp_path):
    alpha = service["done"]["alpha"]
    shown = run(service, "batches", "show", alpha.id).stdout
    fields = dict(line.split(None, 1) for line in shown.splitlines())
    assert fields["project"] == "alpha" and fields["status"] == "completed"
    assert fields["progress"] == "3/3" and fields["output_file_id"] == alpha.output_file_id
    assert fields["metadata.team"] == "a" and fields["error_file_id"] == "-"
    as_json = json.loads(run(service, "batches", "show", alpha.id, "--json").stdout)
    assert openai.types.Batch.model_validate(as_json).request_counts.completed == 3
    said = run(service, "batches", "download", alpha.id, cwd=tmp_path).stdout
    path = tmp_path / f"{alpha.id}_output.jsonl"
    assert said.startswith(f"output: {path.name} (") and alpha.output_file_id in said
    expected = service["alpha"].files.content(alpha.output_file_id).content
    assert path.read_bytes() == expected and len(expected.splitlines()) == 3
    again = run(service, "batches", "download", alpha.id, cwd=tmp_path, check=2)
    assert "exists" in again.stderr and path.read_bytes() == expected  # never overwritten
    # another project's batch is no batch for a project's key: 404, the id named
    other = run(service, "batches", "show", alpha.id, key=PROJECT_KEYS["beta"], check=2)
    assert "answered 404" in other.stderr and alpha.id in other.stderr


def test_cancel_a_running_batch_and_files_list_show_delete(service):
    alpha = service["alpha"]
    running = submit(alpha, chat_lines(60, prefix="c"))
    wait(alpha, running.id, until=lambda b: b.status == "in_progress")
    said = run(service, "batches", "cancel", running.id).stdout
    assert said.startswith(f"{running.id}: cancelling (")
    assert wait(alpha, running.id).status == "cancelled"
    completed = service["done"]["alpha"].id
    finished = run(service, "batches", "cancel", completed, check=2).stderr
    assert "answered 400" in finished and "completed" in finished
    files = run(service, "files", "list", "--purpose", "batch", "--json").stdout
    uploads = [openai.types.FileObject.model_validate(f) for f in json.loads(files)]
    assert {f.model_extra["project"] for f in uploads} == {"alpha", "beta"}
    own = run(service, "files", "list", key=PROJECT_KEYS["alpha"]).stdout.splitlines()
    assert own[0].split() == ["id", "filename", "purpose", "bytes", "created", "expires"]
    assert {line.split()[0] for line in own[2:]} == {f.id for f in alpha.files.list()}
    upload = running.input_file_id
    shown = dict(
        line.split(None, 1) for line in run(service, "files", "show", upload).stdout.splitlines()
    )
    assert shown["project"] == "alpha" and shown["purpose"] == "batch"
    assert run(service, "files", "delete", upload).stdout.strip() == f"deleted: {upload}"
    with pytest.raises(openai.NotFoundError):
        alpha.files.retrieve(upload)


def test_a_wrong_key_a_wrong_url_and_no_key_are_said_plainly(service):
    wrong = "wrong-key-" + "w" * 24
    refused = run(service, "batches", "list", key=wrong, check=1)
    assert "refused the API key (401)" in refused.stderr and service["url"] in refused.stderr
    assert wrong not in refused.stderr + refused.stdout  # never the key
    assert "Traceback" not in refused.stderr
    url = f"http://127.0.0.1:{free_port()}/v1"
    unreachable = run(service, "files", "list", url=url, check=1)
    assert f"cannot reach the batch service at {url}" in unreachable.stderr
    assert "Connection refused" in unreachable.stderr
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    nokey = cli("batches", "list", "--base-url", service["url"], env=env, check=2)
    assert "no API key" in nokey.stderr and "--api-key" in nokey.stderr


def test_the_admin_key_creates_nothing(service):
    admin = client(service["url"], ADMIN_KEY)
    with pytest.raises(openai.PermissionDeniedError, match="create with a project's key"):
        admin.files.create(file=("x.jsonl", b"{}\n"), purpose="batch")
    with pytest.raises(openai.PermissionDeniedError):
        admin.batches.create(
            input_file_id=service["done"]["alpha"].input_file_id,
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
