"""The OpenAI-compatible HTTP front of a deployment, answered through Serve's real HTTP proxy
on loopback and called with the real ``openai`` client, on the same echo replica a batch
processor uses at the same time."""

import json
import os
import re
import secrets
import shlex
import threading
import urllib.error
import urllib.request

import pytest
import support
from support import REPO, echo_deployment, serve_proxy_on_http_port, session_logs_holding

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

KEY_ENV = "RELAYLLM_TEST_HTTP_KEY"
# Set while the test modules are collected, before the session's Ray cluster starts: Ray's
# workers (the replica) inherit the environment the cluster was started with, and the key
# must not travel in the deployment's config (which info() and describe() show).
KEY = os.environ.setdefault(KEY_ENV, secrets.token_hex(16))
#: The control routes' key: another variable, another value.
ADMIN_ENV = "RELAYLLM_TEST_HTTP_ADMIN_KEY"
ADMIN = os.environ.setdefault(ADMIN_ENV, secrets.token_hex(16))
NAME = "httpfront"


#: Serve's one proxy, the session's: every deployment here and in test_http_shapes shares it.
PORT = support.HTTP_PORT


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The directory the control routes may load adapters and weights from, and one beside
    it they may not."""
    root = tmp_path_factory.mktemp("http-sources")
    for name in ("allowed/terse", "outside/terse"):
        (root / name).mkdir(parents=True)
    return root


@pytest.fixture(scope="module")
def front(sources):
    serve_proxy_on_http_port()  # Serve gets its HTTP proxy only while no application runs
    http = {
        "route_prefix": "/echo",
        "port": PORT,
        "api_key_env": KEY_ENV,
        "admin_key_env": ADMIN_ENV,
        "admin_sources": [str(sources / "allowed")],
    }
    with echo_deployment(NAME, options={"fail_marker": "POISON"}, http=http) as ref:
        info = ref.handle().info.remote().result(timeout_s=60)
        client = openai.OpenAI(base_url=info["http"]["url"], api_key=KEY, max_retries=0)
        yield ref, info, client


def test_chat_answers_with_openai_types_and_usage(front):
    _, _, client = front
    reply = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "one two three"}], max_tokens=2
    )
    assert reply.choices[0].message.content == "one two"
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 2)
    assert reply.model == NAME and reply.object == "chat.completion"


def test_chat_streams_chunks_the_client_parses(front):
    _, _, client = front
    stream = client.chat.completions.create(
        model=NAME,
        messages=[{"role": "user", "content": "stream me please"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "stream me please"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop"
    assert chunks[-1].usage.completion_tokens == 3


def test_completion_and_its_stream(front):
    _, _, client = front
    done = client.completions.create(model=NAME, prompt="a b c")
    assert done.choices[0].text == "a b c" and done.object == "text_completion"
    parts = list(client.completions.create(model=NAME, prompt="x y", stream=True))
    assert "".join(p.choices[0].text for p in parts) == "x y"


def test_embeddings_in_base64_and_floats(front):
    _, _, client = front
    # The client asks for base64 by default and decodes it itself.
    got = client.embeddings.create(model=NAME, input=["aa bbb", "c"])
    assert got.data[0].embedding[:3] == [2.0, 3.0, 0.0]
    assert got.data[1].embedding[0] == 1.0 and got.usage.prompt_tokens == 3
    floats = client.embeddings.create(model=NAME, input="dddd", encoding_format="float")
    assert floats.data[0].embedding[0] == 4.0


def test_models_lists_the_served_name(front):
    _, _, client = front
    assert [m.id for m in client.models.list()] == [NAME]


def test_missing_or_wrong_key_is_401_and_the_key_is_never_shown(front):
    ref, info, _ = front
    url = info["http"]["url"]
    for key in ("wrong-key", None):
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        request = urllib.request.Request(f"{url}/models", headers=headers)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(request, timeout=30)
        assert err.value.code == 401
        body = json.loads(err.value.read())
        assert body["error"]["code"] == "invalid_api_key"
        assert KEY not in json.dumps(body)
    bad = openai.OpenAI(base_url=url, api_key="nope", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    described = ref.handle().describe.remote().result(timeout_s=30)
    shown = json.dumps([described, ref.handle().info.remote().result(timeout_s=30)])
    assert KEY not in shown and KEY_ENV in shown  # the variable's name, never its value


def test_bad_requests_get_openai_error_bodies(front):
    _, _, client = front
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=NAME, messages=[{"role": "nobody", "content": "x"}])
    assert err.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as err:  # the engine's refusal of the row
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "POISON"}])
    assert "POISON" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError):
        client.post("/nowhere", cast_to=object, body={})


def test_batch_rows_and_http_requests_share_one_replica_at_once(front):
    import ray

    ref, info, client = front
    answers: list[str] = []

    def interactive():
        for i in range(20):
            reply = client.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": f"hello {i}"}]
            )
            answers.append(reply.choices[0].message.content)

    jobs_before = ref.handle().info.remote().result(timeout_s=30)["admission"]["jobs"]
    thread = threading.Thread(target=interactive)
    thread.start()
    processor = build_processor(ProcessorConfig(deployment=NAME, task="completion", batch_size=8))
    rows = processor(ray.data.from_items([{"prompt": f"row {i}"} for i in range(200)])).take_all()
    thread.join(timeout=120)
    assert sorted(answers) == sorted(f"hello {i}" for i in range(20))
    assert sorted(r["generated_text"] for r in rows) == sorted(f"row {i}" for i in range(200))
    assert all(r["error"] is None for r in rows)
    after = ref.handle().info.remote().result(timeout_s=30)
    assert after["replica_id"] == info["replica_id"]  # one engine served both
    assert after["http"]["rows"] >= info["http"]["rows"] + 20
    assert after["rows"] >= 200
    # Every call of the run carried its run id, from every stage task: one job, not one per
    # call or per worker process (what admission's restart tells a job's first call by).
    assert after["admission"]["jobs"] == jobs_before + 1, after["admission"]


def test_rows_and_tokens_by_traffic_class_in_info_status_and_ray_metrics(front):
    """The core counts every backend's rows and tokens by traffic class: batch rows (a
    processor) and interactive requests (the HTTP front, streamed or not) each land in their
    class, in info(), in status's table and on Ray's Prometheus endpoint."""
    import ray

    from relayllm.cli.lifecycle import METRICS_COLUMNS, metrics_cells
    from relayllm.testing.prometheus import wait_for_sample

    ref, _, client = front
    handle = ref.handle()
    before = handle.info.remote().result(timeout_s=30)["metrics"]
    processor = build_processor(ProcessorConfig(deployment=NAME, task="completion", batch_size=8))
    rows = processor(ray.data.from_items([{"prompt": "a b c"} for _ in range(24)])).take_all()
    assert all(r["error"] is None for r in rows)
    client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "d e"}])
    streamed = client.completions.create(model=NAME, prompt="f g h i", stream=True)
    assert "".join(p.choices[0].text for p in streamed) == "f g h i"
    after = handle.info.remote().result(timeout_s=30)["metrics"]

    def grew(cls: str, kind: str | None = None) -> int:
        if kind is None:
            return after["rows_by_class"][cls] - before["rows_by_class"][cls]
        return after["tokens_by_class"][cls][kind] - before["tokens_by_class"][cls][kind]

    assert (grew("batch"), grew("batch", "input"), grew("batch", "generated")) == (24, 72, 72)
    # A streamed request counts once, with the token counts of its last part.
    assert (grew("interactive"), grew("interactive", "input")) == (2, 2 + 4)
    assert grew("interactive", "generated") == 2 + 4
    # Echo's 'engine' reports its queue and its calls' time; it has no KV cache.
    assert after["queue"] == {"waiting": 0, "running": 0} and after["latency_s"]["count"] > 0
    assert after["kv_cache_use"] is None and after["ttft_s"] is None
    cells = dict(zip(METRICS_COLUMNS[1:], metrics_cells(after), strict=True))
    assert cells["queue"] == "0/0" and cells["kv_cache"] == "-"
    assert cells["batch_rows"] == str(after["rows_by_class"]["batch"])

    # Ray exports what the replica counted (its values reach the endpoint within ~10 s).
    for cls in ("batch", "interactive"):
        tags = {"deployment": NAME, "traffic_class": cls}
        expected = after["rows_by_class"][cls]
        wait_for_sample("ray_relayllm_rows_total", lambda v, e=expected: v == e, **tags)
        expected = after["tokens_by_class"][cls]["generated"]
        wait_for_sample("ray_relayllm_generated_tokens_total", lambda v, e=expected: v == e, **tags)
    assert wait_for_sample(
        "ray_relayllm_request_latency_seconds_count", lambda v: v > 0, deployment=NAME
    )


def test_admission_backs_batch_rows_off_while_interactive_is_slow_and_refills_after(front):
    import time

    import ray

    # The echo 'engine' answers slower the more rows it holds (10 ms per row), so interactive
    # requests are slower than the 0.1 s target while many batch rows are in: the controller
    # must cut the batch rows, and give them the maximum back once interactive stops (idle_s).
    config = DeploymentConfig(
        name="httpadmit",
        backend="echo",
        options={"delay_s": 0.01, "delay_per_busy_row_s": 0.01},
        http={"route_prefix": "/admit", "port": PORT},
        admission={
            "target_ttft_s": 0.1,
            "max_batch_rows": 64,
            "increase_rows": 16,
            "interval_s": 0.2,
            "idle_s": 1.0,
        },
    )
    ref = relayllm.deploy(config)
    info = ref.handle().info.remote().result(timeout_s=60)
    client = openai.OpenAI(base_url=info["http"]["url"], api_key="unused", max_retries=0)
    done = threading.Event()
    answered = []

    def interactive():
        while not done.is_set():
            reply = client.completions.create(model="httpadmit", prompt="quick question")
            answered.append(reply.choices[0].text)

    thread = threading.Thread(target=interactive)
    thread.start()
    try:
        processor = build_processor(
            ProcessorConfig(
                deployment="httpadmit", task="completion", batch_size=16, max_in_flight_batches=8
            )
        )
        items = [{"prompt": f"row {i}"} for i in range(600)]
        rows = processor(ray.data.from_items(items)).take_all()
    finally:
        done.set()
        thread.join(timeout=60)
    during = ref.handle().info.remote().result(timeout_s=30)["admission"]
    assert all(r["error"] is None for r in rows) and len(rows) == 600  # nothing lost
    assert answered and set(answered) == {"quick question"}
    assert during["cuts"] >= 1 and during["lowest_limit"] < 64, during
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # no interactive traffic: the limit climbs back
        after = ref.handle().info.remote().result(timeout_s=30)["admission"]
        if after["limit"] == 64:
            break
        time.sleep(0.5)
    # Back by additive steps while the job ran with interactive traffic, or at once after
    # idle_s (tests/unit/core/test_admission.py tells the two apart).
    assert after["limit"] == 64 and after["raises"] + after["refills"] >= 1, after
    relayllm.shutdown("httpadmit")


#: Request bodies sent through both doors: the HTTP front and a batch file.
BOTH_DOORS = [
    (
        "/v1/chat/completions",
        {
            "model": NAME,
            "messages": [{"role": "user", "content": "one two three four"}],
            "max_completion_tokens": 2,
            "temperature": 0,
            "user": "u1",
        },
    ),
    (
        "/v1/chat/completions",
        {
            "model": NAME,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "parts of text"}]},
            ],
            "seed": 7,
        },
    ),
    ("/v1/completions", {"model": NAME, "prompt": "a b c", "max_tokens": 5, "stop": ["z"]}),
    ("/v1/completions", {"model": NAME, "prompt": ["x y z"], "max_tokens": 1}),
    ("/v1/embeddings", {"model": NAME, "input": "aa bbb", "encoding_format": "float"}),
    # refused: echo declares no logprobs; the engine refuses a row with its fail marker
    (
        "/v1/chat/completions",
        {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "logprobs": True},
    ),
    ("/v1/completions", {"model": NAME, "prompt": "a POISON b"}),
]


def _post(url: str, body: dict | None, key: str | None = KEY) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def _without_ids(body: dict) -> dict:
    """A response body without what differs by request (ids, time, engine time) or by door
    (``model``: the HTTP front names its served model, a batch line the engine's)."""
    return {k: v for k, v in body.items() if k not in ("id", "created", "engine_s", "model")}


def test_the_same_bodies_answer_the_same_through_both_doors(front, tmp_path):
    _, info, _ = front
    base = info["http"]["url"].removesuffix("/v1")
    path = tmp_path / "in.jsonl"
    path.write_text(
        "".join(
            json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body}) + "\n"
            for i, (url, body) in enumerate(BOTH_DOORS)
        )
    )
    counts = relayllm.run_batch_file(path, deployment=NAME, output=tmp_path / "out.jsonl")
    assert (counts.total, counts.completed, counts.failed) == (7, 5, 2)
    with open(counts.output) as out, open(counts.errors) as err:
        lines = [json.loads(x) for x in [*out, *err]]
    by_id = {line["custom_id"]: line for line in lines}
    for i, (url, body) in enumerate(BOTH_DOORS):
        status, answer = _post(base + url, body)
        line = by_id[f"c{i}"]
        if status == 200:
            assert line["error"] is None, line
            assert _without_ids(line["response"]["body"]) == _without_ids(answer), (url, body)
        else:
            assert status == 400 and line["response"] is None, (status, answer)
            assert answer["error"]["message"] in line["error"]["message"], (answer, line)


