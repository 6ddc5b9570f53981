"""The control plane on the echo backend (a real Serve deployment, no model): pause mid-job and
resume with every row once, a replacement replica that comes up paused, refusals that change
nothing, tokenize/detokenize, and the CLI commands in a subprocess."""

import json
import os
import threading
import time

import pytest
import ray
from support import cli, wait_for

import relayllm
from relayllm import DeploymentConfig, ProcessorConfig, build_processor
from relayllm.errors import ControlRefusedError

pytestmark = pytest.mark.usefixtures("ray_session")


class Job:
    """A processor over rows in a thread, so a test can pause the deployment mid-job."""

    def __init__(self, processor, rows, blocks):
        self.result = None
        self.error = None
        self._thread = threading.Thread(target=self._run, args=(processor, rows, blocks))
        self._thread.start()

    def _run(self, processor, rows, blocks):
        try:
            data = ray.data.from_items(rows, override_num_blocks=blocks)
            self.result = processor(data).take_all()
        except BaseException as exc:  # reported by finish()
            self.error = exc

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def finish(self, timeout_s: float = 300) -> list[dict]:
        self._thread.join(timeout=timeout_s)
        assert not self._thread.is_alive(), "the job hung"
        assert self.error is None, f"the job failed: {self.error!r}"
        return self.result


def _rows(controller) -> int:
    """Rows computed by every replica (cache hits excluded: a recompute would show here)."""
    return sum(info["rows"] for info in controller.replicas().values())


def test_a_job_paused_mid_way_waits_and_finishes_after_resume_with_every_row_once():
    name = "ctl-job"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo", options={"delay_s": 0.05}))
    ctl = relayllm.control(name)
    # timeout_s far below the pause and no retries: a paused call that counted as an attempt
    # would fail its rows.
    proc = build_processor(
        ProcessorConfig(
            deployment=name, task="completion", batch_size=10, timeout_s=1.5, max_retries=0
        )
    )
    n = 600
    job = Job(proc, [{"id": i, "prompt": f"row {i}"} for i in range(n)], blocks=6)
    try:
        wait_for(lambda: _rows(ctl) >= 100, "the job got going")
        assert not ctl.is_paused()
        ctl.pause()  # "wait": returns once the rows in the engine have finished
        assert ctl.is_paused()
        at_pause = _rows(ctl)
        assert at_pause < n, "paused mid-job"
        time.sleep(4)  # longer than timeout_s: the stage's calls time out and are re-sent
        assert _rows(ctl) == at_pause, "no row was computed while paused"
        assert job.running, "the job waits while the deployment is paused"
        infos = list(ctl.replicas().values())
        assert [i["paused"] for i in infos] == ["wait"]
    finally:
        ctl.resume()
    assert not ctl.is_paused()
    out = job.finish()
    assert sorted(r["id"] for r in out) == list(range(n)), "every row, once"
    assert not [r for r in out if r["error"]], "no row failed"
    assert all(r["generated_text"] == f"row {r['id']}" for r in out)
    assert _rows(ctl) == n, "no row was computed twice"
    relayllm.shutdown(name)


def test_keep_mode_freezes_the_rows_in_the_engine_until_resume():
    name = "ctl-keep"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo", options={"delay_s": 0.5}))
    ctl = relayllm.control(name)
    ref = relayllm.get_deployment(name)
    call = ref.handle().process_batch.remote([{"task": "completion", "prompt": "a b"}])
    wait_for(lambda: next(iter(ctl.replicas().values()))["ongoing"] == 1, "the call arrived")
    ctl.pause("keep")  # returns at once: the row in the 'engine' stays there
    time.sleep(1.0)  # past the row's 0.5 s in the engine
    assert _rows(ctl) == 0, "the row in the engine is frozen, not answered"
    ctl.resume()
    assert call.result(timeout_s=60)[0]["generated_text"] == "a b"
    assert _rows(ctl) == 1
    relayllm.shutdown(name)


