"""A vLLM engine that cannot start (its model path does not exist): a clear error in bounded
time, and nothing left behind on the cluster."""

import time

import pytest

import relayllm


def test_bad_model_path_fails_clearly_and_leaves_nothing(tmp_path):
    from ray import serve
    from ray.util import list_named_actors

    missing = tmp_path / "no-such-model"
    config = relayllm.DeploymentConfig(
        name="no-model", backend="vllm", options={"model": str(missing)}, startup_timeout_s=600
    )
    start = time.monotonic()
    with pytest.raises((relayllm.DeploymentStartError, relayllm.ConfigError)) as err:
        relayllm.deploy(config)
    elapsed = time.monotonic() - start
    assert "no-such-model" in str(err.value), str(err.value)[:2000]
    assert elapsed < 600
    print(f"\nbad model path: {type(err.value).__name__} after {elapsed:.0f}s")
    assert "relayllm-no-model" not in serve.status().applications
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        "relayllm-no-model" in a["name"] for a in list_named_actors(all_namespaces=True)
    ):
        time.sleep(1)
    assert not any("relayllm-no-model" in a["name"] for a in list_named_actors(all_namespaces=True))