def test_control_routes_pause_and_resume_the_deployment_behind_a_key_of_their_own(front):
    """``POST <prefix>/admin/CALL`` is ``relayllm.control(name).CALL(**body)``, with its own
    key: the API key is refused there, and the admin key is never shown."""
    ref, info, client = front
    admin = info["http"]["url"].removesuffix("/v1") + "/admin"
    controller = relayllm.control(NAME)
    for key in (KEY, "wrong", None):  # the API key opens the API, not the engine's controls
        status, body = _post(f"{admin}/pause", {}, key=key)
        assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert not controller.is_paused()

    assert _post(f"{admin}/pause", {"mode": "wait"}, key=ADMIN) == (
        200,
        {"call": "pause", "result": None},
    )
    try:
        assert controller.is_paused()
        assert _post(f"{admin}/is_paused", None, key=ADMIN) == (
            200,
            {"call": "is_paused", "result": True},
        )
        with pytest.raises(openai.APIStatusError) as err:  # interactive requests: come back
            client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "x"}])
        assert err.value.status_code == 503
    finally:
        assert _post(f"{admin}/resume", None, key=ADMIN)[0] == 200
    assert not controller.is_paused()
    reply = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a"}])
    assert reply.choices[0].message.content == "a"

    status, body = _post(f"{admin}/tokenize", {"text": "one two"}, key=ADMIN)
    assert status == 200 and body["result"] == controller.tokenize("one two")
    # What the caller got wrong is named: the call, its arguments, a value.
    status, body = _post(f"{admin}/halt", {}, key=ADMIN)
    assert status == 404 and "pause" in body["error"]["message"]
    status, body = _post(f"{admin}/pause", {"speed": 3}, key=ADMIN)
    assert status == 400 and "speed" in body["error"]["message"]
    status, body = _post(f"{admin}/pause", {"mode": "abort"}, key=ADMIN)
    assert status == 400 and "abort" in body["error"]["message"]
    assert not controller.is_paused()  # nothing was changed by a refused call
    shown = json.dumps([ref.handle().describe.remote().result(timeout_s=30), controller.replicas()])
    assert ADMIN not in shown and ADMIN_ENV in shown


