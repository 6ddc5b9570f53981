"""``relayllm`` flags as users type them, on the echo backend (the engine adds nothing to
these): ``--address`` naming the cluster (no RAY_ADDRESS), ``relayllm deploy --only``, and
``relayllm batch --resume --retry-errors``. Each command is its own driver process joining this
session's Ray cluster by the address it is given; the docs' own sequence (``ray start --head``,
then relayllm with no Ray setting) runs on a ``ray start`` cluster of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, ray_head_node, wait_started

import relayllm

RELAYLLM = str(Path(sys.executable).parent / "relayllm")

TWO_DEPLOYMENTS = """\
deployments:
  - {{name: {a}, backend: echo}}
  - {{name: {b}, backend: echo, options: {{mode: reverse}}}}
input:
  rows:
    - {{id: 1, question: "alpha beta"}}
    - {{id: 2, question: "gamma delta"}}
  id_column: id
steps:
  - name: answer
    deployment: {a}
    messages: [{{role: user, content: "{{question}}"}}]
    output_column: answer
"""


@pytest.fixture(scope="module")
def address(ray_session) -> str:
    return ray_session.get_runtime_context().gcs_address


def cli(*args, cwd=None, check=0) -> subprocess.CompletedProcess:
    """A command with no RAY_ADDRESS: only ``--address`` can bring it to the session's cluster
    (without it, it would start a cluster of its own)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RELAYLLM_ECHO_BACKEND"] = "1"
    done = subprocess.run(
        [RELAYLLM, *map(str, args)], env=env, cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == check, (
        f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    return done


def running() -> set[str]:
    return {r.name for r in relayllm.list_deployments()}


def test_address_flag_runs_on_the_cluster_it_names(address, tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(TWO_DEPLOYMENTS.format(a="addr-a", b="addr-b"))
    out = tmp_path / "out.jsonl"
    cli("run", pipeline, "--output", out, "--keep-deployments", "--address", address)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["answer"], r["error"]) for r in rows] == [
        (1, "alpha beta", None),
        (2, "gamma delta", None),
    ]
    # Kept on this process's cluster: the command ran there, not on a cluster of its own.
    assert {"addr-a", "addr-b"} <= running()
    status = json.loads(cli("status", "--json", "--address", address).stdout)
    assert {"addr-a", "addr-b"} <= {d["name"] for d in status}
    cli("shutdown", "addr-a", "--address", address)
    cli("shutdown", "addr-b", "--address", address)
    assert not {"addr-a", "addr-b"} & running()


def test_deploy_only_starts_just_the_named_deployment(address, tmp_path):
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(TWO_DEPLOYMENTS.format(a="only-a", b="only-b"))
    done = cli("deploy", pipeline, "--only", "only-b", "--address", address)
    assert "only-b: RUNNING (backend echo)" in done.stdout, done.stdout
    assert "only-a" not in done.stdout
    assert "only-b" in running() and "only-a" not in running()
    # The one it started is the one the file declares (its options included).
    assert (
        relayllm.get_deployment("only-b")
        .handle()
        .describe.remote()
        .result(timeout_s=60)["options"]["mode"]
        == "reverse"
    )
    unknown = cli("deploy", pipeline, "--only", "nope", "--address", address, check=2)
    assert "--only nope: not declared in" in unknown.stderr, unknown.stderr
    cli("shutdown", "only-b", "--address", address)


def _line(custom_id: str, text: str) -> dict:
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/completions",
        "body": {"prompt": text},
    }


