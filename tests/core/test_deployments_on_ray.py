"""Shared deployments by name on a real local Ray cluster with real Serve apps."""

import json
import os
import subprocess
import sys
import time

import pytest

import relayllm
from relayllm import DeploymentConfig

pytestmark = pytest.mark.usefixtures("ray_session")


def _echo(name, **options):
    return DeploymentConfig(name=name, backend="echo", options=options)


def _replica(ref):
    return ref.handle().info.remote().result(timeout_s=60)["replica_id"]


def test_same_name_and_config_reuses_the_running_deployment():
    first = relayllm.deploy(_echo("reuse"))
    again = relayllm.deploy(_echo("reuse", mode="echo"))  # the default, spelled out: same config
    assert _replica(first) == _replica(again)
    assert again.status == "RUNNING"
    relayllm.shutdown("reuse")


def test_same_name_with_another_config_is_an_error_showing_the_difference():
    relayllm.deploy(_echo("conflict"))
    with pytest.raises(relayllm.DeploymentConflictError) as err:
        relayllm.deploy(_echo("conflict", mode="reverse"))
    message = str(err.value)
    assert '-    "mode": "echo"' in message and '+    "mode": "reverse"' in message
    relayllm.shutdown("conflict")


def test_unknown_deployment_lists_running_ones():
    relayllm.deploy(_echo("listed"))
    with pytest.raises(relayllm.DeploymentNotFoundError, match="listed"):
        relayllm.get_deployment("nope")
    relayllm.shutdown("listed")


def test_list_and_shutdown():
    relayllm.deploy(_echo("one"))
    relayllm.deploy(_echo("two"))
    names = [r.name for r in relayllm.list_deployments()]
    assert {"one", "two"} <= set(names)
    assert relayllm.shutdown("one") == ["one"]
    assert "one" not in [r.name for r in relayllm.list_deployments()]
    with pytest.raises(relayllm.DeploymentNotFoundError):
        relayllm.shutdown("one")
    stopped = relayllm.shutdown()
    assert "two" in stopped and relayllm.list_deployments() == []


def test_info_counts_the_time_a_busy_replica_has_gone_without_an_answer():
    """What ``relayllm status`` reads to call a deployment STALLED: 0 while idle (however long),
    growing while a call waits on the engine, 0 again once it answered."""
    from relayllm.cli.lifecycle import activity

    ref = relayllm.deploy(_echo("silent", delay_s=6))
    handle = ref.handle()
    time.sleep(3)  # idle a while: that is not a stall
    idle = handle.info.remote().result(timeout_s=60)
    assert idle["ongoing"] == 0 and idle["seconds_without_answer"] == 0
    assert activity(idle, stall_s=1) == "idle"
    request = {"task": "completion", "prompt": "a b", "request_id": "silent-1"}
    call = handle.process_batch.remote([request])
    deadline = time.monotonic() + 60
    while (busy := handle.info.remote().result(timeout_s=60))["ongoing"] == 0:
        assert time.monotonic() < deadline, "the call never reached the replica"
        time.sleep(0.1)
    # Counted from the idle start it would be 3 s or more; the margin is for a loaded machine.
    assert busy["seconds_without_answer"] < 2.5, "counted from the call, not the idle time"
    assert activity(busy, stall_s=100) == "busy"
    time.sleep(2)
    waiting = handle.info.remote().result(timeout_s=60)
    assert waiting["ongoing"] == 1 and waiting["seconds_without_answer"] >= 2
    assert activity(waiting, stall_s=2) == "STALLED"
    assert call.result(timeout_s=60)[0]["generated_text"] == "a b"
    done = handle.info.remote().result(timeout_s=60)
    assert done["ongoing"] == 0 and done["seconds_without_answer"] == 0
    relayllm.shutdown("silent")


def test_engine_that_fails_to_start_is_reported_and_removed():
    # The failure itself is reported (the replica's error, as Serve gives up on it), not the
    # startup deadline passing: that one says "did not start within" and names no cause.
    with pytest.raises(relayllm.DeploymentStartError) as err:
        relayllm.deploy(
            DeploymentConfig(
                name="broken", backend="echo", options={"fail_start": True}, startup_timeout_s=120
            )
        )
    assert "'broken' failed to start: " in str(err.value), str(err.value)
    assert "fail_start" in str(err.value) and "did not start within" not in str(err.value)
    assert "failed to start 3 times in a row" in str(err.value), "Serve's own count"
    assert "broken" not in [r.name for r in relayllm.list_deployments()]


def test_start_attempts_bounds_the_starts_serve_tries():
    with pytest.raises(relayllm.DeploymentStartError) as err:
        relayllm.deploy(
            DeploymentConfig(
                name="broken-once",
                backend="echo",
                options={"fail_start": True},
                startup_timeout_s=120,
                start_attempts=1,
            )
        )
    assert "failed to start 1 times in a row" in str(err.value), str(err.value)
    assert "fail_start" in str(err.value)
    assert "broken-once" not in [r.name for r in relayllm.list_deployments()]


def test_another_driver_finds_the_deployment_by_name(ray_session):
    relayllm.deploy(_echo("shared-across-drivers", mode="reverse"))
    address = ray_session.get_runtime_context().gcs_address
    code = (
        "import json, ray, relayllm\n"
        "ref = relayllm.get_deployment('shared-across-drivers')\n"
        "out = ref.handle().process_batch.remote([{'request_id': 'x', 'task': 'completion', "
        "'prompt': 'a b c', 'sampling_params': {}}]).result(timeout_s=60)\n"
        "print(json.dumps(out))\n"
    )
    env = {**os.environ, "RAY_ADDRESS": address}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1])[0]["generated_text"] == "c b a"
    relayllm.shutdown("shared-across-drivers")


def test_bad_options_fail_before_anything_starts_naming_the_field():
    with pytest.raises(relayllm.ConfigError, match="delay_s"):
        relayllm.deploy(_echo("bad-options", delay_s="slow"))
    with pytest.raises(relayllm.ConfigError, match="no_such_field"):
        relayllm.deploy(_echo("bad-options", no_such_field=1))
    assert "bad-options" not in [r.name for r in relayllm.list_deployments()]