def _curl(line: str, env: dict[str, str]) -> tuple[int, dict]:
    """One ``curl -X POST -H ... URL -d JSON`` line of a page, sent as curl would send it."""
    for name, value in env.items():
        line = line.replace(f"${name}", value)
    args = shlex.split(line.replace("\\\n", " "), comments=True)
    assert args[0] == "curl", line
    method, headers, data, url = "GET", {}, None, None
    words = iter(args[1:])
    for word in words:
        if word == "-X":
            method = next(words)
        elif word == "-H":
            name, _, value = next(words).partition(": ")
            headers[name] = value
        elif word == "-d":
            data = next(words).encode()
            headers.setdefault("Content-Type", "application/x-www-form-urlencoded")
        else:
            url = word
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def test_the_control_pages_http_commands_do_what_it_says(front):
    """docs/control.md's ``curl`` block, its host, port and name made this front's: each
    command answers 200, with the body its comment shows where it shows one."""
    _, info, _ = front
    page = (REPO / "docs" / "control.md").read_text(encoding="utf-8")
    (block,) = re.findall(r"^```bash\n(.*?)^```$", page, flags=re.S | re.M)
    base = info["http"]["url"].removesuffix("/v1")
    block = block.replace("http://127.0.0.1:8000/smollm", base)
    commands = re.split(r"\n(?=curl )", block.strip())
    assert len(commands) == 2, commands  # pause, resume
    env = {"ADMIN_KEY": ADMIN}
    controller = relayllm.control(NAME)
    for command, paused in zip(commands, (True, False), strict=True):
        status, body = _curl(command, env)
        assert status == 200, (command, body)
        said = re.search(r"# (\{.*\})", command)
        if said:
            assert body == json.loads(said.group(1)), (command, body)
        assert controller.is_paused() is paused


