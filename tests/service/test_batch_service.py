"""The batch service end to end: ``serve_file`` starts two echo deployments and the gateway on
Serve's real HTTP proxy, and the real ``openai`` client on loopback uploads, creates, polls,
cancels and downloads; the runner is the real detached actor, stopped and SIGKILLed from
outside in one test.

One gateway (and one runner) for the module; a second gateway on the same state, under
``/short``, enforces a 3 s completion window for the expiry test, lets files expire after
a second and takes uploads of at most 1 MB."""

import io
import json
import os
import signal
import time

import batch_api
import pytest
from batch_api import CHAT, chat_lines, finished_lines, jsonl, lines_of, submit, wait
from support import cli, free_port, stop_process

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

KEY_A = "alpha-key-" + "a" * 24
KEY_B = "beta-key-" + "b" * 24
KEYS_ENV = "RELAYLLM_API_KEYS"
SLOW_LINES = 64
#: The blocks a stopped runner can leave computed and unwritten: the one it was writing,
#: those Ray Data finished for it meanwhile and those its stage worker held (3 seen).
IN_FLIGHT_BLOCKS = 4
#: The short gateway's upload limit (the main one has the default, 512 MB).
SHORT_MAX_BYTES = 1_000_000

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
  - name: slow
    backend: echo
    options:
      delay_s: 0.5