def test_a_replacement_replica_comes_up_paused_with_the_adapters_loaded(tmp_path):
    name = "ctl-replace"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    ctl = relayllm.control(name)
    ctl.load_adapter("tiny", str(tmp_path))
    ctl.pause()
    (old_id,) = ctl.replicas()
    from relayllm import compat

    ((_, actor_name),) = compat.running_replicas(f"relayllm-{name}", name)
    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)
    wait_for(lambda: set(ctl.replicas()) - {old_id}, "Serve started a replacement")
    (new_id, info), *_ = ctl.replicas().items()
    assert new_id != old_id
    assert info["paused"] == "wait", "the replacement read the deployment's pause state"
    assert ctl.is_paused()
    assert ctl.adapters() == {"tiny": str(tmp_path)}, "and loaded the runtime adapter"
    handle = relayllm.get_deployment(name).handle()
    held = {"task": "completion", "prompt": "held row", "request_id": "held-1", "model": "tiny"}
    call = handle.process_batch.remote([held])
    time.sleep(1.0)
    assert _rows(ctl) == 0, "the new replica holds its rows while paused"
    ctl.resume()
    assert call.result(timeout_s=60)[0]["generated_text"] == "<tiny> held row"
    assert _rows(ctl) == 1
    ctl.unload_adapter("tiny")
    assert ctl.adapters() == {}
    plain = {"task": "completion", "prompt": "plain", "model": "tiny"}
    (after,) = handle.process_batch.remote([plain]).result(timeout_s=60)
    assert after["generated_text"] == "plain"
    relayllm.shutdown(name)


def test_a_new_deployment_of_a_paused_name_starts_unpaused():
    name = "ctl-again"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    relayllm.control(name).pause()
    relayllm.shutdown(name)
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    ctl = relayllm.control(name)
    assert not ctl.is_paused()
    out = (
        relayllm.get_deployment(name)
        .handle()
        .process_batch.remote([{"task": "completion", "prompt": "fresh"}])
    )
    assert out.result(timeout_s=60)[0]["generated_text"] == "fresh"
    relayllm.shutdown(name)


def test_a_refused_call_names_backend_and_call_and_changes_nothing():
    from relayllm.serving.control_state import state_actor

    # shout (examples/third-party-adapter) was written before the control plane: it has no
    # control hook, and keeps working.
    name = "ctl-shout"
    relayllm.deploy(DeploymentConfig(name=name, backend="shout"))
    ctl = relayllm.control(name)
    with pytest.raises(ControlRefusedError) as refused:
        ctl.pause()
    message = str(refused.value)
    assert "'shout'" in message and "'pause'" in message and name in message
    assert refused.value.backend == "shout" and refused.value.call == "pause"
    version, state = ray.get(state_actor(name, create=False).get.remote())
    assert (version, state["paused"]) == (0, None), "the refused pause wrote no state"
    assert list(ctl.replicas().values())[0]["paused"] is None
    out = (
        relayllm.get_deployment(name)
        .handle()
        .process_batch.remote(
            [{"task": "completion", "prompt": "still serving", "sampling_params": {}}]
        )
    )
    assert out.result(timeout_s=60)[0]["generated_text"] == "STILL SERVING!"
    # echo does pause but not sleep or the prefix cache: refused by name too.
    relayllm.shutdown(name)
    relayllm.deploy(DeploymentConfig(name="ctl-echo-refuse", backend="echo"))
    for call, args in (("sleep", (1,)), ("wake_up", ()), ("reset_prefix_cache", ())):
        refusal = f"'echo' cannot do the control call '{call}'"
        with pytest.raises(ControlRefusedError, match=refusal):
            getattr(relayllm.control("ctl-echo-refuse"), call)(*args)
    relayllm.shutdown("ctl-echo-refuse")


def test_tokenize_and_detokenize_round_trip_on_every_replica():
    name = "ctl-tok"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo", num_replicas=2))
    ctl = relayllm.control(name)
    ids = ctl.tokenize("hello control plane")
    assert len(ids) == 3 and all(isinstance(i, int) for i in ids)
    assert ctl.detokenize(ids) == "hello control plane"
    assert len(ctl.replicas()) == 2
    ctl.pause()
    assert [i["paused"] for i in ctl.replicas().values()] == ["wait", "wait"], "both replicas"
    ctl.resume()
    assert [i["paused"] for i in ctl.replicas().values()] == [None, None]
    relayllm.shutdown(name)


def test_an_unknown_deployment_lists_the_running_ones():
    relayllm.deploy(DeploymentConfig(name="ctl-here", backend="echo"))
    with pytest.raises(relayllm.DeploymentNotFoundError, match="ctl-here"):
        relayllm.control("ctl-nowhere")
    relayllm.shutdown("ctl-here")