def test_batch_resume_retry_errors_runs_the_failed_lines_again(address, tmp_path):
    """An earlier batch left two answers, one failed line and one never run: ``--resume
    --retry-errors`` runs the failed and the missing lines, each once, and keeps the two."""
    relayllm.deploy(relayllm.DeploymentConfig(name="retry-batch", backend="echo"))
    lines = [_line(f"c{i}", f"word{i} more{i}") for i in range(4)]
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out, errors = tmp_path / "out.jsonl", tmp_path / "out.errors.jsonl"
    kept = [
        {"id": f"batch_req_{i}", "custom_id": f"c{i}", "response": {"status_code": 200, "body": {}}}
        for i in range(2)
    ]
    out.write_text("".join(json.dumps(k) + "\n" for k in kept))
    failed = {"custom_id": "c2", "response": None, "error": {"code": "x", "message": "earlier"}}
    errors.write_text(json.dumps(failed) + "\n")

    alone = cli(
        "batch", source, "--deployment", "retry-batch", "--output", out, "--retry-errors",
        "--address", address, check=2,
    )  # fmt: skip
    assert "--retry-errors goes with --resume" in alone.stderr

    cli(
        "batch", source, "--deployment", "retry-batch", "--output", out, "--resume",
        "--retry-errors", "--address", address,
    )  # fmt: skip
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written[:2] == kept, "the lines already done are kept as they were"
    assert sorted(r["custom_id"] for r in written) == ["c0", "c1", "c2", "c3"], written
    again = {r["custom_id"]: r for r in written[2:]}
    assert again["c2"]["response"]["body"]["choices"][0]["text"] == "word2 more2"
    assert again["c3"]["response"]["body"]["choices"][0]["text"] == "word3 more3"
    assert not errors.exists(), "the errors file was emptied, nothing failed again: no file"
    relayllm.shutdown("retry-batch")


SERVE_RUNNING = """\
import sys, ray
from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE
ray.init(address=sys.argv[1], log_to_driver=False)
try:
    ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    print("serve running")
except ValueError:
    print("no serve")
"""


def test_ray_start_then_relayllm_with_no_ray_setting(tmp_path):
    """The docs' sequence: ``ray start --head`` (token authentication on, as Ray 2.60 turns it
    on where a token exists), then relayllm commands from a shell that never set
    RAY_AUTH_MODE. They connect (relayllm sends the token at hand), say which cluster they
    joined, and ``status`` -- asked first, on a cluster where Serve never ran -- starts
    nothing there."""
    with ray_head_node("rlfirst-") as (head, log, env):
        wait_started(head, log)
        address = env.pop("RAY_ADDRESS")
        del env["RAY_AUTH_MODE"]  # the user's shell: no Ray setting at all

        def relayllm_(*args, check=0):
            done = subprocess.run(
                [RELAYLLM, *map(str, args), "--address", address],
                env=env, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            assert done.returncode == check, f"exit {done.returncode}\n{done.stderr[-3000:]}"
            return done

        def serve_running() -> str:
            probe = subprocess.run(
                [sys.executable, "-c", SERVE_RUNNING, address],
                env={**env, "RAY_AUTH_MODE": "token"}, capture_output=True, text=True,
                timeout=300,
            )  # fmt: skip
            return probe.stdout.strip()

        status = relayllm_("status")
        assert f"connected to the Ray cluster at {address}" in status.stderr, status.stderr
        assert status.stdout.strip() == "no relayllm deployments are running"
        assert relayllm_("shutdown").stdout.strip() == "no relayllm deployments were running"
        assert serve_running() == "no serve", "a read-only command started Serve"

        deployed = relayllm_("deploy", REPO / "examples" / "echo.yaml")
        assert deployed.stdout.splitlines()[0] == "llm: RUNNING (backend echo)"
        assert serve_running() == "serve running"
        # A file with only deployments: (as `serve` and `batch --config` take) deploys too.
        only = tmp_path / "deployments.yaml"
        only.write_text("deployments:\n  - {name: other, backend: echo}\n")
        assert relayllm_("deploy", only).stdout.splitlines()[0] == "other: RUNNING (backend echo)"
        listed = json.loads(relayllm_("status", "--json").stdout)
        assert [(d["name"], d["status"], d["backend"]) for d in listed] == [
            ("llm", "RUNNING", "echo"),
            ("other", "RUNNING", "echo"),
        ]
        assert relayllm_("shutdown").stdout.strip() == "stopped: llm, other"
