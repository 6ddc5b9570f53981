"""The key is used, and appears nowhere else: not in output rows, info(), health(), error
messages, exceptions, the driver's output, nor any log file of the Ray session (Serve
replicas included) -- even with the openai client logging at debug level and an endpoint that
quotes the Authorization header back in its error messages."""

from __future__ import annotations

import secrets
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from fault_server import FaultServer
from openai_support import KEY_ENV

import relayllm


@pytest.fixture(scope="module")
def ray_logging_to_driver():
    """A Ray session of this module's own whose worker logs also flow to the driver."""
    import ray
    from support import ray_cluster

    with ray_cluster(log_to_driver=True, own_session=True):
        yield ray


def _config(name: str, server: FaultServer, **options: Any) -> relayllm.DeploymentConfig:
    return relayllm.DeploymentConfig(
        name=name,
        backend="openai",
        options={
            "base_url": server.base_url,
            "model": server.model,
            "api_key_env": KEY_ENV,
            "max_retries": 1,
            **options,
        },
    )


def _run(deployment: str, texts: list[str], **fields: Any) -> list[dict[str, Any]]:
    import ray

    processor = relayllm.build_processor(relayllm.ProcessorConfig(deployment=deployment, **fields))
    rows = [{"messages": [{"role": "user", "content": t}]} for t in texts]
    return processor(ray.data.from_items(rows)).take_all()


def _caught(call) -> str:
    try:
        call()
    except Exception as exc:  # the whole story a user would see: message, chain, traceback
        return "".join(traceback.format_exception(exc))
    raise AssertionError(f"{call} did not raise")


def test_the_key_appears_nowhere(ray_logging_to_driver, test_key, capfd, caplog):
    marker = "secret-model-" + secrets.token_hex(4)
    server = FaultServer(model=marker, api_key=test_key, echo_auth_in_errors=True).start()
    refusing = FaultServer(model=marker, api_key="sk-some-other-key").start()  # answers 401
    seen: dict[str, str] = {}
    try:
        handle = relayllm.deploy(_config("secret", server)).handle()
        rows = _run(
            "secret",
            ["hello there", "bad fault=400", "broken fault=500*9", "garbled fault=malformed*9"],
        )
        seen["rows"] = repr(rows)
        seen["raised row error"] = _caught(
            lambda: _run("secret", ["bad fault=400"], on_error="raise")
        )
        seen["health"] = repr(handle.health.remote().result(timeout_s=60))
        seen["info"] = repr(handle.info.remote().result(timeout_s=60))
        seen["describe"] = repr(handle.describe.remote().result(timeout_s=60))
        seen["conflict"] = _caught(
            lambda: relayllm.deploy(_config("secret", server, max_retries=2))
        )
        seen["pasted key"] = _caught(
            lambda: relayllm.deploy(_config("pasted", server, api_key_env=test_key))
        )

        refused = relayllm.deploy(_config("secret-401", refusing)).handle()
        seen["401 health"] = _caught(lambda: refused.health.remote().result(timeout_s=60))
        seen["401 rows"] = repr(_run("secret-401", ["hello"]))
        relayllm.shutdown()
        time.sleep(2)  # let the replicas' log lines reach their files
    finally:
        server.stop()
        refusing.stop()

    out, err = capfd.readouterr()
    seen["driver stdout"], seen["driver stderr"], seen["driver log records"] = out, err, caplog.text
    session = Path(ray_logging_to_driver._private.worker._global_node.get_session_dir_path())
    logs = {
        str(p.relative_to(session)): p.read_text(errors="replace")
        for p in session.rglob("*")
        if p.is_file() and _is_log(p)
    }
    all_logs = "\n".join(logs.values())

    # The key really was used, the surfaces are the real ones, and the careless endpoint did
    # quote it back -- otherwise "not found" would prove nothing.
    assert server.records and all(r.authorized for r in server.records)
    assert rows[0]["error"] is None and "[redacted]" in rows[1]["error"]
    assert "HTTP 401 from the endpoint: invalid API key" in seen["401 health"]
    assert f"retrying a request to {server.base_url}" in all_logs, (
        "the replica's own log lines were not among the files read"
    )
    assert "Sending HTTP Request" in all_logs, "the openai client's debug log was not read"

    leaks = [name for name, text in seen.items() if test_key in text]
    leaks += [f"log {name}" for name, text in logs.items() if test_key in text]
    assert not leaks, f"the key appears in: {leaks}"


def _is_log(path: Path) -> bool:
    return (
        path.suffix in (".log", ".out", ".err", ".txt", ".json", "")
        and path.stat().st_size < 50_000_000
    )
