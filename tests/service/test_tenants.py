"""Projects as tenants, end to end: ``relayllm serve`` on the echo backend (a subprocess, as a
user runs it) with two projects' keys and the admin key, the real ``openai`` client on
loopback. The Usage API's numbers (read with the client's own
``admin.organization.usage.completions``) equal the sums over the batches' output files and
the online answers' ``usage``; ``relayllm usage`` prints the same; a runner SIGKILLed in the
middle of a batch charges each line once.

Each quota through the gateway: a request over it is refused with OpenAI's error body and
changes nothing, and the other project is not affected.

Projects managed on the running service: a key rotated in the keys file is refused from the
next request, a project added or disabled there answers accordingly, and a quota changed in
the quotas file applies to the next request, all without a restart.

One service for the module."""

import json
import os
import signal
import time

import pytest
from batch_api import (
    ADMIN_KEY,
    PROJECT_KEYS,
    chat_lines,
    client,
    finished_lines,
    lines_of,
    serve_echo,
    submit,
    wait,
)
from support import cli

pytestmark = pytest.mark.usefixtures("ray_session")

openai = pytest.importorskip("openai")

DEPLOYMENTS = """\
deployments:
  - name: echo
    backend: echo
  - name: slow
    backend: echo
    options:
      delay_s: 0.3
"""
SLOW_LINES = 96  # twelve blocks of 8: more than run at once, so progress shows mid-batch
#: alpha: at most one batch not finished, 200 kB of files; beta: 2,000 enqueued tokens on
#: echo and 3 online requests a minute.
QUOTAS = """\
alpha: {stored_bytes: 200000, batches: 1}
beta: {enqueued_tokens: {echo: 2000}, requests_per_minute: 3}
"""
RPM = 3
#: The keys file's project (the environment gives alpha and beta).
GAMMA_OLD, GAMMA_NEW, DELTA = "gamma-old-" + "o" * 24, "gamma-new-" + "n" * 24, "delta-" + "d" * 24


@pytest.fixture(scope="module")
def service(ray_session, tmp_path_factory):
    root = tmp_path_factory.mktemp("tenants")
    began = int(time.time())
    (root / "quotas.yaml").write_text(QUOTAS)
    (root / "keys.txt").write_text(f"gamma={GAMMA_OLD}\n")
    url, address, _ = serve_echo(
        ray_session,
        root,
        DEPLOYMENTS,
        "--batch-size",
        2,
        "--quotas",
        root / "quotas.yaml",
        "--keys-file",
        root / "keys.txt",
    )
    yield {
        "url": url,
        "began": began,
        "state": str(root / "state"),
        "root": root,
        "alpha": client(url, PROJECT_KEYS["alpha"]),
        "beta": client(url, PROJECT_KEYS["beta"]),
        "admin": openai.OpenAI(
            base_url=url, api_key=ADMIN_KEY, admin_api_key=ADMIN_KEY, max_retries=0
        ),
    }
    cli("unserve", "--address", address, check=0)