def test_pause_resume_and_control_from_the_command_line():
    name = "ctl-cli"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RELAYLLM_ECHO_BACKEND": "1", "RAY_AUTH_MODE": "token"}
    done = cli("pause", name, "--address", address, env=env, check=0)
    assert f"{name}: paused (wait)" in done.stdout
    assert relayllm.control(name).is_paused()
    done = cli("status", "--json", "--address", address, env=env, check=0)
    (entry,) = [e for e in json.loads(done.stdout) if e["name"] == name]
    assert entry["activity"] == "paused (wait)"
    assert cli("control", name, "is_paused", "--address", address, env=env, check=0).stdout == (
        "true\n"
    )
    done = cli("control", name, "tokenize", "two words", "--address", address, env=env, check=0)
    ids = [int(i) for i in done.stdout.strip("[]\n").split(",")]
    done = cli("control", name, "detokenize", *ids, "--address", address, env=env, check=0)
    assert done.stdout == '"two words"\n'
    done = cli("control", name, "sleep", "1", "--address", address, env=env, check=1)
    assert "backend 'echo' cannot do the control call 'sleep'" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("resume", name, "--address", address, env=env, check=0)
    assert f"{name}: resumed" in done.stdout
    assert not relayllm.control(name).is_paused()
    relayllm.shutdown(name)


# -- weight updates: a version on every row --------------------------------------------------


def test_a_weight_update_mid_job_shows_in_the_version_of_every_row_after_it(tmp_path):
    from relayllm.testing.echo import write_echo_checkpoint

    name = "ctl-weights"
    relayllm.deploy(
        DeploymentConfig(name=name, backend="echo", num_replicas=2, options={"delay_s": 0.05})
    )
    ctl = relayllm.control(name)
    assert ctl.weight_version() is None, "never updated"
    ctl.update_weights(write_echo_checkpoint(tmp_path / "one", "one"), version=1)
    assert ctl.weight_version() == "1"
    proc = build_processor(
        ProcessorConfig(deployment=name, task="completion", batch_size=10, max_in_flight_batches=4)
    )
    n = 600
    job = Job(proc, [{"id": i, "prompt": f"row {i}"} for i in range(n)], blocks=6)
    wait_for(lambda: _rows(ctl) >= 100, "the job got going")
    # A URI: each replica copies the checkpoint to a local directory before it loads.
    ctl.update_weights(f"file://{write_echo_checkpoint(tmp_path / 'two', 'two')}", version="v2")
    at_update = _rows(ctl)
    out = job.finish()
    assert at_update < n, "updated mid-job"
    assert sorted(r["id"] for r in out) == list(range(n)), "every row, once"
    assert not [r for r in out if r["error"]]
    assert _rows(ctl) == n, "no row was computed twice"
    versions = {"1": "[one]", "v2": "[two]"}
    for row in out:
        tag = versions[row["weight_version"]]
        assert row["generated_text"] == f"{tag} row {row['id']}", "the version that answered"
    counted = {v: sum(r["weight_version"] == v for r in out) for v in versions}
    assert counted["1"] >= 100 and counted["v2"] > 0, counted
    assert [i["weight_version"] for i in ctl.replicas().values()] == ["v2", "v2"]
    relayllm.shutdown(name)