"""


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    """``relayllm serve`` (a subprocess, as a user runs it) on the session's cluster, and a
    second gateway on the same state with a 3 s completion window and a 1 MB upload limit."""
    from ray import serve

    import relayllm
    from relayllm_service.deploy import deploy_gateway, shutdown_gateway
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.keys import KeyMap

    # Serve gets its HTTP proxy only while no application runs, and keeps the port it was
    # given: start from no Serve at all, whatever an earlier module left.
    relayllm.shutdown()
    serve.shutdown()
    root = tmp_path_factory.mktemp("batch-service")
    (root / "deployments.yaml").write_text(DEPLOYMENTS)
    port, direct_port, state = free_port(), free_port(), str(root / "state")
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RELAYLLM_ECHO_BACKEND": "1", KEYS_ENV: f"alpha={KEY_A},beta={KEY_B}"}
    served = cli(
        "serve", root / "deployments.yaml", "--port", port, "--direct-port", direct_port,
        "--state-dir", state, "--batch-size", 2, "--max-batches", 1, "--turn-s", 1,
        "--address", address, env=env, check=0,
    )  # fmt: skip
    url = served.stdout.split("base URL: ")[1].split()[0]
    proxy_url = served.stdout.split("also through Serve's proxy: ")[1].split()[0]
    settings = ServiceSettings(
        state_dir=state, port=port, direct_port=direct_port, batch_size=2, max_batches=1, turn_s=1
    )
    keys = KeyMap([("alpha", KEY_A), ("beta", KEY_B)])
    short = deploy_gateway(
        ServiceSettings(name="short", route_prefix="/short", window_s=3, min_expires_s=1,
                        state_dir=state, port=port, direct_port=None, batch_size=2,
                        max_batches=1, turn_s=1, max_file_bytes=SHORT_MAX_BYTES),
        keys,
    )  # fmt: skip
    yield {
        "url": url,
        "proxy_url": proxy_url,
        "short_url": short.url,
        "settings": settings,
        "address": address,
        "served": served.stdout,
    }
    # The deprecated spelling, kept for one release, still stops them (through `unserve`).
    done = cli("shutdown", "--gateways", "--address", address, check=0)
    assert done.stdout.split() == ["stopped:", "gateway,", "short"]
    assert "deprecated: use `relayllm unserve`" in done.stderr
    assert shutdown_gateway() == []
    runner_gone(settings.runner_name)  # it went with them
    serve.shutdown()  # the next module's Serve starts as it wants it (its own proxy, or none)


def runner_gone(name, timeout=30):
    import ray

    from relayllm_service.runner.actor import RUNNER_NAMESPACE

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=RUNNER_NAMESPACE)
        except ValueError:
            return
        time.sleep(0.2)
    raise AssertionError(f"the runner {name} still runs")


def client(url, key=KEY_A):
    return batch_api.client(url, key)


def test_upload_create_poll_download_with_openai_types(service):
    from openai.types import Batch, FileObject
    from openai.types.chat import ChatCompletion

    api = client(service["url"])
    uploaded = api.files.create(file=("input.jsonl", jsonl(chat_lines(6))), purpose="batch")
    assert isinstance(uploaded, FileObject) and uploaded.purpose == "batch"
    assert api.files.retrieve(uploaded.id).bytes == len(jsonl(chat_lines(6)))
    assert api.files.content(uploaded.id).content == jsonl(chat_lines(6))
    created = api.batches.create(
        input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h", metadata={"k": "v"}
    )
    assert created.status == "validating" and created.metadata == {"k": "v"}
    batch = wait(api, created.id)
    assert isinstance(batch, Batch)
    assert batch.status == "completed", batch
    assert (batch.request_counts.total, batch.request_counts.completed) == (6, 6)
    assert batch.created_at <= batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    assert batch.error_file_id is None and batch.metadata == {"k": "v"}
    output = lines_of(api, batch.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(f"r{i}" for i in range(6))
    for line in output:
        assert line["error"] is None and line["response"]["status_code"] == 200
        reply = ChatCompletion.model_validate(line["response"]["body"])
        number = line["custom_id"][1:]
        assert reply.choices[0].message.content == f"line {number} words"
    produced = api.files.retrieve(batch.output_file_id)
    assert produced.purpose == "batch_output" and produced.filename.startswith(batch.id)
    # list with after/limit pages through the project's batches, newest first
    second = submit(api, chat_lines(2, prefix="s"))
    first_page = api.batches.list(limit=1)
    assert [b.id for b in first_page.data] == [second.id] and first_page.has_more
    assert api.batches.list(limit=1, after=second.id).data[0].id == created.id
    assert {b.id for b in api.batches.list(limit=1)} >= {created.id, second.id}  # auto-paging
    wait(api, second.id)
    with pytest.raises(openai.BadRequestError):  # a finished batch cannot be cancelled: 400
        api.batches.cancel(created.id)
    # delete: gone from retrieve and from the list
    assert api.files.delete(uploaded.id).deleted
    with pytest.raises(openai.NotFoundError):
        api.files.retrieve(uploaded.id)
    assert uploaded.id not in {f.id for f in api.files.list()}


def test_a_multi_mb_upload_round_trips_and_one_over_the_limit_keeps_nothing(service):
    """Through Serve's proxy, whose body reaches the gateway in pieces: a file of several MB
    with boundary-like bytes comes back exactly; a file over the short gateway's limit (its
    Content-Length within the limit plus the form's room, so the body is read) is refused
    with the limit named, and no bytes or record of it are left."""
    import random

    api, short = client(service["url"]), client(service["short_url"])
    rng = random.Random(11)
    content = b"".join(
        rng.randbytes(rng.randrange(1, 9000)) + b"\r\n--\r\n-" for _ in range(1500)
    )  # ~7 MB
    uploaded = api.files.create(file=("big.jsonl", content), purpose="batch")
    assert uploaded.bytes == len(content)
    assert api.files.content(uploaded.id).content == content
    api.files.delete(uploaded.id)
    files = service["settings"].files_location
    stored, listed = sorted(os.listdir(files)), {f.id for f in api.files.list()}
    with pytest.raises(openai.APIStatusError) as refused:
        short.files.create(file=("big.jsonl", b"x" * (SHORT_MAX_BYTES + 30_000)), purpose="batch")
    assert refused.value.status_code == 413 and f"{SHORT_MAX_BYTES:,} bytes" in str(refused.value)
    assert sorted(os.listdir(files)) == stored and {f.id for f in api.files.list()} == listed


def test_relayllm_serve_printed_the_url_and_status_shows_the_gateway(service):
    settings = service["settings"]
    assert service["url"] == f"http://127.0.0.1:{settings.direct_port}/v1"
    assert service["proxy_url"] == f"http://127.0.0.1:{settings.port}/v1"
    assert service["short_url"] == f"http://127.0.0.1:{settings.port}/short/v1"  # proxy only
    assert "echo: RUNNING" in service["served"] and "slow: RUNNING" in service["served"]
    listed = json.loads(cli("status", "--json", "--address", service["address"], check=0).stdout)
    gateways = {g["name"]: g for g in listed if g.get("kind") == "gateway"}
    assert gateways["gateway"]["url"] == service["url"]
    assert gateways["gateway"]["proxy_url"] == service["proxy_url"]
    assert gateways["short"]["url"] == service["short_url"]
    assert {d["name"] for d in listed if d.get("kind") == "deployment"} == {"echo", "slow"}
    assert {d.get("kind") for d in listed} == {"deployment", "gateway"}
    assert KEY_A not in json.dumps(listed) and KEY_A not in service["served"]


def test_the_gateways_own_server_and_serves_proxy_answer_from_the_same_state(service):
    direct, proxy = client(service["url"]), client(service["proxy_url"])
    uploaded = proxy.files.create(file=("doors.jsonl", jsonl(chat_lines(2))), purpose="batch")
    assert direct.files.retrieve(uploaded.id).bytes == len(jsonl(chat_lines(2)))
    batch = wait(proxy, direct.batches.create(
        input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h").id)  # fmt: skip
    assert batch.status == "completed" and batch.request_counts.completed == 2, batch
    assert lines_of(direct, batch.output_file_id) == lines_of(proxy, batch.output_file_id)
    messages = [{"role": "user", "content": "a b"}]
    reply = direct.chat.completions.create(model="echo", messages=messages, max_tokens=2)
    assert reply.choices[0].message.content == "a b"


def reading_positions(path):
    """Where each process that has ``path`` open is in it (``/proc/PID/fdinfo``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == path:
                    with open(f"/proc/{pid}/fdinfo/{fd}") as info:
                        found.append(int(info.read().split()[1]))
        except OSError:  # gone, or not ours
            continue
    return found


def test_a_download_the_client_stops_reading_is_read_no_further_than_the_sockets_hold(service):
    """The base URL's server sends a file as the client takes it: a client that stops after
    its first MB leaves the stored file read no further than a few MB. (Serve's proxy reads
    the whole file out of the replica, the memory that grew with a file.)"""
    import socket
    from urllib.parse import urlsplit

    api, size = client(service["url"]), 64 << 20
    content = (b"x" * 1023 + b"\n") * (size >> 10)
    uploaded = api.files.create(file=("big.jsonl", content), purpose="batch")
    path = os.path.join(service["settings"].files_location, uploaded.id)
    url = urlsplit(service["url"])
    request = (
        f"GET {url.path}/files/{uploaded.id}/content HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {KEY_A}\r\n\r\n"
    )
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(request.encode())
        received = 0
        while received < 1 << 20:
            received += len(sock.recv(1 << 16))
        seen = []  # the reader's position until it has not moved for a second
        while len(seen) < 5 or len(set(seen[-5:])) > 1:
            assert len(seen) < 120, f"the file is still being read: {seen[-5:]}"
            seen.append(tuple(reading_positions(path)))
            time.sleep(0.25)
        assert len(seen[-1]) == 1 and seen[-1][0] < 24 << 20, (seen[-1], size)
    api.files.delete(uploaded.id)


def test_a_file_that_fails_validation_fails_the_batch_with_openais_errors(service):
    api = client(service["url"])
    lines = chat_lines(3)
    lines[2]["custom_id"] = "r0"
    text = jsonl(lines) + b"{not json\n"
    uploaded = api.files.create(file=("bad.jsonl", text), purpose="batch")
    batch = wait(
        api,
        api.batches.create(input_file_id=uploaded.id, endpoint=CHAT, completion_window="24h").id,
    )
    assert batch.status == "failed" and batch.failed_at
    codes = {(e.code, e.line) for e in batch.errors.data}
    assert codes == {("duplicate_custom_id", 3), ("invalid_json", 4)}
    assert batch.output_file_id is None and batch.request_counts.completed == 0
    # what the gateway refuses at once is an HTTP error the client raises
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/moderations", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError, match="purpose"):
        api.files.create(file=("x.jsonl", b"{}\n"), purpose="fine-tune")


def test_cancel_keeps_the_finished_lines(service):
    api = client(service["url"])
    created = submit(api, chat_lines(SLOW_LINES, model="slow", prefix="c"))
    running = wait(api, created.id, finished_lines(1))
    assert running.status == "in_progress"
    cancelling = api.batches.cancel(created.id)
    assert cancelling.status in ("cancelling", "cancelled")
    batch = wait(api, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at
    output = lines_of(api, batch.output_file_id)
    ids = [line["custom_id"] for line in output]
    assert 0 < len(ids) < SLOW_LINES and len(set(ids)) == len(ids)
    assert batch.request_counts.completed == len(ids)
    assert api.batches.cancel(created.id).status == "cancelled"  # asking again: as it is


def test_an_expired_batch_keeps_its_lines_and_errors_the_rest(service):
    api = client(service["short_url"])
    created = submit(api, chat_lines(SLOW_LINES, model="slow", prefix="e"))
    assert created.expires_at - created.created_at == 3
    batch = wait(api, created.id)
    assert batch.status == "expired" and batch.expired_at
    done = lines_of(api, batch.output_file_id)
    expired = lines_of(api, batch.error_file_id)
    assert {e["error"]["code"] for e in expired} == {"batch_expired"}
    ids = [line["custom_id"] for line in done + expired]
    assert sorted(ids) == sorted(f"e{i}" for i in range(SLOW_LINES))  # each line once
    assert expired and (batch.request_counts.completed, batch.request_counts.failed) == (
        len(done),
        len(expired),
    )


def test_projects_see_only_their_own(service):
    alpha, beta = client(service["url"]), client(service["url"], KEY_B)
    mine = submit(alpha, chat_lines(1, prefix="p"))
    for call in (
        lambda: beta.batches.retrieve(mine.id),
        lambda: beta.batches.cancel(mine.id),
        lambda: beta.files.retrieve(mine.input_file_id),
        lambda: beta.files.content(mine.input_file_id),
        lambda: beta.files.delete(mine.input_file_id),
        lambda: beta.batches.create(
            input_file_id=mine.input_file_id, endpoint=CHAT, completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            call()
    assert mine.id not in {b.id for b in beta.batches.list()}
    assert mine.input_file_id not in {f.id for f in beta.files.list()}
    assert alpha.batches.retrieve(mine.id).id == mine.id  # still there for its owner
    for key in ("not-a-key-" + "x" * 20, ""):
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=service["url"], api_key=key or "-", max_retries=0).batches.list()
    wait(alpha, mine.id)


def test_online_requests_and_a_small_batch_are_answered_while_a_big_batch_runs(service):
    api = client(service["url"])
    created = submit(api, chat_lines(SLOW_LINES, model="slow", prefix="o"))
    wait(api, created.id, lambda b: b.status != "validating")
    for model in ("echo", "slow"):  # "slow" is the engine the batch keeps busy
        before = api.batches.retrieve(created.id).request_counts.completed
        reply = api.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "are you there"}], max_tokens=2
        )
        assert reply.choices[0].message.content == "are you" and reply.model == model
        # Answered while the batch runs, not after it: the batch is still in progress and
        # finished only a few of its lines meanwhile (counted, so a loaded machine, which
        # slows both alike, does not matter).
        after = api.batches.retrieve(created.id)
        assert after.status == "in_progress", (model, after)
        assert after.request_counts.completed - before < SLOW_LINES // 4, (model, before, after)
    small = wait(api, submit(api, chat_lines(4, prefix="q")).id, timeout=30)
    assert small.status == "completed" and small.request_counts.completed == 4
    embedded = api.embeddings.create(model="echo", input=["aa bbb"], encoding_format="float")
    assert embedded.data[0].embedding[:2] == [2.0, 3.0]
    assert api.completions.create(model="echo", prompt="a b c").choices[0].text == "a b c"
    assert {m.id for m in api.models.list()} == {"echo", "slow"}
    with pytest.raises(openai.NotFoundError):
        api.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    assert api.batches.retrieve(created.id).status == "in_progress"  # it was running all along
    api.batches.cancel(created.id)
    wait(api, created.id)