def sums(lines):
    """(requests, input, cached, output) summed over output lines, as a client reads them."""
    total = [0, 0, 0, 0]
    for line in lines:
        usage = line["response"]["body"]["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        for i, n in enumerate((1, usage["prompt_tokens"], cached, usage["completion_tokens"])):
            total[i] += n
    return tuple(total)


def usage_of(service, **params):
    """The Usage API's results over the whole test run, summed per (project, model)."""
    page = service["admin"].admin.organization.usage.completions(
        start_time=service["began"] - 60, end_time=int(time.time()) + 120, **params
    )
    assert page.object == "page"
    found = {}
    for bucket in page.data:
        assert bucket.object == "bucket"
        for r in bucket.results:
            key = (r.project_id, r.model)
            before = found.get(key, (0, 0, 0, 0))
            now = (r.num_model_requests, r.input_tokens, r.input_cached_tokens, r.output_tokens)
            found[key] = tuple(a + b for a, b in zip(before, now, strict=True))
    return found


def test_the_usage_api_equals_the_sums_over_the_output_files_and_online_answers(service):
    alpha, beta = service["alpha"], service["beta"]
    done = [
        wait(alpha, submit(alpha, chat_lines(3)).id),
        wait(beta, submit(beta, chat_lines(5, prefix="b")).id),
        wait(alpha, submit(alpha, chat_lines(2, prefix="c")).id),
    ]
    assert [b.status for b in done] == ["completed"] * 3
    outputs = {p: [] for p in ("alpha", "beta")}
    for project, batch in zip(("alpha", "beta", "alpha"), done, strict=True):
        outputs[project] += lines_of(alpha if project == "alpha" else beta, batch.output_file_id)
    batch_usage = usage_of(service, group_by=["project_id", "model"], batch=True)
    assert batch_usage == {
        ("alpha", "echo"): sums(outputs["alpha"]),
        ("beta", "echo"): sums(outputs["beta"]),
    }
    assert batch_usage["alpha", "echo"][0] == 5 and batch_usage["alpha", "echo"][1] > 0

    message = [{"role": "user", "content": "how many words are here"}]
    answer = alpha.chat.completions.create(model="echo", messages=message)
    streamed = list(
        beta.chat.completions.create(
            model="echo", messages=message, stream=True, stream_options={"include_usage": True}
        )
    )
    (last,) = [chunk for chunk in streamed if chunk.usage is not None]
    # Recorded before the stream's [DONE] went out, so the client reads it at once.
    online = usage_of(service, group_by=["project_id"], batch=False)
    assert online == {
        ("alpha", None): (1, answer.usage.prompt_tokens, 0, answer.usage.completion_tokens),
        ("beta", None): (1, last.usage.prompt_tokens, 0, last.usage.completion_tokens),
    }
    assert online["alpha", None][1] > 0

    with pytest.raises(openai.PermissionDeniedError):  # a project's key reads no usage
        openai.OpenAI(
            base_url=service["url"], api_key="x", admin_api_key=PROJECT_KEYS["alpha"]
        ).admin.organization.usage.completions(start_time=service["began"])


def test_relayllm_usage_prints_what_the_api_answers(service):
    expected = usage_of(service, group_by=["project_id", "model"])
    env = {**os.environ, "RELAYLLM_BASE_URL": service["url"], "RELAYLLM_API_KEY": ADMIN_KEY}
    env.pop("OPENAI_API_KEY", None)
    since = ["--start", str(service["began"] - 60), "--bucket", "1d"]
    buckets = json.loads(cli("usage", *since, "--json", env=env, check=0).stdout)
    printed = {}
    for bucket in buckets:
        for r in bucket["results"]:
            key = (r["project_id"], r["model"])
            row = (r["num_model_requests"], r["input_tokens"], r["input_cached_tokens"])
            row += (r["output_tokens"],)
            printed[key] = tuple(
                a + b for a, b in zip(printed.get(key, (0,) * 4), row, strict=True)
            )
    assert printed == expected
    table = cli("usage", *since, env=env, check=0).stdout.splitlines()
    assert table[0].split() == ["bucket", "project_id", "model", "requests", "input", "cached",
                                "output", "engine_s"]  # fmt: skip
    assert len(table) - 2 >= len(expected)
    refused = cli("usage", *since, env={**env, "RELAYLLM_API_KEY": PROJECT_KEYS["beta"]})
    assert refused.returncode != 0 and "403" in refused.stderr


def test_a_runner_killed_mid_batch_charges_each_line_once(service):
    """SIGKILL of the runner while a slow batch runs: Ray restarts it, the new claim carries
    the work file over and runs the rest; the batch's usage equals its output file's sums."""
    import ray

    from relayllm_service.runner.actor import RUNNER_NAMESPACE
    from relayllm_service.settings import ServiceSettings
    from relayllm_service.tenancy.usage import UsageLedger

    settings = ServiceSettings(state_dir=service["state"])
    runner = ray.get_actor(settings.runner_name, namespace=RUNNER_NAMESPACE)
    pid = ray.get(runner.pid.remote(), timeout=30)
    beta = service["beta"]
    created = submit(beta, chat_lines(SLOW_LINES, model="slow", prefix="k"))
    running = wait(beta, created.id, finished_lines(4))
    assert running.status == "in_progress" and running.request_counts.completed < SLOW_LINES
    os.kill(pid, signal.SIGKILL)
    batch = wait(beta, created.id, timeout=120)
    assert batch.status == "completed", batch
    assert ray.get(runner.pid.remote(), timeout=60) != pid  # Ray restarted it
    output = lines_of(beta, batch.output_file_id)
    assert len(output) == SLOW_LINES
    ledger = UsageLedger(settings.store_path)
    try:
        (charged,) = ledger.batch_totals(created.id).values()
    finally:
        ledger.close()
    got = (charged.requests, charged.input_tokens, charged.cached_tokens, charged.output_tokens)
    assert got == sums(output)


def test_a_batch_over_the_enqueued_token_quota_is_refused_as_openai_refuses_it(service):
    alpha, beta = service["alpha"], service["beta"]
    before = [b.id for b in beta.batches.list()]
    files = len(list(beta.files.list()))
    big = [{**line, "body": {**line["body"], "messages": [{"role": "user", "content": "w" * 8004}]}}
           for line in chat_lines(1, prefix="big")]  # fmt: skip
    with pytest.raises(openai.RateLimitError) as refused:
        submit(beta, big)
    assert refused.value.code == "token_limit_exceeded"
    assert refused.value.body["message"] == (
        "Enqueued token limit reached for echo in project beta. Limit: 2,000 enqueued "
        "tokens. Please try again once some in_progress batches have been completed."
    )
    assert [b.id for b in beta.batches.list()] == before  # nothing queued
    assert len(list(beta.files.list())) == files + 1  # its upload, as a client made it
    assert wait(beta, submit(beta, chat_lines(3, prefix="s")).id).status == "completed"
    assert wait(alpha, submit(alpha, big).id).status == "completed"  # no such quota


def test_a_second_unfinished_batch_is_refused_and_the_room_comes_back(service):
    """alpha's first batch is held unfinished (its deployment paused: its lines wait in the
    replica) until it is cancelled, however fast the machine runs it otherwise."""
    import relayllm

    alpha, beta = service["alpha"], service["beta"]
    slow = relayllm.control("slow")
    slow.pause()
    try:
        first = submit(alpha, chat_lines(8, model="slow", prefix="q"))
        with pytest.raises(openai.RateLimitError) as refused:
            submit(alpha, chat_lines(1))
        assert refused.value.code == "batch_limit_exceeded"
        assert wait(beta, submit(beta, chat_lines(2, prefix="o")).id).status == "completed"
        alpha.batches.cancel(first.id)
    finally:
        slow.resume()
    assert wait(alpha, first.id).status == "cancelled"
    assert wait(alpha, submit(alpha, chat_lines(1)).id).status == "completed"


def test_an_upload_over_the_stored_bytes_quota_is_refused_and_nothing_is_kept(service):
    alpha, beta = service["alpha"], service["beta"]
    before = sorted(f.id for f in alpha.files.list())
    stored = os.path.join(service["state"], "files")  # the service's file storage

    def on_disk():
        return set(os.listdir(stored)) if os.path.isdir(stored) else set()

    kept = on_disk()
    data = b"x" * 250_000
    with pytest.raises(openai.BadRequestError) as refused:
        alpha.files.create(file=("big.jsonl", data), purpose="batch")
    assert refused.value.code == "storage_limit_exceeded"
    assert sorted(f.id for f in alpha.files.list()) == before
    # The refused upload's bytes are gone from the storage too, not only from the listing.
    assert on_disk() == kept, "the refused upload's bytes were kept"
    assert beta.files.create(file=("big.jsonl", data), purpose="batch").bytes == len(data)


def test_online_requests_over_the_per_minute_quota_answer_429_with_retry_after(service):
    """beta's fourth request in a clock minute is refused (a minute may turn over during the
    loop: then more pass, never more than the limit in one minute)."""
    message = [{"role": "user", "content": "hello"}]
    beta = service["beta"]
    answered = []
    with pytest.raises(openai.RateLimitError) as refused:
        for _ in range(2 * RPM + 1):
            answered.append(beta.chat.completions.create(model="echo", messages=message))
    assert len(answered) <= 2 * RPM
    assert refused.value.code == "rate_limit_exceeded"
    assert refused.value.body["type"] == "requests"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    assert service["alpha"].chat.completions.create(model="echo", messages=message).choices


def _replace(path, text):
    """A file rewritten as the docs say: a new file moved over the old one."""
    part = path.with_name(path.name + ".new")
    part.write_text(text)
    os.replace(part, path)


def test_projects_change_on_the_running_service_without_a_restart(service):
    """Through the gateway, with the openai client: rotate, add, disable, change a quota."""
    url, root = service["url"], service["root"]
    keys, quotas = root / "keys.txt", root / "quotas.yaml"
    message = [{"role": "user", "content": "hello"}]
    old = client(url, GAMMA_OLD)
    assert old.files.list().data == []
    try:
        _replace(keys, f"gamma={GAMMA_NEW}\n")  # rotated
        with pytest.raises(openai.AuthenticationError):
            old.files.list()
        new = client(url, GAMMA_NEW)
        assert new.chat.completions.create(model="echo", messages=message).choices
        delta = client(url, DELTA)
        with pytest.raises(openai.AuthenticationError):
            delta.files.list()
        _replace(keys, f"gamma={GAMMA_NEW}\ndelta={DELTA}\n")  # added
        assert delta.files.list().data == []
        _replace(keys, f"gamma={GAMMA_NEW}\n# delta={DELTA}\n")  # disabled
        with pytest.raises(openai.AuthenticationError):
            delta.files.list()
        _replace(quotas, QUOTAS + "gamma: {requests_per_minute: 1}\n")  # a quota set
        with pytest.raises(openai.RateLimitError) as refused:
            for _ in range(3):  # at most one per clock minute, two if a minute turns over
                new.chat.completions.create(model="echo", messages=message)
        assert refused.value.code == "rate_limit_exceeded"
        assert "Limit 1," in refused.value.message
    finally:
        _replace(quotas, QUOTAS)
        _replace(keys, f"gamma={GAMMA_OLD}\n")
    assert old.files.list().data == []