def test_a_failed_load_on_one_of_two_replicas_aborts_on_both_and_no_row_sees_a_mixed_fleet(
    tmp_path,
):
    """One replica cannot read the checkpoint (set from outside, in the checkpoint): the
    update aborts on both, the other replica reloads the committed weights, the one that
    failed retires and is replaced on them. Every row of a job running throughout says the
    version whose weights answered it, and no row carries the aborted version."""
    from relayllm.errors import WeightUpdateAbortedError
    from relayllm.testing.echo import write_echo_checkpoint

    name = "ctl-weights-txn"
    relayllm.deploy(
        DeploymentConfig(name=name, backend="echo", num_replicas=2, options={"delay_s": 0.1})
    )
    ctl = relayllm.control(name)
    done = ctl.update_weights(write_echo_checkpoint(tmp_path / "one", "one"), version=1)
    assert done["version"] == "1"
    assert sorted(s["state"] for s in done["replicas"].values()) == ["committed", "committed"]
    proc = build_processor(
        ProcessorConfig(deployment=name, task="completion", batch_size=10, max_in_flight_batches=4)
    )
    n = 1000
    rows = [{"id": i, "prompt": f"row {i}"} for i in range(n)]
    # A job across the failed update.
    job = Job(proc, rows, blocks=8)
    wait_for(lambda: _rows(ctl) >= 100, "the job got going")
    bad, good = sorted(ctl.replicas())
    two = write_echo_checkpoint(tmp_path / "two", "two", unreadable_by=[bad])
    with pytest.raises(WeightUpdateAbortedError, match="Permission denied") as caught:
        ctl.update_weights(two, version=2)
    aborted = caught.value
    assert aborted.committed_version == "1"
    assert aborted.replicas[bad]["state"] == "retired", aborted.replicas
    assert aborted.replicas[good]["state"] == "rolled back", aborted.replicas
    good_at_abort = ctl.replicas()[good]["rows"]
    out = job.finish()
    assert ctl.replicas()[good]["rows"] > good_at_abort, "the rolled-back replica served on"
    _every_row_once_and_by_the_weights_it_says(out, n, {"1": "[one]"})
    wait_for(lambda: len(set(ctl.replicas()) - {bad}) == 2, "Serve replaced the retired replica")
    assert ctl.weight_version() == "1", "the replacement came up on the committed weights"
    # A job across an update that commits, on the replaced fleet.
    job = Job(proc, rows, blocks=8)
    before = _rows(ctl)
    wait_for(lambda: _rows(ctl) >= before + 100, "the second job got going")
    done = ctl.update_weights(write_echo_checkpoint(tmp_path / "three", "three"), version=3)
    assert done["version"] == "3"
    assert [s["state"] for s in done["replicas"].values()] == ["committed", "committed"]
    out = job.finish()
    counted = _every_row_once_and_by_the_weights_it_says(out, n, {"1": "[one]", "3": "[three]"})
    assert counted["1"] >= 100 and counted["3"] > 0, counted
    assert [i["weight_version"] for i in ctl.replicas().values()] == ["3", "3"]
    relayllm.shutdown(name)


def _every_row_once_and_by_the_weights_it_says(out, n, versions) -> dict[str, int]:
    """Every row once, none failed, each answered by the weights its ``weight_version``
    names (echo's answer starts with the checkpoint's tag), and no other version (an
    aborted one) on any row. Returns the rows of each version."""
    assert sorted(r["id"] for r in out) == list(range(n)), "every row, once"
    assert not [r for r in out if r["error"]]
    for row in out:
        assert row["weight_version"] in versions, row
        tag = versions[row["weight_version"]]
        assert row["generated_text"] == f"{tag} row {row['id']}", "the version that answered"
    return {v: sum(r["weight_version"] == v for r in out) for v in versions}


def test_replicas_that_loaded_different_weights_abort_the_update(tmp_path):
    """Checked weights: each replica reports a digest of what it loaded (echo's checker: the
    tag it holds); one whose weights landed wrong disagrees, and both go back."""
    from relayllm.errors import WeightUpdateAbortedError
    from relayllm.testing.echo import write_echo_checkpoint

    name = "ctl-weights-digest"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo", num_replicas=2))
    ctl = relayllm.control(name)
    ctl.update_weights(write_echo_checkpoint(tmp_path / "one", "one"), version=1)
    first, second = sorted(ctl.replicas())
    bent = write_echo_checkpoint(tmp_path / "two", "two", tag_by={second: "bent"})
    with pytest.raises(WeightUpdateAbortedError, match="different weights") as caught:
        ctl.update_weights(bent, version=2)
    states = caught.value.replicas
    assert {r: s["state"] for r, s in states.items()} == {
        first: "rolled back",
        second: "rolled back",
    }
    assert states[first]["digest"] != states[second]["digest"]
    assert ctl.weight_version() == "1"
    handle = relayllm.get_deployment(name).handle()
    rows = [{"task": "completion", "prompt": f"r{i}"} for i in range(20)]
    out = handle.process_batch.remote(rows).result(timeout_s=60)
    assert {(r["generated_text"][:5], r["weight_version"]) for r in out} == {("[one]", "1")}
    same = ctl.update_weights(write_echo_checkpoint(tmp_path / "two-ok", "two"), version=2)
    digests = {s["digest"] for s in same["replicas"].values()}
    assert same["version"] == "2" and len(digests) == 1, same
    relayllm.shutdown(name)