def work_lines(settings, batch_id):
    """The complete lines of the batch's current work file (a line cut short is not one)."""
    import glob

    (path,) = glob.glob(os.path.join(settings.work_dir, batch_id, "out.*.jsonl"))
    with open(path, "rb") as work:
        return [line for line in work.read().split(b"\n")[:-1] if line.strip()]


def settled_rows(name, quiet_s=5.0):
    """The deployment's row counter once it has not moved for ``quiet_s`` (the calls sent
    before the runner stopped have all been answered: ten calls' time, so a loaded machine's
    pause between two answers is not taken for the end)."""
    rows, since = deployment_rows(name), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.2)
        now = deployment_rows(name)
        if now != rows:
            rows, since = now, time.monotonic()
    return rows


def check_bodies(lines, prefix):
    """Each line's answer is echo's answer to its own request (a function of the line)."""
    for line in lines:
        number = line["custom_id"][len(prefix) :]
        body = line["response"]["body"]
        said = body["choices"][0]["message"]["content"]
        assert said == f"line {number} words", ("a body not its own line's", line)


def test_runner_killed_mid_batch_resumes_each_line_exactly_once(service):
    """The runner is stopped from outside while lines are in flight: the test holds the job
    store's write lock, so the runner waits at its next write (the counts after a block),
    while the stage worker goes on with the next block; SIGSTOP, then SIGKILL. The deployment
    computed more rows than the work file kept (work was in flight), Ray restarts the runner,
    which computes exactly the lines its work file lacks: the recompute is the rows of the
    blocks in flight, no more; each custom_id once, each body its own line's answer."""
    import sqlite3

    import ray

    from relayllm.blocks import block_rows, stage_batch
    from relayllm_service.runner.actor import RUNNER_NAMESPACE

    settings = service["settings"]
    per_block = block_rows(SLOW_LINES, stage_batch(settings.batch_size))
    api = client(service["url"])
    runner = ray.get_actor(settings.runner_name, namespace=RUNNER_NAMESPACE)
    pid = ray.get(runner.pid.remote(), timeout=30)
    start = deployment_rows("slow")
    created = submit(api, chat_lines(SLOW_LINES, model="slow", prefix="k"))
    running = wait(api, created.id, finished_lines(1))
    assert running.status == "in_progress", running
    lock = sqlite3.connect(settings.store_path, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # the runner's next write waits for it
        recorded = api.batches.retrieve(created.id).request_counts.completed  # reads go on
        deadline = time.monotonic() + 20
        while deployment_rows("slow") - start <= recorded + per_block:
            assert time.monotonic() < deadline, "the next block did not run"
            time.sleep(0.05)
        stop_process(pid)  # every thread, a write it was in the middle of done
        computed = settled_rows("slow") - start
        kept = len(work_lines(settings, created.id))
    finally:
        lock.execute("ROLLBACK")
        lock.close()
        os.kill(pid, signal.SIGKILL)
    assert kept < SLOW_LINES and kept >= recorded
    assert computed > kept, ("no work in flight at the kill", computed, kept)
    batch = wait(api, created.id, timeout=90)
    assert ray.get(runner.pid.remote(), timeout=60) != pid  # Ray restarted it
    assert batch.status == "completed", batch
    resumed = deployment_rows("slow") - start - computed
    lacked = SLOW_LINES - kept
    assert resumed == lacked, ("recomputed: not the lines the work file lacked", resumed, kept)
    # The rows lost at the kill: those of the blocks in flight (finished but not written
    # yet, and those the stage worker held), never the half of the batch.
    lost = computed - kept
    assert lost <= IN_FLIGHT_BLOCKS * per_block, ("more than the blocks in flight", lost)
    output = lines_of(api, batch.output_file_id)
    assert batch.error_file_id is None
    assert sorted(line["custom_id"] for line in output) == sorted(
        f"k{i}" for i in range(SLOW_LINES)
    )  # none lost, none twice
    check_bodies(output, "k")
    assert (batch.request_counts.completed, batch.request_counts.failed) == (SLOW_LINES, 0)


def deployment_rows(name):
    """Rows the deployment's replica has computed so far (its info() counter)."""
    from relayllm.deployments import handle_for

    return handle_for(name).info.remote().result(timeout_s=30)["rows"]


def test_a_cancel_stops_a_long_block_within_the_calls_in_flight(service):
    """A 1,024-line file runs in 64-line blocks; a cancel while the first blocks run stops
    them within the calls in flight (the stage workers check before sending each line),
    counted on the deployment, not after the blocks (128 lines) as a stop between blocks
    would; the lines computed are kept, each once."""
    from relayllm.blocks import block_rows, stage_batch

    total = 1024
    rows_per_block = block_rows(total, stage_batch(service["settings"].batch_size))
    assert rows_per_block == 64
    api = client(service["url"])
    start = deployment_rows("slow")
    created = submit(api, chat_lines(total, model="slow", prefix="L"))
    deadline = time.monotonic() + 60
    while deployment_rows("slow") - start < 8 and time.monotonic() < deadline:
        time.sleep(0.05)
    at_cancel = deployment_rows("slow")
    assert 8 <= at_cancel - start < rows_per_block  # inside the first block
    api.batches.cancel(created.id)
    batch = wait(api, created.id)
    computed = deployment_rows("slow") - start
    assert batch.status == "cancelled", batch
    # after the cancel: at most the calls in flight and one stage batch per worker more
    bound = 3 * stage_batch(service["settings"].batch_size)
    assert computed - (at_cancel - start) <= bound, (computed, at_cancel - start)
    assert computed < rows_per_block
    output = lines_of(api, batch.output_file_id)
    ids = [line["custom_id"] for line in output]
    assert len(set(ids)) == len(ids) == batch.request_counts.completed <= computed
    assert batch.request_counts.failed == 0 and batch.error_file_id is None


def test_files_expire_as_asked_and_their_bytes_are_deleted(service):
    """OpenAI's expires_after on upload (the short gateway allows seconds), and a batch's
    output_expires_after; an expired file answers 404 and the runner deletes its bytes."""
    api, short = client(service["url"]), client(service["short_url"])
    policy = {"anchor": "created_at", "seconds": 2}
    with pytest.raises(openai.BadRequestError, match="expires_after"):  # under an hour here
        api.files.create(file=("in.jsonl", b"{}\n"), purpose="batch", expires_after=policy)
    brief = short.files.create(
        file=("in.jsonl", jsonl(chat_lines(1, prefix="x"))), purpose="batch", expires_after=policy
    )
    assert brief.expires_at == brief.created_at + 2
    stored = os.path.join(service["settings"].files_location, brief.id)
    assert os.path.exists(stored)
    deadline = time.monotonic() + 30
    while os.path.exists(stored) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.exists(stored)  # the bytes deleted...
    for call in (lambda: api.files.retrieve(brief.id), lambda: api.files.content(brief.id)):
        with pytest.raises(openai.NotFoundError):  # ...and the file gone
            call()
    assert brief.id not in {f.id for f in api.files.list()}
    uploaded = api.files.create(
        file=("in.jsonl", jsonl(chat_lines(2, prefix="y"))), purpose="batch"
    )
    assert uploaded.expires_at is None  # kept unless asked
    created = api.batches.create(
        input_file_id=uploaded.id,
        endpoint=CHAT,
        completion_window="24h",
        output_expires_after={"anchor": "created_at", "seconds": 3600},
    )
    batch = wait(api, created.id)
    assert batch.status == "completed", batch
    output = api.files.retrieve(batch.output_file_id)
    assert output.expires_at == output.created_at + 3600


def test_a_small_batch_created_after_a_large_one_finishes_first(service):
    """The runner runs one batch at a time here (--max-batches 1): the large batch gives
    its slot up after its turn (--turn-s 1) because the small one waits, and the small one
    ends while the large one is still in progress; the large one then ends, each line once."""
    api = client(service["url"])
    # Long enough (32 calls of 0.5 s) that the large one cannot end before the small one is
    # seen waiting and its turn given up, however fast the machine.
    size = SLOW_LINES
    large = submit(api, chat_lines(size, model="slow", prefix="g"))
    wait(api, large.id, finished_lines(1))
    small = wait(api, submit(api, chat_lines(4, prefix="h")).id)
    during = api.batches.retrieve(large.id)
    assert small.status == "completed" and small.request_counts.completed == 4
    assert during.status == "in_progress", during
    assert during.request_counts.completed < size
    done = wait(api, large.id, timeout=180)
    assert done.status == "completed" and small.completed_at <= done.completed_at
    ids = [line["custom_id"] for line in lines_of(api, done.output_file_id)]
    assert sorted(ids) == sorted(f"g{i}" for i in range(size))


def test_one_batchs_lines_go_to_the_deployments_their_model_names(service):
    """Lines for "echo" and "slow" in one batch run on those deployments (counted on each);
    lines naming a model no deployment serves fail alone, with OpenAI's 404 model_not_found."""
    from openai.types import ErrorObject
    from openai.types.chat import ChatCompletion

    api = client(service["url"])
    lines = (
        chat_lines(3, model="echo", prefix="m")
        + chat_lines(2, model="slow", prefix="n")
        + chat_lines(2, model="gpt-4o", prefix="u")
    )
    before = {name: deployment_rows(name) for name in ("echo", "slow")}
    batch = wait(api, submit(api, lines).id)
    ran = {name: deployment_rows(name) - before[name] for name in ("echo", "slow")}
    assert batch.status == "completed", batch
    assert ran == {"echo": 3, "slow": 2}
    counts = batch.request_counts
    assert (counts.total, counts.completed, counts.failed) == (7, 5, 2)
    output = lines_of(api, batch.output_file_id)
    assert sorted(x["custom_id"] for x in output) == ["m0", "m1", "m2", "n0", "n1"]
    for line in output:
        ChatCompletion.model_validate(line["response"]["body"])
    refused = lines_of(api, batch.error_file_id)
    assert sorted(x["custom_id"] for x in refused) == ["u0", "u1"]
    for line in refused:
        assert line["error"] is None and line["response"]["status_code"] == 404
        error = ErrorObject.model_validate(line["response"]["body"]["error"])
        assert (error.code, error.param, error.type) == (
            "model_not_found",
            "model",
            "invalid_request_error",
        )
        assert "gpt-4o" in error.message


def test_a_line_with_a_remote_image_fails_alone_and_nothing_is_fetched(service):
    """The service allows no image host unless configured (image_hosts): a line whose
    image_url is an http(s) address fails with a clear error and the address is never asked;
    a data: URL still runs. (The allow-list itself: tests/core/test_image_hosts.py.)"""
    import base64
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    asked = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        from PIL import Image

        buffer = io.BytesIO()
        Image.new("RGB", (3, 2)).save(buffer, format="PNG")
        data = "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()
        lines = chat_lines(2, prefix="i")
        for line, url in zip(
            lines, (f"http://127.0.0.1:{httpd.server_address[1]}/x.png", data), strict=True
        ):
            line["body"]["messages"][0]["content"] = [
                {"type": "text", "text": "see"},
                {"type": "image_url", "image_url": {"url": url}},
            ]
        api = client(service["url"])
        batch = wait(api, submit(api, lines).id)
    finally:
        httpd.shutdown()
    assert batch.status == "completed", batch
    assert asked == []  # the worker never contacted the address
    (refused,) = lines_of(api, batch.error_file_id)
    assert refused["custom_id"] == "i0" and refused["error"]["code"] == "invalid_image_url"
    assert "remote images are not allowed here" in refused["error"]["message"]
    (answered,) = lines_of(api, batch.output_file_id)
    assert answered["custom_id"] == "i1"
    assert "<image:3x2>" in answered["response"]["body"]["choices"][0]["message"]["content"]


def test_a_responses_batch_answers_response_objects(service):
    """``/v1/responses`` lines (text in, text out) run as chats on the deployment and come
    back as openai's Response objects."""
    from openai.types.responses import Response

    api = client(service["url"])
    lines = [
        {
            "custom_id": f"s{i}",
            "method": "POST",
            "url": "/v1/responses",
            "body": {"model": "echo", "input": f"line {i} words", "instructions": "echo it"},
        }
        for i in range(3)
    ]
    uploaded = api.files.create(file=("responses.jsonl", jsonl(lines)), purpose="batch")
    created = api.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/responses", completion_window="24h"
    )
    batch = wait(api, created.id)
    assert batch.status == "completed" and batch.request_counts.completed == 3, batch
    for line in lines_of(api, batch.output_file_id):
        response = Response.model_validate(line["response"]["body"])
        number = line["custom_id"][1:]
        assert response.status == "completed"
        assert response.output_text == f"echo it line {number} words"


