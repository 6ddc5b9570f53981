"""A vLLM engine that cannot start (its model path does not exist, or its KV cache does not fit
the node): a clear error naming the cause -- not the start-up timeout -- and nothing left
behind on the cluster."""

import time

import pytest

import relayllm

#: Far longer than any of these failures takes: an error that only comes when it runs out is
#: the timeout's (its message says "did not start within"), not the cause's.
STARTUP_TIMEOUT_S = 1800
TIMED_OUT = "did not start within"
#: A start that fails for good is not tried again (Serve's own count: tests/core).
ONE_ATTEMPT = "failed to start 1 times in a row"


def test_bad_model_path_fails_clearly_and_leaves_nothing(tmp_path, monkeypatch):
    from ray import serve
    from ray.util import list_named_actors

    missing = tmp_path / "no-such-model"
    config = relayllm.DeploymentConfig(
        name="no-model",
        backend="vllm",
        options={"model": str(missing)},
        startup_timeout_s=STARTUP_TIMEOUT_S,
        start_attempts=1,
    )
    # Where the command runs, the deploy-time check refuses the path before Serve starts...
    with pytest.raises(relayllm.ConfigError, match="options.model|model: the path"):
        relayllm.deploy(config)
    assert "relayllm-no-model" not in serve.status().applications
    # ...and where the check is skipped (a path that only the cluster's nodes have), the
    # replica's engine fails to start, and says why.
    monkeypatch.setenv("RELAYLLM_SKIP_MODEL_CHECK", "1")
    start = time.monotonic()
    with pytest.raises(relayllm.DeploymentStartError) as err:
        relayllm.deploy(config)
    elapsed = time.monotonic() - start
    assert "no-such-model" in str(err.value), str(err.value)[:2000]
    assert ONE_ATTEMPT in str(err.value), str(err.value)[:2000]
    assert TIMED_OUT not in str(err.value) and elapsed < STARTUP_TIMEOUT_S / 3, elapsed
    print(f"\nbad model path: {type(err.value).__name__} after {elapsed:.0f}s")
    assert "relayllm-no-model" not in serve.status().applications
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        "relayllm-no-model" in a["name"] for a in list_named_actors(all_namespaces=True)
    ):
        time.sleep(1)
    assert not any("relayllm-no-model" in a["name"] for a in list_named_actors(all_namespaces=True))


def test_a_kv_cache_larger_than_the_node_fails_before_the_engine_starts(record_result):
    """Asked for more memory than the node has: the replica refuses before vLLM starts its
    engine process (which would be killed by the kernel, or fail after loading the model), and
    the error says what was asked and what the node has."""
    import psutil
    from ray import serve
    from ray.util import list_named_actors

    asked_gb = int(psutil.virtual_memory().total / 2**30) * 4
    config = relayllm.DeploymentConfig(
        name="too-big",
        backend="vllm",
        options={"model": "demo", "kv_cache_memory_gb": asked_gb},
        startup_timeout_s=STARTUP_TIMEOUT_S,
        start_attempts=1,
    )
    start = time.monotonic()
    with pytest.raises(relayllm.DeploymentStartError) as err:
        relayllm.deploy(config)
    elapsed = time.monotonic() - start
    message = str(err.value)
    assert TIMED_OUT not in message and ONE_ATTEMPT in message, message[:2000]
    assert f"KV cache {asked_gb:.1f} GiB" in message, message[:2000]
    assert "GiB available" in message and "kv_cache_memory_gb" in message, message[:2000]
    assert "relayllm-too-big" not in serve.status().applications
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(
        "relayllm-too-big" in a["name"] for a in list_named_actors(all_namespaces=True)
    ):
        time.sleep(1)
    assert not any(
        "relayllm-too-big" in a["name"] for a in list_named_actors(all_namespaces=True)
    ), "a replica actor was left behind"
    print(f"\nKV cache larger than the node: DeploymentStartError after {elapsed:.0f}s")
    # Each of Serve's start attempts stops before the engine: an import, not an engine load.
    assert elapsed < STARTUP_TIMEOUT_S / 6, elapsed
    record_result("vllm_engine_too_big_s", round(elapsed, 1))