def test_control_routes_load_adapters_only_from_admin_sources(front, sources):
    """docs/control.md, "Sources over HTTP": a source outside ``http.admin_sources`` (or
    stepping out of it) is a 403 before any replica is asked; one inside is loaded."""
    _, info, client = front
    admin = info["http"]["url"].removesuffix("/v1") + "/admin"
    controller = relayllm.control(NAME)
    allowed = str(sources / "allowed" / "terse")
    for path in (
        str(sources / "outside" / "terse"),
        f"{sources}/allowed/../outside/terse",
        f"{sources}/allowed/%2e%2e/outside/terse",
        "allowed/terse",
    ):
        status, body = _post(f"{admin}/load_adapter", {"name": "terse", "path": path}, ADMIN)
        assert (status, body["error"]["code"]) == (403, "source_not_allowed"), (path, body)
    status, body = _post(f"{admin}/update_weights", {"source": "/", "version": 2}, ADMIN)
    assert status == 403, body
    assert controller.adapters() == {} and controller.weight_version() is None
    assert _post(f"{admin}/load_adapter", {"name": "terse", "path": allowed}, ADMIN) == (
        200,
        {"call": "load_adapter", "result": None},
    )
    try:
        assert controller.adapters() == {"terse": allowed}
        reply = client.completions.create(model="terse", prompt="a b")
        assert reply.choices[0].text == "<terse> a b"
    finally:
        controller.unload_adapter("terse")


