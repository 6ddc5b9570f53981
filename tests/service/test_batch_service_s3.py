"""The batch service with its files in object storage: ``relayllm serve --files s3://...`` on a
real S3-compatible server (moto's, on loopback). Uploads, the runner's read of a batch's input,
and its output and error files all go through the S3 protocol; nothing lands under the state
directory's files folder. The cluster (a ``ray start`` of the test's own) gets the credentials
from its environment, as a user's would."""

import os
import socket
import subprocess
import sys
import time

import pytest
from batch_api import chat_lines, client, lines_of, submit, wait
from support import cli, free_port, ray_head_node, wait_started

pytest.importorskip("openai")
pytest.importorskip("moto")

BUCKET = "relayllm-files"
KEY = "s3-key-" + "s" * 24
DEPLOYMENTS = "deployments:\n  - name: echo\n    backend: echo\n"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory):
    """moto's S3 server on a free loopback port, with one bucket; ``host:port``."""
    import pyarrow.fs as pafs

    port = free_port()
    log = open(tmp_path_factory.mktemp("moto") / "moto.log", "wb")  # noqa: SIM115
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "moto did not start"
                time.sleep(0.2)
        fs = pafs.S3FileSystem(
            access_key="test",
            secret_key="test",
            region="us-east-1",
            scheme="http",
            endpoint_override=f"127.0.0.1:{port}",
            allow_bucket_creation=True,
        )
        fs.create_dir(BUCKET)
        yield f"127.0.0.1:{port}", fs
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def test_files_and_a_batchs_output_live_in_object_storage(s3_endpoint, tmp_path, monkeypatch):
    import pyarrow.fs as pafs

    endpoint, fs = s3_endpoint
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(name, "test")  # the cluster's environment: no key in the URI
    uri = f"s3://{BUCKET}/service?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    path, state = tmp_path / "deployments.yaml", tmp_path / "state"
    path.write_text(DEPLOYMENTS)
    lines = chat_lines(6, prefix="s")
    lines[5]["body"]["messages"] = "not a list"  # one line for the error file

    with ray_head_node("rls3-") as (head, log, env):
        wait_started(head, log)
        served = cli(
            "serve", path, "--port", free_port(), "--direct-port", 0, "--state-dir", state,
            "--files", uri,
            "--batch-size", 2, env={**env, "RELAYLLM_API_KEYS": f"team={KEY}"}, check=0,
        )  # fmt: skip
        api = client(served.stdout.split("base URL: ")[1].split()[0], KEY)
        batch = wait(api, submit(api, lines).id, timeout=180)
        assert batch.status == "completed", batch
        assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)
        done = lines_of(api, batch.output_file_id) + lines_of(api, batch.error_file_id)
        assert sorted(line["custom_id"] for line in done) == [f"s{i}" for i in range(6)]

        stored = {
            info.base_name
            for info in fs.get_file_info(pafs.FileSelector(f"{BUCKET}/service", recursive=True))
            if info.type == pafs.FileType.File
        }
        assert {batch.input_file_id, batch.output_file_id, batch.error_file_id} <= stored
        local = state / "files"
        assert not local.exists() or not os.listdir(local), "file bytes on the local disk"

        api.files.delete(batch.output_file_id)
        assert not fs.get_file_info(f"{BUCKET}/service/{batch.output_file_id}").is_file
        cli("unserve", env=env, check=0)