def test_an_update_not_prepared_in_time_fails_closed(tmp_path):
    """A replica whose load outlasts ``timeout_s`` aborts the update; it holds its rows until
    its load ends, then goes back to the committed weights: the row waiting meanwhile is
    answered by them, with their version."""
    from relayllm.errors import WeightUpdateAbortedError
    from relayllm.testing.echo import write_echo_checkpoint

    name = "ctl-weights-timeout"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    ctl = relayllm.control(name)
    ctl.update_weights(write_echo_checkpoint(tmp_path / "one", "one"), version=1)
    (rid,) = ctl.replicas()
    slow = write_echo_checkpoint(tmp_path / "two", "two", load_s_by={rid: 8})
    with pytest.raises(WeightUpdateAbortedError, match="timed out") as caught:
        ctl.update_weights(slow, version=2, timeout_s=2)
    assert caught.value.replicas[rid]["state"] == "timed out"
    assert caught.value.committed_version == "1"
    assert ctl.replicas()[rid]["weight_version"] == "1"
    handle = relayllm.get_deployment(name).handle()
    (row,) = handle.process_batch.remote([{"task": "completion", "prompt": "x"}]).result(
        timeout_s=120
    )
    assert (row["generated_text"], row["weight_version"]) == ("[one] x", "1")
    assert set(ctl.replicas()) == {rid}, "rolled back, not replaced"
    relayllm.shutdown(name)


def test_a_replacement_replica_comes_up_with_the_current_weights(tmp_path):
    from relayllm import compat
    from relayllm.testing.echo import write_echo_checkpoint

    name = "ctl-weights-replace"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    ctl = relayllm.control(name)
    ctl.update_weights(write_echo_checkpoint(tmp_path / "w", "w7"), version=7)
    (old_id,) = ctl.replicas()
    ((_, actor_name),) = compat.running_replicas(f"relayllm-{name}", name)
    ray.kill(ray.get_actor(actor_name, namespace="serve"), no_restart=True)
    wait_for(lambda: set(ctl.replicas()) - {old_id}, "Serve started a replacement")
    assert ctl.weight_version() == "7"
    handle = relayllm.get_deployment(name).handle()
    (row,) = handle.process_batch.remote([{"task": "completion", "prompt": "x"}]).result(
        timeout_s=60
    )
    assert (row["generated_text"], row["weight_version"]) == ("[w7] x", "7")
    # A batch file's output lines say it too (response.body.weight_version).
    lines = [
        {
            "custom_id": f"c{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": name, "messages": [{"role": "user", "content": f"q {i}"}]},
        }
        for i in range(3)
    ]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    relayllm.run_batch_file(tmp_path / "in.jsonl", deployment=name, output=tmp_path / "out.jsonl")
    bodies = [json.loads(t)["response"]["body"] for t in (tmp_path / "out.jsonl").open()]
    assert [b["weight_version"] for b in bodies] == ["7"] * 3
    assert all(b["choices"][0]["message"]["content"].startswith("[w7]") for b in bodies)
    relayllm.shutdown(name)
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    assert relayllm.control(name).weight_version() is None, "a new deployment starts afresh"
    relayllm.shutdown(name)


def test_update_weights_from_the_command_line(tmp_path):
    from relayllm.testing.echo import write_echo_checkpoint

    name = "ctl-weights-cli"
    relayllm.deploy(DeploymentConfig(name=name, backend="echo"))
    address = ray.get_runtime_context().gcs_address
    env = {**os.environ, "RELAYLLM_ECHO_BACKEND": "1", "RAY_AUTH_MODE": "token"}
    path = write_echo_checkpoint(tmp_path / "c", "cli")
    args = ("--address", address)
    done = cli("control", name, "update_weights", path, "3", *args, env=env, check=0)
    answer = json.loads(done.stdout)
    assert answer["version"] == "3"
    assert [s["state"] for s in answer["replicas"].values()] == ["committed"]
    done = cli("control", name, "weight_version", *args, env=env, check=0)
    assert done.stdout == '"3"\n'
    ctl = relayllm.control(name)
    (old_id,) = ctl.replicas()
    done = cli("control", name, "update_weights", str(tmp_path), "4", *args, env=env, check=1)
    assert "not an echo checkpoint" in done.stderr and "Traceback" not in done.stderr
    assert "aborted" in done.stderr and "serves version '3'" in done.stderr
    # The engine failed its load: the replica retired, its replacement is on version 3.
    wait_for(lambda: set(ctl.replicas()) - {old_id}, "Serve replaced the retired replica")
    assert ctl.weight_version() == "3", "the failed update committed nothing"
    relayllm.shutdown(name)
