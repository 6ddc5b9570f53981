"""The runner's steps that need no cluster, on a real SQLite store and a real directory: a
batch that fails validation, one cancelled before it ran, expiry after a killed claim (its
lines carried over, the cut one trimmed, the rest ``batch_expired``), and a replaced claim
that can publish nothing; the processor settings its lines run with (no local image files).
Plus the service's settings and the keys' fingerprint."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path

import pytest

from relayllm.deployments.names import app_name, name_of
from relayllm_service.errors import StaleClaimError
from relayllm_service.runner.job import BatchJob, processor_fields
from relayllm_service.runner.workfiles import EXPIRED_MESSAGE
from relayllm_service.settings import ServiceSettings, gateway_name_of
from relayllm_service.tenancy.keys import KeyMap

CHAT = "/v1/chat/completions"


def line(i: int) -> dict:
    body = {"model": "echo", "messages": [{"role": "user", "content": f"hi {i}"}]}
    return {"custom_id": f"r{i}", "method": "POST", "url": CHAT, "body": body}


def output_line(i: int) -> str:
    return json.dumps({"id": f"x{i}", "custom_id": f"r{i}", "response": {}, "error": None})


def new_batch(service, lines: list[dict] | bytes, window_s: int | None = None):
    settings, store, storage = service
    data = (
        lines
        if isinstance(lines, bytes)
        else b"".join(json.dumps(x).encode() + b"\n" for x in lines)
    )
    record = store.add_file("alpha", filename="in.jsonl", purpose="batch", bytes=len(data))
    storage.put(record.id, [data])
    return store.create_batch("alpha", input_file_id=record.id, endpoint=CHAT, window_s=window_s)


def job(service, batch_id: str, claim: int) -> BatchJob:
    settings, store, storage = service
    return BatchJob(settings, store, storage, batch_id, claim, deployments=lambda: ["echo"])


def content(service, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    with service[2].open(file_id) as source:
        return [json.loads(text) for text in source if text.strip()]


def test_a_batch_that_fails_validation_is_failed_with_the_errors_and_runs_nothing(service):
    _, store, _ = service
    batch = new_batch(service, [line(0), line(0)])
    job(service, batch.id, store.claim(batch.id, "me")).run()
    failed = store.get_batch("alpha", batch.id)
    assert failed.status == "failed" and failed.output_file_id is None
    assert [(e["code"], e["line"]) for e in failed.errors] == [("duplicate_custom_id", 2)]


def test_a_batch_cancelled_before_it_ran_ends_cancelled_without_files(service):
    _, store, _ = service
    batch = new_batch(service, [line(0)])
    store.cancel_batch("alpha", batch.id)
    job(service, batch.id, store.claim(batch.id, "me")).run()
    done = store.get_batch("alpha", batch.id)
    assert done.status == "cancelled" and (done.output_file_id, done.error_file_id) == (None, None)


def test_expiry_after_a_killed_claim_keeps_its_lines_and_errors_the_rest(service):
    _, store, _ = service
    batch = new_batch(service, [line(i) for i in range(4)], window_s=3600)
    first = job(service, batch.id, store.claim(batch.id, "dead"))
    first.update(status="in_progress")
    first._fetch_input(store.get_batch("alpha", batch.id))
    with open(first.output, "w") as out:  # two lines written, a third cut short by the kill
        out.write(output_line(0) + "\n" + output_line(1) + "\n" + output_line(2)[:10])
    second = job(service, batch.id, store.claim(batch.id, "new"))
    second._carry_over()
    second.finish(second.update(), "expired")
    done = store.get_batch("alpha", batch.id)
    assert done.status == "expired"
    assert [x["custom_id"] for x in content(service, done.output_file_id)] == ["r0", "r1"]
    expired = content(service, done.error_file_id)
    assert [(x["custom_id"], x["error"]["code"]) for x in expired] == [
        ("r2", "batch_expired"),
        ("r3", "batch_expired"),
    ]
    assert expired[0]["error"]["message"] == EXPIRED_MESSAGE
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (4, 2, 2)
    assert not os.path.exists(second.dir)  # the work files are gone once stored


def test_a_replaced_claim_publishes_nothing(service):
    _, store, storage = service
    batch = new_batch(service, [line(0)])
    old = job(service, batch.id, store.claim(batch.id, "old"))
    old.update(status="in_progress")
    store.claim(batch.id, "new")
    os.makedirs(old.dir, exist_ok=True)
    with open(old.output, "w") as out:
        out.write(output_line(0) + "\n")
    with pytest.raises(StaleClaimError):
        old.finish(store.get_batch("alpha", batch.id), "cancelled")
    assert [f.id for f in store.list_files("alpha").data] == [batch.input_file_id]
    assert sorted(os.listdir(storage._base)) == [batch.input_file_id]  # no orphan bytes
    assert store.get_batch("alpha", batch.id).status == "in_progress"


def test_settings_name_the_gateway_apart_from_deployments_and_the_runner_by_state():
    settings = ServiceSettings(state_dir="/srv/a", port=8123, route_prefix="/api")
    assert settings.url == "http://127.0.0.1:8123/api/v1"
    assert ServiceSettings(host="0.0.0.0").url == "http://127.0.0.1:8000/v1"
    assert ServiceSettings(host="::1", port=9).url == "http://[::1]:9/v1"
    assert settings.app_name == "relayllm-gateway:gateway"  # one prefix, the gateway's kind
    assert name_of(settings.app_name) is None  # never listed as a deployment
    assert gateway_name_of(settings.app_name) == "gateway"
    assert gateway_name_of("relayllm_old") == "old"  # a gateway started before 0.2
    assert gateway_name_of(app_name("gateway")) is None  # a deployment named gateway
    same = ServiceSettings(state_dir="/srv/a", name="other")
    assert same.runner_name == settings.runner_name  # one runner per state
    assert ServiceSettings(state_dir="/srv/b").runner_name != settings.runner_name
    with pytest.raises(ValueError):
        ServiceSettings(route_prefix="api/")


def test_the_keys_fingerprint_tells_maps_apart_and_holds_no_key():
    key = "k" * 32
    one = KeyMap([("alpha", key)])
    assert one.fingerprint == KeyMap([("alpha", key)]).fingerprint
    assert one.fingerprint != KeyMap([("beta", key)]).fingerprint
    assert one.fingerprint != KeyMap([("alpha", "j" * 32)]).fingerprint
    assert one.fingerprint != KeyMap([("alpha", key)], anonymous="alpha").fingerprint
    assert key not in one.fingerprint


def test_runner_settings_leave_out_the_gateway_only_fields(tmp_path):
    from relayllm_service.runner.loop import runner_fields

    base = ServiceSettings(state_dir=str(tmp_path))
    assert runner_fields(base) == runner_fields(base.model_copy(update={"name": "b", "port": 9}))
    for change in ({"batch_size": 3}, {"concurrency": 2}, {"files": str(tmp_path / "f")}):
        assert runner_fields(base) != runner_fields(base.model_copy(update=change))


def test_start_runner_replaces_a_runner_with_other_settings(tmp_path, monkeypatch):
    """Serving again with another --batch-size stops the runner the state had (for good)
    and starts one with the new settings; the same settings reuse it."""
    import sys
    import types

    from relayllm_service.runner import actor as module
    from relayllm_service.runner.loop import runner_fields

    old = ServiceSettings(state_dir=str(tmp_path))
    new = old.model_copy(update={"batch_size": 3})
    actors: dict[str, object] = {}
    killed: list[object] = []

    class Actor:
        def __init__(self, settings):
            self.settings_json = types.SimpleNamespace(remote=lambda: runner_fields(settings))

    class Remote:
        def options(self, **options):
            self.name = options["name"]
            assert options["get_if_exists"]
            return self

        def remote(self, settings):
            return actors.setdefault(self.name, Actor(settings))

    def kill(actor, no_restart):
        assert no_restart
        killed.append(actor)
        actors.clear()

    fake_ray = types.SimpleNamespace(
        remote=lambda cls: Remote(), get=lambda value, timeout: value, kill=kill
    )
    monkeypatch.setitem(sys.modules, "ray", fake_ray)
    monkeypatch.setattr(module, "find_runner", lambda name: actors.get(name))

    first = module.start_runner(old)
    assert module.start_runner(old) is first and not killed
    second = module.start_runner(new)
    assert killed == [first] and second is not first
    assert second.settings_json.remote()["batch_size"] == 3


def test_an_unexpected_error_publishes_the_finished_lines_and_hides_the_details(service):
    from relayllm_service.runner.loop import RUNNER_ERROR, BatchRunner

    _, store, _ = service
    batch = new_batch(service, [line(0), line(1)])
    failing = job(service, batch.id, store.claim(batch.id, "me"))
    failing.update(status="in_progress")
    failing._fetch_input(store.get_batch("alpha", batch.id))
    with open(failing.output, "w") as out:
        out.write(output_line(0) + "\n")
    secret = OSError(2, "No such file", "/srv/secret/path")
    BatchRunner._fail(None, failing, secret)  # type: ignore[arg-type]
    failed = store.get_batch("alpha", batch.id)
    assert failed.status == "failed"
    assert [x["custom_id"] for x in content(service, failed.output_file_id)] == ["r0"]
    assert failed.errors == [RUNNER_ERROR]
    assert "/srv/secret" not in json.dumps(failed.errors)
    assert not os.path.exists(failing.dir)


def test_a_stale_claim_failing_validation_leaves_the_current_claims_files(service):
    _, store, _ = service
    batch = new_batch(service, [line(0), line(0)])  # a duplicate custom_id: fails validation
    stale = job(service, batch.id, store.claim(batch.id, "old"))
    current = job(service, batch.id, store.claim(batch.id, "new"))
    os.makedirs(current.dir, exist_ok=True)
    with open(current.output, "w") as out:
        out.write(output_line(0) + "\n")
    with pytest.raises(StaleClaimError):
        stale.validate(store.get_batch("alpha", batch.id))
    assert os.path.exists(current.output)
    assert store.get_batch("alpha", batch.id).status == "validating"


def test_a_cancel_arriving_after_the_last_block_ends_the_batch_cancelled(service, monkeypatch):
    _, store, _ = service
    batch = new_batch(service, [line(0)])
    running = job(service, batch.id, store.claim(batch.id, "me"))

    def run_lines(record):  # the line done, then the cancel, before "finalizing" is written
        with open(running.output, "w") as out:
            out.write(output_line(0) + "\n")
        store.cancel_batch("alpha", batch.id)

    monkeypatch.setattr(running, "run_lines", run_lines)
    running.run()  # no IllegalTransitionError
    done = store.get_batch("alpha", batch.id)
    assert done.status == "cancelled"
    assert [x["custom_id"] for x in content(service, done.output_file_id)] == ["r0"]


def test_the_runners_lines_may_not_read_local_image_files(service, monkeypatch):
    """Lines come from any project key holder: the runner's processors refuse images that
    are files of the workers (``relayllm batch``'s own keep the default, True)."""
    import relayllm.batch.ray_job
    from relayllm import ProcessorConfig

    settings, store, _ = service
    assert not ProcessorConfig(deployment="echo", **processor_fields(settings)).local_image_files
    passed = []

    def run_scanned(scan, names, default, out, err, fields, done, on_block, stop, **routing):
        passed.append(fields)
        return {}

    monkeypatch.setattr(relayllm.batch.ray_job, "run_scanned", run_scanned)
    batch = new_batch(service, [line(0)])
    running = job(service, batch.id, store.claim(batch.id, "me"))
    running.run_lines(running.update(status="in_progress"))
    (fields,) = passed
    assert fields == processor_fields(settings)
    config = ProcessorConfig(deployment="echo", **fields)
    assert config.local_image_files is False
    assert (config.batch_size, config.concurrency) == (settings.batch_size, settings.concurrency)


def test_the_runners_scan_leaves_the_duplicate_check_to_validation(service, monkeypatch):
    """A batch reaches in_progress only through validation, which fails a repeated custom_id
    (test above): the runner's scan of the same file does not check the ids a second time.
    Here the batch is put in_progress by hand, so the scan sees a repeat and must let it by."""
    import relayllm.batch.ray_job

    _, store, _ = service
    scans = []

    def run_scanned(scan, names, default, out, err, fields, done, on_block, stop, **routing):
        scans.append(scan)
        return {}

    monkeypatch.setattr(relayllm.batch.ray_job, "run_scanned", run_scanned)
    batch = new_batch(service, [line(0), line(0)])
    running = job(service, batch.id, store.claim(batch.id, "me"))
    running.run_lines(running.update(status="in_progress"))
    (scan,) = scans
    assert scan.lines == 2 and scan.to_run == 2


def test_the_runners_lines_fetch_images_only_from_the_hosts_the_service_allows(tmp_path):
    from relayllm import ProcessorConfig

    def hosts(image_hosts):
        settings = ServiceSettings(state_dir=str(tmp_path), image_hosts=image_hosts)
        return ProcessorConfig(deployment="echo", **processor_fields(settings)).remote_image_hosts

    assert hosts([]) == []  # the default: no host
    assert ServiceSettings(state_dir=str(tmp_path)).image_hosts == []
    assert hosts(["img.example.org"]) == ["img.example.org"]
    assert hosts(["*"]) is None  # any host


def test_waiting_batches_take_turns_oldest_first_then_the_longest_waiting(service):
    """The runner's slot rule without a cluster: one slot, three unfinished batches: they
    get it a, b, c, a, b (a turn that ended without finishing goes to the back), and the one
    running is told to give its slot up once its turn is long enough, only while others
    wait."""
    from relayllm_service.runner.loop import BatchRunner
    from relayllm_service.tenancy.fair import FairShare

    settings, store, _ = service
    runner = object.__new__(BatchRunner)  # no loop thread: _start_due driven by hand
    runner.settings = settings.model_copy(update={"max_batches": 1, "turn_s": 5.0})
    runner.store, runner.active, runner.turns, runner._tick = store, {}, {}, 0
    runner.fair = FairShare(lambda project: 1.0)
    started: list[str] = []
    runner._run = started.append  # a turn that ends at once, the batch unfinished
    a, b, c = (new_batch(service, [line(i)]).id for i in range(3))
    for _ in range(5):
        runner._start_due()
        for thread in runner.active.values():
            thread.join()
        assert runner.contended  # two wait while one runs
        assert runner._turn_over(5.0) and not runner._turn_over(4.9)
    assert started == [a, b, c, a, b]
    for batch_id in (a, b):
        store.cancel_batch("alpha", batch_id)
        claim = store.claim(batch_id, "x")
        store.update(batch_id, claim, status="cancelled")
    runner._start_due()
    assert not runner.contended and not runner._turn_over(60.0)  # alone: it keeps its slot


def test_serve_takes_a_direct_port_zero_or_off():
    """``relayllm serve --direct-port``: a port, 0 (any free one) or ``off`` (proxy only); the
    default is the settings'."""
    import click

    from relayllm_service.cli.serve import PortOrOff, serve

    port = PortOrOff()
    taken = [port.convert(value, None, None) for value in ("8001", "0", "off", "OFF")]
    assert taken == [8001, 0, None, None]
    for bad in ("x", "-1", "65536"):
        with pytest.raises(click.BadParameter, match="not a port"):
            port.convert(bad, None, None)
    option = next(p for p in serve.params if p.name == "direct_port")
    assert option.default == ServiceSettings().direct_port


def test_serve_places_the_gateway_and_the_runner_by_node_resource(tmp_path, monkeypatch):
    """``relayllm serve --node-resource NAME[=AMOUNT]`` (repeatable) becomes
    ``ServiceSettings.node_resources``; none leaves them on the head node. The cluster's part
    is not reached here: what serve would start is taken where it starts it."""
    import importlib

    import click
    from click.testing import CliRunner

    import relayllm_service.deploy as deploy

    cli_serve = importlib.import_module(
        "relayllm_service.cli.serve"
    )  # the package names a command so

    kind = cli_serve.NodeResource()
    assert kind.convert("service", None, None) == ("service", cli_serve.NODE_RESOURCE_AMOUNT)
    assert kind.convert("pool-a=0.5", None, None) == ("pool-a", 0.5)
    for bad in ("", "=1", "service=0", "service=x", "service=-1"):
        with pytest.raises(click.BadParameter, match="NAME or NAME=AMOUNT"):
            kind.convert(bad, None, None)

    from types import SimpleNamespace

    started: list[ServiceSettings] = []

    def serve_file(path, settings, keys, **kwargs):
        started.append(settings)
        return SimpleNamespace(name="gateway", status="RUNNING", url="u", proxy_url=None)

    monkeypatch.setattr(cli_serve, "connect", lambda *args, **kwargs: None)
    monkeypatch.setattr(deploy, "serve_file", serve_file)
    monkeypatch.setenv("RELAYLLM_API_KEYS", "alpha=" + "a" * 32)
    config = tmp_path / "deployments.yaml"
    config.write_text("deployments:\n  - name: echo\n    backend: echo\n")
    for flags, wanted in (
        ([], None),
        (["--node-resource", "service"], {"service": 0.01}),
        (["--node-resource", "a=1", "--node-resource", "b=0.5"], {"a": 1.0, "b": 0.5}),
    ):
        result = CliRunner().invoke(
            cli_serve.serve, [str(config), "--state-dir", str(tmp_path / "state"), *flags]
        )
        assert result.exit_code == 0, result.output
        assert started.pop().node_resources == wanted
    refused = CliRunner().invoke(cli_serve.serve, [str(config), "--node-resource", "x=0"])
    assert refused.exit_code == 2 and "NAME=AMOUNT" in refused.output


def test_the_batch_service_stops_its_stage_workers_by_signal_not_by_their_clock():
    import relayllm_service.runner.job as job_module

    job = ast.parse(Path(job_module.__file__).read_text())
    checks = [
        node
        for node in ast.walk(job)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "StopCheck"
    ]
    assert checks, "the runner's batch job builds its StopCheck"
    for call in checks:
        deadline = call.args[1] if len(call.args) > 1 else None
        deadline = deadline or next((k.value for k in call.keywords if k.arg == "deadline"), None)
        assert deadline is None or (
            isinstance(deadline, ast.Constant) and deadline.value is None
        ), "a deadline in StopCheck is compared with each stage worker's clock"