def test_without_admin_key_env_the_control_routes_answer_404(front):
    """A deployment with an ``http`` section but no ``admin_key_env`` serves no control
    route, whatever key is sent: nothing is paused."""
    config = DeploymentConfig(
        name="httpplain", backend="echo", http={"route_prefix": "/plain", "port": PORT}
    )
    ref = relayllm.deploy(config)
    try:
        url = ref.handle().info.remote().result(timeout_s=60)["http"]["url"]
        admin = url.removesuffix("/v1") + "/admin"
        for key in (KEY, ADMIN, None):
            for call in ("pause", "update_weights", "nothing"):
                status, body = _post(f"{admin}/{call}", {}, key=key)
                assert (status, body["error"]["code"]) == (404, "not_found"), (call, body)
        assert not relayllm.control("httpplain").is_paused()
    finally:
        relayllm.shutdown("httpplain")


def test_bodies_answered_after_a_weight_update_carry_its_version(front, tmp_path):
    """docs/control.md's promise at the HTTP door: after ``update_weights`` every body says
    which weights answered it (top-level ``weight_version``: in a chat completion, a text
    completion and every chunk of a stream after the first part of the answer). Near the
    module's end: the answers then carry the checkpoint's tag."""
    from relayllm.testing.echo import write_echo_checkpoint

    _, _, client = front
    before = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "a b"}]
    )
    relayllm.control(NAME).update_weights(write_echo_checkpoint(tmp_path / "w", "w9"), version=9)
    chat = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "a b"}])
    text = client.completions.create(model=NAME, prompt="a b")
    chunks = list(
        client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "a b c"}], stream=True
        )
    )
    assert (before.model_extra or {}).get("weight_version") is None  # never updated: null
    assert chat.model_extra["weight_version"] == text.model_extra["weight_version"] == "9"
    assert chat.choices[0].message.content.startswith("[w9]"), "answered by the new weights"
    versions = [c.model_extra.get("weight_version") for c in chunks if c.choices]
    assert versions and set(versions[1:]) == {"9"}, versions


def test_the_keys_are_in_no_log_line_of_the_session(front, ray_session):
    """Runs last: the API key went with every request of the module, the admin key with the
    control calls, and wrong keys with the refused ones; none of them is in a log file."""
    _, info, _ = front
    wrong = "wrong-" + secrets.token_hex(16)
    status, _ = _post(info["http"]["url"].removesuffix("/v1") + "/admin/pause", {}, key=wrong)
    assert status == 401
    read, found = session_logs_holding(ray_session, KEY, ADMIN, wrong)
    assert read > 10 and not found, found