def test_the_batch_apis_output_lines_carry_the_weight_version_that_answered(service, tmp_path):
    """A deployment updated with ``update_weights``: the service's output lines carry the
    version in ``response.body.weight_version``, each answered by those weights (echo's
    answers start with the checkpoint's tag); null before any update."""
    import relayllm
    from relayllm.testing.echo import write_echo_checkpoint

    name = "versioned"
    relayllm.deploy(relayllm.DeploymentConfig(name=name, backend="echo"))
    try:
        api = client(service["url"])
        before = wait(api, submit(api, chat_lines(2, model=name, prefix="v")).id)
        relayllm.control(name).update_weights(write_echo_checkpoint(tmp_path, "w9"), version=9)
        after = wait(api, submit(api, chat_lines(3, model=name, prefix="w")).id)
    finally:
        relayllm.shutdown(name)
    assert (before.status, after.status) == ("completed", "completed"), (before, after)
    old, new = lines_of(api, before.output_file_id), lines_of(api, after.output_file_id)
    assert [line["response"]["body"]["weight_version"] for line in old] == [None, None]
    check_bodies(old, "v")
    assert [line["response"]["body"]["weight_version"] for line in new] == ["9"] * 3
    for line in new:
        number = line["custom_id"][1:]
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        assert content == f"[w9] line {number} words", line
